"""A subject process: runs one model for the judge. `python -m musacoder.verifier.subject --fd N ...`

The candidate subject is fresh for each candidate and sandboxed: it holds no reference output, no comparison, no
clock that decides speed and no cache; whatever it does dies with it. It maps the judge's input buffers, runs
forward (always under the op tracer, so no call is unwatched), copies the output into the judge's buffers and
synchronises the device before replying. Where the judge's buffers are host shared memory on a device backend
(musa: torch's IPC is CUDA's only, see buffers.py), inputs are staged onto the device before forward and copied back
after it (so in-place changes still reach the judge), outputs are copied to the host. The reference subject runs the
same code on the task's `Model` and never sees candidate code. Messages are `protocol` models as JSON.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from multiprocessing.connection import Connection


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--private", required=True)
    ap.add_argument("--sandbox", action="store_true")
    ap.add_argument("--writable", action="append", default=[], help="another directory the sandbox may write")
    ap.add_argument("--no-device", action="store_true", help="import only (compile tier): never touch the device")
    args = ap.parse_args(argv)
    cpus = os.environ.get("MUSACODER_CPUS")
    if cpus and hasattr(os, "sched_setaffinity"):  # both subjects pinned to the same cores: timings comparable
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    sandbox = "none (trusted subject)"
    from musacoder.verifier.sandbox import hide_process, restrict_writes

    if args.sandbox:  # before any import can start a thread
        # realpath: /proc/self names this process's own entry only once resolved here
        sandbox = restrict_writes(args.private, [os.path.realpath(p) for p in args.writable])
    else:  # the reference maps the judge's buffers: their paths must not be readable in its /proc entry
        hide_process()
    conn = Connection(args.fd)
    from musacoder.pool.worker import adopt_orphans_and_follow_parent

    adopt_orphans_and_follow_parent()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # candidate prints must not reach the judge's pipe
    from musacoder.verifier.protocol import Hello, send

    subject = Subject(conn, args.backend, args.private, not args.no_device)
    send(conn, Hello(pid=os.getpid(), sandbox=sandbox))
    subject.loop()


class Subject:
    def __init__(self, conn, backend_name: str, private: str, use_device: bool):
        from functools import partial

        import torch

        from musacoder.backends import get_backend
        from musacoder.verifier import legality
        from musacoder.verifier.build import LaunchCounter, RemoteLoader
        from musacoder.verifier.protocol import request_build

        self.torch = torch
        if os.environ.get("MUSACODER_THREADS"):
            torch.set_num_threads(int(os.environ["MUSACODER_THREADS"]))
        self.conn = conn
        self.private = private
        self.backend = get_backend(backend_name)
        self.counter = LaunchCounter()
        self.loader = RemoteLoader(partial(request_build, conn), self.counter, self.backend.extension_apis)
        self.loader.install()
        self.backend.install_launch_hook(self.counter)
        self.backend.disable_tf32()
        self.device = self.backend.device() if use_device else None
        if use_device and self.device.type != "cpu":
            torch.empty(1, device=self.device)  # create the context now, while we wait for a job
        self.task = self.cand = None
        self.models: dict = {}
        self.opened: dict = {}
        self.staged: dict = {}  # buffer key -> its device copy (host buffers on a device backend)
        self.legality = legality
        # The first traced call imports and warms up torch's Python dispatch machinery (about a second on a small
        # CPU): do it while this process waits as a spare, not inside the candidate's first correctness trial.
        with torch.no_grad(), legality.OpTrace(self.backend.torch_namespaces):
            torch.ones(2, device=self.device or "cpu").clone().view(2, 1)
        self.snapshot = legality.snapshot()

    # ---- wire ----------------------------------------------------------------------------------------------------
    def loop(self):
        import json

        from musacoder.verifier.protocol import SubjectCommand, SubjectReply, send

        while True:
            try:
                cmd = SubjectCommand.model_validate(json.loads(self.conn.recv_bytes()))
            except (EOFError, OSError):
                return
            if cmd.op == "exit":
                return
            t0 = time.perf_counter()
            try:
                reply = getattr(self, "op_" + cmd.op)(cmd)
            except BaseException as e:  # the model's failure: reported, the judge decides what it means
                reply = SubjectReply(ok=False, error=_tb(e), fatal=self._fatal(e))
            reply.seconds = time.perf_counter() - t0
            send(self.conn, reply)

    def _fatal(self, e) -> bool:
        return self.device is not None and self.backend.is_fatal(e)

    # ---- commands ------------------------------------------------------------------------------------------------
    def op_release(self, cmd):
        """Drop the judge's buffers after a job: while a mapping is open, CUDA IPC keeps the judge's memory allocated
        (and a judge holding GiBs after a job is recycled, ~10 s on a GPU host)."""
        from musacoder.verifier.protocol import SubjectReply

        self.opened.clear()
        self.staged.clear()
        if self.device is not None and self.device.type != "cpu":
            import gc

            gc.collect()  # a cycle holding an opened tensor keeps its mapping
            self.backend.memory_state()  # and the reference's own cache goes back: the next job may need all of it
        return SubjectReply()

    def op_load(self, cmd):
        from musacoder.verifier.build import BuildError
        from musacoder.verifier.inputs import load_module
        from musacoder.verifier.protocol import SubjectReply

        self.task = load_module(cmd.task_code, "task", self.private) if cmd.task_code else None
        self.models.clear()
        self.opened.clear()
        self.staged.clear()
        if not cmd.candidate_code:
            self.cls = self.task.Model
            return SubjectReply()
        try:
            self.cand = load_module(cmd.candidate_code, "cand", self.private)
        except BuildError as e:
            return SubjectReply(ok=False, kind="build", error=str(e)[-20000:], builds=self.loader.records)
        except BaseException as e:
            return SubjectReply(ok=False, kind="import", error=_tb(e), fatal=self._fatal(e),
                                builds=self.loader.records)
        if not hasattr(self.cand, "ModelNew"):
            return SubjectReply(ok=False, kind="format", error="the candidate module defines no ModelNew",
                                builds=self.loader.records)
        self.cls = self.cand.ModelNew
        return SubjectReply(builds=self.loader.records)

    def op_build_model(self, cmd):
        from musacoder.verifier.inputs import DTYPES, Shape, init_inputs
        from musacoder.verifier.protocol import SubjectReply

        torch = self.torch
        init = init_inputs(self.task, Shape(cmd.overrides))
        torch.manual_seed(cmd.weight_seed)
        with torch.device(self.device):
            m = self.cls(*init)
        m = m.to(self.device)
        if cmd.precision != "fp32":
            m = m.to(DTYPES[cmd.precision])
        m = m.eval()
        self.models[cmd.shape_key] = torch.compile(m) if cmd.compiled else m
        return SubjectReply()

    def _open(self, ref):
        from musacoder.verifier.buffers import open_ref

        key = _key(ref)
        if key not in self.opened:
            self.opened[key] = open_ref(ref)
        return key, self.opened[key]

    def _args(self, cmd) -> list:
        """The inputs as forward gets them: the judge's buffers, or their device copies, refreshed from the buffers
        (the judge refills them between runs)."""
        from musacoder.verifier.protocol import TensorRef

        args = []
        for a in cmd.inputs:
            if isinstance(a, dict) and "kind" in a:
                key, t = self._open(TensorRef.model_validate(a))
                if self.device is not None and t.device.type != self.device.type:
                    if key not in self.staged:
                        self.staged[key] = self.torch.empty_like(t, device=self.device)
                    t = self.staged[key].copy_(t)
                args.append(t)
            else:
                args.append(a)
        return args

    def _unstage(self, cmd) -> None:
        """Device copies of this command's inputs back into the judge's buffers: in-place changes stay visible."""
        from musacoder.verifier.protocol import TensorRef

        for a in cmd.inputs:
            key = _key(TensorRef.model_validate(a)) if isinstance(a, dict) and "kind" in a else None
            if key in self.staged:
                self.opened[key].copy_(self.staged[key])

    def op_ping(self, cmd):
        from musacoder.verifier.protocol import SubjectReply

        return SubjectReply()

    def op_flops(self, cmd):
        from torch.utils.flop_counter import FlopCounterMode

        from musacoder.verifier.protocol import SubjectReply

        with self.torch.no_grad(), FlopCounterMode(display=False) as fc:
            self.models[cmd.shape_key](*self._args(cmd))
        return SubjectReply(flops=float(fc.get_total_flops()))

    def op_profile(self, cmd):
        from musacoder.verifier.protocol import SubjectReply

        with self.torch.no_grad():
            prof = self.backend.kernel_profile(self.models[cmd.shape_key], self._args(cmd),
                                               own_kernels=cmd.own_kernels or None)
        return SubjectReply(profile=prof)

    def op_run(self, cmd):
        from musacoder.verifier.protocol import OutputSpec, SubjectReply

        torch = self.torch
        args = self._args(cmd)
        if cmd.poison_bytes:
            self.backend.poison(cmd.poison_bytes)
        trace = self.legality.OpTrace(self.backend.torch_namespaces)
        self.counter.reset()
        with torch.no_grad(), trace:
            out = self.models[cmd.shape_key](*args)
        leaves = list(_leaves(out))
        spec = OutputSpec(leaves=[_describe(x) for x in leaves])
        if cmd.outputs is not None:
            for x, ref in zip(leaves, cmd.outputs):
                if ref is not None and type(x) is torch.Tensor and list(x.shape) == ref.shape \
                        and str(x.dtype) == ref.dtype:
                    # stream-ordered copy before the device-wide sync: work left on another stream is not in it
                    self._open(ref)[1].copy_(x)
        self._unstage(cmd)
        self.backend.synchronize()
        integrity = self.legality.integrity_changes(self.snapshot, self.legality.snapshot())
        return SubjectReply(spec=spec, ops=dict(trace.ops), launches=self.counter.launches + trace.own_ops(),
                            launch_names=sorted(self.counter.names),
                            error="" if not integrity else "harness functions replaced: " + ", ".join(integrity),
                            ok=not integrity, kind="integrity" if integrity else "")

    def op_conditioning(self, cmd):
        """How far this reference's own output is from the same model in float64 on the trial's inputs, per output
        leaf: ||out - out64|| / ||out64||. The inputs are made again here from the trial's seed and variant, never
        read from buffers another process can map, so no candidate can make a trial look ill-conditioned."""
        import copy

        from musacoder.verifier.inputs import DTYPES, Shape, fill_inputs, raw_inputs
        from musacoder.verifier.protocol import SubjectReply

        torch, device = self.torch, self.device or self.torch.device("cpu")
        raw = raw_inputs(self.task, Shape(cmd.overrides), cmd.input_seed, device)
        args = [torch.empty(x.shape, dtype=DTYPES[cmd.precision] if x.is_floating_point() else x.dtype, device=device)
                if isinstance(x, torch.Tensor) else x for x in raw]
        fill_inputs(args, raw, cmd.input_seed, device, cmd.precision, cmd.transform)
        del raw
        model = self.models[cmd.shape_key]
        wide = lambda x: x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x  # noqa: E731
        with torch.no_grad():
            out = list(_leaves(model(*args)))
            out64 = list(_leaves(copy.deepcopy(model).double()(*[wide(a) for a in args])))
        errors = []
        for o, o64 in zip(out, out64):
            if not (isinstance(o, torch.Tensor) and o.is_floating_point() and o.shape == o64.shape):
                errors.append(None)
                continue
            diff, norm = (o.double() - o64).norm().item(), o64.norm().item()
            errors.append(diff / norm if norm > 0 and math.isfinite(diff / norm) else None)
        return SubjectReply(rel_errors=errors)


def _key(ref) -> str:
    """One opened tensor per buffer and shape: a smaller shape variant opens a prefix of the same file (or CUDA IPC
    share) with its own shape (buffers.prefix_view)."""
    return f"{ref.path}:{ref.shape}:{ref.dtype}" if ref.kind == "shm" else repr(ref.ipc)


def _leaves(obj):
    if isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _leaves(o)
    else:
        yield obj


def _describe(x) -> dict:
    import torch

    if isinstance(x, torch.Tensor):
        return {"tensor": True, "type": f"{type(x).__module__}.{type(x).__name__}", "shape": list(x.shape),
                "dtype": str(x.dtype), "device": str(x.device)}
    try:
        import json

        json.dumps(x)
        return {"tensor": False, "value": x}
    except (TypeError, ValueError):
        return {"tensor": False, "value": repr(x)[:200]}


def _tb(e: BaseException, limit: int = 6) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__)[-limit:])[-3000:]


if __name__ == "__main__":
    main()
