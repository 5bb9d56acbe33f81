"""`musacoder synth tasks`: generated operator-graph tasks, each checked (clean.py), kept ones written as KernelBench
JSONL records with their provenance and operator families, dropped ones with the reason. Appends and resumes: a seed
already in either file is not generated again."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from musacoder.synth.clean import check_task
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


def synth_tasks(out: Path, n: int, seed: int = 0, spec: GraphSpec | None = None, check_scale: float = 1.0,
                progress: Callable[[int, int], None] | None = None) -> dict:
    """Generate seeds seed..seed+n-1 into `out` (kept) and `out`'s sibling dropped.jsonl; return the summary."""
    spec = spec or GraphSpec()
    out.parent.mkdir(parents=True, exist_ok=True)
    dropped_path = out.with_name(DROPPED)
    done = recorded(out, _seed) | recorded(dropped_path, _seed)
    todo = [s for s in range(seed, seed + n) if s not in done]
    kept, reasons, families = 0, Counter(), Counter()
    with open(out, "a") as keep, open(dropped_path, "a") as drop:
        for i, s in enumerate(todo):
            g = generate(s, spec)
            code = render(g)
            rep = check_task(code, check_scale)
            meta = {"seed": s, "generator": "graphs", "spec": asdict(spec), "ops": g.ops,
                    "aten_ops": rep.aten_ops, "families": rep.families}
            rec = {"name": task_name(g), "problem_id": s, "level": None, "code": code, "metadata": meta}
            if rep.ok:
                keep.write(json.dumps(rec) + "\n")
                kept += 1
                families.update(rep.families)
            else:
                drop.write(json.dumps({**rec, "problems": rep.problems}) + "\n")
                reasons.update(p.split(":")[0] for p in rep.problems)
            keep.flush()
            drop.flush()
            if progress:
                progress(i + 1, len(todo))
    return {"generated": len(todo), "skipped_existing": n - len(todo), "kept": kept,
            "dropped": dict(reasons.most_common()), "families": dict(families.most_common())}
