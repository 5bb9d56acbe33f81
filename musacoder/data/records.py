"""Training records: the chat-format JSONL schema, its validation, reading and writing (`train.data` mixes them).

One record a line:

    {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...],
     "kind": "generation",            # optional, one of KINDS (default "generation")
     "task": "level1/19_ReLU",        # optional task id
     "metadata": {...}}               # optional; "pool" and "cluster" have a meaning (train/data.py)

A malformed line never stops a load: it becomes a `Problem` naming `file:line`, and every other line is kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("generation", "reviewer", "profiling", "qa", "rewrite", "repair")
ROLES = ("system", "user", "assistant")
_FIELDS = {"messages", "kind", "task", "metadata"}


class RecordError(ValueError):
    """A record that breaks the format (or cannot be tokenised); the message says why."""


class DataError(ValueError):
    """A data source that cannot be used at all (missing file, bad weight, nothing left to train on)."""


@dataclass
class Record:
    messages: list[dict]
    kind: str = "generation"
    task: str | None = None
    metadata: dict = field(default_factory=dict)
    origin: str = ""  # "file:line", for reports; not written out

    def to_dict(self) -> dict:
        return {"messages": self.messages, "kind": self.kind, "task": self.task, "metadata": self.metadata}

    @property
    def pool(self) -> str | None:
        return self.metadata.get("pool")


@dataclass(frozen=True)
class Problem:
    origin: str  # "file:line"
    message: str

    def __str__(self) -> str:
        return f"{self.origin}: {self.message}"


@dataclass
class Source:
    path: str  # a .jsonl file or a directory of them
    # Items drawn per item of the source: 2 repeats each, 0.5 keeps a random half. Repeated pools draw anew.
    weight: float = 1.0

    @classmethod
    def coerce(cls, s: Source | str | Path | dict) -> Source:
        if isinstance(s, Source):
            return s
        if isinstance(s, dict):
            return cls(**s)
        return cls(str(s))


def validate(obj) -> Record:
    """A Record from one decoded JSON value, or RecordError saying what is wrong."""
    if not isinstance(obj, dict):
        raise RecordError(f"a record is a JSON object, not {type(obj).__name__}")
    if unknown := set(obj) - _FIELDS:
        raise RecordError(f"unknown field(s) {sorted(unknown)}; a record has {sorted(_FIELDS)}")
    msgs = obj.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RecordError("'messages' must be a non-empty list")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or set(m) - {"role", "content"} or not isinstance(m.get("content"), str):
            raise RecordError(f"message {i} must be {{'role': ..., 'content': str}}, got {str(m)[:80]!r}")
        if m.get("role") not in ROLES:
            raise RecordError(f"message {i} has role {m.get('role')!r}; roles are {', '.join(ROLES)}")
    first = 1 if msgs[0]["role"] == "system" else 0
    turns = msgs[first:]
    for i, m in enumerate(turns):
        want = "user" if i % 2 == 0 else "assistant"
        if m["role"] != want:
            raise RecordError(f"message {first + i} is {m['role']!r}, expected {want!r}: after an optional system "
                              "message, user and assistant turns alternate, starting with user")
    if len(turns) < 2 or turns[-1]["role"] != "assistant":
        raise RecordError("the last message must be an assistant turn (the one trained on)")
    if not turns[-1]["content"].strip():
        raise RecordError("the last assistant turn is empty")
    kind = obj.get("kind", "generation")
    if kind not in KINDS:
        raise RecordError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    task = obj.get("task")
    if task is not None and not isinstance(task, str):
        raise RecordError("'task' must be a string or null")
    meta = obj.get("metadata", {})
    if not isinstance(meta, dict):
        raise RecordError("'metadata' must be an object")
    if "pool" in meta and not isinstance(meta["pool"], str):
        raise RecordError("metadata 'pool' must be a string")
    return Record([dict(m) for m in msgs], kind, task, meta)


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(path.rglob("*.jsonl"))
    if path.is_file():
        return [path]
    raise DataError(f"data source {path} does not exist")


def load_source(source: Source | str | Path | dict) -> tuple[list[Record], list[Problem]]:
    """All valid records of one source, and a Problem for every line that is not one."""
    src = Source.coerce(source)
    records, problems = [], []
    for f in _files(Path(src.path)):
        with open(f, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                origin = f"{f}:{n}"
                try:
                    rec = validate(json.loads(line.strip()))
                except json.JSONDecodeError as e:
                    problems.append(Problem(origin, f"not valid JSON: {e}"))
                    continue
                except RecordError as e:
                    problems.append(Problem(origin, str(e)))
                    continue
                rec.origin = origin
                records.append(rec)
    return records, problems


def load_records(paths_or_sources: Iterable[Source | str | Path | dict] | Source | str | Path
                 ) -> tuple[list[Record], list[Problem]]:
    """Records of every source in order, and the problems found; weights are not applied (see `mix`)."""
    if isinstance(paths_or_sources, (str, Path, Source, dict)):
        paths_or_sources = [paths_or_sources]
    records, problems = [], []
    for s in paths_or_sources:
        r, p = load_source(s)
        records += r
        problems += p
    return records, problems


def write_records(path: str | Path, records: Iterable[Record | dict]) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r.to_dict() if isinstance(r, Record) else r) + "\n")
            n += 1
    return n
