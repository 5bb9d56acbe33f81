"""Does a persisting L2 window survive the judge's flush, and does the judge's reset undo it from another process?

A "candidate" process runs `cuda/exploit_49_l2_persisting_window.py`'s kernel (which marks its weights persisting)
and times each call with events on its own side (kernel time, no messaging); the parent, as the judge does, writes
its flush buffer (the CUDA backend's `flush_cache`, with or without `cuCtxResetPersistingL2Cache` first) before each
call. Modes alternate call by call:
  hot       no flush: the weights are in L2 (the bound of what a window can give)
  flush     the flush alone: what the judge did before the reset
  reset     reset + flush: what the judge does now

  python scripts/l2_persisting.py --calls 200 --sizes 4,4096,1536
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics


def candidate(conn, sizes):
    import torch

    from musacoder.examples_catalog import EXAMPLES_DIR

    scope: dict = {}
    exec((EXAMPLES_DIR / "cuda" / "exploit_49_l2_persisting_window.py").read_text(), scope)
    n, k, m = sizes
    x, w, b = (torch.randn(n, k, device="cuda"), torch.randn(m, k, device="cuda"), torch.randn(m, device="cuda"))
    ext = scope["l2_persist_ext"]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    conn.send("ready")
    while conn.recv() == "go":
        start.record()
        ext.gemm_add_relu(x, w, b)
        end.record()
        torch.cuda.synchronize()
        conn.send(start.elapsed_time(end) * 1e3)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200, help="calls a mode")
    ap.add_argument("--sizes", default="4,4096,1536", help="batch, in_features, out_features (weights in fp32)")
    args = ap.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))

    import ctypes

    import torch

    from musacoder.backends.cuda import CudaBackend, _reset_persisting_l2

    torch.cuda.init()
    cu, v = ctypes.CDLL("libcuda.so.1"), ctypes.c_int()
    for attr, what in ((108, "max persisting L2"), (109, "max access-policy window"), (38, "L2")):
        cu.cuDeviceGetAttribute(ctypes.byref(v), attr, 0)
        print(f"{what}: {v.value / 2**20:.1f} MiB")
    print(f"weights: {sizes[1] * sizes[2] * 4 / 2**20:.1f} MiB")
    backend, reset = CudaBackend(), _reset_persisting_l2()
    backend.flush_cache()  # allocates its buffer
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=candidate, args=(there, sizes))
    proc.start()
    assert here.recv() == "ready"
    times: dict[str, list[float]] = {"hot": [], "flush": [], "reset": []}
    for i in range(args.calls * len(times) + 30):
        mode = list(times)[i % len(times)]
        if mode == "flush":
            backend._flush_buf.zero_()
        elif mode == "reset":
            backend.flush_cache()
        torch.cuda.synchronize()
        here.send("go")
        us = here.recv()
        if i >= 30:  # warm-up
            times[mode].append(us)
    here.send("stop")
    proc.join()
    print("reset returned", reset() if reset else "(no driver entry point)")
    for mode, ts in times.items():
        ts.sort()
        print(f"{mode:6s} kernel median {statistics.median(ts):8.2f} us  p10 {ts[len(ts) // 10]:8.2f}  "
              f"p90 {ts[9 * len(ts) // 10]:8.2f}  (n={len(ts)})")


if __name__ == "__main__":
    main()
