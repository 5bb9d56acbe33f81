"""The fixed set of verdict statuses and the JSON-serialisable Verdict."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum


class Status(str, Enum):
    OK = "ok"
    FORMAT_ERROR = "format_error"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    INCORRECT = "incorrect"
    ILLEGAL = "illegal"
    TIMEOUT = "timeout"
    INFRA_ERROR = "infra_error"


@dataclass
class Verdict:
    status: Status
    reason: str
    task: str = ""
    backend: str = ""
    candidate_hash: str = ""
    correctness: float = 0.0  # q: fraction of correctness trials passed
    trials_passed: int = 0
    trials_total: int = 0
    max_abs_err: float | None = None
    mean_abs_err: float | None = None
    error_where: str | None = None
    illegal_ops: list[str] = field(default_factory=list)
    ops_seen: dict[str, int] = field(default_factory=dict)
    kernel_launches: int | None = None
    kernel_time_share: float | None = None
    candidate_ms: float | None = None
    eager_ms: float | None = None
    compile_ms: float | None = None
    timing_rse: float | None = None
    timing_reps: int | None = None
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    sol_ms: float | None = None
    sol_flag: bool = False
    reward: float = -1.0
    feedback: str = ""
    compile_log: str = ""
    stage_seconds: dict[str, float] = field(default_factory=dict)
    device: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    details: dict = field(default_factory=dict)
    emulated: bool = False  # another platform's code verified here after translation (musa-on-cuda)
    portability: list[str] = field(default_factory=list)  # MUSA portability findings, checked before compiling

    @property
    def passed(self) -> bool:
        return self.status is Status.OK

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict) -> Verdict:
        d = dict(d)
        d["status"] = Status(d["status"])
        return cls(**d)
