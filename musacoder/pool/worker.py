"""Entry point of a worker process: `python -m musacoder.pool.worker --role ROLE --backend NAME --fd N`.

Roles: `compile` (prebuild candidates into the shared build cache; no device), `device` (evaluate candidates),
`baseline` (time references only: candidate code never runs in it). Messages are JSON over a socket inherited from
the parent (never pickle: the parent must not unpickle what candidate-touched code produced).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from multiprocessing.connection import Connection
from pathlib import Path


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", required=True, choices=["compile", "device", "baseline"])
    ap.add_argument("--backend", required=True)
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--cache", required=True)
    args = ap.parse_args(argv)
    conn = Connection(args.fd)
    _adopt_orphans_and_follow_parent()
    mem_gb = float(os.environ.get("MUSACODER_WORKER_MEM_GB", "0"))
    if mem_gb > 0:  # host-memory cap: an allocation (or compiler) bomb fails inside the worker, not the node
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (int(mem_gb * 2**30), int(mem_gb * 2**30)))
    # Candidate output must not reach the parent's terminal through our stdout.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    from musacoder.backends import get_backend
    from musacoder.verifier.evaluate import Worker

    backend = get_backend(args.backend)
    worker = Worker(backend, Path(args.cache))
    hello = {"type": "hello", "pid": os.getpid(), "role": args.role}
    if args.role != "compile":
        hello.update(device=backend.device_name(), versions=backend.versions())
    conn.send_bytes(json.dumps(hello).encode())
    handlers = {"compile": worker.prebuild, "device": worker.evaluate, "baseline": worker.baseline}
    handler = handlers[args.role]
    while True:
        try:
            job = json.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            result = handler(job)
        except Exception as e:  # a harness bug, not the candidate's doing (its errors are caught inside)
            import traceback

            result = {"infra_error": "".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:]}
        spawned = _reap_children()
        if spawned and args.role == "device":
            result["processes_spawned"] = spawned
        if args.role == "device":
            result["worker_pid"] = os.getpid()
        if backend.device_type != "cpu":  # give cached blocks back: baseline and device workers share the GPU
            import gc

            import torch

            gc.collect()
            torch.cuda.empty_cache()
        if args.role == "device" and not result.get("fatal") and _holds_memory(backend):
            result["recycle"] = True  # memory a candidate kept (a global, a static) must not starve the next job
        conn.send_bytes(json.dumps(result, default=str).encode())
        if result.get("fatal"):
            return  # sticky device error or tampered harness: the parent starts a fresh process


def _adopt_orphans_and_follow_parent():
    """Linux: become the reaper of our descendants (a double-forked or setsid'd child of a candidate is still
    found by _reap_children) and die with the pool process (a Ray actor or pool killed hard leaves no workers)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


GIB = 2**30


def gpu_holds_memory(allocated: int, own: int | None, reserved: int, free: int, total: int) -> bool:
    """Recycle a device worker after a job if it still holds GPU memory: over 2 GiB allocated through torch, or
    over 4 GiB of its own that torch does not account for (raw cudaMalloc; the CUDA context is well under that).
    `own` is the process's usage as NVML reports it; without it (NVML missing, or PIDs of another namespace) all
    we can see is free memory, so under a quarter free counts, as if the GPU were the verifier's alone. With it,
    memory held by other processes (an RL trainer sharing the GPU) never recycles the worker."""
    if allocated > 2 * GIB:
        return True
    if own is None:
        return free < total / 4
    return own - reserved > 4 * GIB


def _own_gpu_bytes() -> int | None:
    """This process's GPU memory summed over devices, from NVML; None when NVML cannot tell."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            own, seen = 0, False
            for i in range(pynvml.nvmlDeviceGetCount()):
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i)):
                    if p.pid == os.getpid() and p.usedGpuMemory is not None:
                        own, seen = own + p.usedGpuMemory, True
            return own if seen else None
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no pynvml, no driver support: fall back to free memory
        return None


def _holds_memory(backend) -> bool:
    """After a job: GPU memory still held (`gpu_holds_memory`), or host RSS over half the worker cap."""
    import gc

    gc.collect()
    if backend.device_type != "cpu":
        import torch

        free, total = torch.cuda.mem_get_info()
        return gpu_holds_memory(torch.cuda.memory_allocated(), _own_gpu_bytes(), torch.cuda.memory_reserved(),
                                free, total)
    cap = float(os.environ.get("MUSACODER_WORKER_MEM_GB", "0")) * GIB
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return cap > 0 and rss > cap / 2


def _reap_children() -> int:
    """Kill whatever processes the job left behind (candidate-spawned, or adopted orphans); return how many."""
    import signal

    pids = set()
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    return len(pids)


if __name__ == "__main__":
    main()
