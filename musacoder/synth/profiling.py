"""Stage 3c: `profiling` records, a verified program's profiler read-out with its bottleneck named and, where a rewrite
pair exists for it (stage 3b, rewrite_pairs.jsonl), the faster program with its measured speedup.

Each program runs under torch.profiler in a fresh sandboxed process (`python -m musacoder.synth.profiling`, started
as the verifier starts its workers): candidate code never runs in the caller's process. Its native code is built by
the caller through the verifier's trusted `Builder` into the verifier's cache, so a verified program's build is
reused. The process loads the task and the program (weights seeded, the task's own inputs), runs `warmup` forwards,
times `iterations` plain forwards, then profiles `iterations` more. On the cpu the program's extension functions
are labelled (record_function), so the table has them as kernels beside the aten ops; on a GPU the kernels are the
profiler's device events. A program that does not load, raises, crashes the process or passes `timeout_s` while
profiled gets a recorded status and reason (profiles.jsonl), never an exception.

The bottleneck, by a stated rule (`diagnose`), over times per forward:
- host overhead: the kernels take under HOST_BOUND (half) of the wall time; the bottleneck named is the largest
  host row (an aten op, or on the cpu the host time outside any profiled op);
- one kernel: else, when the largest kernel has at least ONE_KERNEL (half) of the kernel time; it is named;
- many launches: else (the kernel time is spread, none has half); the largest kernel is named.
The advice that follows is by category; on the cpu it also reads the program's source (vector code, OpenMP threads).

Nsight Compute, where available (a GPU backend with `ncu` on PATH): a second sandboxed process runs under
`ncu --profile-from-start off --clock-control none`; it loads the program, runs the warm-up forwards (Triton's JIT
compiles there), then one forward between cudaProfilerStart and cudaProfilerStop, so ncu replays exactly that
forward's kernels. Per kernel launch: duration, SM and memory throughput as shares of peak, DRAM throughput,
achieved occupancy, registers per thread, grid and block (`NCU_METRICS`). The named kernel (or the longest one ncu
measured) gets a second rule, Nsight Compute's own: memory-bound when its memory throughput is at least BOUND_PCT of
peak and above its SM throughput, compute-bound when its SM throughput is, else latency-bound. ncu's report is
written outside the process's private directory, so the program cannot edit it after the fact; the program can
still shape what runs between the start and stop calls, which is why the metrics are training text and never enter
a verdict. Where ncu is missing or fails, the record says so and carries no metric. Written to the output directory:
profiling.jsonl (kind `profiling`) and profiles.jsonl (every program tried: the table, or the reason it has none).
Resumable: a (task, program) already in profiles.jsonl is not profiled again.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING

from musacoder.config import VerifyConfig
from musacoder.conversation import STYLES, task_messages
from musacoder.data.schema import ProfileRecord, ProfilingMeta, ProfilingRecord, RewritePair, RewriteRef, line, parse
from musacoder.tasks.model import Task
from musacoder.verifier.feedback import BOUND_ADVICE, BOUND_PCT, kernel_bound

# The rest of musacoder.synth imports torch: imported where used, so that the profiling process (this module run
# with -m) is sandboxed before torch and anything it starts.
if TYPE_CHECKING:
    from musacoder.synth.rewrite import Solution
    from musacoder.verifier.protocol import ProfileCommand, ProfileReply

PROFILING, PROFILES = "profiling.jsonl", "profiles.jsonl"
HOST_BOUND = 0.5  # kernels under this share of the wall time: the host bounds the program
ONE_KERNEL = 0.5  # the largest kernel with at least this share of the kernel time bounds it alone
OTHER_HOST = "[host time outside profiled ops]"  # cpu: Python and glue between the ops the profiler records
STARTUP_S = 300.0  # the profiling process starting (Python, torch, a GPU context): not the program's time
TABLE_ROWS = 12
# Nsight Compute metric -> its name in the records
NCU_METRICS = {"gpu__time_duration.sum": "duration_ns",
               "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
               "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory_pct",
               "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
               "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
               "launch__registers_per_thread": "registers"}

PROMPT = Template("""\
The program below replaces the PyTorch architecture that follows it with its own $lang kernels; MooreEval verified \
it. After it is what torch.profiler measured over $n forwards on $device.

Program:
```python
$code
```

Architecture:
```python
$task
```

Profiler read-out, per forward (wall time $wall ms under the profiler, $plain ms without it):
$table

What bounds this kernel, and how would you speed it up?""")

# what the advice reads in a cpu program's source: vector code, and work spread over threads
_VECTOR = re.compile(r"Vectorized<|#pragma\s+omp\s+(parallel\s+for\s+)?simd|\b_mm(256|512)?_|__m(256|512)")
_THREADS = re.compile(r"#pragma\s+omp\s+parallel|at::parallel_for")


# ---- the rule ---------------------------------------------------------------------------------------------------
@dataclass
class Diagnosis:
    category: str  # "one kernel", "many launches" or "host overhead"
    bottleneck: dict  # the row named
    kernel_ms: float  # per forward
    kernel_share: float  # of the wall time
    top_kernel: dict | None  # the largest kernel row
    top_kernel_share: float  # its share of the kernel time
    launches: float  # kernel launches per forward


def diagnose(rows: list[dict], wall_ms: float, iterations: int) -> Diagnosis:
    """The rule of the module docstring. rows: {name, kind: kernel | host, calls, self_ms} summed over `iterations`
    forwards; wall_ms: per forward."""
    kernels = sorted((r for r in rows if r["kind"] == "kernel"), key=lambda r: -r["self_ms"])
    hosts = sorted((r for r in rows if r["kind"] == "host"), key=lambda r: -r["self_ms"])
    kernel_ms = sum(r["self_ms"] for r in kernels) / iterations
    share = kernel_ms / wall_ms if wall_ms > 0 else 0.0
    top = kernels[0] if kernels else None
    top_share = top["self_ms"] / iterations / kernel_ms if top and kernel_ms > 0 else 0.0
    launches = sum(r["calls"] for r in kernels) / iterations
    if share < HOST_BOUND or top is None:
        category, named = "host overhead", hosts[0] if hosts else top
    else:
        category, named = ("one kernel" if top_share >= ONE_KERNEL else "many launches"), top
    return Diagnosis(category, named, kernel_ms, share, top, top_share, launches)


def table_text(rows: list[dict], wall_ms: float, iterations: int) -> str:
    lines = ["| op or kernel | kind | calls | self ms | share of wall |", "|---|---|---|---|---|"]
    shown = sorted(rows, key=lambda r: -r["self_ms"])
    for r in shown[:TABLE_ROWS]:
        ms = r["self_ms"] / iterations
        calls = "-" if r["calls"] is None else f"{r['calls'] / iterations:g}"
        lines.append(f"| {r['name']} | {r['kind']} | {calls} | {ms:.4f} | {ms / wall_ms:.1%} |")
    if len(shown) > TABLE_ROWS:
        rest = sum(r["self_ms"] for r in shown[TABLE_ROWS:]) / iterations
        lines.append(f"| ({len(shown) - TABLE_ROWS} more) | | | {rest:.4f} | {rest / wall_ms:.1%} |")
    return "\n".join(lines)


def _count(n: float, one: str, many: str) -> str:
    return f"{n:g} {one if n == 1 else many}"


def advice(d: Diagnosis, code: str, gpu: bool, iterations: int) -> str:
    """How to speed it up, by category; on the cpu also from what the program's source shows it does already."""
    name = d.bottleneck["name"]
    if d.category == "host overhead":
        return ("Cut the host work per forward: fewer allocations and tensor-level calls, fewer launches (fuse "
                "them). At this size a faster kernel would hardly show.")
    if d.category == "many launches":
        return ("Fuse the kernels into fewer: intermediates then stay in registers or cache instead of going "
                "through memory between launches, and each launch's fixed cost is paid once.")
    if gpu:
        text = (f"Make `{name}` itself faster: coalesced, vectorised loads, enough blocks to fill every SM, and one "
                "pass over global memory.")
    else:
        todo = []
        if not _VECTOR.search(code):
            todo.append("its source has no vector code (at::vec, `#pragma omp simd`, intrinsics): vectorise the "
                        "inner loop")
        if not _THREADS.search(code):
            todo.append("it runs on one thread (no `#pragma omp parallel`, no at::parallel_for): spread the outer "
                        "loop over the cores")
        text = f"Make `{name}` itself faster: " + ("; ".join(todo) + "." if todo else
                                                   "it is vectorised and multi-threaded already, so what is left is "
                                                   "memory traffic: read and write each element once, in one pass.")
    calls = d.top_kernel["calls"] / iterations
    if calls > 1:
        text += f" It runs {calls:g} times per forward: where those launches repeat work, do it once."
    return text


def answer_text(d: Diagnosis, code: str, wall_ms: float, iterations: int, gpu: bool, verdict: dict | None,
                rewrite: RewritePair | None, kernels: list[dict] | None = None) -> str:
    """The assistant's answer: the bottleneck, the reasoning from the numbers, the advice, what Nsight Compute
    measured of the named kernel (`kernels`: its launches of one forward, when measured), the faster program."""
    name = d.bottleneck["name"]
    share = d.bottleneck["self_ms"] / iterations / wall_ms
    out = [f"Bottleneck: `{name}` ({d.category}: {share:.0%} of the wall time per forward)."]
    why = [f"Per forward the program takes {wall_ms:.4g} ms; {d.kernel_ms:.4g} ms of it ({d.kernel_share:.0%}) is "
           f"in kernels ({_count(d.launches, 'kernel launch', 'kernel launches')})."]
    if d.top_kernel:
        k = d.top_kernel
        why.append(f"The largest kernel, `{k['name']}`, has {d.top_kernel_share:.0%} of the kernel time: "
                   f"{_count(k['calls'] / iterations, 'call', 'calls')} per forward, "
                   f"{k['self_ms'] / k['calls']:.4g} ms each.")
    if d.category == "host overhead":
        why.append(f"The kernels are under {HOST_BOUND:.0%} of the wall time, so the host bounds it; its largest "
                   f"item is `{name}`.")
    elif d.category == "one kernel":
        why.append(f"The kernels are most of the wall time and this one has at least {ONE_KERNEL:.0%} of theirs, "
                   "so it bounds the program.")
    else:
        why.append(f"The kernels are most of the wall time, spread so that none has {ONE_KERNEL:.0%} of it.")
    if verdict and verdict.get("sol_ms"):
        why.append(f"MooreEval's speed-of-light estimate for the task is {verdict['sol_ms']:.4g} ms.")
    out += [" ".join(why), advice(d, code, gpu, iterations)]
    if kernels:
        out.append(nsight_text(d, kernels))
    if rewrite:
        out.append(f"A faster program for this task, verified by MooreEval and measured {rewrite.speedup:.2f}x "
                   f"faster ({rewrite.slow.ms:.4g} ms -> {rewrite.fast.ms:.4g} ms):\n\n```python\n"
                   f"{rewrite.fast_code.strip()}\n```")
    return "\n\n".join(out)


# ---- Nsight Compute ----------------------------------------------------------------------------------------------
NVIDIA = ("cuda", "triton")


def nsight_compute(backend: str, enabled: bool = True) -> tuple[str | None, str]:
    """ncu's path, or None and what the records say instead: never a metric that was not measured."""
    if not enabled:
        return None, "off"
    if backend not in NVIDIA:
        return None, f"not applicable: the {backend} backend runs no NVIDIA GPU kernel"
    path = shutil.which("ncu")
    return (path, f"ncu at {path}") if path else (None, "not available: ncu is not on PATH")


def parse_ncu_csv(text: str) -> list[dict]:
    """`ncu --import REPORT --csv --page raw`: a header row, a units row, a row per kernel launch ->
    [{kernel, grid, block, and NCU_METRICS' names (None where ncu gave no number)}], durations in ns whatever
    unit ncu scaled them to."""
    rows = list(csv.reader(line for line in text.splitlines() if not line.startswith("==")))
    at = next((i for i, r in enumerate(rows) if r[:1] == ["ID"]), None)
    if at is None or at + 1 >= len(rows):
        return []
    head, units = rows[at], rows[at + 1]
    col = {name: i for i, name in enumerate(head)}
    out = []
    for r in rows[at + 2:]:
        if len(r) != len(head) or not r[0].isdigit():  # ncu's own lines
            continue
        k = {"kernel": r[col["Kernel Name"]], "grid": r[col["Grid Size"]], "block": r[col["Block Size"]]}
        for metric, name in NCU_METRICS.items():
            value = _number(r[col[metric]]) if metric in col else None
            scale = _TO_NS.get(units[col[metric]], 1.0) if name == "duration_ns" and len(units) == len(head) else 1.0
            k[name] = None if value is None else value * scale
        out.append(k)
    return out


_TO_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))  # ncu writes thousands separators
    except ValueError:
        return None


def short_name(kernel: str) -> str:
    """A demangled kernel signature's function name: `void f<4, T>(int, T2)` -> `f`."""
    name = kernel.removeprefix("void ").strip()
    depth = 0
    for i, ch in enumerate(name):
        if ch in "<(" and depth == 0 and i:
            return name[:i].split("::")[-1]
        depth += ch == "<"
        depth -= ch == ">"
    return name.split("::")[-1]


def ncu_table(kernels: list[dict]) -> str:
    lines = ["| kernel | us | SM % of peak | memory % of peak | DRAM % of peak | achieved occupancy % | registers | "
             "grid | block |", "|---|---|---|---|---|---|---|---|---|"]

    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    for k in sorted(kernels, key=lambda k: -(k["duration_ns"] or 0))[:TABLE_ROWS]:
        lines.append(f"| {short_name(k['kernel'])} | {num(k['duration_ns'] and k['duration_ns'] / 1e3, '.4g')} | "
                     f"{num(k['sm_pct'], '.1f')} | {num(k['memory_pct'], '.1f')} | {num(k['dram_pct'], '.1f')} | "
                     f"{num(k['occupancy_pct'], '.1f')} | {num(k['registers'], 'g')} | {k['grid']} | {k['block']} |")
    return "\n".join(lines)


def nsight_text(d: Diagnosis, kernels: list[dict]) -> str:
    """The answer's paragraph on the named kernel (the longest launch of that name ncu measured, else the longest)."""
    def longest(ks):
        return max(ks, key=lambda k: k["duration_ns"] or 0) if ks else None

    named = short_name(d.top_kernel["name"]) if d.top_kernel else None
    k = longest([k for k in kernels if short_name(k["kernel"]) == named]) or longest(kernels)
    bound = kernel_bound(k)
    facts = [f"{k['sm_pct']:.0f}% of peak SM throughput" if k["sm_pct"] is not None else None,
             f"{k['memory_pct']:.0f}% of peak memory throughput" if k["memory_pct"] is not None else None,
             f"DRAM {k['dram_pct']:.0f}%" if k["dram_pct"] is not None else None,
             f"achieved occupancy {k['occupancy_pct']:.0f}%" if k["occupancy_pct"] is not None else None,
             f"{k['registers']:g} registers a thread" if k["registers"] is not None else None]
    took = f" took {k['duration_ns'] / 1e3:.4g} us" if k["duration_ns"] is not None else ""
    return (f"Nsight Compute, one forward: `{short_name(k['kernel'])}`{took} (grid {k['grid']}, block "
            f"{k['block']}): {', '.join(f for f in facts if f)}. By Nsight Compute's {BOUND_PCT:.0f}% line it is "
            f"{bound}. {BOUND_ADVICE[bound]}")


# ---- running a program in the profiling process -------------------------------------------------------------------
def profile_program(task: Task, code: str, cfg: VerifyConfig, iterations: int = 10, warmup: int = 3,
                    timeout_s: float = 60.0) -> dict:
    """{status: ok | failed | crashed | timeout, reason, sandbox (as the process described it), and with ok: rows,
    wall_ms, plain_ms, device, threads}. timeout_s bounds the profiled forwards; loading (and building, when the
    cache misses) is bounded by cfg.compile_timeout_s, the process's start by STARTUP_S."""
    from musacoder.verifier.protocol import ProfileCommand

    return _run(task, code, cfg, ProfileCommand(op="profile", iterations=iterations, warmup=warmup), timeout_s)


def nsight_program(task: Task, code: str, cfg: VerifyConfig, ncu: str, warmup: int = 3,
                   timeout_s: float = 60.0) -> dict:
    """One forward after `warmup` under Nsight Compute (the module docstring): {status, reason, sandbox, kernels}.
    timeout_s bounds the measured forwards with ncu's replays, and again ncu's writing and reading of its report."""
    from musacoder.verifier.protocol import ProfileCommand

    report = Path(tempfile.mkdtemp(prefix="musacoder-ncu-"))  # not the program's: it cannot write there
    # ncu's target side takes a lock under the temporary directory (the program's private one) or /tmp/nvidia
    lock = Path(tempfile.gettempdir()) / "nvidia" / "nsight_compute"
    lock.mkdir(parents=True, exist_ok=True)
    launcher = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--metrics", ",".join(NCU_METRICS),
                "--export", str(report / "report"), "--force-overwrite"]
    try:
        r = _run(task, code, cfg, ProfileCommand(op="nsight", warmup=warmup), timeout_s, launcher, [str(lock)])
        out = {"status": r["status"], "reason": r["reason"], "sandbox": r["sandbox"], "kernels": []}
        if r["status"] != "ok":
            return out
        if r["exit"] != 0:
            what = "killed: it did not end in time" if r["exit"] is None else f"exit status {r['exit']}"
            return {**out, "status": "failed", "reason": f"ncu: {what}: {r['log'][-800:]}"}
        try:
            read = subprocess.run([ncu, "--import", str(report / "report.ncu-rep"), "--csv", "--page", "raw",
                                   "--print-units", "base"],
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {**out, "status": "timeout", "reason": "ncu --import: no answer in time (killed)"}
        out["kernels"] = parse_ncu_csv(read.stdout)
        if not out["kernels"]:
            return {**out, "status": "failed", "reason": f"ncu measured no kernel: {(read.stderr or r['log'])[-800:]}"}
        return out
    finally:
        shutil.rmtree(report, ignore_errors=True)


def _run(task: Task, code: str, cfg: VerifyConfig, cmd: ProfileCommand, timeout_s: float,
         launcher: list[str] | None = None, writable: list[str] = ()) -> dict:
    """Start the profiling process (under `launcher`), load the program, run `cmd`: {status, reason, sandbox, and
    the reply's fields}. With a launcher the process is ended by closing its channel, so the launcher writes what
    it collected: `exit` is then its exit status and `log` the tail of its output."""
    from pydantic import ValidationError

    from musacoder.backends import get_backend
    from musacoder.proc.process import WorkerDied, WorkerProcess, WorkerTimeout
    from musacoder.verifier.build import Builder
    from musacoder.verifier.judge import private_env, steady_malloc
    from musacoder.verifier.protocol import BuildRequest, ProfileCommand, ProfileReply

    backend = get_backend(cfg.backend)
    builder = Builder(cfg.cache_dir, backend)
    private = Path(tempfile.mkdtemp(prefix="musacoder-profile-"))
    # the environment of the verifier's subjects, so the profile is taken as MooreEval's times were
    env = private_env(private)
    if backend.device_type == "cpu":
        env.update(steady_malloc())
        if cfg.worker_mem_gb > 0:
            env["MUSACODER_PROFILE_MEM_GB"] = str(cfg.worker_mem_gb)
    argv = ["musacoder.synth.profiling", "--backend", backend.name, "--sandbox"]
    if backend.device_type != "cpu":  # the driver writes under the process's own /proc entry (as for subjects)
        argv += ["--writable", "/proc/self"]
    for path in writable:
        argv += ["--writable", path]
    proc = WorkerProcess("profiler", backend.name, cfg.cache_dir, env=env, start_timeout=STARTUP_S, argv=argv,
                         log_path=private / "log", launcher=launcher)

    def serve(msg: dict) -> dict:  # the program's load_inline: built here, by the trusted builder
        return builder.build(BuildRequest.model_validate(msg).arguments).model_dump()

    def call(c: ProfileCommand, timeout: float) -> ProfileReply:
        return ProfileReply.model_validate(proc.call(c.model_dump(), timeout, serve))

    stage, sandbox = "starting", ""
    try:
        sandbox = proc.start().get("sandbox", "")
        stage = "loading"
        r = call(ProfileCommand(op="load", task_code=task.code, code=code, precision=cfg.precision),
                 cfg.compile_timeout_s)
        if r.ok:
            stage = "profiling"
            r = call(cmd, timeout_s)
        if not r.ok:
            return {"status": "failed", "reason": f"{stage}: {r.error[-1500:]}", "sandbox": sandbox}
        ended = {"exit": proc.finish(timeout_s), "log": proc.log_tail(1500)} if launcher else {}
        return {"status": "ok", "reason": "", "sandbox": sandbox, **r.model_dump(exclude={"ok", "error"}), **ended}
    except WorkerTimeout as e:
        return {"status": "timeout", "reason": f"{stage}: {e} (killed)", "sandbox": sandbox}
    except ValidationError as e:  # the program wrote on the process's channel itself
        return {"status": "failed", "reason": f"{stage}: malformed reply: {str(e)[:500]}", "sandbox": sandbox}
    except WorkerDied as e:
        return {"status": "crashed", "reason": f"{stage}: {e}"[-1500:], "sandbox": sandbox}
    finally:
        proc.kill()
        shutil.rmtree(private, ignore_errors=True)


# ---- records ----------------------------------------------------------------------------------------------------
def load_rewrites(path: Path) -> dict[tuple[str, str], RewritePair]:
    """(task, slower program's hash) -> the kept rewrite pair with the largest speedup, from rewrite_pairs.jsonl."""
    from musacoder.synth.rewrite import PAIRS

    out: dict[tuple[str, str], RewritePair] = {}
    file = path / PAIRS if path.is_dir() else path
    if not file.is_file():
        return out
    for text in file.read_text(errors="replace").splitlines():
        try:
            pair = parse(RewritePair, json.loads(text))
        except ValueError:  # a line cut by an interrupted run
            continue
        key = (pair.task, pair.slow.solution)
        if pair.kept and (key not in out or pair.speedup > out[key].speedup):
            out[key] = pair
    return out


def profiling_messages(s: Solution, backend: str, prof: dict, iterations: int,
                       kernels: list[dict] | None = None) -> list[dict]:
    system = task_messages(s.task, backend, one_shot=False)[0]
    table = table_text(prof["rows"], prof["wall_ms"], iterations)
    if kernels:
        table += f"\n\nNsight Compute, one forward after the warm-up, per kernel launch:\n{ncu_table(kernels)}"
    user = PROMPT.substitute(lang=STYLES[backend].lang, n=iterations, device=prof["device"], code=s.code.strip(),
                             task=s.task.code.strip(), wall=f"{prof['wall_ms']:.4g}", plain=f"{prof['plain_ms']:.4g}",
                             table=table)
    return [system, {"role": "user", "content": user}]


def profiling_records(solutions: list[Solution], out_dir: Path, cfg: VerifyConfig,
                      rewrites: dict[tuple[str, str], RewritePair] | None = None, iterations: int = 10,
                      timeout_s: float = 60.0, progress: Callable[[str, int, int], None] | None = None,
                      nsight: bool = True) -> dict:
    """Profile each program (one at a time: concurrent runs would share the cores the times are read from), under
    Nsight Compute too where `nsight` and ncu is there, and write profiling.jsonl and profiles.jsonl under out_dir;
    return the summary."""
    from musacoder.synth.clean import with_families
    from musacoder.synth.tasks import recorded

    out_dir.mkdir(parents=True, exist_ok=True)
    rewrites = rewrites or {}
    done = recorded(out_dir / PROFILES, ProfileRecord, lambda r: (r.task, r.solution))
    todo = [s for s in solutions if (s.task.key, s.hash) not in done]
    ncu, ncu_status = nsight_compute(cfg.backend, nsight)
    statuses, categories, ncu_statuses, with_rewrite = Counter(), Counter(), Counter(), 0
    with open(out_dir / PROFILES, "a") as profs, open(out_dir / PROFILING, "a") as recs:
        for i, s in enumerate(todo, 1):
            prof = profile_program(s.task, s.code, cfg, iterations, timeout_s=timeout_s)
            statuses[prof["status"]] += 1
            base = {"task": s.task.key, "solution": s.hash, "teacher": s.teacher, "origin": s.origin,
                    "backend": cfg.backend, "ncu_kernels": [],
                    "nsight_compute": ncu_status if prof["status"] == "ok" or not ncu else
                    "not run: the program has no torch.profiler profile"}
            if prof["status"] == "ok" and ncu:
                measured = nsight_program(s.task, s.code, cfg, ncu, timeout_s=timeout_s)
                ncu_statuses[measured["status"]] += 1
                base.update(nsight_compute="measured" if measured["status"] == "ok" else
                            f"{measured['status']}: {measured['reason'][-600:]}", ncu_kernels=measured["kernels"])
            if prof["status"] == "ok":
                d = diagnose(prof["rows"], prof["wall_ms"], iterations)
                categories[d.category] += 1
                rewrite = rewrites.get((s.task.key, s.hash))
                with_rewrite += rewrite is not None
                gpu = cfg.backend != "cpu"
                kernels = base["ncu_kernels"]
                answer = answer_text(d, s.code, prof["wall_ms"], iterations, gpu, s.verdict, rewrite, kernels)
                ref = RewriteRef(speedup=rewrite.speedup, slow_ms=rewrite.slow.ms, fast_ms=rewrite.fast.ms,
                                 fast=rewrite.fast.solution) if rewrite else None
                meta = ProfilingMeta(**base, category=d.category, bottleneck=d.bottleneck["name"],
                                     kernel_share=round(d.kernel_share, 4), wall_ms=prof["wall_ms"],
                                     iterations=iterations, profiler="torch.profiler", rewrite=ref)
                recs.write(line(ProfilingRecord(
                    messages=profiling_messages(s, cfg.backend, prof, iterations, kernels)
                    + [{"role": "assistant", "content": answer}],
                    kind="profiling", task=s.task.key, metadata=with_families(meta, s.task))))
                recs.flush()
                base.update(category=d.category, bottleneck=d.bottleneck["name"])
            # the program's line is written last: it is the resume point
            profs.write(line(ProfileRecord(**base, **prof, iterations=iterations)))
            profs.flush()
            if progress:
                progress("profiling", i, len(todo))
    return {"programs": len(solutions), "tried": len(todo), "skipped_existing": len(solutions) - len(todo),
            "records": statuses["ok"], "with_rewrite": with_rewrite, "statuses": dict(statuses.most_common()),
            "categories": dict(categories.most_common()), "nsight_compute": ncu_status,
            "nsight_statuses": dict(ncu_statuses.most_common())}


# ---- the profiling process ----------------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--sandbox", action="store_true")
    ap.add_argument("--writable", action="append", default=[])
    args = ap.parse_args(argv)
    private = os.environ["MUSACODER_PRIVATE"]
    sandbox = "none"
    if args.sandbox:  # before any import can start a thread (Landlock binds this thread and its future children)
        from musacoder.verifier.sandbox import restrict_writes

        sandbox = restrict_writes(private, [os.path.realpath(p) for p in args.writable])
    mem_gb = float(os.environ.get("MUSACODER_PROFILE_MEM_GB", "0"))
    if mem_gb > 0:  # as the verifier caps its cpu workers: a memory bomb fails here, not the host
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (int(mem_gb * 2**30), int(mem_gb * 2**30)))
    from multiprocessing.connection import Connection

    from musacoder.proc.process import adopt_orphans_and_follow_parent
    from musacoder.verifier.protocol import Hello, send

    conn = Connection(args.fd)
    adopt_orphans_and_follow_parent()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # the program's prints must not reach the pipe
    child = _Child(conn, args.backend, private)
    send(conn, Hello(pid=os.getpid(), sandbox=sandbox))
    child.loop()


class _Child:
    def __init__(self, conn, backend: str, private: str):
        from functools import partial

        import torch

        from musacoder.backends import get_backend
        from musacoder.verifier.build import LaunchCounter
        from musacoder.verifier.protocol import request_build

        self.torch, self.conn, self.private = torch, conn, private
        self.backend = get_backend(backend)
        self.labels: set[str] = set()
        _labelling_loader(partial(request_build, conn), LaunchCounter(), self.backend.extension_apis,
                          self.labels).install()
        self.backend.disable_tf32()
        self.device = self.backend.device()
        self.model = self.inputs = None

    def loop(self):
        from musacoder.verifier.protocol import ProfileCommand, ProfileReply, send

        while True:
            try:
                job = ProfileCommand.model_validate(json.loads(self.conn.recv_bytes()))
            except (EOFError, OSError):
                return
            try:
                reply = getattr(self, "op_" + job.op)(job)
            except BaseException as e:  # the program's failure is the answer
                reply = ProfileReply(ok=False, error="".join(traceback.format_exception(type(e), e, e.__traceback__)))
            send(self.conn, reply)

    def op_load(self, job: ProfileCommand) -> ProfileReply:
        from musacoder.verifier.inputs import DTYPES, Shape, init_inputs, load_module, make_inputs
        from musacoder.verifier.protocol import ProfileReply

        torch = self.torch
        task = load_module(job.task_code, "task", self.private)
        cls = load_module(job.code, "cand", self.private).ModelNew
        torch.manual_seed(0)
        with torch.device(self.device):
            model = cls(*init_inputs(task, Shape()))
        model = model.to(self.device)
        if job.precision != "fp32":
            model = model.to(DTYPES[job.precision])
        self.model = model.eval()
        self.inputs = make_inputs(task, Shape(), 0, self.device, job.precision)
        return ProfileReply()

    def _forward(self) -> float:
        t0 = time.perf_counter()
        self.model(*self.inputs)
        self.backend.synchronize()
        return (time.perf_counter() - t0) * 1e3

    def op_nsight(self, job: ProfileCommand) -> ProfileReply:
        """The forward ncu measures (it profiles only between cudaProfilerStart and cudaProfilerStop)."""
        from musacoder.verifier.protocol import ProfileReply

        with self.torch.no_grad():
            for _ in range(job.warmup):
                self._forward()
            self.torch.cuda.profiler.start()
            try:
                self._forward()
            finally:
                self.torch.cuda.profiler.stop()
        return ProfileReply()

    def op_profile(self, job: ProfileCommand) -> ProfileReply:
        import statistics

        from torch.profiler import ProfilerActivity, profile, schedule

        from musacoder.verifier.protocol import ProfileReply

        torch, n = self.torch, job.iterations
        gpu = self.device.type != "cpu"
        activities = [ProfilerActivity.CPU]
        if gpu:
            activities.append(ProfilerActivity.CUDA if self.device.type == "cuda" else ProfilerActivity.PrivateUse1)
        with torch.no_grad():
            for _ in range(job.warmup):
                self._forward()
            plain = statistics.fmean(self._forward() for _ in range(n))  # a mean, as the profiled wall time
            # one profiled warm-up step first: the profiler's own start-up is not the program's time
            with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=n, repeat=1)) as prof:
                wall = 0.0
                for step in range(n + 1):
                    ms = self._forward()
                    wall += ms if step else 0.0
                    prof.step()
        rows: dict[tuple[str, str], dict] = {}
        for ev in prof.events():
            if ev.device_type != torch.autograd.DeviceType.CPU:
                us = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total  # older torch
                kind, ms = "kernel", us / 1e3
            elif ev.name.startswith("ProfilerStep") or gpu and "Synchronize" in ev.name:
                continue  # the step's range (its glue is the cpu's OTHER_HOST row), the host waiting for kernels
            else:
                kind, ms = ("kernel" if not gpu and ev.name in self.labels else "host"), ev.self_cpu_time_total / 1e3
            row = rows.setdefault((ev.name, kind), {"name": ev.name, "kind": kind, "calls": 0, "self_ms": 0.0})
            row["calls"] += 1
            row["self_ms"] += ms
        if not rows:  # nothing to name a bottleneck from: no record
            raise RuntimeError("torch.profiler recorded no event")
        out = list(rows.values())
        if not gpu:  # kernels run on the calling thread: the rest of the wall time is host work nothing recorded
            covered = sum(r["self_ms"] for r in out)
            out.append({"name": OTHER_HOST, "kind": "host", "calls": None, "self_ms": max(0.0, wall - covered)})
        return ProfileReply(rows=out, wall_ms=wall / n, plain_ms=plain, device=self.backend.device_name(),
                            threads=torch.get_num_threads())


def _labelling_loader(request_build, counter, apis, labels: set):
    """The verifier's RemoteLoader, whose extension functions also open a profiler range named after themselves."""
    import torch

    from musacoder.verifier.build import RemoteLoader

    class Loader(RemoteLoader):
        def _load(self, arguments, kind, api):
            mod = super()._load(arguments, kind, api)
            for name, fn in list(vars(mod).items()) if not isinstance(mod, str) else []:
                if not name.startswith("_") and callable(fn):
                    labels.add(name)
                    setattr(mod, name, _labelled(torch, fn, name))
            return mod

    return Loader(request_build, counter, apis)


def _labelled(torch, fn, name: str):
    def call(*args, **kwargs):
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)

    call.__name__ = name
    return call


if __name__ == "__main__":
    main()
