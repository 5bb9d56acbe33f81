"""The shipped example candidates (honest and exploits) and what the verifier must say about each."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

EXAMPLES_DIR = Path(__file__).parent / "examples"
# The MUSA backends have no examples of their own: they get the CUDA ones translated c2m (musa-on-cuda gives them the
# CUDA verdicts, tested on an H100; on MUSA hardware that is the expectation, never run).
MUSA_BACKENDS = ("musa", "musa-on-cuda")


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
    def code(self) -> str:
        """The candidate as its backend receives it: the file's text, in MUSA dialect for the MUSA backends."""
        text = self.path.read_text()
        if self.backend in MUSA_BACKENDS:
            from musacoder.musa.translate import C2M, translate

            text = translate(text, C2M).text
        return text

    @property
    def name(self) -> str:
        return Path(self.file).stem

    @property
    def accepted(self) -> tuple[str, ...]:
        """The statuses that match `expect`: a timed exploit (`ok_timed`) is caught or not depending on timing; "a|b"
        where two refusals race (which of two rules sees it first)."""
        return ("ok", "incorrect") if self.expect == "ok_timed" else tuple(self.expect.split("|"))

    def reason_matches(self, reason: str) -> bool:
        """Whether a verdict's reason says what `reason` does (one of "a|b")."""
        return any(part.lower() in reason.lower() for part in self.reason.split("|"))


def load_catalog(backend: str | None = None) -> list[Example]:
    entries = json.loads((EXAMPLES_DIR / "catalog.json").read_text())
    fields = Example.__dataclass_fields__
    out = [Example(**{k: e.get(k) for k in fields}) for e in entries]
    if backend in MUSA_BACKENDS:
        return [replace(e, backend=backend) for e in out if e.backend == "cuda"]
    return [e for e in out if backend is None or e.backend == backend]


def tour(examples: list[Example]) -> list[Example]:
    """A representative share, in catalog order: the first honest kernel of each task and the first exploit of each
    threat class (`demo`'s default: a cold first run builds a third as many extensions as the whole catalog)."""
    seen, out = set(), []
    for e in examples:
        key = ("task", e.task) if e.honest else ("threat", e.threat)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out
