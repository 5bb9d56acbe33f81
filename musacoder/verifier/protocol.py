"""Typed messages between the processes of a verification (JSON on the wire; never pickle).

pool <-WorkerHello--- judge (a device or compile worker, once)
pool --EvaluateJob--> judge --SubjectCommand--> subject (reference or candidate)
pool <---Facts------- judge <--SubjectReply---- subject
pool --PrebuildJob--> compile worker (a judge without a device); PrebuildResult back
                      judge <--BuildRequest---- subject (its load_inline); judge --BuildReply--> subject
synth.profiling --ProfileCommand--> its profiling process; ProfileReply back, builds requested as a subject's
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator

from musacoder.config import VerifyConfig


class Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- tensors that cross processes ----------------------------------------------------------------------------
class TensorRef(Msg):
    """Where a tensor lives: a file in a shared-memory directory (cpu) or a CUDA IPC handle (cuda)."""

    kind: Literal["shm", "cuda"]
    shape: list[int]
    dtype: str
    path: str = ""  # shm
    ipc: list[Any] = Field(default_factory=list)  # cuda: torch's storage sharing tuple, bytes as base64
    readonly: bool = False  # shm: mapped read-only (a candidate's inputs: a write faults instead of landing)


class OutputSpec(Msg):
    """Structure of a forward's output: one entry per leaf; tensors by shape/dtype/device, others by value."""

    leaves: list[dict]


class WorkerHello(Msg):
    """A pool worker's first message: it is up, where it runs, and (device workers) on what. The pool adds what
    only it knows: the Ray node it runs on, or why it did not start (`error`; pid 0)."""

    type: Literal["hello"] = "hello"
    pid: int
    role: Literal["compile", "device"]
    cpus: list[int] = Field(default_factory=list)  # the cores it and what it starts run on
    device: str = ""
    versions: dict[str, Any] = Field(default_factory=dict)
    node: str = ""
    error: str | None = None


class BuildRecord(Msg):
    """One build a candidate asked for, as facts and verdicts report it."""

    key: str = ""
    seconds: float = 0.0
    cached: bool = False
    error: str | None = None  # the tail of the build log

    @classmethod
    def of(cls, reply: BuildReply) -> BuildRecord:
        return cls(key=reply.key, seconds=round(reply.seconds, 3), cached=reply.cached,
                   error=reply.error[-500:] if reply.error else None)


class PrebuildResult(Msg):
    """A compile worker's answer: what importing the candidate built (the pool caches it), or why nothing was."""

    build_error: str | None = None
    import_error: str | None = None
    builds: list[BuildRecord] = Field(default_factory=list)
    symbol_problems: list[str] = Field(default_factory=list)
    kernels: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    timeout: str | None = None
    infra_error: str | None = None


class Hello(Msg):
    """A subject's (or the profiling process's) first message: it is up, and how it is sandboxed."""

    type: Literal["hello"] = "hello"
    pid: int
    sandbox: str
    tracer: str = ""  # which op tracer its forwards run under (legality.tracer_kind)


# ---- subject commands and replies ----------------------------------------------------------------------------
class SubjectCommand(Msg):
    op: Literal["load", "build_model", "run", "block", "kb_time", "conditioning", "profile", "flops", "ping", "release",
                "exit"]
    # load
    task_code: str = ""
    candidate_code: str = ""  # empty: this subject runs the reference
    # build_model
    shape_key: str = ""
    overrides: dict = Field(default_factory=dict)
    weight_seed: int = 0
    precision: str = "fp32"
    compiled: bool = False  # reference only: torch.compile the model (the compile baseline)
    # run
    inputs: list[Any] = Field(default_factory=list)  # TensorRef dicts or plain values, in get_inputs order
    outputs: list[TensorRef | None] | None = None  # where to copy the output leaves; None: report the spec only
    poison_bytes: int = 0
    # block: forward on each input set in turn, back to back, between a bare `go` and `done` (judge.time_ab); `sets`
    # given once a window (None: the previous block's sets), `outputs` one [calls, ...] buffer per output leaf, each
    # call's output copied into its row after `done` (None: nothing read back)
    sets: list[list[Any]] | None = None
    graph: bool = False  # capture the calls as a CUDA graph when the sets arrive, and replay it (where it captures)
    # kb_time: KernelBench's own timing of `inputs` in this process (warm-up, then `trials` timed calls)
    trials: int = 0
    # conditioning (reference only): the trial's inputs made again inside the reference's own process
    input_seed: int = 0
    transform: str = ""
    # profile
    own_kernels: list[str] = Field(default_factory=list)


class SubjectReply(Msg):
    ok: bool = True
    error: str = ""  # a traceback tail: the subject's own failure
    fatal: bool = False  # the device is unusable (sticky error)
    kind: str = ""  # "build" / "import" / "format" for load failures
    spec: OutputSpec | None = None
    ops: dict[str, int] = Field(default_factory=dict)  # aten ops dispatched during this command
    launches: int = 0
    launch_names: list[str] = Field(default_factory=list)
    builds: list[BuildRecord] = Field(default_factory=list)
    profile: dict | None = None
    flops: float = 0.0
    seconds: float = 0.0
    rel_errors: list[float | None] = Field(default_factory=list)  # conditioning: per output leaf
    # block: the subject's own clock from `go` to `done`; the first call whose output does not fit the buffers (-1:
    # none); how often this process was continued after a stop (SIGCONT) since it started
    self_ms: float = 0.0
    misfit: int = -1
    graphed: bool = False  # block: the calls run as a captured CUDA graph
    held_bytes: int = 0  # block, when captured: a call's intermediates kept in the graph (capture.py)
    graph_error: str = ""  # block, asked for a graph: why its calls could not be captured as one
    continued: int = 0
    times_ms: list[float] = Field(default_factory=list)  # kb_time: each timed call


class BuildRequest(Msg):
    """A subject's load_inline / load call: the build arguments, sources as text."""

    type: Literal["build"] = "build"
    arguments: dict


class BuildReply(Msg):
    path: str = ""
    error: str = ""
    key: str = ""
    cached: bool = False
    seconds: float = 0.0
    problems: list[str] = Field(default_factory=list)  # imported symbols the verifier refuses
    kernels: list[str] = Field(default_factory=list)  # device kernels the library defines


def send(conn, msg: Msg) -> None:
    """One message to the process at the other end of `conn` (a multiprocessing Connection)."""
    conn.send_bytes(json.dumps(msg.model_dump()).encode())


def request_build(conn, arguments: dict) -> BuildReply:
    """A subject's (or the profiling process's) load_inline: built by the process at the other end of `conn`."""
    send(conn, BuildRequest(arguments=arguments))
    return BuildReply.model_validate(json.loads(conn.recv_bytes()))


# ---- synth.profiling <-> its profiling process ---------------------------------------------------------------
class ProfileCommand(Msg):
    op: Literal["load", "profile", "nsight"]  # nsight: `warmup` forwards, then one between profiler start and stop
    # load
    task_code: str = ""
    code: str = ""  # the program (its ModelNew)
    precision: str = "fp32"
    # profile, nsight
    iterations: int = 0
    warmup: int = 0


class ProfileRow(Msg):
    """An op or kernel of the profiler's table, summed over the profiled forwards."""

    name: str
    kind: Literal["kernel", "host"]
    calls: int | None  # None: the cpu's host time outside any profiled op
    self_ms: float


class ProfileReply(Msg):
    ok: bool = True
    error: str = ""  # a traceback: the program's failure
    # profile
    rows: list[ProfileRow] = Field(default_factory=list)
    wall_ms: float = 0.0  # per forward, under the profiler
    plain_ms: float = 0.0  # per forward, without it
    device: str = ""
    threads: int = 0


# ---- pool <-> judge ------------------------------------------------------------------------------------------
def _verify_config(v: Any) -> VerifyConfig:
    return v if isinstance(v, VerifyConfig) else VerifyConfig.from_dict(v)


# VerifyConfig is a settings dataclass: its own loader validates it (unknown keys refused, strict types), and it
# crosses as its to_dict(). A backend 'auto' crosses as it is: it is resolved where a device is known, not here.
WireConfig = Annotated[VerifyConfig, PlainValidator(_verify_config), PlainSerializer(VerifyConfig.to_dict)]


class EvaluateJob(Msg):
    task_code: str
    task_key: str
    candidate_code: str
    config: WireConfig
    build_env: dict[str, str] = Field(default_factory=dict)
    device_lock: str = ""  # path prefix of the lock judges sharing this device take (verifier/devlock.py); "": none


class PrebuildJob(Msg):
    candidate_code: str
    config: WireConfig


class Trial(Msg):
    kind: str
    passed: bool = False
    reason: str = ""
    max_abs: float | None = None
    mean_abs: float | None = None
    where: str | None = None
    error: str | None = None


class Timing(Msg):
    """One timing window. `method` judge: rounds of one block per arm (secret order), each block a run of `calls`
    back-to-back forwards on distinct fresh input sets timed by the judge's clock, outputs read back after it and
    checked; times are per call (block / calls). kernelbench: each subject timed itself (not tamper-proof)."""

    method: str = "judge"
    graphs: bool = False  # each block replayed its calls as a CUDA graph (both sides)
    candidate_ms: float
    reference_ms: float
    compile_ms: float | None = None
    speedup: float
    speedup_low: float  # 95% bootstrap interval of the speedup over paired rounds
    speedup_high: float
    compile_speedup: float | None = None
    rse: float
    reps: int  # rounds counted
    calls: int = 1  # calls a block
    floor_ms: float  # round trip of a block of no calls to the clean reference subject: the protocol's own cost, taken
    # off every timed block of both arms (timing.net_block_ms)
    threads: int | None = None  # cpu: threads each side used
    # the reference's own clock over its blocks, per call: the rest of reference_ms is the round trip
    reference_self_ms: float | None = None
    # median ms the judge's clock read over each side's own a block, candidate and reference: the round trip (the
    # candidate's own clock is its claim, so this is a diagnostic; it grew by 1.4-3.5 ms in some windows of an H200:
    # docs/benchmarks.md, 2026-11-29)
    round_trip_ms: list[float] | None = None
    # spare candidate processes still warming up when the window's rounds began and when they ended (a diagnostic of
    # what ran beside the window: settle() waits for them on the cpu only)
    spares_starting: list[int] | None = None
    # median ms a block spent outside its timed stretch (preparing before `ready`, reading its outputs back after
    # `done`), candidate and reference; when the candidate's is clearly longer, the speedup counts that time on both
    # sides (`outside_included`): work moved out of the timed stretch is paid for
    outside_ms: list[float] | None = None
    outside_included: bool = False
    # device: median ms the quiet gate waited after the candidate's blocks, and after the reference's (quiet.py)
    quiet_wait_ms: list[float] | None = None
    # seconds the probe blocks took, candidate and reference (window._probe; the candidate's are bounded), and the
    # bytes of intermediates a call keeps in a captured graph that the memory plan counted (capture.py)
    probe_s: list[float] | None = None
    held_bytes: int = 0


class Facts(Msg):
    """What the judge measured for one candidate. `pipeline.decide` turns it into a verdict."""

    stage_seconds: dict[str, float] = Field(default_factory=dict)
    trials: list[Trial] = Field(default_factory=list)
    fatal: bool = False
    infra_error: str = ""
    task_error: str = ""
    compile_error: str = ""
    import_error: str = ""
    symbol_problems: list[str] = Field(default_factory=list)
    ops: dict[str, int] = Field(default_factory=dict)
    illegal_ops: list[str] = Field(default_factory=list)
    launches: int = 0
    launch_names: list[str] = Field(default_factory=list)
    builds: list[BuildRecord] = Field(default_factory=list)
    profile: dict | None = None
    profile_error: str = ""
    processes_spawned: int = 0
    busy_after_return: str = ""
    timing: Timing | None = None
    timing_error: str = ""
    spot_check: str = ""
    timed_out: str = ""
    crashed: str = ""
    integrity: list[str] = Field(default_factory=list)
    bytes: int = 0
    flops: float = 0.0
    rates: dict | None = None
    sandbox: str = ""
    tracer: str = ""
    recycle: bool = False
    worker_pid: int | None = None
    candidate_pid: int | None = None
