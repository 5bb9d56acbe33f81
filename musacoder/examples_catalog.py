"""The shipped example candidates (honest and exploits) and what the verifier must say about each."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

EXAMPLES_DIR = Path(__file__).parent / "examples"


@dataclass(frozen=True)
class Example:
    file: str
    task: str
    backend: str
    honest: bool
    threat: int | None
    expect: str
    reason: str
    description: str

    @property
    def path(self) -> Path:
        return EXAMPLES_DIR / self.file

    @property
    def name(self) -> str:
        return Path(self.file).stem

    @property
    def accepted(self) -> tuple[str, ...]:
        """The statuses that match `expect`: a timed exploit (`ok_timed`) is caught or not depending on timing."""
        return ("ok", "incorrect") if self.expect == "ok_timed" else (self.expect,)


def load_catalog(backend: str | None = None) -> list[Example]:
    entries = json.loads((EXAMPLES_DIR / "catalog.json").read_text())
    fields = Example.__dataclass_fields__
    out = [Example(**{k: e.get(k) for k in fields}) for e in entries]
    return [e for e in out if backend is None or e.backend == backend]
