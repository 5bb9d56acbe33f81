"""Calibration: the verifier's speedups against the same kernels timed in one process (ground truth).

A shipped set of honest kernels (fused elementwise, reduction, GEMM, a fused level-2 task) at sizes from microseconds to
~100 ms is verified as a user would (timing.method judge), then timed again in a plain process:

- GPU: triton's `do_bench` (CUDA events, L2 cleared before each call, median) of one call, the field's figure; and
  `do_bench` of the verifier's own workload in that process (its calls a block, back to back on their own input
  sets, replayed as a CUDA graph where the verifier did, L2 cleared before each block), per call. The second is what
  the verdict is judged against: the same kernels and calls, without the process boundary, round trips and checks
  the calibration exists to prove harmless. The two differ where a call is a few kernels of a few microseconds: an
  isolated call after a cache flush pays each kernel's start-up (~3-4 us a kernel on an H200), back-to-back calls do
  not (docs/benchmarks.md).
- cpu: `torch.utils.benchmark` of one call with the judge's thread count, OpenMP and allocator settings
  (judge.steady_malloc), inputs rotating over sets larger than the last-level cache (cold, like do_bench's cleared
  L2); and the verifier's own workload in that process (its calls a block on their own input sets, rewritten before
  each block), per call, which the verdict is judged against. The two differ by where outputs land: a lone call's
  output reuses the buffer its predecessor freed, warm in the cache, while a block keeps every call's output for the
  checks after it, each written to memory the cache does not hold (+0.2 ms a call of 4 MiB on a 2-vCPU EPYC,
  docs/benchmarks.md).

A row outside its tolerance fails the run (exit 1): 5% where the reference call takes 20 us or more on a GPU, 10% from
5 to 20 us and on the cpu; below 5 us a row is shown, not judged. `--kernelbench` adds KernelBench's own method (each
process timing itself) as another column.

    musacoder calibrate                        # the GPU when present, else the cpu set
    musacoder calibrate --backend cpu --quick  # the cpu part CI runs
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from musacoder.examples_catalog import EXAMPLES_DIR

CALIBRATION_DIR = EXAMPLES_DIR / "calibration"


@dataclass(frozen=True)
class Case:
    family: str
    task: str  # a built-in task key, or a file under examples/calibration/tasks
    kernel: str  # per backend: a file under examples/ ("{backend}" is replaced)
    sizes: dict  # profile -> list of {module-level name: value}

    def task_code(self, sizes: dict) -> str:
        if self.task.endswith(".py"):
            code = (CALIBRATION_DIR / "tasks" / self.task).read_text()
        else:
            from musacoder.tasks import builtin_task

            code = builtin_task(self.task).code
        for name, value in sizes.items():
            code, n = re.subn(rf"^{name} = \d+$", f"{name} = {int(value)}", code, flags=re.M)
            if n != 1:
                raise ValueError(f"{self.task} has no module-level `{name} = <int>`")
        return code


CASES = [
    Case("elementwise", "fused_scale_shift_relu.py", "calibration/{backend}/fused_scale_shift_relu.py",
         {"cuda": [{"batch_size": b, "dim": 16384} for b in (4, 64, 1024, 8192)],
          "cpu": [{"batch_size": b, "dim": 16384} for b in (4, 64, 256)],
          "quick": [{"batch_size": 64, "dim": 16384}]}),
    Case("reduction", "level1/49_Max_reduction_over_a_dimension", "{reduction}",
         {"cuda": [{"batch_size": 16, "dim1": 256, "dim2": 255}, {"batch_size": 32, "dim1": 512, "dim2": 511},
                   {"batch_size": 64, "dim1": 1024, "dim2": 1023}],
          "cpu": [{"batch_size": 16, "dim1": 256, "dim2": 255}, {"batch_size": 32, "dim1": 512, "dim2": 511}],
          "quick": []}),
    Case("gemm", "level1/1_Square_matrix_multiplication_", "{backend}/honest_matmul.py",
         {"cuda": [{"N": n} for n in (256, 1024, 4096, 8192)], "cpu": [{"N": n} for n in (128, 256, 512)],
          "quick": [{"N": 128}]}),
    Case("fused level-2", "level2/76_Gemm_Add_ReLU", "{backend}/honest_gemm_add_relu.py",
         {"cuda": [{"batch_size": 64, "in_features": 256, "out_features": 128},
                   {"batch_size": 128, "in_features": 4096, "out_features": 4096},
                   {"batch_size": 1024, "in_features": 4096, "out_features": 4096}],
          "cpu": [{"batch_size": 64, "in_features": 256, "out_features": 128},
                  {"batch_size": 256, "in_features": 1024, "out_features": 512}],
          "quick": []}),
]


def kernel_path(case: Case, backend: str) -> Path:
    name = case.kernel
    if name == "{reduction}":
        name = "calibration/cuda/max_reduction.py" if backend == "cuda" else "cpu/honest_max_reduction.py"
    return EXAMPLES_DIR / name.format(backend=backend)


def tolerance(backend: str, reference_ms: float) -> float | None:
    """How far the verifier's speedup may be from the ground truth's (None: too short a call to judge)."""
    if backend == "cpu":
        return 0.10
    if reference_ms >= 0.020:
        return 0.05
    return 0.10 if reference_ms >= 0.005 else None


# ---- ground truth, in a plain process ---------------------------------------------------------------------------
TRUTH_REPEATS = 5  # alternations of the two arms in the ground truth, on a GPU


def truth_main(spec_path: str) -> None:
    """`python -m musacoder.bench.calibrate --truth SPEC.json`: time each row's reference and candidate in this
    process; print one JSON line {"row", "reference_ms", "candidate_ms", ...} per row as it is measured."""
    spec = json.loads(Path(spec_path).read_text())
    import torch

    from musacoder.backends import get_backend
    from musacoder.verifier.build import Builder, LaunchCounter, RemoteLoader
    from musacoder.verifier.inputs import load_module

    backend = get_backend(spec["backend"])
    threads = spec.get("threads")
    if threads:
        torch.set_num_threads(threads)
    builder = Builder(Path(spec["cache"]), backend)
    # the candidates' load_inline resolved through the verifier's build cache: the same libraries it verified
    RemoteLoader(lambda a: builder.build(dict(a)), LaunchCounter(), backend.extension_apis).install()
    device = backend.device()
    if device.type != "cpu":  # clocks up before the first row (an idle GPU's first measurements ran slow)
        x = torch.rand(4096, 4096, device=device)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 2.0:
            x @ x
        backend.synchronize()
    for i, row in enumerate(spec["rows"]):
        task = load_module(row["task_code"], f"truth_task_{i}", Path(spec["cache"]))
        cand = load_module(row["kernel_code"], f"truth_cand_{i}", Path(spec["cache"]))
        init = task.get_init_inputs()
        torch.manual_seed(1)
        ref = task.Model(*init).to(device).eval()
        torch.manual_seed(1)
        new = cand.ModelNew(*init).to(device).eval()
        times = {}
        with torch.no_grad():
            # one workload a row, born on the device (the task's get_inputs under it, as the judge makes its
            # inputs), shared by both sides and every repeat: making it on the host took minutes a run
            one = _inputs(task, device)
            sets = [one] + [_inputs(task, device) for _ in range(row["calls"] - 1)]
            # the arms alternate; a GPU gets more repeats (one process's reading of the same ~10 us graph moved by
            # 15% between repeats on an H200), the cpu's each last a second or more
            gpu = device.type != "cpu"
            for side, model in (("reference", ref), ("candidate", new)) * (TRUTH_REPEATS if gpu else 2):
                times.setdefault(f"{side}_ms", []).append(_time(model, task, one, device, backend))
                if gpu:
                    times.setdefault(f"{side}_block_ms", []).append(_time_block(model, sets, row["graphs"]))
            if not gpu:  # round by round, as the verifier: a 2-vCPU VM's speed drifted by 25% between seconds
                times.update(_time_blocks_cpu({"reference": ref, "candidate": new}, sets))
            del sets, one
        each = [a / b for a, b in zip(times["reference_block_ms"], times["candidate_block_ms"])]
        print(json.dumps({"row": i, **{k: statistics.median(v) for k, v in times.items()},
                          "range": [min(each), max(each)]}), flush=True)


def _inputs(task, device) -> list:
    import torch

    with torch.device(device):
        return list(task.get_inputs())


def _time_block(model, sets: list, graphs: bool) -> float:
    """do_bench of the verifier's workload in this process: back-to-back calls on their own input sets (one CUDA
    graph replay where the verifier replayed graphs, captured as its subjects capture: each call's intermediates kept
    alive, verifier/capture.py), L2 cleared before each block, per call."""
    import torch
    from triton.testing import do_bench

    from musacoder.verifier.capture import KeepAlive

    if graphs:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model(*sets[0])
        torch.cuda.current_stream().wait_stream(side)
        graph, keep = torch.cuda.CUDAGraph(), KeepAlive()
        with torch.cuda.graph(graph), keep:
            outs = [model(*s) for s in sets]
        keep.release()
        ms = do_bench(graph.replay, warmup=25, rep=200, return_mode="median")
        del graph, outs
    else:
        ms = do_bench(lambda: [model(*s) for s in sets], warmup=25, rep=200, return_mode="median")
    return float(ms) / len(sets)


def _time_blocks_cpu(models: dict, sets: list, min_s: float = 2.0) -> dict[str, list[float]]:
    """The verifier's cpu workload in this process, per call, each arm's block in a random order each round (as the
    verifier's window): back-to-back calls on their own input sets, every call's output kept until the block ends
    (the verifier checks each), the sets rewritten in place before each block (the judge refills them: cold, dirty
    lines); rounds for `min_s` and at least 8, the first left out. `{side}_block_ms`: each round's time a call."""
    import random

    import torch

    times: dict[str, list[float]] = {side: [] for side in models}
    order, t_end = list(models), time.perf_counter() + min_s
    while len(times[order[0]]) < 8 or time.perf_counter() < t_end:
        random.shuffle(order)
        for side in order:
            for s in sets:
                for x in s:
                    if isinstance(x, torch.Tensor) and x.is_floating_point():
                        x.mul_(1.0)
            t0 = time.perf_counter()
            outs = [models[side](*s) for s in sets]
            times[side].append((time.perf_counter() - t0) * 1e3 / len(sets))
            del outs
    return {f"{side}_block_ms": t[1:] for side, t in times.items()}


def _time(model, task, inputs: list, device, backend) -> float:
    import torch

    if device.type != "cpu":
        from triton.testing import do_bench

        return float(do_bench(lambda: model(*inputs), warmup=25, rep=200, return_mode="median"))
    import torch.utils.benchmark as tb

    set_bytes = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
    n = max(2, min(256, math.ceil(2 * backend.cache_bytes() / max(set_bytes, 1))))
    sets = [inputs] + [task.get_inputs() for _ in range(n - 1)]
    state = {"i": 0}

    def call():
        state["i"] = (state["i"] + 1) % n
        model(*sets[state["i"]])

    timer = tb.Timer(stmt="call()", globals={"call": call}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=1.0).median * 1e3


# ---- the run ----------------------------------------------------------------------------------------------------
def rows_for(backend: str, quick: bool) -> list[dict]:
    profile = "quick" if quick else backend
    rows = []
    for case in CASES:
        for sizes in case.sizes.get(profile, []):
            rows.append({"family": case.family, "task": case.task, "sizes": sizes,
                         "task_code": case.task_code(sizes), "kernel": str(kernel_path(case, backend)),
                         "kernel_code": kernel_path(case, backend).read_text()})
    return rows


def _verify(rows: list[dict], tasks: list, backend: str, cache: str, method: str, log, done=lambda: None) -> None:
    """Each row through a pool with timing `method`; the verdict's figures into row[method], then `done()`."""
    from musacoder.config import VerifyConfig
    from musacoder.pool.local import LocalPool

    cfg = VerifyConfig(backend=backend, profile="kernelbench", cache_dir=cache)
    cfg.timing.baselines, cfg.timing.method = ("eager",), method
    with LocalPool(cfg) as pool:
        if method == "judge":  # each kernel built once, all at once, before any row is timed beside a build
            first = {row["kernel"]: i for i, row in reversed(list(enumerate(rows)))}
            for f in [pool.submit(tasks[i], rows[i]["kernel_code"]) for i in first.values()]:
                f.result()
        for i, row in enumerate(rows):
            v = pool.submit(tasks[i], row["kernel_code"]).result()
            row[method] = {"status": v.status.value, "reason": v.reason, "speedup": v.speedup_eager,
                           "interval": v.details.get("speedup_interval"), "candidate_ms": v.candidate_ms,
                           "reference_ms": v.eager_ms, **{k: v.details.get(k) for k in (
                               "calls_per_block", "graphs", "timer_floor_ms", "reference_self_ms", "outside_ms",
                               "outside_included", "probe_s", "held_bytes", "round_trip_ms", "spares_starting")},
                           "seconds": v.stage_seconds.get("total")}
            log(f"verified {i + 1}/{len(rows)} ({method}): {row['family']} {row['sizes']}: {v.status.value} "
                f"{v.speedup_eager} (round trip a block, candidate and reference: {v.details.get('round_trip_ms')} ms)")
            done()


def _truth(rows: list[dict], backend: str, cache: str):
    """The same kernels timed in a plain process, after the pool is closed (nothing else on the device): each row's
    (index, times) as the process measures it, so a run cut short keeps the rows it has."""
    from musacoder.proc.process import usable_cores
    from musacoder.verifier.judge import steady_malloc, subject_omp

    threads = usable_cores() if backend == "cpu" else None
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"backend": backend, "cache": cache, "threads": threads,
                                    "rows": [{"task_code": r["task_code"], "kernel_code": r["kernel_code"],
                                              "calls": r["judge"].get("calls_per_block") or 1,
                                              "graphs": bool(r["judge"].get("graphs"))} for r in rows]}))
        env = dict(os.environ, **subject_omp())  # as the judge's subjects run (judge.Subject)
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), **steady_malloc())
        with subprocess.Popen([sys.executable, "-m", "musacoder.bench.calibrate", "--truth", str(spec)], env=env,
                              stdout=subprocess.PIPE, text=True) as child:
            for line in child.stdout:
                if line.startswith('{"row"'):  # anything else on stdout (a build's words) is not a row
                    times = json.loads(line)
                    yield times.pop("row"), times
        if child.returncode:
            raise RuntimeError(f"the in-process timing exited with status {child.returncode}")


def _judge(row: dict, truth: dict, backend: str) -> None:
    # judged against the verifier's own workload timed in one process; the lone call's speedup is shown beside it
    row["truth"] = {**truth, "speedup": truth["reference_ms"] / truth["candidate_ms"],
                    "block_speedup": truth["reference_block_ms"] / truth["candidate_block_ms"]}
    judged = row["judge"]
    against = row["truth"]["block_speedup"]
    tol = tolerance(backend, truth["reference_block_ms"])
    row["tolerance"] = tol
    if judged["status"] != "ok" or judged["speedup"] is None:
        row["verdict"] = "FAIL"
        return
    row["ratio"] = judged["speedup"] / against
    row["ratio_isolated"] = judged["speedup"] / row["truth"]["speedup"]
    row["verdict"] = "n/a" if tol is None else ("ok" if abs(row["ratio"] - 1) <= tol else "FAIL")


def _resumed(rows: list[dict], out: str, backend: str) -> int:
    """Copy into `rows` what `out` (an earlier run's JSON, cut short) measured for the same rows; how many it had."""
    try:
        saved = json.loads(Path(out).read_text())
    except (OSError, ValueError):
        return 0
    if not isinstance(saved, dict) or saved.get("backend") != backend:
        return 0
    by_key = {_row_key(r): r for r in saved.get("rows", []) if isinstance(r, dict) and "judge" in r}
    for row in rows:
        if old := by_key.get(_row_key(row)):
            row.update({k: v for k, v in old.items() if k not in ("task_code", "kernel_code", "kernel")})
    return sum(_row_key(r) in by_key for r in rows)


def _row_key(row: dict) -> tuple:
    return row.get("family"), row.get("task"), json.dumps(row.get("sizes"), sort_keys=True)


def run(backend: str = "auto", quick: bool = False, cache: str | None = None, out: str | None = None,
        kernelbench: bool = False, log=print, resume: bool = False) -> list[dict]:
    """Verify, then time in one process, every row; the rows with both speedups and a verdict each. Each row's
    verdict is logged, and `out` written, as soon as it is known, before KernelBench's method runs: a run cut short
    keeps its calibration, and `resume` (on the same machine) measures only what `out` lacks."""
    from musacoder.backends import resolve
    from musacoder.tasks.model import Task

    backend = resolve(backend)
    if backend not in ("cpu", "cuda"):
        raise ValueError(f"calibration ships kernels for cpu and cuda, not {backend}")
    cache = cache or tempfile.mkdtemp(prefix="musacoder-calibrate-")
    rows = rows_for(backend, quick)
    tasks = [Task(name=f"calib_{row['family'].replace(' ', '_')}_{i}", code=row["task_code"])
             for i, row in enumerate(rows)]

    start = time.monotonic()

    def say(message: str) -> None:  # seconds since the start: where a long run's time goes
        log(f"{time.monotonic() - start:5.0f} s  {message}")

    def save():
        if out:
            kept = [{k: v for k, v in r.items() if k not in ("task_code", "kernel_code")} for r in rows]
            Path(out).write_text(json.dumps({"backend": backend, "rows": kept}, indent=1))

    if resume and out and (n := _resumed(rows, out, backend)):
        say(f"resumed: {n} of {len(rows)} rows verified in {out}, {sum('truth' in r for r in rows)} timed in process")
    if todo := [i for i, r in enumerate(rows) if "judge" not in r]:
        _verify([rows[i] for i in todo], [tasks[i] for i in todo], backend, cache, "judge", say, save)
    todo = [i for i, r in enumerate(rows) if "truth" not in r]
    for j, truth in _truth([rows[i] for i in todo], backend, cache) if todo else ():
        i = todo[j]
        row = rows[i]
        _judge(row, truth, backend)
        say(f"row {i + 1}/{len(rows)}: {row['family']} {row['sizes']}: in process {row['truth']['speedup']:.3f}, "
            f"verifier {row['judge']['speedup']}, ratio {row.get('ratio', float('nan')):.3f}: {row['verdict']}")
        save()
    if kernelbench:
        _verify(rows, tasks, backend, cache, "kernelbench", say)
        save()
    for row in rows:
        row.pop("task_code")
        row.pop("kernel_code")
    return rows


def table(rows: list[dict]) -> list[list[str]]:
    """Header and rows, for a terminal table or Markdown."""
    kb = any("kernelbench" in r for r in rows)
    block = any("block_speedup" in r["truth"] for r in rows)
    head = (["family", "sizes", "reference ms", "candidate ms", "speedup, in process"]
            + (["speedup, in process, the verifier's blocks"] if block else [])
            + ["its range over the repeats", "speedup, verifier [95% interval]", "ratio",
               "time a call, verifier / in process: reference, candidate", "calls a block", "tolerance", "verdict"]
            + (["speedup, KernelBench's method"] if kb else []))
    body = []
    for r in rows:
        t, j = r["truth"], r["judge"]
        lo, hi = j.get("interval") or (None, None)
        calls = f"{j.get('calls_per_block') or '-'}{' graph' if j.get('graphs') else ''}"
        body.append([r["family"], ",".join(f"{k}={v}" for k, v in r["sizes"].items()), f"{t['reference_ms']:.4g}",
                     f"{t['candidate_ms']:.4g}", f"{t['speedup']:.3f}"]
                    + ([f"{t['block_speedup']:.3f}" if "block_speedup" in t else "-"] if block else [])
                    + ["{:.3f}-{:.3f}".format(*t["range"]) if "range" in t else "-",
                       f"{j['speedup']:.3f} [{lo:.3f}-{hi:.3f}]" if j["speedup"] else j["status"],
                       f"{r['ratio']:.3f}" if "ratio" in r else "-", _arms(j, t), calls,
                       f"{r['tolerance']:.0%}" if r["tolerance"] else "-", r["verdict"]]
                    + ([f"{r['kernelbench']['speedup']:.3f}" if r.get("kernelbench", {}).get("speedup") else "-"]
                       if kb else []))
    return [head, *body]


def _arms(judged: dict, truth: dict) -> str:
    """Each arm's time a call in the verdict over the same in process (the verifier's blocks where timed so): which
    side a disagreement comes from."""
    if not judged.get("reference_ms") or not judged.get("candidate_ms"):
        return "-"
    ref, cand = (truth.get(f"{side}_block_ms", truth[f"{side}_ms"]) for side in ("reference", "candidate"))
    return f"{judged['reference_ms'] / ref:.3f}, {judged['candidate_ms'] / cand:.3f}"


def main(argv=None):
    """The ground-truth process: `python -m musacoder.bench.calibrate --truth SPEC.json` (`musacoder calibrate` is
    the command)."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--truth", required=True)
    truth_main(ap.parse_args(argv).truth)


if __name__ == "__main__":
    main()
