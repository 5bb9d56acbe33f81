"""`musacoder synth tasks`: generated operator-graph tasks, each checked (clean.py), kept ones written as KernelBench
JSONL records with their provenance and operator families, dropped ones with the reason. Appends and resumes: a seed
already in either file is not generated again. `write_checked` is the writer harvested modules (harvest.py) share."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from musacoder.data.schema import DroppedTask, TaskMeta, TaskRecord, line, parse
from musacoder.synth.clean import TaskReport, check_task
from musacoder.synth.graphs import GraphSpec, generate, render, task_name

DROPPED = "dropped.jsonl"


def recorded(path: Path, kind, key: Callable) -> set:
    """key(record) of every line of a JSONL file that parses as `kind` (data/schema.py): the resume point of an
    appending run."""
    if not path.exists():
        return set()
    seen = set()
    for text in path.read_text().splitlines():
        try:
            seen.add(key(parse(kind, json.loads(text))))
        except ValueError:  # a line cut by an interrupted run (or not such a record): redone
            continue
    return seen


def done_keys(out: Path, key: Callable[[TaskRecord], object]) -> set:
    """key(record) of what an earlier run kept in `out` or dropped beside it."""
    return recorded(out, TaskRecord, key) | recorded(out.with_name(DROPPED), DroppedTask, key)


def write_checked(out: Path, todo: list, make: Callable[[object], TaskRecord], check: Callable[[str], TaskReport],
                  progress: Callable[[int, int], None] | None = None) -> dict:
    """make(item) -> a task record; check(code) decides: kept ones are appended to `out`, the others to dropped.jsonl
    beside it with their problems. A DroppedTask (not built) is dropped unchecked. Returns counts, per metadata
    source (or generator) too."""
    out.parent.mkdir(parents=True, exist_ok=True)
    kept, reasons, families, sources = 0, Counter(), Counter(), {}
    with open(out, "a") as keep, open(out.with_name(DROPPED), "a") as drop:
        for i, item in enumerate(todo):
            rec = make(item)
            meta = rec.metadata
            if isinstance(rec, DroppedTask):
                problems = rec.problems
            else:
                rep = check(rec.code)
                meta.aten_ops, meta.families = rep.aten_ops, rep.families
                problems = rep.problems
            tally = sources.setdefault(meta.source or meta.generator, Counter())
            if not problems:
                keep.write(line(rec))
                kept += 1
                families.update(meta.families)
                tally["kept"] += 1
            else:
                drop.write(line(rec if isinstance(rec, DroppedTask) else rec.dropped(problems)))
                reasons.update(p.split(":")[0] for p in problems)
                tally["dropped"] += 1
            keep.flush()
            drop.flush()
            if progress:
                progress(i + 1, len(todo))
    return {"generated": len(todo), "kept": kept, "dropped": dict(reasons.most_common()),
            "families": dict(families.most_common()), "sources": {k: dict(v) for k, v in sources.items()}}


def synth_tasks(out: Path, n: int, seed: int = 0, spec: GraphSpec | None = None, check_scale: float = 1.0,
                progress: Callable[[int, int], None] | None = None) -> dict:
    """Generate seeds seed..seed+n-1 into `out` (kept) and `out`'s sibling dropped.jsonl; return the summary."""
    spec = spec or GraphSpec()
    done = done_keys(out, lambda r: r.metadata.seed)
    todo = [s for s in range(seed, seed + n) if s not in done]

    def make(s: int) -> TaskRecord:
        g = generate(s, spec)
        return TaskRecord(name=task_name(g), problem_id=s, level=None, code=render(g),
                          metadata=TaskMeta(seed=s, generator="graphs", spec=asdict(spec), ops=g.ops))

    summary = write_checked(out, todo, make, lambda code: check_task(code, check_scale), progress)
    return {**summary, "skipped_existing": n - len(todo)}
