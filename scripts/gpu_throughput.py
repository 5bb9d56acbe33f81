"""Verifier throughput on one GPU: verifications per GPU-hour and the GPU tier's busy fraction, cold (every
candidate compiled) and cache-warm, for several compile-tier sizes.

Candidates are the shipped honest CUDA kernels for the shipped KernelBench level-1/2 tasks. A cold run needs
sources nobody built yet, so each run salts the CUDA source with a comment (`// variant RUN-K`): a new build key,
a real nvcc build, the same kernel. Baselines (eager only here) are cached after the first run, as in a long job.

    python scripts/gpu_throughput.py --workers 14,4 --variants 2 --out results.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter

from musacoder.config import VerifyConfig
from musacoder.examples_catalog import load_catalog
from musacoder.pool.local import LocalPool
from musacoder.tasks import builtin_task


def jobs(salt: str, variants: int):
    out = []
    for e in load_catalog("cuda"):
        if not e.honest:
            continue
        src = e.code
        for k in range(variants):
            out.append((builtin_task(e.task), src.replace("#include <torch/extension.h>",
                                                          f"#include <torch/extension.h>\n// variant {salt}-{k}", 1)))
    return out


def run(pool: LocalPool, batch) -> dict:
    before = pool.stats()
    t0 = time.perf_counter()
    verdicts = [v for _, v in pool.verify_many(batch)]
    wall = time.perf_counter() - t0
    after = pool.stats()
    busy = {k: after[f"{k}_busy_s"] - before[f"{k}_busy_s"] for k in ("compile", "device")}
    device_compile = sum(v.stage_seconds.get("import", 0.0) for v in verdicts)
    return {"jobs": len(batch), "wall_s": round(wall, 1), "per_gpu_hour": round(len(batch) / wall * 3600),
            "gpu_busy": round(busy["device"] / wall, 3),
            "compile_busy": round(busy["compile"] / (wall * pool.n_compile), 3),
            "statuses": dict(Counter(v.status.value for v in verdicts)),
            "device_import_s": round(device_compile, 1),
            "median_compile_s": sorted(v.stage_seconds.get("compile", 0) for v in verdicts)[len(verdicts) // 2]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", default="14,4", help="compile-tier sizes to measure, comma-separated")
    ap.add_argument("--variants", type=int, default=2)
    ap.add_argument("--out", default="throughput.json")
    args = ap.parse_args()
    cache = tempfile.mkdtemp(prefix="mc-throughput-")
    results = []
    for n in [int(x) for x in args.workers.split(",")]:
        cfg = VerifyConfig(backend="cuda", cache_dir=cache)
        cfg.timing.baselines = ("eager",)
        with LocalPool(cfg, compile_workers=n) as pool:
            hello = pool.wait_ready()
            batch = jobs(f"w{n}", args.variants)
            cold = run(pool, batch)
            warm = run(pool, batch)
        results.append({"compile_workers": n, "cold": cold, "warm": warm, "device": hello.device})
        print(json.dumps(results[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
