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
import contextlib
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
    ap.add_argument("--sandbox", action="store_true")
    ap.add_argument("--writable", action="append", default=[], help="another directory the sandbox may write")
    ap.add_argument("--no-device", action="store_true", help="import only (compile tier): never touch the device")
    args = ap.parse_args(argv)
    # its private directory comes in the environment: any process may read another's argv (/proc/PID/cmdline), not
    # the environment of one that is non-dumpable (the reference) or in another sandbox (a candidate)
    private = os.environ["MUSACODER_PRIVATE"]
    cpus = os.environ.get("MUSACODER_CPUS")
    if cpus and hasattr(os, "sched_setaffinity"):  # both subjects pinned to the same cores: timings comparable
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    from musacoder.proc.process import adopt_orphans_and_follow_parent
    from musacoder.verifier.sandbox import hide_process, own_namespace, restrict_writes

    adopt_orphans_and_follow_parent()
    pid, sandbox = os.getpid(), "none (trusted subject)"
    if args.sandbox:  # before any import can start a thread
        # from here on PID 1 of its own namespace (the process started stays behind as its waiter); `pid` is how the
        # judge sees it
        # CUDA IPC opens across it (the judge stays in the host's: scripts/pidns_cuda_check.py, H200 2026-11-28);
        # MUSACODER_OWN_PIDNS=0 is the way out where a driver or container refuses it
        pid, isolated, tmp = (own_namespace(private) if os.environ.get("MUSACODER_OWN_PIDNS") != "0" else
                              (os.getpid(), "no pid namespace (MUSACODER_OWN_PIDNS=0): a process it starts could leave "
                               "its tree", []))
        # realpath: /proc/self names this process's own entry only once resolved here
        sandbox = restrict_writes(private, [os.path.realpath(p) for p in args.writable] + tmp) + "; " + isolated
    else:  # the reference maps the judge's buffers: their paths must not be readable in its /proc entry
        hide_process()
    conn = Connection(args.fd)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # candidate prints must not reach the judge's pipe
    from musacoder.verifier.protocol import Hello, send

    subject = Subject(conn, args.backend, private, not args.no_device)
    from musacoder.verifier.legality import tracer_kind

    send(conn, Hello(pid=pid, sandbox=sandbox, tracer=tracer_kind()))
    subject.loop()


WARM_MS = 20.0  # cpu: parallel work before each timed block (Subject._switch_in)
_CONTINUED = [0]  # SIGCONTs this process received: a process stopped and continued while it was timed shows here


def _continued(*_):
    _CONTINUED[0] += 1


class Subject:
    def __init__(self, conn, backend_name: str, private: str, use_device: bool):
        import signal
        from functools import partial

        signal.signal(signal.SIGCONT, _continued)

        import torch

        from musacoder.backends import get_backend
        from musacoder.verifier import legality
        from musacoder.verifier.build import LaunchCounter, RemoteLoader
        from musacoder.verifier.capture import keep_alive_warmed
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
        # shape key -> the timing window's calls (input sets as forward gets them) and, where captured, their CUDA
        # graph and its outputs (op_block)
        self.blocks: dict = {}
        self.graph_error = ""  # why the last block's calls could not be captured as a graph
        self._touch = None
        self.legality = legality
        # The first traced call imports and warms up torch's Python dispatch machinery (about a second on a small
        # CPU), and a capture's first keep-alive imports torch._dynamo (~1 s more; 2026-11-29 on an H200 it pushed
        # honest candidates' probes past their bound): do it while this process waits as a spare, not inside the
        # candidate's first correctness trial or probe.
        with torch.no_grad(), legality.OpTrace(self.backend.torch_namespaces), keep_alive_warmed(self.device):
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
            reply.seconds, reply.continued = time.perf_counter() - t0, _CONTINUED[0]
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
        self.blocks.clear()
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
        self.blocks.clear()
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

    def _args(self, inputs: list) -> list:
        """The inputs as forward gets them: the judge's buffers, or their device copies, refreshed from the buffers
        (the judge refills them between runs)."""
        from musacoder.verifier.protocol import TensorRef

        args = []
        for a in inputs:
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

    def _unstage(self, inputs: list) -> None:
        """Device copies of these inputs back into the judge's buffers: in-place changes stay visible (a read-only
        buffer is the candidate's own copy: nothing to show)."""
        from musacoder.verifier.protocol import TensorRef

        for a in inputs:
            ref = TensorRef.model_validate(a) if isinstance(a, dict) and "kind" in a else None
            key = _key(ref) if ref is not None and not ref.readonly else None
            if key in self.staged:
                self.opened[key].copy_(self.staged[key])

    def op_ping(self, cmd):
        from musacoder.verifier.protocol import SubjectReply

        return SubjectReply()

    def op_flops(self, cmd):
        from torch.utils.flop_counter import FlopCounterMode

        from musacoder.verifier.protocol import SubjectReply

        with self.torch.no_grad(), FlopCounterMode(display=False) as fc:
            self.models[cmd.shape_key](*self._args(cmd.inputs))
        return SubjectReply(flops=float(fc.get_total_flops()))

    def op_profile(self, cmd):
        from musacoder.verifier.protocol import SubjectReply

        with self.torch.no_grad():
            prof = self.backend.kernel_profile(self.models[cmd.shape_key], self._args(cmd.inputs),
                                               own_kernels=cmd.own_kernels or None)
        return SubjectReply(profile=prof)

    def op_run(self, cmd):
        from musacoder.verifier.protocol import OutputSpec, SubjectReply

        torch = self.torch
        args = self._args(cmd.inputs)
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
        self._unstage(cmd.inputs)
        self.backend.synchronize()
        integrity = self.legality.integrity_changes(self.snapshot, self.legality.snapshot())
        return SubjectReply(spec=spec, ops=dict(trace.ops), launches=self.counter.launches + trace.own_ops(),
                            launch_names=sorted(self.counter.names),
                            error="" if not integrity else "harness functions replaced: " + ", ".join(integrity),
                            ok=not integrity, kind="integrity" if integrity else "")

    def op_block(self, cmd):
        """A timed block (window.py): forward on each input set in turn, back to back, under the op tracer, the device
        synchronised after the last call; or, where the window asked for it and forward could be captured, one
        replay of those calls captured as a CUDA graph (captured, traced, when the sets arrive). `ready` is answered
        once the calls are prepared (buffers opened, host buffers staged on the device, the device switched to this
        process), then a bare `go` starts the calls and a bare `done` follows the synchronisation: only that stretch
        is on the judge's clock. The outputs are read back into the judge's buffers after `done`, one row per call,
        while the judge times the read-back too (work deferred to it is paid for there). The same code runs the
        reference and the candidate."""
        from musacoder.verifier.protocol import OutputSpec, SubjectReply, send

        torch = self.torch
        trace = self.legality.OpTrace(self.backend.torch_namespaces)
        self.counter.reset()
        model = self.models[cmd.shape_key]
        self.graph_error = ""
        if cmd.sets is not None:
            # the earlier block's graph goes first: with its calls' intermediates kept alive, a probe's 8-call graph of
            # a 4 GiB task held 64 GiB, and the next capture beside it ran out of memory (H200, 2026-11-29)
            self.blocks.pop(cmd.shape_key, None)
            calls = [self._args(inputs) for inputs in cmd.sets]
            # a compiled baseline runs eagerly under a dispatch mode (dynamo steps aside), and its own buffers bypass
            # the dispatcher: captured without the keep-alive
            self.blocks[cmd.shape_key] = (calls, self._capture(model, calls, trace, cmd.shape_key != "compiled")
                                          if cmd.graph else None)
        calls, graph = self.blocks[cmd.shape_key]
        rows = [None if ref is None else self._open(ref)[1] for ref in (cmd.outputs or [])]
        self._switch_in()
        send(self.conn, SubjectReply(kind="ready"))
        if self.device is not None and self.device.type != "cpu":  # `go` comes at once: no wake-up on the clock
            deadline = time.perf_counter() + 0.01
            while not self.conn.poll(0) and time.perf_counter() < deadline:
                pass
        if self.conn.recv_bytes() != b"go":
            raise RuntimeError("the judge did not start the block")
        t0 = time.perf_counter()
        if graph is not None:
            graph[0].replay()
            outs = graph[1]
        else:
            with torch.no_grad(), trace:
                outs = [model(*args) for args in calls]
        self.backend.synchronize()
        self_ms = (time.perf_counter() - t0) * 1e3
        self.conn.send_bytes(b"done")
        spec, misfit = None, -1
        leaves = [list(_leaves(out)) for out in outs]
        for i, got in enumerate(leaves):
            if spec is None:
                spec = OutputSpec(leaves=[_describe(x) for x in got])
            fits = len(got) >= len(rows) and all(
                row is None or (type(x) is torch.Tensor and x.shape == row.shape[1:] and x.dtype == row.dtype)
                for x, row in zip(got, rows))
            if not fits:
                misfit = i
                break
        if misfit < 0:
            for k, row in enumerate(rows):  # one copy of every call's output a row, so the read-back's time is the
                if row is None or not leaves:  # device's, comparable between the two sides
                    continue
                parts = [got[k] for got in leaves]
                if parts[0].device == row.device:
                    torch.stack(parts, out=row)
                else:  # host buffers of a device backend (musa): stacked on the device, then copied
                    row.copy_(torch.stack(parts))
        del outs, leaves
        self.backend.synchronize()
        integrity = self.legality.integrity_changes(self.snapshot, self.legality.snapshot())
        return SubjectReply(spec=spec, misfit=misfit, self_ms=self_ms, graphed=graph is not None,
                            held_bytes=graph[2] if graph is not None and cmd.sets is not None else 0,
                            graph_error=self.graph_error,
                            ops=dict(trace.ops), launches=self.counter.launches + trace.own_ops(),
                            launch_names=sorted(self.counter.names),
                            error="" if not integrity else "harness functions replaced: " + ", ".join(integrity),
                            ok=not integrity, kind="integrity" if integrity else "")

    def _capture(self, model, calls: list, trace, keep_alive: bool):
        """The block's calls as one CUDA graph, its (static) outputs and the bytes a call's intermediates hold in it
        (kept alive through the capture: capture.py), after two calls off the capture to warm up, all of them traced;
        None where forward cannot be captured (a launch on the legacy default stream, a host synchronisation...): the
        window then times eager calls on both sides. Replay runs exactly the kernels captured, so no host code of the
        candidate's runs while it is timed.

        A capture can also succeed without the candidate's kernels in it: a launch on the legacy default stream runs
        at once, beside a capture on torch's (non-blocking) stream, and the graph replays nothing of it (an honest
        `kernel<<<grid, block>>>` does this; its outputs were right for the capture's input sets only). So each graph
        replays once into poisoned outputs before it is used, and must give the warm-up calls' outputs again."""
        torch = self.torch
        if self.device is None or self.device.type != "cuda":
            return None
        from musacoder.verifier.capture import KeepAlive

        side = torch.cuda.Stream()
        try:
            side.wait_stream(torch.cuda.current_stream())
            with torch.no_grad(), trace, torch.cuda.stream(side):
                warm = [[x.clone() if isinstance(x, torch.Tensor) else x for x in _leaves(model(*args))]
                        for args in calls[:2]]
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph, keep = torch.cuda.CUDAGraph(), KeepAlive() if keep_alive else contextlib.nullcontext()
            # capture_begin/end by hand: torch.cuda.graph() leaves its capture stream current when the end fails
            with torch.no_grad(), trace, torch.cuda.stream(side):
                graph.capture_begin()
                try:
                    with keep:  # each call's intermediates at addresses of their own (capture.py)
                        outs = [model(*args) for args in calls]
                finally:
                    graph.capture_end()
            held = keep.held_bytes(leave_out=(calls, outs)) // len(calls) if keep_alive else 0
            del keep
            if not self._replays_itself(graph, outs, warm, calls):
                self.graph_error = "a replay alone did not give the captured calls' outputs again"
                return None
            return graph, outs, held
        except Exception as e:  # not capturable: eager calls instead, decided by the window for both sides
            first = (str(e).strip().splitlines() or [""])[0]
            self.graph_error = f"{type(e).__name__}: {first[:300]}"
            torch.cuda.synchronize()
            return None

    def _replays_itself(self, graph, outs, warm, calls) -> bool:
        """Whether a replay alone writes the outputs the warm-up calls gave: the outputs of those calls are poisoned
        (NaN, or -1 for integers), the graph replayed, and the two compared (a kernel whose results differ from run
        to run also fails: timed eagerly then). Outputs that share memory with an input cannot be poisoned: no."""
        torch = self.torch
        inputs = {a.untyped_storage().data_ptr() for args in calls for a in args if isinstance(a, torch.Tensor)}
        got = [list(_leaves(out)) for out in outs[:len(warm)]]
        for leaves in got:
            for x in leaves:
                if isinstance(x, torch.Tensor):
                    if x.untyped_storage().data_ptr() in inputs:
                        return False
                    x.fill_(float("nan") if x.is_floating_point() or x.is_complex() else -1)
        graph.replay()
        torch.cuda.synchronize()
        for leaves, expected in zip(got, warm):
            for x, e in zip(leaves, expected):
                if isinstance(x, torch.Tensor) != isinstance(e, torch.Tensor):
                    return False
                if isinstance(x, torch.Tensor) and not (
                        x.shape == e.shape and (torch.allclose(x, e, rtol=1e-3, atol=1e-5, equal_nan=True)
                                                if x.is_floating_point() or x.is_complex() else torch.equal(x, e))):
                    return False
        return True

    def _switch_in(self):
        """This process ready to run before `go`. A device: running this process's context (the judge flushed the cache
        in its own, and a first call that paid for the switch cost ~0.35 ms a block on an H200). The cpu: its threads
        and cores awake, by WARM_MS of parallel work (a block started after the judge's mostly single-threaded
        refill ran up to 1.9x slower on the 2-core machine than one started after another block)."""
        torch = self.torch
        if self.device is not None and self.device.type != "cpu":
            if self._touch is None:
                self._touch = torch.zeros(1, device=self.device)
            self._touch.add_(1)
            self.backend.synchronize()
            return
        if self._touch is None:
            self._touch = torch.ones(1 << 18)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < WARM_MS / 1e3:
            self._touch.mul_(1.0)

    def op_kb_time(self, cmd):
        """KernelBench's own timing of this process's model on `inputs` (timing.method kernelbench): warm-up calls,
        then per trial a synchronisation, the device cache cleared, start event, forward, end event, synchronisation
        (host clock on the cpu). What this process reports about itself: comparable with published figures, not
        tamper-proof."""
        from musacoder.verifier.protocol import SubjectReply

        torch, model, args = self.torch, self.models[cmd.shape_key], self._args(cmd.inputs)
        device = self.device is not None and self.device.type != "cpu"
        rt = getattr(torch, self.device.type) if device else None  # torch.cuda, torch.musa
        times = []
        with torch.no_grad():
            for _ in range(3):
                model(*args)
            self.backend.synchronize()
            for _ in range(cmd.trials):
                if device:
                    self.backend.flush_cache()
                    rt.synchronize()
                    start, end = rt.Event(enable_timing=True), rt.Event(enable_timing=True)
                    start.record()
                    model(*args)
                    end.record()
                    rt.synchronize()
                    times.append(start.elapsed_time(end))
                else:
                    t0 = time.perf_counter()
                    model(*args)
                    times.append((time.perf_counter() - t0) * 1e3)
        return SubjectReply(times_ms=times)

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
