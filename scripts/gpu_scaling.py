"""Verifier scaling over the GPUs of one host: the same batch of build-cached candidates verified with several
layouts of device workers (judges): GPUs x judges per GPU, judges sharing a GPU timing one at a time or not.
Reports throughput, each judge's busy share (the pool's own busy seconds) and each GPU's NVML kernel activity,
whether every candidate got the same verdict in every layout, and how far each candidate's speedup moved from
the first layout's (the truth cost of sharing a GPU).

Layouts: GPUSxJUDGES per GPU, with suffixes: `-shared-timing` (judges sharing a GPU time side by side), `-spawn`
(candidate processes started from scratch instead of forked from the judge's pre-imported server) and `-sparesN`
(N candidate processes kept ready per judge, `verify.spares`). Besides
throughput: the host's busy cores during the run (how many cores keep N GPUs busy) and the mean seconds per
verification of each judge stage (`subject_wait`: waiting for a candidate process to start), and the five candidates
whose device stage took longest (median over repeats: what judges idle at a batch's end wait for).

Candidates are the shipped CUDA examples (honest kernels and exploits, KernelBench level-1/2 tasks at their
KernelBench sizes), repeated: the pool caches builds, never verdicts, so a repeat is a full verification; or the
`ok` solutions of a `musacoder synth solve` run (`--solutions`, with the tasks file it solved), or every verified
answer of a `musacoder bench run` (`--bench`: a model's honest and failing answers mixed, each expected to get the
status the run gave it). A first pass builds everything (cold, the last layout) and is reported too.

    python scripts/gpu_scaling.py --layouts 1x2,2x2,4x2,4x4,4x4-spawn --repeats 12 --out scaling.json --plot s.png
    python scripts/gpu_scaling.py --backend triton --solutions triton/solutions.jsonl --tasks clean/tasks.jsonl \
        --limit 16 --repeats 1 --layouts 1x1,1x4,1x4-shared-timing,2x4
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import threading
import time
from collections import Counter, defaultdict

import psutil

from musacoder.config import VerifyConfig
from musacoder.examples_catalog import load_catalog
from musacoder.pool.local import LocalPool
from musacoder.tasks import builtin_task


class NvmlSampler:
    """Mean GPU utilisation (share of time a kernel ran) per device while the block runs; {} without NVML."""

    def __init__(self, n: int, period: float = 0.1):
        self.n, self.period, self.samples = n, period, [[] for _ in range(n)]
        self._stop = threading.Event()

    def __enter__(self):
        try:
            import pynvml
            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.n)]
            self._util = pynvml.nvmlDeviceGetUtilizationRates
            threading.Thread(target=self._loop, daemon=True).start()
        except Exception:  # no NVML: the pool's busy seconds still tell
            self._handles = []
        return self

    def _loop(self):
        while not self._stop.wait(self.period):
            for i, h in enumerate(self._handles):
                self.samples[i].append(self._util(h).gpu)

    def __exit__(self, *exc):
        self._stop.set()

    def means(self) -> list[float]:
        return [round(sum(s) / len(s) / 100, 3) for s in self.samples if s]


def batch(args):
    """-> (jobs, names, accepted): the batch, a name per distinct candidate (jobs repeat them in order), and the
    statuses each may get (the catalog's; `ok` for synthesized solutions, all verified `ok` once; a bench run's own)."""
    if args.bench:
        from musacoder.bench.store import Store
        from musacoder.tasks.loaders import load_tasks

        tasks = {t.key: t for t in load_tasks(args.tasks)}
        store = Store(f"{args.bench}/samples.sqlite")
        rows = [r for r in store.rows() if r.code and r.verified and r.task in tasks][:args.limit or None]
        store.close()
        distinct = [(tasks[r.task], r.code) for r in rows]
        names, accepted = [f"{r.task}#{r.sample}" for r in rows], [(r.status,) for r in rows]
    elif args.solutions:
        from musacoder.tasks.loaders import load_tasks

        tasks = {t.key: t for t in load_tasks(args.tasks)}
        rows = [json.loads(line) for line in open(args.solutions)]
        rows = [r for r in rows if r.get("status") == "ok" and r["task"] in tasks][:args.limit or None]
        distinct = [(tasks[r["task"]], r["code"]) for r in rows]
        names, accepted = [r["task"] for r in rows], [("ok",)] * len(rows)
    else:
        examples = load_catalog(args.backend)[:args.limit or None]
        distinct = [(builtin_task(e.task), e.code) for e in examples]
        names, accepted = [e.path.name for e in examples], [e.accepted for e in examples]
    return [j for _ in range(args.repeats) for j in distinct], names, accepted


def layout(spec: str) -> tuple[list[int], set[str], int]:
    """'2x4' -> four judges on each of GPUs 0 and 1; '1x4-shared-timing-spawn-spares2' -> ([0,0,0,0], the two
    flags, two spares a judge)."""
    size, *flags = spec.replace("shared-timing", "shared_timing").split("-")
    gpus, judges = (int(x) for x in size.split("x"))
    spares = [int(f[6:]) for f in flags if f.startswith("spares") and f[6:].isdigit()]
    if set(flags) - {"shared_timing", "spawn"} - {f"spares{n}" for n in spares}:
        raise SystemExit(f"error: unknown layout flag in {spec!r} (known: -shared-timing, -spawn, -sparesN)")
    return [g for g in range(gpus) for _ in range(judges)], set(flags), (spares or [0])[0]


def pool_for(args, cache: str, spec: str) -> LocalPool:
    devices, flags, spares = layout(spec)
    cfg = VerifyConfig(backend=args.backend, cache_dir=cache, devices=tuple(devices),
                       fork_subjects="spawn" not in flags, spares=spares, timing_enabled=not args.no_timing)
    cfg.timing.exclusive = "shared_timing" not in flags
    return LocalPool(cfg, compile_workers=args.compile_workers)


def busy_cores() -> float:
    """CPU seconds the host has spent working (all processes), to divide by a wall time."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def run(pool: LocalPool, jobs, spec: str) -> dict:
    n_gpus = max(pool._on) + 1
    before = pool.stats()
    with NvmlSampler(n_gpus) as nv:
        t0, cpu0 = time.perf_counter(), busy_cores()
        verdicts = dict(pool.verify_many(jobs))
        wall, cpu = time.perf_counter() - t0, busy_cores() - cpu0
    after = pool.stats()
    each = [a - b for a, b in zip(after["device_busy_s_each"], before["device_busy_s_each"], strict=True)]
    vs = [verdicts[i] for i in range(len(jobs))]
    return {"layout": spec, "gpus": n_gpus, "judges": len(pool._on), "jobs": len(jobs), "wall_s": round(wall, 1),
            "per_hour": round(len(jobs) / wall * 3600),
            "judge_busy_each": [round(b / wall, 3) for b in each], "nvml_util_each": nv.means(),
            "host_busy_cores": round(cpu / wall, 1),
            "compile_busy_s": round(after["compile_busy_s"] - before["compile_busy_s"], 1),
            "stage_mean_s": {k: round(sum(v.stage_seconds.get(k, 0) for v in vs) / len(vs), 3)
                             for k in sorted({k for v in vs for k in v.stage_seconds})},
            "timing_wait_s": round(sum(v.stage_seconds.get("timing_wait", 0) for v in vs), 1),
            "lock_timeouts": sum("lock_timeout" in v.stage_seconds for v in vs),
            "statuses": dict(Counter(v.status.value for v in vs)),
            "infra_errors": sorted({v.reason[:300] for v in vs if v.status.value == "infra_error"}),
            "_status": [v.status.value for v in vs], "_reason": [v.reason[:300] for v in vs],
            "_speedup": [v.speedup_eager for v in vs], "_device": [v.stage_seconds.get("device", 0.0) for v in vs]}


def drift(base: list, other: list) -> dict:
    """How far speedups moved against the first layout's, candidate by candidate: |log ratio| as a factor."""
    d = sorted(abs(math.log(b / a)) for a, b in zip(base, other) if a and b)
    if not d:
        return {}
    return {"n": len(d), "median_factor": round(math.exp(statistics.median(d)), 3),
            "p90_factor": round(math.exp(d[int(0.9 * (len(d) - 1))]), 3), "max_factor": round(math.exp(d[-1]), 3)}


def judged(r: dict, base: dict, names: list, accepted: list):
    """Add to a layout's result what it says of the verdicts: those that differ from the first layout's, those the
    candidate may not get, and how far its speedups moved against the first layout's."""
    r["speedup_vs_first"] = round(r["per_hour"] / base["per_hour"], 2)
    r["differ"] = [f"{names[i % len(names)]}: {a} vs {b} ({why})"
                   for i, (a, b, why) in enumerate(zip(base["_status"], r["_status"], r["_reason"], strict=True))
                   if a != b]
    r["speedup_drift_vs_first"] = drift(base["_speedup"], r["_speedup"])
    by_name = defaultdict(list)  # the longest verifications: what judges left idle at a batch's end waited for
    for i, s in enumerate(r["_device"]):
        by_name[names[i % len(names)]].append(s)
    r["slowest_device_s"] = dict(sorted(((n, round(statistics.median(s), 2)) for n, s in by_name.items()),
                                        key=lambda kv: -kv[1])[:5])
    r["unexpected"] = sorted({f"{names[i % len(names)]}: {s} (expected {accepted[i % len(names)]}): {why}"
                              for i, (s, why) in enumerate(zip(r["_status"], r["_reason"], strict=True))
                              if s not in accepted[i % len(names)]})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layouts", default="1x1,2x1",
                    help="GPUSxJUDGES per GPU, comma-separated; suffix -shared-timing: judges time side by side")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--repeats", type=int, default=8, help="times each candidate is in the batch")
    ap.add_argument("--solutions", help="solutions.jsonl of `synth solve` (its ok records) instead of the examples")
    ap.add_argument("--bench", help="a `musacoder bench run` directory: its verified answers (honest and failing, as "
                    "a model wrote them), each expected to get the status the run recorded")
    ap.add_argument("--tasks", help="the tasks file those solutions (or the bench run) used")
    ap.add_argument("--no-timing", action="store_true", help="correctness only (timing_enabled=false)")
    ap.add_argument("--limit", type=int, default=0, help="at most this many distinct candidates")
    ap.add_argument("--compile-workers", type=int, default=None)
    ap.add_argument("--cache", default=None, help="build cache to use (default: a new temporary directory)")
    ap.add_argument("--out", default="scaling.json")
    ap.add_argument("--plot", default=None)
    args = ap.parse_args()
    specs = args.layouts.split(",")
    jobs, names, accepted = batch(args)
    cache = args.cache or tempfile.mkdtemp(prefix="mc-scaling-")
    results = {"candidates": len(names), "repeats": args.repeats, "backend": args.backend, "runs": []}
    biggest = max(specs, key=lambda spec: len(layout(spec)[0]))  # the cold pass: builds go fastest with most judges
    with pool_for(args, cache, biggest) as pool:
        results["device"] = pool.wait_ready().device
        cold = run(pool, jobs[:len(names)], biggest)
        results["cold"] = {k: v for k, v in cold.items() if not k.startswith("_")}
        print("cold", json.dumps(results["cold"]), flush=True)
    for spec in specs:
        with pool_for(args, cache, spec) as pool:
            pool.wait_ready()
            # warm-up: every judge up, its spares booted, every task seen once (the first layout of 2026-11-26 paid
            # 0.1 s a verification loading tasks that later layouts found loaded)
            run(pool, jobs[:max(len(pool._on), len(names))], spec)
            r = run(pool, jobs, spec)
        base = (results["runs"] or [r])[0]
        judged(r, base, names, accepted)
        results["runs"].append(r)
        print(spec, json.dumps({k: v for k, v in r.items() if not k.startswith("_")}), flush=True)
        with open(args.out, "w") as f:  # so far, verdicts checked, should a later layout not finish
            json.dump(results, f, indent=1)
    results["speedups"] = {r["layout"]: r.pop("_speedup") for r in results["runs"]}
    for r in results["runs"]:
        r.pop("_status"), r.pop("_reason"), r.pop("_device")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot)


def plot(results: dict, path: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar([r["layout"] for r in runs], [r["per_hour"] for r in runs])
    ax.set(ylabel="verifications / hour", title=f"MooreEval, build-cached, {results['device']}")
    ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
