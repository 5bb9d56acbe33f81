"""Verifier scaling over the GPUs of one host: the same batch of build-cached candidates verified with 1..N device
workers. Reports throughput, each GPU's busy share (the pool's own busy seconds and NVML's kernel-activity samples),
and whether every candidate got the same verdict at every GPU count.

Candidates are the shipped CUDA examples (honest kernels and exploits, KernelBench level-1/2 tasks at their
KernelBench sizes), repeated: the pool caches builds, never verdicts, so a repeat is a full verification. A first
pass builds everything (cold, all GPUs) and is reported too.

    python scripts/gpu_scaling.py --gpus 1,2 --repeats 8 --out scaling.json --plot scaling.png
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections import Counter

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


def batch(repeats: int):
    examples = load_catalog("cuda")
    return [(builtin_task(e.task), e.path.read_text()) for _ in range(repeats) for e in examples], examples


def run(pool: LocalPool, jobs, n_gpus: int) -> dict:
    before = pool.stats()
    with NvmlSampler(n_gpus) as nv:
        t0 = time.perf_counter()
        verdicts = dict(pool.verify_many(jobs))
        wall = time.perf_counter() - t0
    after = pool.stats()
    each = [a - b for a, b in zip(after["device_busy_s_each"], before["device_busy_s_each"], strict=True)]
    return {"gpus": n_gpus, "jobs": len(jobs), "wall_s": round(wall, 1),
            "per_hour": round(len(jobs) / wall * 3600),
            "pool_busy_each": [round(b / wall, 3) for b in each], "nvml_util_each": nv.means(),
            "compile_busy_s": round(after["compile_busy_s"] - before["compile_busy_s"], 1),
            "statuses": dict(Counter(verdicts[i].status.value for i in range(len(jobs)))),
            "_status": [verdicts[i].status.value for i in range(len(jobs))]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", default="1,2", help="GPU counts to measure, comma-separated")
    ap.add_argument("--repeats", type=int, default=8, help="times each shipped example is in the batch")
    ap.add_argument("--compile-workers", type=int, default=None)
    ap.add_argument("--out", default="scaling.json")
    ap.add_argument("--plot", default=None)
    args = ap.parse_args()
    counts = [int(x) for x in args.gpus.split(",")]
    jobs, examples = batch(args.repeats)
    cache = tempfile.mkdtemp(prefix="mc-scaling-")
    cfg = VerifyConfig(backend="cuda", cache_dir=cache)
    results = {"examples": len(examples), "repeats": args.repeats, "runs": []}
    with LocalPool(cfg, compile_workers=args.compile_workers, devices=max(counts)) as pool:
        results["device"] = pool.wait_ready().get("device")
        results["cold"] = {k: v for k, v in run(pool, jobs[:len(examples)], max(counts)).items() if k != "_status"}
        print("cold", json.dumps(results["cold"]), flush=True)
    for n in counts:
        with LocalPool(VerifyConfig(backend="cuda", cache_dir=cache), compile_workers=args.compile_workers,
                       devices=n) as pool:
            pool.wait_ready()
            run(pool, jobs[:len(examples)], n)  # warm-up: spare subjects booted, reference subjects loaded
            r = run(pool, jobs, n)
        results["runs"].append(r)
        print(n, json.dumps({k: v for k, v in r.items() if k != "_status"}), flush=True)
    base = results["runs"][0]
    results["differ"] = {r["gpus"]: [f"{examples[i % len(examples)].path.name}: {a} vs {b}"
                                     for i, (a, b) in enumerate(zip(base["_status"], r["_status"], strict=True))
                                     if a != b] for r in results["runs"][1:]}
    for r in results["runs"]:
        r["speedup_vs_first"] = round(r["per_hour"] / base["per_hour"], 2)
        r.pop("_status")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps({"differ": results["differ"]}), flush=True)
    if args.plot:
        plot(results, args.plot)


def plot(results: dict, path: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    g = [r["gpus"] for r in runs]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(g, [r["per_hour"] for r in runs], "o-", label="measured")
    ax.plot(g, [runs[0]["per_hour"] * n / runs[0]["gpus"] for n in g], "--", label="linear")
    ax.set(xlabel="GPUs", ylabel="verifications / hour", xticks=g,
           title=f"MooreEval, build-cached, {results['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
