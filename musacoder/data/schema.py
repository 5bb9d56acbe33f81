"""The JSONL records of the synth stages and of training: one pydantic model per record kind.

Writers build a model and write `line(model)`: the fields they set, in the model's order, as `json.dumps` writes them
(a field a writer leaves out stays out of the file, so the files keep their keys). Readers `parse` a decoded line
strictly (JSON's own types, nothing coerced), so a malformed line is a ValidationError naming its field (`brief`),
never a KeyError further on.

Which file holds which kind: tasks and variants (TaskRecord, DroppedTask in dropped.jsonl and *.dropped.jsonl),
solutions.jsonl (SolutionRecord), mutants.jsonl (MutantRecord), rewrite_pairs.jsonl (RewritePair), profiles.jsonl
(ProfileRecord), qa_answers.jsonl (QAAnswer), and the training records: sft.jsonl (generation and repair),
repair.jsonl, reviewer.jsonl, rewrite.jsonl, profiling.jsonl, qa.jsonl (SynthTrainingRecord, by `kind`).
Training reads any TrainingRecord: hand-written ones too, whose metadata is free.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

Kind = Literal["generation", "reviewer", "profiling", "qa", "rewrite", "repair"]
Role = Literal["system", "user", "assistant"]
KINDS: tuple[str, ...] = get_args(Kind)
ROLES: tuple[str, ...] = get_args(Role)


class _Closed(BaseModel):
    """A record one writer builds whole: an unknown field is a mistake (a typo in a writer, a foreign line)."""

    model_config = ConfigDict(extra="forbid")


class _Open(BaseModel):
    """A record that carries fields owned elsewhere: unknown ones are kept and written back."""

    model_config = ConfigDict(extra="allow")


def line(record: BaseModel) -> str:
    """One JSONL line of `record`: the fields its writer set, in the model's order."""
    return json.dumps(record.model_dump(exclude_unset=True)) + "\n"


def parse(kind, obj):
    """A decoded JSON line as `kind` (a model, or a TypeAdapter of a union of them), strictly; ValidationError when it
    is not one."""
    if isinstance(kind, TypeAdapter):
        return kind.validate_python(obj, strict=True)
    return kind.model_validate(obj, strict=True)


def brief(e: ValidationError) -> str:
    """The first problem of a ValidationError in one line, without the offending value ('teacher: Field required'):
    short, and the same for every line with that problem (the card counts lines by it)."""
    err = e.errors()[0]
    where = ".".join(map(str, err["loc"]))
    return f"{where}: {err['msg']}" if where else err["msg"]


# ---- training records -------------------------------------------------------------------------------------------

class Message(_Closed):
    role: Role
    content: str


class TrainingRecord(_Closed):
    """One chat-format training record, as training reads it: an optional system message, then user and assistant
    turns alternating, ending with the assistant turn trained on."""

    messages: list[Message] = Field(min_length=1)
    kind: Kind = "generation"
    task: str | None = None
    # free for hand-written records; "pool", "cluster" and "families" have a meaning to train/data.py
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("metadata")
    @classmethod
    def _pool(cls, meta):
        if isinstance(meta, dict) and "pool" in meta and not isinstance(meta["pool"], str):
            raise ValueError("metadata 'pool' must be a string")
        return meta

    @model_validator(mode="after")
    def _turns(self):
        first = 1 if self.messages[0].role == "system" else 0
        turns = self.messages[first:]
        for i, m in enumerate(turns):
            want = "user" if i % 2 == 0 else "assistant"
            if m.role != want:
                raise ValueError(f"message {first + i} is {m.role!r}, expected {want!r}: after an optional system "
                                 "message, user and assistant turns alternate, starting with user")
        if len(turns) < 2 or turns[-1].role != "assistant":
            raise ValueError("the last message must be an assistant turn (the one trained on)")
        if not turns[-1].content.strip():
            raise ValueError("the last assistant turn is empty")
        return self


class SolveMeta(_Closed):
    """A teacher's passing answer (`synth solve`): the compiler teacher writes teacher, status, speedup_eager; an LLM
    teacher also its backend, prompt, sample and turns."""

    teacher: str
    backend: str | None = None
    prompt: str | None = None
    sample: int | None = None
    turns: int | None = None
    status: str
    speedup_eager: float | None
    families: list[str] | None = None  # the task's, when known (clean.with_families)


class MutationMeta(_Closed):
    """A failing mutant of a verified solution (`synth repair`), shared by its repair and reviewer records."""

    source: Literal["mutation"]
    operator: str
    seed: int
    solution: str  # hashes: of the solution mutated, of the mutant
    mutant: str
    status: str
    bug: str
    families: list[str] | None = None


class Provenance(_Closed):
    """One program of a rewrite pair: where it came from and what its verdict measured."""

    solution: str
    teacher: str
    origin: str  # "file:line"
    ms: float | None
    rse: float | None
    reps: int | None
    eager_ms: float | None
    speedup_eager: float | None


class _Pair(_Closed):
    """What a judged rewrite pair and its rewrite record's metadata share."""

    source: Literal["timed pair"]
    backend: str
    speedup: float | None  # None: a verdict had no timing
    threshold: float
    slow: Provenance
    fast: Provenance


class RewriteMeta(_Pair):
    families: list[str] | None = None


class RewriteRef(_Closed):
    """The rewrite pair a profiled program is the slower one of."""

    speedup: float
    slow_ms: float | None
    fast_ms: float | None
    fast: str  # the faster program's hash


class _Profiled(_Closed):
    """What a profiled program's line and its profiling record's metadata share."""

    task: str
    solution: str
    teacher: str
    origin: str
    backend: str
    ncu_kernels: list[dict[str, Any]]  # per kernel launch: NCU_METRICS' names (profiling.parse_ncu_csv)
    nsight_compute: str  # "measured", or why not


class ProfilingMeta(_Profiled):
    category: str
    bottleneck: str
    kernel_share: float
    wall_ms: float
    iterations: int
    profiler: str
    rewrite: RewriteRef | None
    families: list[str] | None = None


class QAMeta(_Closed):
    verified: Literal[False]  # nothing executes prose: a qa answer is never verified
    teacher: str
    backend: str
    seed: int
    template: str
    families: list[str]
    source: str
    sample: int
    question: str
    finish_reason: str | None
    tokens: int | None


class GenerationRecord(TrainingRecord):
    """A teacher's passing answer to a task (`synth solve`)."""

    kind: Literal["generation"]
    task: str
    metadata: SolveMeta


class RepairRecord(TrainingRecord):
    """A mutant's fix (`synth repair`), or a teacher's answer repaired after the verifier's feedback (`synth solve`)."""

    kind: Literal["repair"]
    task: str
    metadata: MutationMeta | SolveMeta


class ReviewerRecord(TrainingRecord):
    """A mutant to find the bug in, answered by the bug and the fix (`synth repair`)."""

    kind: Literal["reviewer"]
    task: str
    metadata: MutationMeta


class RewriteRecord(TrainingRecord):
    """A verified program to make faster, answered by a measured faster one (`synth rewrite`)."""

    kind: Literal["rewrite"]
    task: str
    metadata: RewriteMeta


class ProfilingRecord(TrainingRecord):
    """A program's profiler read-out, answered by its bottleneck and advice (`synth profile`)."""

    kind: Literal["profiling"]
    task: str
    metadata: ProfilingMeta


class QARecord(TrainingRecord):
    """A question about a task or kernel, answered by a teacher and never verified (`synth qa`)."""

    kind: Literal["qa"]
    task: str
    metadata: QAMeta


# sft.jsonl mixes generation and repair records: the kind says which
SynthTrainingRecord = Annotated[Union[GenerationRecord, RepairRecord, ReviewerRecord, RewriteRecord, ProfilingRecord,
                                      QARecord], Field(discriminator="kind")]
SYNTH_TRAINING = TypeAdapter(SynthTrainingRecord)


# ---- tasks ----------------------------------------------------------------------------------------------------------

class TaskMeta(_Open):
    """A task's provenance. Open: each generator adds its own (a variant's drawn factors, dtype or partner) and task
    files from elsewhere bring theirs; the fields below are the synth stages'."""

    seed: int | None = None
    generator: str | None = None  # graphs, harvest
    spec: dict[str, Any] | None = None  # graphs: the GraphSpec
    ops: list[str] | None = None  # graphs: the op sequence drawn
    origin: str | None = None  # harvest: the layer or function's dotted path
    source: str | None = None  # harvest: its library
    size: float | None = None  # harvest: the multiplier of its drawn sizes
    parent: str | None = None  # variants: the task varied, and how
    variant: str | None = None
    aten_ops: list[str] | None = None  # the cleaning check's
    families: list[str] | None = None
    rotation: str | None = None  # a hidden set's


class TaskRecord(_Closed):
    """A task in KernelBench's JSONL format, with the synth stages' metadata."""

    name: str
    problem_id: int | None = None
    level: int | None = None
    code: str
    metadata: TaskMeta = Field(default_factory=TaskMeta)

    @property
    def key(self) -> str:
        """Task.key: how solutions and training records name it."""
        return f"level{self.level}/{self.name}" if self.level is not None else self.name

    def dropped(self, problems: list[str]) -> DroppedTask:
        return DroppedTask(**self.model_dump(exclude_unset=True), problems=problems)


class DroppedTask(TaskRecord):
    """A task a check refused, with why."""

    code: str | None = None  # a variant that could not be drawn has none
    problems: list[str]


# ---- what the stages judged -------------------------------------------------------------------------------------

class SolutionRecord(_Closed):
    """One try of a teacher (`synth solve`, the slow teacher of `synth rewrite`) with its verdict. The writers set
    teacher, backend and reason too; the readers take hand-made files without them."""

    task: str
    teacher: str | None = None
    backend: str | None = None
    prompt: str | None = None  # LLM teachers: the prompt, the sample and its turn
    config: dict[str, Any] | None = None  # the slow teacher's Inductor configuration
    sample: int | None = None
    turn: int | None = None
    status: str
    reason: str | None = None
    kernels: list[str] | None = None
    code: str | None = None  # None: nothing to verify in the answer
    raw: str | None = None
    tokens: int | None = None
    finish_reason: str | None = None
    verdict: dict[str, Any] | None = None  # Verdict.to_dict(): the verifier's own schema


class MutantRecord(_Closed):
    """One mutant `synth repair` tried: kept (it fails, and became records) or dropped with why."""

    task: str
    solution: str
    operator: str
    seed: int
    mutant: str
    description: str
    code: str
    status: str
    reason: str
    kept: bool
    dropped: str | None
    verdict: dict[str, Any]


class _OfTask(_Closed):
    task: str


class RewritePair(_Pair, _OfTask):  # _OfTask last: its `task` comes first in the line, as the writer always put it
    """One slower -> fastest pair `synth rewrite` judged, kept or dropped with why."""

    kept: bool
    dropped: str | None
    slow_code: str
    fast_code: str


class ProfileRecord(_Profiled):
    """One program `synth profile` tried: its table, or why it has none."""

    # open: the profiling process's reply (verifier.protocol.ProfileReply) is written whole, its fields the protocol's
    model_config = ConfigDict(extra="allow")

    category: str | None = None
    bottleneck: str | None = None
    status: str
    reason: str
    sandbox: str
    rows: list[dict[str, Any]] | None = None  # with status ok: the reply's table and times
    wall_ms: float | None = None
    plain_ms: float | None = None
    device: str | None = None
    threads: int | None = None
    iterations: int


class QAAnswer(_Closed):
    """One question `synth qa` asked: kept (a qa record), dropped with why, or not answered."""

    task: str
    source: str
    template: str
    sample: int
    question: str
    teacher: str
    backend: str
    seed: int
    kept: bool
    dropped: str | None
    reason: str | None = None
    answer: str | None = None
    finish_reason: str | None = None


def _judged(v) -> str:
    if not isinstance(v, dict):
        return type(v).__name__
    return "RewritePair" if "slow_code" in v else "QAAnswer" if "question" in v else "MutantRecord"


# mutants.jsonl, rewrite_pairs.jsonl and qa_answers.jsonl: every item a stage judged, kept or dropped; told apart by
# their fields, so that a malformed line is reported against its own kind
JUDGED = TypeAdapter(Annotated[Union[Annotated[MutantRecord, Tag("MutantRecord")],
                                     Annotated[RewritePair, Tag("RewritePair")],
                                     Annotated[QAAnswer, Tag("QAAnswer")]], Discriminator(_judged)])
