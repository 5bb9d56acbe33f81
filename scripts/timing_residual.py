"""What timing exploits gain against the same kernel written honestly (profile `kernelbench`, eager baseline only):
honest and exploits alternate on one pool; each line gives the quiet gate's median waits after the candidate's and
the reference's replies (verifier/quiet.py). By default `cuda/exploit_45_gpu_busy_after_return.py` and
`exploit_46_gpu_work_queued_after_return.py` against the honest ReLU at KernelBench's size;
`--task level2/76_Gemm_Add_ReLU --sizes batch_size=4,in_features=4096,out_features=1536` times a built-in task (or
one of --kb-jsonl) with its module-level sizes changed.

  python scripts/timing_residual.py --kb-jsonl kernelbench.jsonl --cache /tmp/cache --rounds 3
  python scripts/timing_residual.py --cache /tmp/cache --task level2/76_Gemm_Add_ReLU \
      --sizes batch_size=4,in_features=4096,out_features=1536 \
      --names honest_gemm_add_relu,exploit_49_l2_persisting_window
"""

from __future__ import annotations

import argparse
import dataclasses
import re

from musacoder.config import VerifyConfig
from musacoder.examples_catalog import EXAMPLES_DIR
from musacoder.pool.local import LocalPool
from musacoder.tasks import builtin_task, load_tasks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kb-jsonl", help="KernelBench tasks; without it, the built-in ones")
    ap.add_argument("--cache", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--task", default="level1/19_ReLU")
    ap.add_argument("--sizes", default="", help="NAME=VALUE,...: the task's module-level integer sizes changed")
    ap.add_argument("--names", default="honest_relu,exploit_45_gpu_busy_after_return,"
                    "exploit_46_gpu_work_queued_after_return", help="shipped cuda examples, alternating")
    args = ap.parse_args()
    if args.kb_jsonl:
        task = next(t for t in load_tasks(args.kb_jsonl) if t.key == args.task)
    else:
        task = builtin_task(args.task)
    for kv in filter(None, args.sizes.split(",")):
        name, value = kv.split("=")
        code, n = re.subn(rf"^{name} = \d+$", f"{name} = {int(value)}", task.code, flags=re.M)
        if n != 1:
            raise SystemExit(f"error: {task.key} has no module-level `{name} = <int>`")
        task = dataclasses.replace(task, code=code)
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
