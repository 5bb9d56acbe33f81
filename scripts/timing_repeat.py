"""The timing stage on its own: honest CUDA kernels of KernelBench problems verified again and again on one pool
(builds warm after the first round), each verdict's repetitions, timing-stage seconds, speedup and its interval.
Run it on two versions of the verifier (PYTHONPATH) to compare their stop rules side by side.

  python scripts/timing_repeat.py --kb-jsonl kernelbench.jsonl --cache /tmp/cache --rounds 8 --out runs/t.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from compare_kernelbench import PAIRS, ROOT  # the problems and their shipped honest kernels

from musacoder.config import VerifyConfig
from musacoder.pool.local import LocalPool
from musacoder.tasks import load_tasks

TASKS = "level1/19_ReLU,level1/1_Square_matrix_multiplication_,level1/23_Softmax,level2/76_Gemm_Add_ReLU"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kb-jsonl", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tasks", default=TASKS, help="comma-separated keys of compare_kernelbench.PAIRS")
    args = ap.parse_args()
    keys = args.tasks.split(",")
    tasks = [t for t in load_tasks(args.kb_jsonl, levels=[1, 2]) if t.key in keys]
    code = {k: (ROOT / PAIRS[k]).read_text() for k in keys}
    cfg = VerifyConfig(backend="cuda", cache_dir=args.cache, profile="kernelbench")
    cfg.timing.baselines = ("eager",)
    rows = []
    with LocalPool(cfg) as pool:
        list(pool.verify_many([(t, code[t.key]) for t in tasks]))
        for r in range(args.rounds):
            for t in tasks:
                t0 = time.perf_counter()
                v = pool.submit(t, code[t.key]).result()
                rows.append({"task": t.key, "round": r, "status": v.status.value, "wall_s": time.perf_counter() - t0,
                             "timing_s": v.stage_seconds.get("timing"), "reps": v.timing_reps,
                             "speedup": v.speedup_eager, "interval": v.details.get("speedup_interval"),
                             "candidate_ms": v.candidate_ms, "eager_ms": v.eager_ms, "stages": v.stage_seconds})
                print(json.dumps(rows[-1]), flush=True)
    summary = {}
    for key in keys:
        mine = [x for x in rows if x["task"] == key and x["speedup"]]
        if not mine:
            continue
        sp = [x["speedup"] for x in mine]
        summary[key] = {"n": len(mine), "reps_median": statistics.median(x["reps"] for x in mine),
                        "timing_s_median": statistics.median(x["timing_s"] for x in mine),
                        "speedup_median": statistics.median(sp),
                        "speedup_spread": (max(sp) - min(sp)) / statistics.median(sp),
                        "interval_width_median": statistics.median(
                            (x["interval"][1] - x["interval"][0]) / x["speedup"] for x in mine if x["interval"])}
        print(key, json.dumps(summary[key]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
