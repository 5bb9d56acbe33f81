"""The judge: sequences a verification's stages in a process that never runs candidate code.

Per candidate it takes a fresh, pre-spawned, sandboxed candidate subject (`subject.py`) and a long-lived reference
subject that only ever runs the task's `Model`. It draws every seed, spot-check position, shape factor and check order
from a secret random source, builds the candidate's native code itself (`build.Builder`), generates inputs into
buffers it owns, compares outputs in its own memory, and times candidate and reference alternately with its own
clock. What the candidate process reports about itself (op trace, launch count) is evidence, not trust: see
docs/verifier.md for what a hostile candidate can still forge.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import statistics
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch

from musacoder.config import VerifyConfig
from musacoder.proc import scratch
from musacoder.proc.process import (
    WorkerDied,
    WorkerProcess,
    WorkerTimeout,
    descendants,
    usable_cores,
)
from musacoder.proc.zygote import ForkedWorker
from musacoder.verifier import buffers, legality, quiet
from musacoder.verifier.buffers import DTYPE_NAMES
from musacoder.verifier.build import Builder
from musacoder.verifier.correctness import Comparison, all_finite, compare, inputs_unchanged
from musacoder.verifier.devlock import DeviceLock, stopped_while_waiting
from musacoder.verifier.inputs import (
    DTYPES,
    Shape,
    clone_tree,
    fill_inputs,
    load_module,
    raw_inputs,
    scaled_constants,
    tensor_bytes,
)
from musacoder.verifier.protocol import (
    BuildRecord,
    BuildReply,
    EvaluateJob,
    Facts,
    Hello,
    OutputSpec,
    PrebuildJob,
    PrebuildResult,
    SubjectCommand,
    SubjectReply,
    TensorRef,
    Timing,
    Trial,
)
from musacoder.verifier.stages import stage
from musacoder.verifier.timing import mean_ratio_interval, rse
from musacoder.verifier.window import Block, Window
from musacoder.verifier.zygote import SubjectZygote


def auto_spares(cores: int, sharing: int) -> int:
    """Spare candidate processes a judge keeps starting when `verify.spares` is 0: a quarter of its cores, at most 8,
    split among the judges sharing its device, since each spare holds a device context (~0.6 GiB on an H100: eight
    judges of 8 spares held 51 GB of an H100)."""
    return max(1, min(8, cores // 4) // max(1, sharing))


def steady_malloc() -> dict:
    """The environment that makes glibc's allocator keep what a cpu subject frees (no mmap per large tensor, no trim
    of the heap): each call reuses pages already faulted in, as PyTorch's caching allocators do on a GPU. With glibc's
    defaults the same eager call measured 1.7 to 5.4 ms in one process, at 10 to 3,200 page faults a call, by where
    the heap's top happened to lie (docs/benchmarks.md). Read when a process starts: the zygote and every subject."""
    own = os.environ.get("GLIBC_TUNABLES")
    steady = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776"
    return {"GLIBC_TUNABLES": f"{own}:{steady}" if own else steady}


def subject_omp() -> dict:
    """OpenMP's wait in a subject (read once, when OpenMP loads): its idle threads sleep (PASSIVE) after a short spin
    (GOMP_SPINCOUNT: 1,000 spins, microseconds) that carries them from one parallel region to the next within a
    call. Without the spin every region paid a wake-up across cores, whose cost varied with what the other core was
    doing: a 128x128 matmul on two threads of a 2-vCPU VM took 0.14 ms a call instead of 0.043 (docs/benchmarks.md).
    The spin ends long before the other side's clock starts (Subject._switch_in prepares for 20 ms), within the
    judge's 3 ms sample of the candidate's CPU after a reply, far under what that allows (quiet.CpuGate)."""
    return {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "1000"}


def private_env(private: Path) -> dict:
    """A sandboxed subject's environment: its private directory (there, not in argv, which every process can read)
    and the caches that write into it. Triton's writes its files in place (backends/triton_cache.py) rather than
    renaming them across directories, which Landlock ABI 1 refuses."""
    return {"MUSACODER_PRIVATE": str(private), "TMPDIR": str(private), "TRITON_CACHE_DIR": str(private / "triton"),
            "TRITON_CACHE_MANAGER": "musacoder.backends.triton_cache:BesideCacheManager",
            "TORCHINDUCTOR_CACHE_DIR": str(private / "inductor"), **subject_omp()}


@dataclass
class TrialBuffers:
    """The judge's buffers of one trial shape, allocated once and refilled by each trial of it; the base trial's are
    the ones the timing window and the speed-of-light figures use. Input lists follow the task's inputs (a buffer the
    judge owns for each tensor, the value as it is for anything else); output lists have one entry a leaf of the
    reference's output (None for a leaf that is not a tensor)."""

    key: str  # the shape's key (Shape.key): the model each subject built for this shape runs on these buffers
    layout: list  # what the inputs must hold (_layout): ("tensor", shape, dtype) or ("value", x) each
    cand_in: list  # the candidate's copy of the inputs: in its own directory or memory pool, read-only where possible
    cand_in_refs: list  # what the candidate subject opens for `cand_in` (TensorRef dumps; values as they are)
    ref_in: list  # the reference's copy of the inputs, in the judge's own memory: no candidate can map it
    ref_in_refs: list  # what the reference subject opens for `ref_in`
    spec: OutputSpec  # the reference's output structure (leaves' shape, dtype, device): what the candidate must return
    ref_out: list  # the reference's output buffers (the judge's own); the kept first output in the determinism check
    ref_out_refs: list  # what the reference subject writes `ref_out` through (TensorRef, or None)
    cand_out: list  # the candidate's output buffers (in its pool), poisoned before each of its runs
    cand_out_refs: list  # what the candidate subject writes `cand_out` through (TensorRef, or None)


class Subject:
    """The judge's handle on one subject process."""

    def __init__(self, backend, cache_dir: Path, role: str, device: bool, threads: int | None,
                 zygote: SubjectZygote | None = None):
        ipc = buffers.device_ipc(backend.device_type)
        self.private = scratch.new_dir(role, shared_memory=not ipc)
        # the private directory goes in the environment, not argv: argv is readable to every process (cmdline)
        env = private_env(self.private)
        if backend.device_type == "cpu":
            env.update(steady_malloc())
        if threads:
            cpus = sorted(os.sched_getaffinity(0))[:threads]
            env.update(MUSACODER_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                       MUSACODER_CPUS=",".join(map(str, cpus)))
        if not device:
            env[backend.visible_devices_var] = ""
        argv = ["musacoder.verifier.subject", "--backend", backend.name]
        # CUDA IPC needs write access to the reference counters torch keeps in /dev/shm, and the driver writes under
        # the process's own /proc entry when it initialises (assumed of the MUSA driver too: untried); host buffers
        # are files in the subject's own directory, so without IPC /dev/shm stays closed
        paths = (["--writable", "/dev/shm"] if ipc else []) + \
            (["--writable", "/proc/self"] if backend.device_type != "cpu" else [])
        argv += ["--sandbox", *paths] if role == "cand" else []
        argv += [] if device else ["--no-device"]
        # the log is gone with the subject's directory: no file per candidate
        kw = dict(env=env, max_jobs=10**9, argv=argv, log_path=self.private / "log")
        self.proc = (ForkedWorker(zygote, f"subject-{role}", backend.name, cache_dir, **kw) if zygote
                     else WorkerProcess(f"subject-{role}", backend.name, cache_dir, **kw))
        self.error = ""
        self.hello: Hello | None = None
        self.proc.launch()  # from the judge's own thread: a subject dies with the thread that started it
        self._thread = threading.Thread(target=self._hello, daemon=True)
        self._thread.start()  # it warms up (imports torch, creates the device context) while the judge works

    def _hello(self):
        try:
            self.hello = Hello.model_validate(self.proc.await_hello())
        except WorkerDied as e:
            self.error = str(e)
        except ValueError as e:  # not a subject's hello: a broken harness
            self.error = f"the subject's first message is not a hello: {str(e)[:300]}"

    def ready(self) -> Subject:
        self._thread.join()
        if self.error:
            raise WorkerDied(self.error)
        return self

    @property
    def pid(self) -> int:
        return self.hello.pid if self.hello else 0

    def call(self, cmd: SubjectCommand, timeout: float, on_build=None) -> SubjectReply:
        return SubjectReply.model_validate(self.proc.call(cmd.model_dump(), timeout, on_build))

    def block(self, cmd: SubjectCommand, timeout: float, on_build=None, spin: bool = False,
              limit_s: float | None = None, grace=None) -> Block:
        """A timed block (window.py): the command, answered `ready` once the subject has prepared its calls; a bare
        `go` and `done` around the calls, on this clock; then the reply, once the outputs are read back. The
        preparation and the read-back are on this clock too (work moved out of the timed stretch shows there). A
        subject that fails before `done` ends it with its reply. `spin`: poll for `done` without sleeping (a device
        backend: the judge's own wake-up stays off the clock; never on the cpu, whose cores the subjects use).
        `limit_s`: the most the calls and the read-back may take from `go` (past it WorkerTimeout, the subject
        killed), unless `grace()` then gives more seconds (a cpu block slowed by other processes: _Contention)."""
        t_cmd = time.perf_counter()
        ready = self.call(cmd, timeout, on_build)
        if ready.kind != "ready":
            return Block(reply=ready)
        end = time.monotonic() + timeout  # the run's own limit: no grace past it
        deadline = end if limit_s is None else min(end, time.monotonic() + limit_s)
        t0 = time.perf_counter()
        self.proc.conn.send_bytes(b"go")
        while True:  # a build its forward asked for, or its failure, until `done`
            deadline = self._wait(deadline, end, spin, grace)
            try:
                msg = self.proc.conn.recv_bytes()
            except (EOFError, OSError):  # its end closed: WorkerDied with its log tail (or the deadline's timeout)
                self.proc._recv(max(deadline - time.monotonic(), 0.001))
                continue
            if msg == b"done":
                break
            answer = json.loads(msg)
            if "type" not in answer or on_build is None:
                return Block(reply=SubjectReply.model_validate(answer))
            self.proc.conn.send_bytes(json.dumps(on_build(answer)).encode())
        t1 = time.perf_counter()
        while True:
            deadline = self._wait(deadline, end, False, grace)
            answer = self.proc._recv(max(deadline - time.monotonic(), 0.001))
            if "type" not in answer or on_build is None:
                break
            self.proc.conn.send_bytes(json.dumps(on_build(answer)).encode())
        t2 = time.perf_counter()
        return Block((t1 - t0) * 1e3, (t0 - t_cmd) * 1e3, (t2 - t1) * 1e3, SubjectReply.model_validate(answer))

    def _wait(self, deadline: float, end: float, spin: bool, grace) -> float:
        """Until the next message can be read, for as long as the process lives: the deadline it came by (moved by
        `grace()` where that gives more time, never past `end`). Past it the process is killed (WorkerTimeout)."""
        conn = self.proc.conn
        spin_until = time.perf_counter() + (1.0 if spin else 0.0)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                more = grace() if grace is not None and deadline < end else 0.0
                if more > 0:
                    deadline = min(end, deadline + more)
                    continue
                self.proc.kill()
                raise WorkerTimeout("no answer within the run's time limit")
            try:
                if conn.poll(0 if time.perf_counter() < spin_until else min(left, 1.0)):
                    return deadline
            except (EOFError, OSError):
                pass
            if time.perf_counter() >= spin_until and not self.proc.alive:
                self.proc._recv(0.001)  # raises WorkerDied with the process's log tail

    def close(self):
        self.proc.kill()
        scratch.remove_dir(self.private)


class Judge:
    def __init__(self, backend, cache_dir: Path, use_device: bool = True):
        self.backend, self.cache_dir, self.use_device = backend, Path(cache_dir), use_device
        self.builder = Builder(cache_dir, backend)
        tracer = legality.use_tracer(self.cache_dir)  # before any subject or zygote starts: they inherit it
        if not legality.dispatcher_traced():
            print(tracer, file=sys.stderr, flush=True)
        self.device = backend.device() if use_device else torch.device("cpu")
        self.threads = usable_cores() if backend.device_type == "cpu" else None
        # the judge's own buffers (reference outputs): no subject writes here
        self.dir = scratch.new_dir("judge", shared_memory=not buffers.device_ipc(backend.device_type))
        self.ref: Subject | None = None
        # Warm candidate subjects, forked from a pre-imported zygote (~20 ms instead of ~1.5 s of CPU on cpu, ~10 s
        # on a GPU host: Python, torch, the device runtime); `verify.fork_subjects=false` starts each from scratch.
        # A spare still creates its device context (~1 s), longer than a cached verification: a device judge keeps
        # several starting where its cores allow (`verify.spares`).
        n = (int(os.environ.get("MUSACODER_SPARES") or 0)
             or auto_spares(usable_cores(), int(os.environ.get("MUSACODER_JUDGES_SHARING") or 1))) if use_device else 1
        self.zygote = None
        if os.environ.get("MUSACODER_FORK_SUBJECTS") != "0":
            env = subject_omp()  # read once, when OpenMP loads: must be set before the import
            if self.threads:
                env["OMP_NUM_THREADS"] = str(self.threads)
            if backend.device_type == "cpu":
                env.update(steady_malloc())
            self.zygote = SubjectZygote(env, self.cache_dir / "logs" / f"zygote-{os.getpid()}.log")
            if use_device and backend.device_type != "cpu" and not self.zygote.device_fork():
                print("forked subjects could not use the device: starting them from scratch", file=sys.stderr,
                      flush=True)
                self.zygote.close()
                self.zygote = None
        self.spares = deque(self._new_candidate() for _ in range(n))
        self._rates = None
        self._floor: float | None = None
        self._continued = 0
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            signal.signal(signal.SIGCONT, self._on_continue)

    def _on_continue(self, *_):
        self._continued += 1

    def continued(self) -> int:
        """SIGCONTs this process received: it is never stopped on purpose, so a change while timing means another
        process stopped it (a candidate stopping the judge while the reference is timed lengthens the reference)."""
        return self._continued

    def _new_candidate(self) -> Subject:
        return Subject(self.backend, self.cache_dir, "cand", self.use_device, self.threads, self.zygote)

    def _take_candidate(self) -> Subject:
        cand = self.spares.popleft()
        self.spares.append(self._new_candidate())
        return cand.ready()

    def settle(self):
        """cpu: wait until the spares have finished starting, a process warming up must not share the cores with a
        timing window. A GPU timing window is not disturbed by a spare warming up on the host's other cores."""
        if self.backend.device_type == "cpu":
            for s in self.spares:
                s._thread.join()

    def spares_starting(self) -> int:
        """Spare candidate processes still warming up (importing, creating their device context)."""
        return sum(s._thread.is_alive() for s in self.spares)

    def _reference(self) -> Subject:
        if self.ref is None or not self.ref.proc.alive:
            if self.ref is not None:
                self.ref.close()
            self.ref = Subject(self.backend, self.cache_dir, "ref", True, self.threads).ready()
        return self.ref

    def close(self):
        for s in [*self.spares, self.ref]:
            if s is not None:
                s.close()
        if self.zygote is not None:
            self.zygote.close()
        scratch.remove_dir(self.dir)

    # ---- compile tier ----------------------------------------------------------------------------------------------
    def prebuild(self, job: PrebuildJob) -> PrebuildResult:
        """Import the candidate in a fresh sandboxed subject (no device) so its builds land in the cache."""
        cfg = job.config
        builds: list[BuildReply] = []
        cand = self._take_candidate()
        t0 = time.perf_counter()
        try:
            r = cand.call(SubjectCommand(op="load", candidate_code=job.candidate_code), cfg.compile_timeout_s,
                          self._serve_builds(builds))
        except WorkerTimeout:
            return PrebuildResult(timeout=f"compilation exceeded {cfg.compile_timeout_s:.0f}s")
        except WorkerDied as e:
            r = SubjectReply(ok=False, kind="import", error=f"the candidate crashed its process: {str(e)[:500]}")
        finally:
            cand.close()
        out = PrebuildResult(builds=[BuildRecord.of(b) for b in builds],
                             symbol_problems=sorted({p for b in builds for p in b.problems}),
                             kernels=[k for b in builds for k in b.kernels], seconds=time.perf_counter() - t0)
        if not r.ok:
            setattr(out, "build_error" if r.kind == "build" else "import_error", r.error or "import failed")
        return out

    def _serve_builds(self, sink: list):
        def serve(msg: dict) -> dict:
            reply = self.builder.build(dict(msg["arguments"]))
            sink.append(reply)
            return reply.model_dump()

        return serve

    # ---- device tier -----------------------------------------------------------------------------------------------
    def evaluate(self, job: EvaluateJob) -> Facts:
        cfg = job.config
        os.environ.update(job.build_env)  # the compile tier's arch list, so its builds are found in the cache
        f = Facts(worker_pid=os.getpid())
        run = _Run(self, cfg, f, random.SystemRandom())
        try:
            run.go(job)
        except WorkerTimeout:
            f.timed_out = f"evaluation exceeded {cfg.run_timeout_s:.0f}s (killed)"
        except WorkerDied as e:
            f.crashed = _crash(e, self.backend, 500)
        finally:
            run.close()
        return f


class _Run:
    """One verification: state that lives exactly as long as the job."""

    def __init__(self, judge: Judge, cfg: VerifyConfig, facts: Facts, rng: random.Random):
        self.j, self.cfg, self.f, self.rng = judge, cfg, facts, rng
        self.deadline = time.monotonic() + cfg.run_timeout_s
        self.cand: Subject | None = None
        self.passed = False  # every correctness trial passed (checks)
        self.builds: list[BuildReply] = []
        self.keep: list = []  # (tensor, reference) the judge shared with subjects: alive until the job ends
        self.pool = buffers.new_pool(judge.device)  # where the buffers a candidate can map live (cuda)
        self.trial_call_ms = {"ref": float("inf"), "cand": float("inf")}  # fastest correctness-trial call, handler
        self.base: TrialBuffers | None = None  # the base trial's buffers, once its candidate run passed

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 0.001)

    def ccall(self, cmd: SubjectCommand) -> SubjectReply:
        return self.note(self.cand.call(cmd, self.left(), self.j._serve_builds(self.builds)))

    def note(self, r: SubjectReply) -> SubjectReply:
        """What a candidate's reply says it ran: ops, launches, harness integrity (evidence, summed over the job); and
        what it had built meanwhile, with the symbols refused in any of it: a build asked for after import (in
        __init__ or forward) is judged like one at import (a BLAS call built lazily was `ok` before 2026-11-28)."""
        self.f.builds = [BuildRecord.of(b) for b in self.builds]
        self.f.symbol_problems = sorted({p for b in self.builds for p in b.problems})
        self.f.ops.update({k: self.f.ops.get(k, 0) + v for k, v in r.ops.items()})
        self.f.launches += r.launches
        self.f.launch_names = sorted(set(self.f.launch_names) | set(r.launch_names))
        if r.kind == "integrity":
            self.f.integrity = [r.error]
        return r

    def rcall(self, cmd: SubjectCommand) -> SubjectReply:
        return self.j._reference().call(cmd, max(self.cfg.run_timeout_s, 900))

    def go(self, job: EvaluateJob):
        """Checks beside the other judges of this device, then timing alone (verifier/devlock.py), or beside them
        (timing.exclusive off); a candidate the device stayed busy after beside them is timed again alone, where the
        waits are its own and the exclusive rules decide."""
        f, lock = self.f, DeviceLock(job.device_lock, self.f.stage_seconds)
        with lock.shared():
            timed = self.checks(job)
        if timed:
            alone = self.cfg.timing.exclusive or not job.device_lock
            pid = self.cand.pid if job.device_lock else None  # stopped while this judge waits for the device
            with stopped_while_waiting(pid, lock.exclusive() if alone else lock.shared()), stage(f, "timing"):
                again = self.time_ab(alone)
            if again:
                with stopped_while_waiting(pid, lock.exclusive("retime_wait")), stage(f, "retime"):
                    self.time_ab(alone=True)
        if self.to_profile():
            with lock.shared():
                self.profile()
        # what it ran while timed and profiled counts as much as what it ran in its trials
        f.illegal_ops = legality.OpTrace.illegal_names(f.ops, self.j.backend.torch_namespaces)
        self.count_processes()

    def checks(self, job: EvaluateJob) -> bool:
        """Load, import and correctness; whether the candidate is to be timed."""
        f, cfg = self.f, self.cfg
        with stage(f, "load_task"):
            try:
                self.task = load_module(job.task_code, "task", self.j.cache_dir)
                r = self.rcall(SubjectCommand(op="load", task_code=job.task_code))
                if not r.ok:
                    raise RuntimeError(r.error)
            except BaseException as e:
                f.task_error = f"task {job.task_key} failed to load: {str(e)[-800:]}"
                return False
        if cfg.timing_enabled and self.j.device.type != "cpu":
            quiet.calibrate(self.j.device, self.j.backend.synchronize)  # before this job's candidate exists
        try:
            with stage(f, "subject_wait"):  # none if a spare was ready: what a judge waits for a candidate process
                self.cand = self.j._take_candidate()
        except WorkerDied as e:  # ours, not the candidate's: it has not run yet
            f.infra_error = f"no candidate process could be started: {e}"
            return False
        f.sandbox, f.candidate_pid, f.tracer = self.cand.hello.sandbox, self.cand.pid, self.cand.hello.tracer
        with stage(f, "import"):
            r = self.ccall(SubjectCommand(op="load", task_code=job.task_code, candidate_code=job.candidate_code))
        if not r.ok:
            if r.kind == "build":
                f.compile_error = r.error
            else:
                f.import_error = ("importing the candidate failed: " if r.kind == "import" else "") + r.error
            return False
        if f.symbol_problems:
            return False  # illegal whatever it computes: nothing more to run
        with stage(f, "correctness"):
            ok = self.trials(job.task_key)
        f.illegal_ops = legality.OpTrace.illegal_names(f.ops, self.j.backend.torch_namespaces)
        self.count_processes()
        if not ok or f.integrity or f.illegal_ops or f.processes_spawned or f.symbol_problems:
            return False
        self.passed = all(t.passed for t in f.trials) and self.base is not None
        return self.passed and cfg.timing_enabled and f.launches > 0

    def to_profile(self) -> bool:
        """Whether the candidate's kernels go under the device profiler (their share of device time, what feedback
        names): once it passed, after its timing, since the profiler's CUPTI stays in a process once started and slowed
        every later kernel of it by ~0.35-0.45 us (H200, 2026-11-29: a 4.0 us kernel timed at 4.4 in its subject),
        which the reference, never profiled, did not pay. A candidate its timing refused (the timed output changed, it
        failed) or whose process did not outlive its timing is not profiled: that refusal is its verdict."""
        f = self.f
        return (self.passed and not f.spot_check and not f.timing_error and self.j.backend.device_type != "cpu"
                and self.cand.proc.alive)

    def profile(self):
        f = self.f
        with stage(f, "profile"):
            r = self.ccall(SubjectCommand(op="profile", shape_key=self.base.key, inputs=self.base.cand_in_refs,
                                          own_kernels=[k for b in self.builds for k in b.kernels]))
            f.profile, f.profile_error = r.profile, ("" if r.ok else r.error[-500:])

    def count_processes(self):
        if self.cand is not None and self.cand.proc.alive:
            self.f.processes_spawned = len(descendants(self.cand.proc.proc.pid))

    # ---- correctness ---------------------------------------------------------------------------------------------
    def plan(self) -> list[tuple[int, str, Shape, int, str]]:
        """(rank, label, shape, seed, transform) of each trial, run in secret order; `rank` is the trial's place in
        the fixed order a verdict reports failures in (base seeds first), so one candidate's reason does not vary."""
        cc, rng = self.cfg.correctness, self.rng
        seed = lambda: rng.randrange(1, 2**31)  # noqa: E731
        plan = [("seed", Shape(), seed(), "") for _ in range(cc.seeds)]
        if cc.distribution_variants:
            plan.append(("sign-symmetric inputs", Shape(), seed(), "sign"))
            plan += [(f"inputs x{s:g}", Shape(), seed(), f"scale{s:g}") for s in cc.rescale_factors]
            few = rng.choice(("negfew", "posfew"))  # at the task's sizes too: a kernel may spot small ones
            plan.append((_TRANSFORM_LABELS[few][2:], Shape(), seed(), few))
        if cc.shape_variants:
            picks = [(f, None, [""]) for f in rng.sample(list(cc.shape_scales),
                                                         min(cc.shape_variant_count, len(cc.shape_scales)))]
            picks += [(rng.choice(cc.shape_scales), rng, [""])] if cc.ragged_shape else []
            small = ["sign", "neg", "pos", "negfew", "posfew"] if cc.distribution_variants else [""]
            picks += [(rng.choice(cc.small_scales), None, small)] if cc.small_shape else []
            for factor, ragged, transforms in picks:
                over = scaled_constants(self.task, factor, cc.shape_min_size, ragged=ragged)
                if over:
                    label = "shape " + ", ".join(f"{k}={v}" for k, v in over.items())
                    plan += [(label + _TRANSFORM_LABELS[t], Shape(over), seed(), t) for t in transforms]
        first, *rest = [(rank, *item) for rank, item in enumerate(plan)]
        rng.shuffle(rest)  # the order of checks is secret too; the first plain trial also checks determinism
        return [first, *rest]

    def trials(self, task_key: str) -> bool:
        rank: dict[int, int] = {}  # id(trial) -> its plan rank
        ok = self.run_trials(task_key, rank)
        self.f.trials.sort(key=lambda t: rank[id(t)])
        return ok

    def run_trials(self, task_key: str, rank: dict[int, int]) -> bool:
        """The plan's trials in its order: the reference's output first (reference_trial), then the candidate's model
        (candidate_model) and its run against that output (candidate_trial). False: nothing more is to run for this
        candidate (its task or a fatal error of its own, with the reason in the facts)."""
        f = self.f
        self.weight_seed = self.rng.randrange(1, 2**31)
        self.base = None
        built: dict[str, bool] = {}  # shape key -> the candidate's model was built
        # shape key -> buffers, allocated once and refilled by later trials; a shape variant's are views of the task
        # shape's where they fit (buffers.prefix_view), so the judge holds one set of buffers whatever the trials
        bufs: dict[str, TrialBuffers] = {}
        for i, (order, kind, shape, seed, transform) in enumerate(self.plan()):
            base_trial = kind == "seed"
            try:
                b, ref_vals = self.reference_trial(bufs, shape, seed, transform)
            except BaseException as e:
                if base_trial:
                    # the exception's line, from its start: an out-of-memory message lists every process on the
                    # device for ~900 characters, and its tail lost what failed (bench on an H100, 2026-11-26)
                    f.task_error = f"reference of {task_key} failed: {_last_line(str(e))}"
                    return False
                continue  # the reference does not accept this variant: skip it
            if not base_trial and not _finite(ref_vals):
                continue
            trial = Trial(kind=kind)
            f.trials.append(trial)
            rank[id(trial)] = order
            model = self.candidate_model(shape, built, trial)
            if model is None:
                return False
            if not model:
                continue
            end = self.candidate_trial(trial, shape, seed, transform, b, ref_vals, first=i == 0)
            if end is not None:
                return end
        if not f.trials:
            f.task_error = f"no correctness trial of {task_key} could run"
            return False
        return True

    def reference_trial(self, bufs: dict[str, TrialBuffers], shape: Shape, seed: int,
                        transform: str) -> tuple[TrialBuffers, list]:
        """A trial's inputs in its shape's buffers (allocated, or refilled when `bufs` has them in the same layout),
        then the reference's run on them: the buffers and the reference's output values. Raises when the reference
        fails."""
        f, cfg = self.f, self.cfg
        with stage(f, "trial_inputs"):
            raw = raw_inputs(self.task, shape, seed, self.j.device)
            layout = _layout(raw, cfg.precision)
            b = bufs.get(shape.key)
            if b is None or not _same_layout(b.layout, layout):
                within = bufs.get(Shape().key) if shape.overrides else None
                b = bufs[shape.key] = self.buffers_for(shape, raw, layout, seed, transform, within)
            else:
                self.fill(b.cand_in, b.ref_in, raw, seed, transform)
            del raw  # the task's own tensors: only the judge's buffers stay
        with stage(f, "trial_reference"):
            r = self.rcall(SubjectCommand(op="run", shape_key=shape.key, inputs=b.ref_in_refs, outputs=b.ref_out_refs))
        if not r.ok:
            raise RuntimeError(r.error)
        self.trial_call_ms["ref"] = min(self.trial_call_ms["ref"], r.seconds * 1e3)
        return b, _fill_values(b.ref_out, r.spec)

    def candidate_model(self, shape: Shape, built: dict[str, bool], trial: Trial) -> bool | None:
        """The candidate's model of `shape`, built the first time the shape comes up (`built` remembers whether it
        was). True: it is there to run; False: not (the trial says why); None: building it failed fatally."""
        if shape.key not in built:
            r = self.ccall(self._model_cmd(shape))
            built[shape.key] = r.ok
            if not r.ok:
                trial.error, trial.reason = r.error, "constructing ModelNew failed: " + _last_line(r.error)
                self.f.fatal = self.f.fatal or r.fatal
                return None if r.fatal else False
        if not built[shape.key]:
            trial.reason = "constructing ModelNew failed"
            return False
        return True

    def candidate_trial(self, trial: Trial, shape: Shape, seed: int, transform: str, b: TrialBuffers, ref_vals: list,
                        first: bool) -> bool | None:
        """The candidate's run on the trial's inputs, checked against the reference's output (`ref_vals`) and for
        inputs it changed; the `first` trial (the base shape) is run twice, for determinism, and its buffers become
        the base trial's if it passes. The verdict goes into `trial`. None: go on with the next trial; True or False:
        the trials end here, with that result."""
        f, cfg = self.f, self.cfg
        tol, rel = cfg.tolerance(), cfg.rel_tolerance()
        with stage(f, "trial_checks"):
            pristine = clone_tree(b.cand_in)
        try:
            with stage(f, "trial_candidate"):
                r = self.call_candidate(shape, b, trial)
        except WorkerDied as e:  # this trial crashed it (a bound hard-coded for another shape): a failed trial
            trial.error = trial.reason = _crash(e, self.j.backend, 300)
            return True  # the trials run so far stand; nothing more can run
        with stage(f, "trial_checks"):
            # checked before the comparison, so the copy is gone before the comparison's temporaries exist
            changed = inputs_unchanged(pristine, b.cand_in) if r is not None else None
            del pristine
            res = None if r is None else self.check(r, b, ref_vals, tol, rel)
        if r is None:
            return False if f.fatal else None
        if res.rel_error is not None and not changed:
            res = self.conditioned(res, r, b, ref_vals, tol, rel, shape, seed, transform)
        if res.ok and changed:
            res.ok, res.reason = False, changed
        if res.ok and first:
            self.determinism(res, r, shape, b, trial, tol)
            self.base = b
        trial.passed, trial.reason = res.ok, res.reason
        trial.max_abs, trial.mean_abs, trial.where = res.max_abs, res.mean_abs, res.where
        return None

    def determinism(self, res: Comparison, r: SubjectReply, shape: Shape, b: TrialBuffers, trial: Trial, tol: float):
        """The same inputs again (unchanged: checked before), against the first run's output (`r`): `res` refused
        when the second run raises or disagrees. The judge keeps that output in the reference's output buffer, whose
        values are compared already and which the candidate cannot map; its own buffer is poisoned again before the
        second run."""
        f = self.f
        for o, kept in zip(b.cand_out, b.ref_out):
            if kept is not None:
                kept.copy_(o)
        first = _fill_values(b.ref_out, r.spec)
        with stage(f, "trial_candidate"):
            again = self.call_candidate(shape, b, trial)
        if again is None:  # raising instead of answering must not skip the check
            res.ok, res.reason = False, "the second run on the same inputs raised: " + trial.reason
        else:
            with stage(f, "trial_checks"):
                again = self.check(again, b, first, tol, None)
            if not again.ok:
                res.ok, res.reason = False, "two runs on the same inputs disagree: " + again.reason
        del first

    def conditioned(self, res: Comparison, r: SubjectReply, b: TrialBuffers, ref_vals, tol: float, rel: float,
                    shape: Shape, seed: int, transform: str) -> Comparison:
        """A trial the relative check alone refused, judged again against the reference's own float32 error: where
        that reference is itself far from float64 (a difference of two nearly equal numbers: `mish(x) - x` at x ~ 8
        gives ~1e-6 of rounding noise), an honest kernel cannot be nearer to it than the noise, and a more accurate
        one is farther. Each output's bound becomes max(rel, COND_FACTOR x that error); atol still holds for every
        element. The reference measures its error in its own process on inputs it makes itself."""
        with stage(self.f, "trial_conditioning"):
            c = self.rcall(SubjectCommand(op="conditioning", shape_key=shape.key, overrides=shape.overrides,
                                          input_seed=seed, transform=transform, precision=self.cfg.precision))
        own = c.rel_errors[res.leaf] if c.ok and res.leaf < len(c.rel_errors) else None
        if own is None or COND_FACTOR * own <= rel:
            return res  # a well-conditioned trial: the refusal stands
        bounds = [rel if e is None else max(rel, COND_FACTOR * e) for e in c.rel_errors]
        again = self.check(r, b, ref_vals, tol, bounds)
        note = f"the reference's own float32 error here is {own:.3g} against float64"
        again.reason = f"ill-conditioned trial ({note})" if again.ok else f"{again.reason} ({note})"
        return again

    def buffers_for(self, shape: Shape, raw: list, layout: list, seed: int, transform: str,
                    within: TrialBuffers | None) -> TrialBuffers:
        """Input and output buffers of one shape, filled with `raw`'s trial values: the reference builds its model and
        reports its output's layout. The inputs twice: the candidate's copy (in its own directory or memory pool,
        read-only to it where the platform allows) and the reference's (in the judge's, which the candidate cannot
        map), so nothing the candidate or a process it left behind writes reaches the reference's inputs. `within`:
        the task shape's buffers, whose first elements hold this shape's where they fit (same dtype, no more
        elements); anything that does not fit gets a buffer of its own."""
        r = self.rcall(self._model_cmd(shape))
        if not r.ok:
            raise RuntimeError(r.error)
        cand_in, cand_in_refs = self.share(layout, "cand", None if within is None else (within.cand_in,
                                                                                        within.cand_in_refs))
        ref_in, ref_in_refs = self.share(layout, "ref", None if within is None else (within.ref_in, within.ref_in_refs))
        self.fill(cand_in, ref_in, raw, seed, transform)
        spec = self.rcall(SubjectCommand(op="run", shape_key=shape.key, inputs=ref_in_refs))
        if not spec.ok:
            raise RuntimeError(spec.error)
        ref_out, ref_out_refs = self.alloc_outputs(spec.spec, False,
                                                   None if within is None else (within.ref_out, within.ref_out_refs))
        cand_out, cand_out_refs = self.alloc_outputs(spec.spec, True,
                                                     None if within is None else (within.cand_out,
                                                                                  within.cand_out_refs))
        return TrialBuffers(key=shape.key, layout=layout, cand_in=cand_in, cand_in_refs=cand_in_refs, ref_in=ref_in,
                            ref_in_refs=ref_in_refs, spec=spec.spec, ref_out=ref_out, ref_out_refs=ref_out_refs,
                            cand_out=cand_out, cand_out_refs=cand_out_refs)

    def fill(self, cand_in: list, ref_in: list, raw: list, seed: int, transform: str = ""):
        """A trial's input values (raw_inputs' tensors, the float variant applied, in the precision) written into the
        reference's copy of the inputs (`ref_in`) a slice at a time, then copied into the candidate's (`cand_in`);
        then wait for the copy: the subjects read them from other processes, which no stream orders after this one
        (unsynchronised, they saw the previous trial's inputs on large tensors)."""
        fill_inputs(ref_in, raw, seed, self.j.device, self.cfg.precision, transform)
        for c, r in zip(cand_in, ref_in):  # the candidate's copy from the one it cannot map
            if isinstance(c, torch.Tensor):
                c.copy_(r)
        self.j.backend.synchronize()

    def _model_cmd(self, shape: Shape) -> SubjectCommand:
        return SubjectCommand(op="build_model", shape_key=shape.key, overrides=shape.overrides,
                              weight_seed=self.weight_seed, precision=self.cfg.precision)

    def poison_outputs(self, b: TrialBuffers):
        """The candidate's output buffers overwritten (NaN, or random bits) and the device synchronised before it runs:
        a candidate that writes nothing finds nothing of a previous run there."""
        for t in b.cand_out:
            if t is not None:
                buffers.poison(t, self.rng.randrange(1, 2**31))
        self.j.backend.synchronize()

    def call_candidate(self, shape: Shape, b: TrialBuffers, trial: Trial) -> SubjectReply | None:
        """One candidate forward into its (poisoned) output buffers; None when it raised."""
        self.poison_outputs(b)
        r = self.ccall(SubjectCommand(op="run", shape_key=shape.key, inputs=b.cand_in_refs, outputs=b.cand_out_refs,
                                      poison_bytes=tensor_bytes(b.cand_out)))
        if not r.ok:
            trial.error, trial.reason = r.error, _last_line(r.error)
            self.f.fatal = self.f.fatal or r.fatal
            return None
        self.trial_call_ms["cand"] = min(self.trial_call_ms["cand"], r.seconds * 1e3)
        return r

    def check(self, r: SubjectReply, b: TrialBuffers, expected, tol, rel) -> Comparison:
        """The candidate's reported output structure, then its values in the judge's buffers, against `expected`."""
        problem = _spec_problem(r.spec, b.spec)
        if problem:
            return Comparison(False, problem)
        got = _fill_values(b.cand_out, r.spec)
        if len(got) == 1:  # one output: report it as `out`, not `out[0]`
            return compare(got[0], expected[0], tol, rel)
        return compare(got, expected, tol, rel)

    def share(self, layout: list, side: str, within: tuple | None = None) -> tuple[list, list]:
        """One copy of a set of inputs for `side` ("cand" or "ref"): the judge's tensors and what the subject opens."""
        shared, refs = [], []
        for k, entry in enumerate(layout):
            if entry[0] != "tensor":
                shared.append(entry[1])
                refs.append(entry[1])
                continue
            _, shp, dtype = entry
            got = None
            if within is not None and k < len(within[0]) and isinstance(within[0][k], torch.Tensor):
                got = buffers.prefix_view(within[0][k], TensorRef.model_validate(within[1][k]), shp, dtype)
            t, ref = got or self.alloc_buffer(shp, dtype, candidate=side == "cand")
            ref.readonly = side == "cand" and ref.kind == "shm"  # its own copy: a write faults, it cannot land
            shared.append(t)
            refs.append(ref.model_dump())
        return shared, refs

    def alloc_buffer(self, shape, dtype: torch.dtype, candidate: bool) -> tuple[torch.Tensor, TensorRef]:
        """A buffer the judge owns, kept until the job ends: in the candidate's directory or memory pool when the
        candidate is to map it, else in the judge's own."""
        directory, pool = (self.cand.private, self.pool) if candidate else (self.j.dir, None)
        t, ref = buffers.alloc(shape, dtype, self.j.device, directory, pool)
        self.keep.append((t, ref))
        return t, ref

    def alloc_outputs(self, spec: OutputSpec, candidate: bool, within: tuple | None = None):
        """Output buffers of the reference (the judge's own) or of the candidate (in its pool)."""
        outs, refs = [], []
        for k, leaf in enumerate(spec.leaves):
            if leaf["tensor"]:
                got = None
                if within is not None and k < len(within[0]) and within[0][k] is not None:
                    got = buffers.prefix_view(within[0][k], within[1][k], leaf["shape"], DTYPE_NAMES[leaf["dtype"]])
                t, ref = got or self.alloc_buffer(leaf["shape"], DTYPE_NAMES[leaf["dtype"]], candidate)
                outs.append(t)
                refs.append(ref)
            else:
                outs.append(None)
                refs.append(None)
        return outs, refs

    # ---- timing ----------------------------------------------------------------------------------------------------
    def time_ab(self, alone: bool = True) -> bool:
        """The timing window (window.py, or each subject timing itself: timing.method kernelbench), then what the
        speed-of-light estimate needs. `alone`: no other judge's kernels can run on the device meanwhile. True: the
        device stayed busy after the candidate's blocks beside them, to be timed again alone."""
        if self.cfg.timing.method == "kernelbench":
            self.time_in_process()
        elif Window(self, alone).go():
            return True
        if self.f.timing is None:
            return False
        b = self.base
        self.f.bytes = tensor_bytes(b.cand_in) + tensor_bytes(b.ref_out)
        r = self.rcall(SubjectCommand(op="flops", shape_key=b.key, inputs=b.ref_in_refs))
        self.f.flops = r.flops if r.ok else 0.0
        if self.j._rates is None:
            self.j._rates = self.j.backend.peak_rates()
        self.f.rates = self.j._rates
        return False

    def time_in_process(self):
        """KernelBench's method (timing.method kernelbench): each subject times its own model on the base trial's
        inputs with device events (host clock on the cpu), means compared. Comparable with published fast_p
        figures; not tamper-proof, since the candidate's process reports its own time."""
        b, tc = self.base, self.cfg.timing
        cmd = dict(op="kb_time", shape_key=b.key, trials=max(tc.max_reps, 1))
        times = {}
        for side in ("ref", "cand"):
            r = (self.ccall if side == "cand" else self.rcall)(
                SubjectCommand(**cmd, inputs=b.cand_in_refs if side == "cand" else b.ref_in_refs))
            if not r.ok:
                self.f.timing_error = r.error
                return
            times[side] = r.times_ms
        ref, cand = statistics.fmean(times["ref"]), statistics.fmean(times["cand"])
        lo, hi = mean_ratio_interval(times["ref"], times["cand"], self.rng)
        self.f.timing = Timing(method="kernelbench", candidate_ms=cand, reference_ms=ref, speedup=ref / cand,
                               speedup_low=lo, speedup_high=hi, rse=rse(times["cand"]), reps=len(times["cand"]),
                               floor_ms=0.0, threads=self.j.threads)

    def floor(self) -> float:
        """The protocol's own cost: median round trip of a block of no calls to the clean reference subject, measured
        each window and kept as the lowest this judge has seen (taken off every timed block: a busy moment may raise one
        measurement, never the figure)."""
        ref, cmd = self.j._reference(), SubjectCommand(op="block", shape_key=self.base.key, sets=[])
        now = statistics.median(ref.block(cmd, self.left(), spin=self.j.device.type != "cpu").ms for _ in range(10))
        self.j._floor = min(now, self.j._floor or math.inf)
        return self.j._floor

    def release_reference(self, ref: Subject):
        with stage(self.f, "close_reference_release"):
            try:
                ref.call(SubjectCommand(op="release"), 60)
            except (WorkerDied, WorkerTimeout):
                ref.close()
                self.j.ref = None

    def close_candidate(self):
        """Its process gone (at the end of a job, or of a timing window the device was busy after: whose work was it).
        A consumer killed while it maps the judge's CUDA IPC buffers never lets go of them: the judge's memory stays
        allocated and the worker is recycled (~10 s). Ask first; a candidate that ignores it costs that."""
        f = self.f
        if buffers.device_ipc(self.j.device.type) and self.cand.proc.alive:
            with stage(f, "close_candidate_release"):
                try:
                    self.cand.call(SubjectCommand(op="release"), 5)
                except Exception:  # anything the candidate sends back or does here only costs a recycle
                    pass
        with stage(f, "close_candidate_exit"):
            self.cand.close()  # kills its process tree and waits (up to 10 s) until it is gone
        self.cand = None

    def close(self):
        # staged: on a GPU ~0.5 s of a cached verification's 2 s is spent here, each subject's release ~0.2 s (a gc
        # pass, the allocator's cache): the reference lets go in a thread while the candidate does and is killed
        f = self.f
        ref = self.j.ref
        releasing = None
        if ref is not None and ref.proc.alive and ref.proc.needs_restart:  # a fatal device error: no release, gone
            ref.close()
            self.j.ref = None
        elif ref is not None and ref.proc.alive:
            releasing = threading.Thread(target=self.release_reference, args=(ref,), name="release-reference")
            releasing.start()
        if self.cand is not None:
            self.close_candidate()
        if releasing is not None:
            releasing.join()
        with stage(f, "close_free"):
            if buffers.device_ipc(self.j.device.type):
                # Both subjects have let go or are dead now: their counts go to 0 (buffers.disown says why), so the
                # buffers are freed below instead of held until the worker is recycled.
                for _, ref in self.keep:
                    buffers.disown(ref)
            self.keep.clear()
            if buffers.device_ipc(self.j.device.type):
                torch.cuda.ipc_collect()  # blocks whose consumers let go return to the allocator now
            self.base = None
            if self.pool is not None:
                self.pool = None  # no tensor of it is left: its segments go back to the device, not to the next job
                torch.cuda.empty_cache()
            for p in self.j.dir.iterdir():
                p.unlink(missing_ok=True)


# ---- helpers ---------------------------------------------------------------------------------------------------------
def _crash(e: WorkerDied, backend, limit: int) -> str:
    """Why a candidate's process died, with the likely cause where the platform makes one likely."""
    why = f"the candidate crashed its process: {str(e)[:limit]}"
    if "SIGSEGV" in str(e) and not buffers.device_ipc(backend.device_type):
        why += " (its inputs are mapped read-only: writing to them faults)"
    return why


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else text)[:500]


def _fill_values(outs: list, spec: OutputSpec) -> list:
    """Output leaves as the judge sees them: its buffers for tensors, reported values for the rest."""
    return [o if leaf["tensor"] else leaf.get("value") for o, leaf in zip(outs, spec.leaves)]


def _spec_problem(got: OutputSpec | None, want: OutputSpec) -> str:
    if got is None:
        return "forward returned nothing the verifier could read"
    if len(got.leaves) != len(want.leaves):
        return f"output has {len(got.leaves)} values, reference has {len(want.leaves)}"
    for i, (g, w) in enumerate(zip(got.leaves, want.leaves)):
        path = f"out[{i}]" if len(want.leaves) > 1 else "out"
        if w["tensor"]:
            if not g["tensor"] or g["type"] != "torch.Tensor":
                return f"{path} is {g.get('type', type(g.get('value')).__name__)}, not a plain torch.Tensor"
            if g["shape"] != w["shape"]:
                return f"{path} has shape {tuple(g['shape'])}, expected {tuple(w['shape'])}"
            if g["dtype"] != w["dtype"]:
                return f"{path} has dtype {g['dtype']}, expected {w['dtype']}"
            if g["device"] != w["device"]:
                return f"{path} is on {g['device']}, expected {w['device']}"
    return ""


def _layout(raw: list, precision: str) -> list:
    """What a trial's buffers must hold: ("tensor", shape, dtype) for each top-level tensor (floats in the run's
    precision), ("value", x) for anything else (passed as it is)."""
    return [("tensor", tuple(x.shape), DTYPES[precision] if x.is_floating_point() else x.dtype)
            if isinstance(x, torch.Tensor) else ("value", x) for x in raw]


def _same_layout(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x[0] == y[0] and (x == y if x[0] == "tensor" else bool(x[1] == y[1]))
                                    for x, y in zip(a, b))


def _finite(vals) -> bool:
    return all(not isinstance(v, torch.Tensor) or not v.is_floating_point() or all_finite(v) for v in vals)


# A trial's relative bound where the reference is itself ill-conditioned: an honest kernel's float32 error is of the
# reference's order, and its distance from the reference at most their sum; x4 leaves room for another summation order
COND_FACTOR = 4.0
_TRANSFORM_LABELS = {"": "", "sign": ", sign-symmetric inputs", "neg": ", negative inputs", "pos": ", positive inputs",
                     "negfew": ", positive inputs but a few negative lines",
                     "posfew": ", negative inputs but a few positive lines"}


