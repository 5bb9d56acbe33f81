"""What the strict profile's extra trials cost: the shipped honest kernels of a backend verified (timing off) with
each `correctness.*` switch off in turn against everything on, one judge, builds cached by a first pass. Reports the
median correctness-stage seconds per kernel and setting, and the verdicts (which must not change).

    python scripts/trial_cost.py --backend cuda --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from musacoder.config import VerifyConfig
from musacoder.examples_catalog import load_catalog
from musacoder.pool.local import LocalPool
from musacoder.tasks import builtin_task

SETTINGS = {"all on": {}, "no small shape": {"small_shape": False}, "no ragged shape": {"ragged_shape": False},
            "kernelbench profile": None}


def run(backend: str, examples, cache: str, over: dict | None, repeats: int) -> dict[str, tuple[float, str]]:
    cfg = VerifyConfig(backend=backend, cache_dir=cache, timing_enabled=False,
                       **({"profile": "kernelbench"} if over is None else {}))
    for k, v in (over or {}).items():
        setattr(cfg.correctness, k, v)
    pairs = [(builtin_task(e.task), e.code) for e in examples] * repeats
    secs: dict[str, list[float]] = {e.name: [] for e in examples}
    status: dict[str, str] = {}
    with LocalPool(cfg) as pool:
        for i, v in pool.verify_many(pairs):
            e = examples[i % len(examples)]
            secs[e.name].append(v.stage_seconds.get("correctness", float("nan")))
            status[e.name] = f"{v.status.value} {v.trials_passed}/{v.trials_total}"
    return {n: (statistics.median(s), status[n]) for n, s in secs.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit", type=int, default=None, help="the first N honest kernels only")
    a = ap.parse_args()
    examples = [e for e in load_catalog(a.backend) if e.honest][:a.limit]
    with tempfile.TemporaryDirectory() as cache:
        run(a.backend, examples, cache, {}, 1)  # builds, once
        got = {name: run(a.backend, examples, cache, over, a.repeats) for name, over in SETTINGS.items()}
    print("| kernel | " + " | ".join(SETTINGS) + " |\n|---|" + "---:|" * len(SETTINGS))
    for e in examples:
        cells = (f"{got[s][e.name][0]:.2f} s ({got[s][e.name][1]})" for s in SETTINGS)
        print(f"| {e.name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
