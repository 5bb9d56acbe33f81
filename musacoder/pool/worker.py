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
    mem_gb = float(os.environ.get("MUSACODER_WORKER_MEM_GB", "0"))
    if mem_gb > 0:  # host-memory cap (cpu backend): an allocation bomb fails inside the candidate, not the node
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
        if backend.device_type != "cpu":  # give cached blocks back: baseline and device workers share the GPU
            import gc

            import torch

            gc.collect()
            torch.cuda.empty_cache()
        conn.send_bytes(json.dumps(result, default=str).encode())
        if result.get("fatal"):
            return  # sticky device error or tampered harness: the parent starts a fresh process


if __name__ == "__main__":
    main()
