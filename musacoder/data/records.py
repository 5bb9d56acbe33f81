"""Training records: the chat-format JSONL schema, its validation, reading and writing (`train.data` mixes them).

One record a line:

    {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...],
     "kind": "generation",            # optional, one of KINDS (default "generation")
     "task": "level1/19_ReLU",        # optional task id
     "metadata": {...}}               # optional; "pool" and "cluster" have a meaning (train/data.py)

A malformed line never stops a load: it becomes a `Problem` naming `file:line`, and every other line is kept. The
schema is `schema.TrainingRecord`; `validate` says what is wrong in the loader's own words.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from musacoder.data.schema import KINDS, ROLES, TrainingRecord, brief, parse


class RecordError(ValueError):
    """A record that breaks the format (or cannot be tokenised); the message says why."""


class DataError(ValueError):
    """A data source that cannot be used at all (missing file, bad weight, nothing left to train on)."""


@dataclass
class Record:
    """A TrainingRecord as training holds it (`validate` makes one), with where it came from."""

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


def validated(model: type[TrainingRecord], obj) -> TrainingRecord:
    """obj as `model` (TrainingRecord, or one of the synth kinds of data/schema.py), or RecordError saying why not."""
    try:
        return parse(model, obj)
    except ValidationError as e:
        raise RecordError(_why(e, obj)) from None


def validate(obj) -> Record:
    """A Record from one decoded JSON value, or RecordError saying what is wrong."""
    rec = validated(TrainingRecord, obj)
    return Record([m.model_dump() for m in rec.messages], rec.kind, rec.task, rec.metadata)


_FIELD_WHY = {"messages": "'messages' must be a non-empty list", "task": "'task' must be a string or null",
              "metadata": "'metadata' must be an object"}


def _why(e: ValidationError, obj) -> str:
    """The first problem of a refused record, said as users of the loader have always read it."""
    errors = e.errors()
    if unknown := sorted(str(x["loc"][0]) for x in errors if x["type"] == "extra_forbidden" and len(x["loc"]) == 1):
        return f"unknown field(s) {unknown}; a record has {sorted(TrainingRecord.model_fields)}"
    err = errors[0]
    loc = err["loc"]
    if err["type"] == "value_error":  # the turns, metadata's pool: the validator's own words
        return str(err["ctx"]["error"])
    if not loc:
        return f"a record is a JSON object, not {type(obj).__name__}"
    if loc[0] == "messages" and len(loc) > 1:
        i, m = loc[1], obj["messages"][loc[1]]
        if all(x["loc"][2:] == ("role",) for x in errors if x["loc"][:2] == ("messages", i)):
            return f"message {i} has role {m.get('role')!r}; roles are {', '.join(ROLES)}"
        return f"message {i} must be {{'role': ..., 'content': str}}, got {str(m)[:80]!r}"
    if loc == ("kind",):
        return f"kind {obj['kind']!r} is not one of {', '.join(KINDS)}"
    return _FIELD_WHY[loc[0]] if len(loc) == 1 and loc[0] in _FIELD_WHY else brief(e)


def data_files(path: Path) -> list[Path]:
    """A source's .jsonl files: the file, or those under the directory."""
    if path.is_dir():
        return sorted(path.rglob("*.jsonl"))
    if path.is_file():
        return [path]
    raise DataError(f"data source {path} does not exist")


def load_source(source: Source | str | Path | dict) -> tuple[list[Record], list[Problem]]:
    """All valid records of one source, and a Problem for every line that is not one."""
    src = Source.coerce(source)
    records, problems = [], []
    for f in data_files(Path(src.path)):
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
