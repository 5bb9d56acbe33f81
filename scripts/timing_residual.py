"""What `cuda/exploit_45_gpu_busy_after_return.py` and `exploit_46_gpu_work_queued_after_return.py` gain against the
same ReLU kernel written honestly, at KernelBench's size (profile `kernelbench`, eager baseline only): honest and
exploits alternate on one pool; each line gives the quiet gate's median waits after the candidate's and the
reference's replies (verifier/quiet.py).

  python scripts/timing_residual.py --kb-jsonl kernelbench.jsonl --cache /tmp/cache --rounds 3
"""

from __future__ import annotations

import argparse

from musacoder.config import VerifyConfig
from musacoder.examples_catalog import EXAMPLES_DIR
from musacoder.pool.local import LocalPool
from musacoder.tasks import load_tasks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kb-jsonl", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--names", default="honest_relu,exploit_45_gpu_busy_after_return,"
                    "exploit_46_gpu_work_queued_after_return", help="shipped cuda examples, alternating")
    args = ap.parse_args()
    task = next(t for t in load_tasks(args.kb_jsonl, levels=[1]) if t.key == "level1/19_ReLU")
    cfg = VerifyConfig(backend="cuda", cache_dir=args.cache, profile="kernelbench")
    cfg.timing.baselines = ("eager",)
    with LocalPool(cfg) as pool:
        for name in args.names.split(",") * args.rounds:
            v = pool.submit(task, (EXAMPLES_DIR / "cuda" / f"{name}.py").read_text()).result()
            print(f"{name:40s} {v.status.value} candidate {v.candidate_ms} ms, reference {v.eager_ms} ms, "
                  f"speedup {v.speedup_eager} {v.details.get('speedup_interval')} quiet waits "
                  f"{v.details.get('quiet_wait_ms')} {v.reason[:200]} {v.stage_seconds}", flush=True)


if __name__ == "__main__":
    main()
