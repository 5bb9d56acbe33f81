"""Where a timed block's time goes, on one GPU: the same kernels timed four ways.

1. do_bench (events, L2 cleared before each call, median): the ground truth of `musacoder calibrate`;
2. in this process, the timing window's method without processes: L2 flushed, then K back-to-back calls on K
   distinct input sets and one synchronisation, on the host clock (per call = block / K);
3. the same under the op tracer (what each subject runs its calls under);
4. the verifier (timing.method judge), with the details that split a block's time (floor, the subject's own clock,
   read-back, calls a block), with default spares and with one.

    python scripts/timing_probe.py --cache /tmp/cc [--sizes 1024,8192]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from musacoder.backends import get_backend
from musacoder.bench.calibrate import CASES, kernel_path
from musacoder.verifier import legality
from musacoder.verifier.build import Builder, LaunchCounter, RemoteLoader
from musacoder.verifier.inputs import load_module


def block_ms(model, sets, backend, trace: bool) -> float:
    times = []
    for _ in range(7):
        backend.flush_cache()
        backend.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad(), (legality.OpTrace(backend.torch_namespaces) if trace else torch.no_grad()):
            outs = [model(*s) for s in sets]
        backend.synchronize()
        times.append((time.perf_counter() - t0) * 1e3 / len(sets))
        del outs
    return statistics.median(times[2:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", required=True)
    ap.add_argument("--batches", default="64,1024,8192")
    ap.add_argument("--verify", action="store_true")
    args = ap.parse_args()
    from triton.testing import do_bench

    backend = get_backend("cuda")
    builder = Builder(__import__("pathlib").Path(args.cache), backend)
    RemoteLoader(lambda a: builder.build(dict(a)), LaunchCounter(), backend.extension_apis).install()
    case = CASES[0]
    dev = backend.device()
    for b in map(int, args.batches.split(",")):
        sizes = {"batch_size": b, "dim": 16384}
        task = load_module(case.task_code(sizes), f"t{b}", args.cache)
        cand = load_module(kernel_path(case, "cuda").read_text(), f"c{b}", args.cache)
        ref, new = task.Model(2.0, -0.5).to(dev), cand.ModelNew(2.0, -0.5).to(dev)
        x = task.get_inputs()[0].to(dev)
        row = {}
        with torch.no_grad():
            for name, m in (("ref", ref), ("cand", new)):
                row[f"{name} do_bench"] = do_bench(lambda m=m, x=x: m(x), warmup=25, rep=200, return_mode="median")
                for k in (1, 4, 16):
                    n = max(1, min(k, int(4e9 // (2 * x.numel() * 4))))
                    sets = [(torch.randn_like(x),) for _ in range(n)]
                    row[f"{name} block{n}"] = block_ms(m, sets, backend, False)
                    row[f"{name} block{n} traced"] = block_ms(m, sets, backend, True)
        print(b, {k: round(v, 4) for k, v in row.items()}, flush=True)
        if args.verify:
            from musacoder.config import VerifyConfig
            from musacoder.pool.local import LocalPool
            from musacoder.tasks.model import Task

            for spares in (0, 1):
                cfg = VerifyConfig(backend="cuda", profile="kernelbench", cache_dir=args.cache, spares=spares)
                cfg.timing.baselines = ("eager",)
                with LocalPool(cfg) as pool:
                    t = Task(name=f"probe{b}", code=case.task_code(sizes))
                    for _ in range(2):
                        v = pool.submit(t, kernel_path(case, "cuda").read_text()).result()
                    d = v.details
                    print(b, f"spares={spares}", v.status.value, round(v.eager_ms, 4), round(v.candidate_ms, 4),
                          round(v.speedup_eager, 3), {k: d.get(k) for k in ("calls_per_block", "timer_floor_ms",
                                                                           "reference_self_ms", "outside_ms",
                                                                           "quiet_wait_ms")},
                          {k: s for k, s in v.stage_seconds.items() if k.startswith("timing")}, flush=True)


if __name__ == "__main__":
    main()
