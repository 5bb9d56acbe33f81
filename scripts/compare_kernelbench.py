"""Side-by-side benchmark: musacoder's verifier and KernelBench's own harness on the same honest kernels, same GPU.

KernelBench (ScalingIntelligence/KernelBench) is not part of this project: fetch it yourself and pass its `src`
folder. Its `kernelbench/__init__` imports generation clients (openai, litellm, dotenv); where they are not installed,
put stub modules on `--shims`. Each side runs in this process, one after the other (ours first, then the pool is shut
down so its workers give the GPU memory back before KernelBench runs in this process, as its own scripts do).

What is measured, per task (KernelBench problem) and honest candidate:
  ours   cold: fresh cache dir, all tasks submitted at once (builds in parallel + baselines + verification), then
         built: build cache warm, baseline cache cleared (what a new task costs), then
         warm: everything cached (steady state in RL, where each task is verified many times)
  kb     build: `build_compile_cache` (its pre-compile step) in parallel processes, then
         eval: static checker + `eval_kernel_against_ref` (5 correctness trials, 100 perf trials, cuda events,
         compiles cached) — the way its eval_from_generations.py runs
Speedups: ours is eager median / candidate median (profile `kernelbench`: task inputs and shape only); KernelBench's
is ref_runtime / runtime (means). Repeat spread: one task verified --repeats times with the baseline re-timed each
time; spread = (max - min) / median of the speedups.

  python scripts/compare_kernelbench.py --kb-src .kbsrc/src --shims .kbsrc/shims \
      --kb-jsonl ../shared/kernelbench/kernelbench.jsonl --out runs/kb --side both
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAIRS = {  # KernelBench problem -> shipped honest CUDA candidate (the kernels handle general sizes)
    "level1/19_ReLU": "musacoder/examples/cuda/honest_relu.py",
    "level1/1_Square_matrix_multiplication_": "musacoder/examples/cuda/honest_matmul.py",
    "level1/23_Softmax": "musacoder/examples/cuda/honest_softmax.py",
    "level1/100_HingeLoss": "musacoder/examples/cuda/honest_hinge_loss.py",
    "level1/94_MSELoss": "musacoder/examples/cuda/honest_mse_loss.py",
    "level2/76_Gemm_Add_ReLU": "musacoder/examples/cuda/honest_gemm_add_relu.py",
}


def log(*a):
    print(*a, flush=True)


def run_ours(tasks, cands, args) -> dict:
    from musacoder.config import VerifyConfig
    from musacoder.pool.local import LocalPool

    cache = Path(tempfile.mkdtemp(prefix="mc-bench-"))
    cfg = VerifyConfig(backend="cuda", profile="kernelbench", cache_dir=cache)
    t = time.perf_counter()
    pool = LocalPool(cfg)
    pool.wait_ready()
    out = {"pool_start_s": time.perf_counter() - t, "tasks": {}}
    log(f"[ours] pool up in {out['pool_start_s']:.1f}s")
    t = time.perf_counter()  # cold: everything submitted at once, so the compile workers build in parallel
    cold = dict(pool.verify_many([(tk, cands[tk.key]) for tk in tasks]))
    out["cold_batch_wall_s"] = time.perf_counter() - t
    for i, task in enumerate(tasks):
        v = cold[i]
        out["tasks"].setdefault(task.key, {})["cold"] = {"wall_s": v.stage_seconds.get("total"),
                                                         "status": v.status.value, "stages": v.stage_seconds}
        log(f"[ours] cold  {task.key:45s} {v.status.value:10s} {v.stage_seconds} {v.reason[:300]}")
    for phase in ("built", "warm"):
        if phase == "built":
            pool.cache.clear("baseline")
        for task in tasks:
            t = time.perf_counter()
            v = pool.submit(task, cands[task.key]).result()
            wall = time.perf_counter() - t
            rec = out["tasks"].setdefault(task.key, {})
            rec[phase] = {"wall_s": wall, "status": v.status.value, "reason": v.reason, "speedup": v.speedup_eager,
                          "speedup_compile": v.speedup_compile, "candidate_ms": v.candidate_ms,
                          "eager_ms": v.eager_ms, "stages": v.stage_seconds, "rse": v.timing_rse,
                          "reps": v.timing_reps, "floor_ms": v.details.get("timer_floor_ms"),
                          "reference_self_ms": v.details.get("reference_self_ms")}
            log(f"[ours] {phase:5s} {task.key:45s} {v.status.value:10s} {wall:7.2f}s  speedup "
                f"{v.speedup_eager if v.speedup_eager is None else round(v.speedup_eager, 3)} {v.stage_seconds} "
                f"{v.reason[:300]}")
    rep_task = next(t for t in tasks if t.key == args.repeat_task)
    for mode in ("baseline cached", "baseline re-timed"):
        speeds = []
        for _ in range(args.repeats):
            if mode == "baseline re-timed":
                pool.cache.clear("baseline")
            speeds.append(pool.submit(rep_task, cands[rep_task.key]).result().speedup_eager)
        out.setdefault("repeats", []).append(
            {"task": rep_task.key, "mode": mode, "speedups": speeds,
             "spread": (max(speeds) - min(speeds)) / statistics.median(speeds) if all(speeds) else None})
        log(f"[ours] repeats {rep_task.key} ({mode}): {speeds}")
    t = time.perf_counter()
    got = dict(pool.verify_many([(tk, cands[tk.key]) for tk in tasks]))
    out["batch_warm"] = {"n": len(got), "wall_s": time.perf_counter() - t}
    pool.close()
    shutil.rmtree(cache, ignore_errors=True)
    return out


def _kb_build(job) -> dict:
    src, shims, code, bdir = job
    sys.path[:0] = [src] + ([shims] if shims else [])
    from kernelbench import eval as kbe

    t = time.perf_counter()
    ok, _, err = kbe.build_compile_cache(code, False, bdir)
    return {"wall_s": time.perf_counter() - t, "ok": ok, "error": err}


def run_kb(tasks, cands, args, save=lambda out: None) -> dict:
    sys.path[:0] = [args.kb_src] + ([args.shims] if args.shims else [])
    import torch
    from kernelbench import eval as kbe
    from kernelbench.kernel_static_checker import validate_kernel_static

    out = {"tasks": {}}
    build_root = Path(tempfile.mkdtemp(prefix="kb-build-"))
    bdirs = {t.key: str(build_root / t.key.replace("/", "_")) for t in tasks}
    t = time.perf_counter()  # its pre-compile step, in parallel processes as eval_from_generations.py does
    with ProcessPoolExecutor(max_workers=len(tasks), mp_context=mp.get_context("spawn")) as ex:
        builds = dict(zip(bdirs, ex.map(_kb_build, [(args.kb_src, args.shims, cands[k], d) for k, d in bdirs.items()])))
    out["build_batch_wall_s"] = time.perf_counter() - t
    for task in tasks:
        rec = out["tasks"].setdefault(task.key, {})
        bdir = bdirs[task.key]
        rec["build"] = builds[task.key]
        try:
            t = time.perf_counter()
            static_ok, errors, _ = validate_kernel_static(cands[task.key], backend="cuda", precision="fp32")
            res = kbe.eval_kernel_against_ref(task.code, cands[task.key], seed_num=42, num_correct_trials=5,
                                              num_perf_trials=100, measure_performance=True, build_dir=bdir,
                                              device=torch.device("cuda:0"), backend="cuda")
            wall = time.perf_counter() - t
            rec["eval"] = {"wall_s": wall, "static_ok": static_ok, "static_errors": errors,
                           "compiled": res.compiled, "correctness": res.correctness, "runtime_ms": res.runtime,
                           "ref_runtime_ms": res.ref_runtime,
                           "speedup": (res.ref_runtime / res.runtime
                                       if res.runtime > 0 and res.ref_runtime > 0 else None)}
            log(f"[kb]   eval  {task.key:45s} correct={res.correctness} static_ok={static_ok} {wall:7.2f}s "
                f"speedup {rec['eval']['speedup']}")
        except Exception as e:  # one failing task never stops the run
            rec["error"] = f"{type(e).__name__}: {e}"[:2000]
            log(f"[kb]   {task.key}: {rec['error'][:300]}")
        torch.cuda.empty_cache()
        save(out)  # each task as it ends: a run cut by a time limit keeps what it measured
    return out


def summary(ours: dict, kb: dict) -> str:
    rows = ["| task | ours verdict | KB correct | ours s/eval warm | ours built | ours cold | KB s/eval (cached build) "
            "| KB build s | ratio KB/ours (warm) | ours speedup | KB speedup | diff % |", "|" + "---|" * 12]
    ratios, diffs = [], []
    for key in PAIRS:
        o, k = ours.get("tasks", {}).get(key), kb.get("tasks", {}).get(key)
        if not o and not k:
            continue
        ow, ke = (o or {}).get("warm", {}), (k or {}).get("eval", {})
        ratio = ke["wall_s"] / ow["wall_s"] if ow.get("wall_s") and ke.get("wall_s") else None
        diff = (100 * (ow["speedup"] - ke["speedup"]) / ke["speedup"]
                if ow.get("speedup") and ke.get("speedup") else None)
        ratios += [ratio] if ratio else []
        diffs += [abs(diff)] if diff is not None else []
        f = lambda x, s=".2f": "-" if x is None else format(x, s)  # noqa: E731
        rows.append(f"| {key} | {ow.get('status', '-')} | {ke.get('correctness', (k or {}).get('error', '-'))} | "
                    f"{f(ow.get('wall_s'))} | {f((o or {}).get('built', {}).get('wall_s'))} | "
                    f"{f((o or {}).get('cold', {}).get('wall_s'))} | {f(ke.get('wall_s'))} | "
                    f"{f((k or {}).get('build', {}).get('wall_s'))} | {f(ratio, '.1f')} | "
                    f"{f(ow.get('speedup'), '.3f')} | "
                    f"{f(ke.get('speedup'), '.3f')} | {f(diff, '+.1f')} |")
    lines = rows
    if ratios:
        lines.append(f"\nmedian wall-time ratio KB/ours (warm): {statistics.median(ratios):.1f}x; "
                     f"max |speedup difference|: {max(diffs) if diffs else float('nan'):.1f}%")
    for rep in ours.get("repeats", []):
        runs = ", ".join("-" if s is None else f"{s:.3f}" for s in rep["speedups"])
        lines.append(f"repeat spread of one speedup ({rep['task']}, {len(rep['speedups'])} runs, {rep['mode']}): "
                     f"{100 * (rep['spread'] or 0):.2f}% ({runs})")
    if ours.get("batch_warm"):
        b = ours["batch_warm"]
        lines.append(f"verify_many of all {b['n']} (warm): {b['wall_s']:.2f}s; pool start {ours['pool_start_s']:.1f}s")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kb-src", default=".kbsrc/src")
    ap.add_argument("--shims", default=None)
    ap.add_argument("--kb-jsonl", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--side", choices=["both", "ours", "kb", "summary"], default="both")
    ap.add_argument("--tasks", default=None, help="comma-separated keys (default: all pairs)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--repeat-task", default="level1/1_Square_matrix_multiplication_")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from musacoder.tasks import load_tasks

    keys = args.tasks.split(",") if args.tasks else list(PAIRS)
    tasks = [t for t in load_tasks(args.kb_jsonl, levels=[1, 2]) if t.key in keys]
    cands = {k: (ROOT / PAIRS[k]).read_text() for k in keys}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.side in ("both", "ours"):
        (out / "ours.json").write_text(json.dumps(run_ours(tasks, cands, args), indent=1, default=str))
    if args.side in ("both", "kb"):
        save = lambda res: (out / "kb.json").write_text(json.dumps(res, indent=1, default=str))  # noqa: E731
        save(run_kb(tasks, cands, args, save))
    load = lambda n: json.loads((out / n).read_text()) if (out / n).exists() else {}  # noqa: E731
    text = summary(load("ours.json"), load("kb.json"))
    (out / "summary.md").write_text(text + "\n")
    log(text)


if __name__ == "__main__":
    main()
