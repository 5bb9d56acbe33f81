"""What the op trace costs per op: small ops called from C++ in a loop, untraced, under the dispatcher tracer
(legality.OpTrace over optrace.cpp) and under the Python dispatch mode it replaces; thread CPU time, best of the
repeats (a loaded machine's preemption and cache misses only ever add).

    python scripts/optrace_overhead.py [--device cuda] [--cache DIR]

Builds the tracer and a tiny loop extension into DIR (default: the verifier's cache) the first time.
"""

import argparse
import os
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

from musacoder.config import default_cache_dir
from musacoder.verifier import legality

LOOP = r"""
#include <torch/extension.h>
#include <time.h>

static double cpu_ns() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

// ns per iteration of one small op (each a single dispatcher call, zeros three: zeros, empty, zero_)
double loop(torch::Tensor x, int64_t n, int64_t which) {
    double t0 = cpu_ns();
    for (int64_t i = 0; i < n; i++) {
        if (which == 0) x.view({-1});
        else if (which == 1) at::empty({4}, x.options());
        else if (which == 2) at::add(x, x);
        else at::zeros({4}, x.options());
    }
    return (cpu_ns() - t0) / n;
}
"""
OPS = ["view", "empty", "add", "zeros (3 ops)"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cache", default=str(default_cache_dir()))
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    os.environ[legality.TRACER_ENV] = legality.ensure_tracer(args.cache)
    build = Path(args.cache) / "optrace_overhead"
    build.mkdir(parents=True, exist_ok=True)
    ext = load_inline("mc_optrace_overhead", LOOP, functions=["loop"], build_directory=str(build),
                      extra_cflags=["-O2"])
    torch.set_num_threads(1)
    x = torch.randn(4, device=args.device)
    ns = ("aten",)

    def best(which, trace=None, calls=args.calls):
        times = []
        for _ in range(args.repeats):
            if trace is None:
                times.append(ext.loop(x, calls, which))
            else:
                with trace():
                    times.append(ext.loop(x, calls, which))
        return min(times)

    def mode():
        return legality._ModeTrace(legality.Counter())

    print(f"{args.device}, torch {torch.__version__}, ns per call (thread CPU time, best of {args.repeats})")
    print(f"{'op':14s} {'untraced':>9s} {'dispatcher':>11s} {'python mode':>12s}")
    with torch.no_grad():
        for which, name in enumerate(OPS):
            off = best(which)
            native = best(which, lambda: legality.OpTrace(ns))
            py = best(which, mode, args.calls // 20)  # some microseconds a call
            print(f"{name:14s} {off:9.0f} {native:8.0f} (+{native - off:.0f}) {py:8.0f} (+{py - off:.0f})")


if __name__ == "__main__":
    main()
