"""Entry point of a worker process: `python -m musacoder.pool.worker --role ROLE --backend NAME --fd N`.

Roles: `compile` (a judge without a device: imports each candidate in a fresh sandboxed subject so its native code
is built into the cache) and `device` (a judge: verifies candidates on one device). Candidate code never runs in a
worker, only in the subjects a judge starts. Messages are typed models (`verifier.protocol`) as JSON over a socket
inherited from the parent (never pickle).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from multiprocessing.connection import Connection
from pathlib import Path


def worker_argv(role: str, backend: str, cache_dir) -> list[str]:
    """This module and its arguments, for `proc.process.WorkerProcess`."""
    return ["musacoder.pool.worker", "--role", role, "--backend", backend, "--cache", str(cache_dir)]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", required=True, choices=["compile", "device"])
    ap.add_argument("--backend", required=True)
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--cache", required=True)
    args = ap.parse_args(argv)
    conn = Connection(args.fd)
    affinity = hasattr(os, "sched_setaffinity")  # Linux
    if affinity and os.environ.get("MUSACODER_WORKER_CPUS"):  # before any thread or child: they all inherit it
        os.sched_setaffinity(0, {int(c) for c in os.environ["MUSACODER_WORKER_CPUS"].split(",")})
    from musacoder.proc.process import adopt_orphans_and_follow_parent

    adopt_orphans_and_follow_parent()
    mem_gb = float(os.environ.get("MUSACODER_WORKER_MEM_GB", "0"))
    if mem_gb > 0:  # host-memory cap, inherited by subjects and compilers: a bomb fails inside, not the node
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (int(mem_gb * 2**30), int(mem_gb * 2**30)))
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    from musacoder.backends import get_backend
    from musacoder.verifier.judge import Judge
    from musacoder.verifier.protocol import EvaluateJob, PrebuildJob, WorkerHello
    from musacoder.verifier.sandbox import hide_process

    backend = get_backend(args.backend)
    if args.role == "device":  # the judge's /proc entry names its buffers: out of a candidate's reach
        hide_process()
    judge = Judge(backend, Path(args.cache), use_device=args.role == "device")
    hello = WorkerHello(pid=os.getpid(), role=args.role, cpus=sorted(os.sched_getaffinity(0)) if affinity else [])
    if args.role != "compile":
        hello.device, hello.versions = backend.device_name(), backend.versions()
    conn.send_bytes(hello.model_dump_json().encode())
    while True:
        try:
            job = json.loads(conn.recv_bytes())
        except (EOFError, OSError):
            judge.close()
            return
        try:
            if args.role == "compile":
                result = judge.prebuild(PrebuildJob.model_validate(job)).model_dump()
            else:
                facts = _profiled(judge.evaluate)(EvaluateJob.model_validate(job))
                reason = _holds_memory(backend)
                if reason:  # the log says why a worker was replaced (each replacement costs a start, ~10 s on a GPU)
                    print(f"recycling after job: {reason}", file=sys.stderr, flush=True)
                facts.recycle = bool(reason)
                result = facts.model_dump()
        except Exception as e:  # a harness bug, not the candidate's doing (its failures are facts)
            result = {"infra_error": infra_error(e)}
        conn.send_bytes(json.dumps(result, default=str).encode())


def infra_error(e: BaseException) -> str:
    """The traceback's tail, then the error's own first line: the verdict's reason is the last line, and a CUDA
    error's message ends in boilerplate (H200: 'verifier error: Compile with `TORCH_USE_CUDA_DSA`...')."""
    import traceback

    lines = str(e).strip().splitlines()
    return ("".join(traceback.format_exception(type(e), e, e.__traceback__))[-2500:]
            + f"\n{type(e).__name__}: {lines[0] if lines else ''}"[:500])


def _profiled(fn):
    """`MUSACODER_PROFILE_DIR` set: each job's judge-side profile (cProfile) is written there, to see what bounds a
    verification (the subject's time shows as waiting on its socket)."""
    where = os.environ.get("MUSACODER_PROFILE_DIR")
    if not where:
        return fn
    Path(where).mkdir(parents=True, exist_ok=True)  # a missing directory must not fail every job

    def run(*args):
        import cProfile
        import time

        with cProfile.Profile() as prof:
            try:
                return fn(*args)
            finally:
                prof.dump_stats(Path(where) / f"judge-{os.getpid()}-{time.monotonic_ns()}.prof")
    return run


GIB = 2**30


def gpu_holds_memory(allocated: int, own: int | None, reserved: int, free: int, total: int) -> str:
    """Recycle a device worker after a job if it still holds GPU memory: over 2 GiB allocated through torch, or
    over 4 GiB of its own that torch does not account for (raw cudaMalloc; the CUDA context is well under that).
    `own` is the process's usage as NVML reports it; without it (NVML missing, or PIDs of another namespace) all
    we can see is free memory, so under a quarter free counts, as if the GPU were the verifier's alone. With it,
    memory held by other processes (an RL trainer sharing the GPU) never recycles the worker."""
    mine = "unknown" if own is None else f"{own / GIB:.1f}"
    seen = f"allocated {allocated / GIB:.1f} GiB, reserved {reserved / GIB:.1f}, own {mine}, " \
        f"free {free / GIB:.1f} of {total / GIB:.1f}"
    if allocated > 2 * GIB:
        return seen
    if own is None:
        return seen if free < total / 4 else ""
    return seen if own - reserved > 4 * GIB else ""


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


def _live_device_tensors(shown: int = 3) -> str:
    """For the log: the largest device tensors still alive in the judge after a job, and what refers to them (a
    tensor the judge forgot to drop; memory that torch's CUDA IPC keeps for a consumer shows no tensor here)."""
    import gc

    import torch

    # type(), not isinstance(): isinstance reads __class__, which raises on a dead weakproxy in gc's list
    live = [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor) and o.device.type != "cpu"]
    live.sort(key=lambda t: t.untyped_storage().nbytes(), reverse=True)
    top = live[:shown]
    del live
    parts = []
    for t in top:
        holders = sorted({type(r).__name__ for r in gc.get_referrers(t) if r is not top})
        parts.append(f"{tuple(t.shape)} {t.dtype} held by {holders}")
    return "; live device tensors: " + (", ".join(parts) if parts else "none (CUDA IPC blocks a consumer holds)")


def _holds_memory(backend) -> str:
    """After a job: why the judge must be replaced ("" if not): GPU memory still held (`gpu_holds_memory`), or host
    RSS over half the worker cap."""
    import gc

    gc.collect()
    if backend.device_type != "cpu":
        allocated, reserved, free, total = backend.memory_state()
        reason = gpu_holds_memory(allocated, _own_gpu_bytes(), reserved, free, total)
        return reason + _live_device_tensors() if reason and allocated > 2 * GIB else reason
    cap = float(os.environ.get("MUSACODER_WORKER_MEM_GB", "0")) * GIB
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return f"host RSS {rss / GIB:.1f} GiB over half the cap {cap / GIB:.1f}" if cap > 0 and rss > cap / 2 else ""


if __name__ == "__main__":
    main()
