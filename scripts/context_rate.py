"""How fast device contexts come up: a process that has imported torch (as the verifier's fork server has) forks N
children at once, each creating its CUDA context and running one kernel; per N: wall, median and slowest child,
contexts per second. Each verification starts one candidate process, so this bounds a GPU's verifications/s.

    python scripts/context_rate.py 0        # GPU 0;  "0,1,2,3": children spread over four GPUs
    python scripts/context_rate.py 0,1,2,3 --one-visible   # each child sees only its GPU, as a judge's candidates do

Without --one-visible every child sees all the host's GPUs (the figures of 2026-11-27 in docs/benchmarks.md).
"""

import json
import os
import statistics
import sys
import time

import torch


def main():
    args = [a for a in sys.argv[1:] if a != "--one-visible"]
    one_visible = "--one-visible" in sys.argv
    devices = [int(x) for x in args[0].split(",")] if args else [0]
    out = {}
    for n in (1, 2, 4, 8, 16, 32):
        r, w = os.pipe()
        t0 = time.perf_counter()
        pids = []
        for i in range(n):
            pid = os.fork()
            if pid == 0:  # the child: its own context, one kernel, its time on the pipe
                os.close(r)
                t = time.perf_counter()
                if one_visible:  # read at the first CUDA call: the parent has not made one
                    os.environ["CUDA_VISIBLE_DEVICES"] = str(devices[i % len(devices)])
                torch.cuda.set_device(0 if one_visible else devices[i % len(devices)])
                torch.zeros(1, device="cuda").add_(1)
                torch.cuda.synchronize()
                os.write(w, f"{time.perf_counter() - t:.4f}\n".encode())
                os._exit(0)
            pids.append(pid)
        os.close(w)
        for pid in pids:
            os.waitpid(pid, 0)
        wall = time.perf_counter() - t0
        times = [float(x) for x in os.fdopen(r).read().split()]
        out[n] = {"wall_s": round(wall, 3), "median_s": round(statistics.median(times), 3),
                  "max_s": round(max(times), 3), "per_s": round(n / wall, 2)}
        print(n, out[n], flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
