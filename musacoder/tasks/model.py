"""A task is KernelBench-format source: `class Model`, `get_inputs()`, `get_init_inputs()`."""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass, field

from musacoder.pyast import parse


class TaskLoadError(ValueError):
    """A task that cannot be used; the message names the task."""


REQUIRED = ("Model", "get_inputs", "get_init_inputs")


@dataclass(frozen=True)
class Task:
    name: str  # e.g. "19_ReLU"
    code: str
    level: int | None = None
    problem_id: int | None = None
    source: str = ""  # where it was loaded from, for error messages
    metadata: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        """Stable id: 'level1/19_ReLU' when the level is known."""
        return f"level{self.level}/{self.name}" if self.level is not None else self.name

    @property
    def code_hash(self) -> str:
        return hashlib.sha256(self.code.encode()).hexdigest()[:16]

    def validate(self) -> Task:
        """Cheap syntactic check that the source defines what a task needs (no execution)."""
        try:
            tree = parse(self.code)
        except SyntaxError as e:
            raise TaskLoadError(f"task {self.key} ({self.source}): syntax error line {e.lineno}: {e.msg}") from e
        names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
        missing = [r for r in REQUIRED if r not in names]
        if missing:
            raise TaskLoadError(f"task {self.key} ({self.source}): missing {', '.join(missing)}")
        return self
