"""`musacoder synth tasks`: generated operator-graph tasks, each checked (clean.py), kept ones written as KernelBench
JSONL records with their provenance and operator families, dropped ones with the reason. Appends and resumes: a seed
already in either file is not generated again. `write_checked` is the writer harvested modules (harvest.py) share."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from musacoder.synth.clean import TaskReport, check_task
from musacoder.synth.graphs import GraphSpec, generate, render, task_name

DROPPED = "dropped.jsonl"


def recorded(path: Path, key: Callable[[dict], object]) -> set:
    """key(record) of every complete line of a JSONL file (the resume point of an appending run)."""
    if not path.exists():
        return set()
    seen = set()
    for line in path.read_text().splitlines():
        try:
            seen.add(key(json.loads(line)))
        except (ValueError, KeyError, TypeError):  # a line cut by an interrupted run: redone
            continue
    return seen


def _seed(rec: dict) -> int:
    return int(rec["metadata"]["seed"])


def done_keys(out: Path, key: Callable[[dict], object]) -> set:
    """key(record) of what an earlier run kept in `out` or dropped beside it."""
    return recorded(out, key) | recorded(out.with_name(DROPPED), key)


def write_checked(out: Path, todo: list, make: Callable[[object], dict], check: Callable[[str], TaskReport],
                  progress: Callable[[int, int], None] | None = None) -> dict:
    """make(item) -> a record ({name, problem_id, level, code, metadata}); check(code) decides: kept ones are appended
    to `out`, the others to dropped.jsonl beside it with their problems. A record that comes with `problems` already
    (not built) is dropped unchecked. Returns counts, per metadata source (or generator) too."""
    out.parent.mkdir(parents=True, exist_ok=True)
    kept, reasons, families, sources = 0, Counter(), Counter(), {}
    with open(out, "a") as keep, open(out.with_name(DROPPED), "a") as drop:
        for i, item in enumerate(todo):
            rec = make(item)
            meta = rec["metadata"]
            problems = rec.pop("problems", None)
            if problems is None:
                rep = check(rec["code"])
                meta.update(aten_ops=rep.aten_ops, families=rep.families)
                problems = rep.problems
            tally = sources.setdefault(meta.get("source", meta["generator"]), Counter())
            if not problems:
                keep.write(json.dumps(rec) + "\n")
                kept += 1
                families.update(meta["families"])
                tally["kept"] += 1
            else:
                drop.write(json.dumps({**rec, "problems": problems}) + "\n")
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
    done = done_keys(out, _seed)
    todo = [s for s in range(seed, seed + n) if s not in done]

    def make(s: int) -> dict:
        g = generate(s, spec)
        meta = {"seed": s, "generator": "graphs", "spec": asdict(spec), "ops": g.ops}
        return {"name": task_name(g), "problem_id": s, "level": None, "code": render(g), "metadata": meta}

    summary = write_checked(out, todo, make, lambda code: check_task(code, check_scale), progress)
    return {**summary, "skipped_existing": n - len(todo)}
