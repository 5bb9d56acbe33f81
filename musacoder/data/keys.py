"""The facts of a task text that dedupe, split, twin search and the retrieval baseline group by: its traced op graph
(at any rank), op sequence, canonical program and operator families, computed once per distinct text."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from musacoder.data.decontam import TraceError, canonical_hash, task_code, trace_task
from musacoder.data.opgraph import families_of


@dataclass(frozen=True)
class Facts:
    graph: str | None  # None: the task could not be traced (see problem)
    sequence: str | None
    ast: str | None
    ranks: tuple
    families: tuple[str, ...]
    problem: str = ""


def ops_of(record: dict) -> str | None:
    """The generator's op sequence (`synth tasks` writes metadata.ops) as the task's name shows it, a repeated op
    once (`transpose -> transpose` is `transpose`), e.g. 'relu -> bias_add'; None without."""
    ops = (record.get("metadata") or {}).get("ops")
    return " -> ".join(dict.fromkeys(map(str, ops))) if isinstance(ops, list) and ops else None


class Keys:
    """The facts of each distinct task text, computed once (a trace on the meta device, the canonical program)."""

    def __init__(self, max_trace_ops: int = 4096):
        self.max_trace_ops = max_trace_ops
        self._cache: dict[str, Facts] = {}

    def facts(self, code: str) -> Facts:
        h = hashlib.sha256(code.encode()).hexdigest()
        if h not in self._cache:
            self._cache[h] = self._compute(code)
        return self._cache[h]

    def _compute(self, code: str) -> Facts:
        try:
            ast_key = canonical_hash(code)
        except SyntaxError as e:
            return Facts(None, None, None, (), (), f"SyntaxError: {e}")
        try:
            tr = trace_task(code, self.max_trace_ops)
        except TraceError as e:
            return Facts(None, None, ast_key, (), (), str(e))
        fams = families_of(["aten::" + op.split("[")[0] for op in tr.ops])
        return Facts(tr.signature, tr.sequence_signature, ast_key, tr.input_ranks, tuple(fams))

    def key(self, record: dict, by: str) -> str | None:
        """The record's `graph` or `ops` key; None when it has none (no task, untraceable, no metadata.ops)."""
        if by == "ops":
            return ops_of(record)
        code = task_code(record)
        return None if code is None else self.facts(code).graph

    def families(self, record: dict) -> tuple[str, ...]:
        """The record's operator families: its metadata's (synth writes them), else the traced ones."""
        fams = (record.get("metadata") or {}).get("families")
        if isinstance(fams, list) and fams:
            return tuple(map(str, fams))
        code = task_code(record)
        return () if code is None else self.facts(code).families
