"""Where a verification's CPU goes: in the caller's process (the pool's threads: admission, static checks,
scheduling, verdicts; they hold the GIL the caller's own Python needs, e.g. a trainer's generate loop) and in the
verifier's processes (judges, compile workers, candidate subjects: they compete with the caller for cores).

The shipped examples of a backend (honest and cheating) are verified by a fresh `LocalPool` per pass: a cold pass
(builds) and warm passes (builds cached). After each pass the pool is closed, so its processes have exited and their
CPU (with that of the subjects they reaped) shows in this process's RUSAGE_CHILDREN.

    python scripts/pool_cpu.py --backend cuda --passes 2 --set 'devices=[0,0,0,0]'
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time

from musacoder.config import VerifyConfig
from musacoder.examples_catalog import load_catalog
from musacoder.pool.local import LocalPool
from musacoder.tasks import builtin_task


def one_pass(cfg, pairs) -> dict:
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    own0, wall0 = time.process_time(), time.perf_counter()
    statuses = []
    with LocalPool(cfg) as pool:
        for _, v in pool.verify_many(pairs):
            statuses.append(v.status.value)
    wall, own = time.perf_counter() - wall0, time.process_time() - own0
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    kids = (kids1.ru_utime - kids0.ru_utime) + (kids1.ru_stime - kids0.ru_stime)
    n = len(pairs)
    return {"n": n, "wall_s": wall, "own_cpu_ms_each": 1000 * own / n, "verifier_cpu_s_each": kids / n,
            "cores_busy": (own + kids) / wall, "ok": statuses.count("ok")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--passes", type=int, default=2, help="1 cold + N-1 warm")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="verifier setting KEY=VALUE")
    ap.add_argument("--timing", action="store_true", help="time candidates (off: correctness and legality only)")
    ap.add_argument("--honest", action="store_true", help="the honest examples only")
    ap.add_argument("--cache", help="build cache to use (default: a new one, so the first pass builds)")
    a = ap.parse_args()
    examples = [e for e in load_catalog(a.backend) if e.honest or not a.honest]
    pairs = [(builtin_task(e.task), e.code) for e in examples]
    with tempfile.TemporaryDirectory() as tmp:
        cache = a.cache or tmp
        cfg = VerifyConfig.from_options({"backend": a.backend, "cache_dir": cache, "timing_enabled": a.timing},
                                        a.sets)
        print(f"{len(pairs)} {a.backend} examples, timing {'on' if a.timing else 'off'}, {a.sets or 'defaults'}")
        print("| pass | wall s | caller's process CPU ms / verification | verifier processes CPU s / verification "
              "| cores busy | ok |\n|---|---:|---:|---:|---:|---:|")
        rows = [one_pass(cfg, pairs) for _ in range(a.passes)]
        for i, r in enumerate(rows):
            print(f"| {'cold' if i == 0 else f'warm {i}'} | {r['wall_s']:.1f} | {r['own_cpu_ms_each']:.1f} | "
                  f"{r['verifier_cpu_s_each']:.2f} | {r['cores_busy']:.1f} | {r['ok']} |")
        if len(rows) > 2:
            warm = rows[1:]
            print(f"warm median: caller {statistics.median(r['own_cpu_ms_each'] for r in warm):.1f} ms, verifier "
                  f"{statistics.median(r['verifier_cpu_s_each'] for r in warm):.2f} s per verification")


if __name__ == "__main__":
    main()
