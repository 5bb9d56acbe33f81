"""`synth twins`: how held out an evaluation set is from a training set, task by task.

For every eval task, the training records that are its twin by each key of synth/heldout.py: the same computation
(`graph`, the `opgraph` detector), the same program (`ast`), the same generator op sequence (`ops`: at the same
input rank or at another one), and the former rank-keyed sequence (`sequence`), which shows what keying on ranks
let through; and the nearest training task's text: the exact Jaccard of normalised-code shingles (the `minhash`
detector's measure) and, for that nearest task, difflib's character ratio. The eval set is then split into the
tasks with a same-computation twin and those without, written as task files to bench separately.
"""

from __future__ import annotations

import difflib
import statistics
from dataclasses import dataclass
from pathlib import Path

from musacoder.data.decontam import record_name, task_code, task_shingles
from musacoder.data.diversity import jaccard
from musacoder.data.keys import Keys, ops_of

DETECTORS = ("graph", "ast", "ops", "ops_other_rank", "sequence")
WHY = {"graph": "the same computation at any rank, size or spelling (canonical op graph: the opgraph detector)",
       "ast": "the same program up to names, comments and formatting (the ast detector)",
       "ops": "the same generator op sequence (metadata.ops), any input rank",
       "ops_other_rank": "the same generator op sequence at another input rank",
       "sequence": "the former opgraph key: the aten op sequence over the same input ranks"}


@dataclass
class EvalSet:
    name: str  # the source as given
    records: list[dict]  # task records (code, name, level, problem_id, metadata)


def eval_records(source: str) -> list[dict]:
    """Task records of any task source `select_tasks` reads; a JSONL file's own records, so metadata.ops stays."""
    from musacoder.synth.heldout import read_records
    from musacoder.tasks.select import select_tasks

    path = Path(source)
    if path.suffix == ".jsonl" and path.is_file():
        select_tasks(path)  # the loader's checks: a record without code is an error naming it
        return read_records(path)
    return [{"name": t.name, "level": t.level, "problem_id": t.problem_id, "code": t.code, "metadata": t.metadata}
            for t in select_tasks(None if source == "builtin" and not path.exists() else path)]


def task_key(rec: dict, i: int) -> str:
    level = rec.get("level")
    name = record_name(rec, i)
    return f"level{level}/{name}" if level is not None else name


def analyse(train: list[dict], evals: list[EvalSet], keys: Keys, shown: int = 5) -> dict:
    """The twins of every eval task among `train` (task or SFT records), and per eval set the counts."""
    index: dict[str, dict[str, list[str]]] = {d: {} for d in DETECTORS if d != "ops_other_rank"}
    rank_of_ops: dict[str, set] = {}
    shingle_sets, codes, names = [], [], []
    untraced = 0
    for i, rec in enumerate(train):
        code = task_code(rec)
        if code is None:
            continue
        f = keys.facts(code)
        untraced += f.graph is None
        name = record_name(rec, i)
        for d, k in (("graph", f.graph), ("ast", f.ast), ("sequence", f.sequence), ("ops", ops_of(rec))):
            if k is not None:
                index[d].setdefault(k, []).append(name)
        if (o := ops_of(rec)) is not None:
            rank_of_ops.setdefault(o, set()).add(f.ranks)
        shingle_sets.append(task_shingles(code))
        codes.append(code)
        names.append(name)
    sets = []
    for es in evals:
        rows = []
        for i, rec in enumerate(es.records):
            f = keys.facts(rec["code"])
            o = ops_of(rec)
            twins = {d: index[d].get(k, []) if k is not None else []
                     for d, k in (("graph", f.graph), ("ast", f.ast), ("sequence", f.sequence), ("ops", o))}
            other = sorted(map(str, rank_of_ops.get(o, set()) - {f.ranks})) if o is not None else []
            sh = task_shingles(rec["code"])
            sims = [jaccard(sh, other) for other in shingle_sets]
            best = max(range(len(sims)), key=sims.__getitem__, default=None)
            nearest = None
            if best is not None:
                nearest = {"name": names[best], "jaccard": round(sims[best], 4),
                           "ratio": round(difflib.SequenceMatcher(None, rec["code"], codes[best]).ratio(), 4)}
            rows.append({"task": task_key(rec, i), "ops": o, "single_op": o is not None and " -> " not in o,
                         "ranks": list(f.ranks), "problem": f.problem,
                         "twins": {d: {"count": len(v), "first": v[:shown]} for d, v in twins.items()},
                         "ops_other_rank": other, "nearest": nearest})
        sets.append({"eval": es.name, "tasks": len(rows), "summary": _summary(rows), "rows": rows})
    return {"train_records": len(train), "train_tasks": len(codes), "train_untraced": untraced,
            "detectors": WHY, "sets": sets}


def _summary(rows: list[dict]) -> dict:
    def has(r, d):
        return bool(r["ops_other_rank"]) if d == "ops_other_rank" else r["twins"][d]["count"] > 0

    with_twin = {d: sum(has(r, d) for r in rows) for d in DETECTORS}
    single = [r for r in rows if r["single_op"]]
    jac = [r["nearest"]["jaccard"] for r in rows if r["nearest"]]
    ratio = [r["nearest"]["ratio"] for r in rows if r["nearest"]]
    missed = sum(has(r, "graph") and not has(r, "sequence") for r in rows)
    return {"with_twin": with_twin, "single_op": len(single),
            "single_op_with_graph_twin": sum(has(r, "graph") for r in single),
            "graph_twin_missed_by_sequence_key": missed,
            "untraced": sum(bool(r["problem"]) for r in rows),
            "nearest_jaccard_median": statistics.median(jac) if jac else None,
            "nearest_ratio_median": statistics.median(ratio) if ratio else None}


def markdown(report: dict) -> str:
    lines = ["# Eval twins in training data", "",
             f"{report['train_records']} training records ({report['train_tasks']} with a task, "
             f"{report['train_untraced']} of them not traceable).", ""]
    lines += [f"- `{d}`: {why}" for d, why in report["detectors"].items()]
    for s in report["sets"]:
        sm = s["summary"]
        lines += ["", f"## {s['eval']}: {s['tasks']} tasks", "", "| twin by | eval tasks with a twin |", "|---|---:|"]
        lines += [f"| `{d}` | {n} of {s['tasks']} |" for d, n in sm["with_twin"].items()]
        lines += ["", f"Single-op tasks (by metadata.ops): {sm['single_op']}, with a same-computation twin: "
                  f"{sm['single_op_with_graph_twin']}. Same-computation twins the rank-keyed sequence missed: "
                  f"{sm['graph_twin_missed_by_sequence_key']}. Not traceable: {sm['untraced']}.",
                  f"Nearest training task by text: median shingle Jaccard {_num(sm['nearest_jaccard_median'])}, "
                  f"median character ratio {_num(sm['nearest_ratio_median'])}.", "",
                  "| eval task | ops | graph twins | ast | ops (other rank) | nearest (Jaccard, ratio) |",
                  "|---|---|---:|---:|---|---|"]
        for r in s["rows"]:
            t = r["twins"]
            near = r["nearest"]
            lines.append(f"| {r['task']} | {r['ops'] or '-'} | {t['graph']['count']} | {t['ast']['count']} | "
                         f"{t['ops']['count']}" + (f" ({', '.join(r['ops_other_rank'])})" if r["ops_other_rank"]
                                                   else "")
                         + (f" | {near['name']} ({near['jaccard']:.2f}, {near['ratio']:.2f}) |" if near else " | - |"))
    return "\n".join(lines) + "\n"


def _num(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def split_by_twin(es: EvalSet, rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(eval records with a same-computation or same-program twin in training, those without)."""
    twin = [rec for rec, r in zip(es.records, rows) if r["twins"]["graph"]["count"] or r["twins"]["ast"]["count"]]
    alone = [rec for rec, r in zip(es.records, rows)
             if not (r["twins"]["graph"]["count"] or r["twins"]["ast"]["count"])]
    return twin, alone


def counts_line(report: dict) -> list[str]:
    out = []
    for s in report["sets"]:
        w = s["summary"]["with_twin"]
        out.append(f"{s['eval']}: {s['tasks']} tasks; with a training twin: " + ", ".join(
            f"{d} {n}" for d, n in w.items()) + f"; nearest text Jaccard median "
            f"{_num(s['summary']['nearest_jaccard_median'])}")
    return out
