"""`musacoder synth card`: a data card of what the synth stages wrote, computed from their files alone.

Every *.jsonl under the given directories is read and recognised by its records, not by its name (files added later
are counted too): task records (`synth tasks`, `synth variants`), dropped tasks (`problems`), solutions (task,
teacher, status: every try of `synth solve` with its verdict), judged items (`kept` and `dropped`: mutants.jsonl,
rewrite_pairs.jsonl, qa_answers.jsonl) and training records (`messages`, checked by `data.records.validate` as
training will read them, counted by `kind`). A line is parsed as the data/schema.py model of the kind its fields
name. decontam_report.json files are read as `synth decontam` writes them; the kept copy beside a report is counted
under decontam only when its input is read too. A file name serves only when a file has no
readable record (an empty dropped.jsonl is still the tasks stage's).

With eval sets (`--eval`), the card also says how many of its training records and tasks are eval twins: the same
computation at any rank, size or spelling (the canonical op graph of data/opgraph.py) or the same program as an
eval task, and which eval tasks they copy (synth/heldout.py's keys, as `synth twins` and SFT's refusal use them).

A line that is not read is counted with its reason, never raised: a line cut by an interrupted run (the last line
without its newline, or a cut line a later run appended its next record to, as `tasks.recorded` skips them), a line
that is not JSON, a malformed record (a field missing or of the wrong type), a record unlike the rest of its file, a
training record training would refuse. A file a stage always writes beside another (sft.jsonl beside solutions.jsonl)
is reported when it is not there.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from musacoder.bench.report import _cell, _table, pct
from musacoder.data.records import Record, RecordError, validate
from musacoder.data.schema import JUDGED, DroppedTask, MutantRecord, SolutionRecord, TaskRecord, brief, parse
from musacoder.synth.repair import MUTANTS, REPAIR, REVIEWER
from musacoder.synth.solve import NO_PROMPT, SFT, SOLUTIONS
from musacoder.synth.tasks import DROPPED
from musacoder.synth.variants import dropped_path

REPORT = "decontam_report.json"  # the name `synth decontam` gives its report
CUT = "cut by an interrupted run"
NOT_JSON = "not JSON"
NO_CANDIDATE = {"no_solution", NO_PROMPT}  # solve recorded the task without anything to verify
ROLES = {"tasks": "tasks", "dropped": "dropped tasks", "solutions": "solutions", "judged": "judged items",
         "sft": "training records", "decontam": "decontam report"}
BY_NAME = {SOLUTIONS: "solutions", SFT: "sft", REPAIR: "sft", REVIEWER: "sft", MUTANTS: "judged", DROPPED: "dropped",
           REPORT: "decontam"}
# files a stage always writes together: a missing one means a run was moved, cut short or cleaned by hand
SIBLINGS = {SOLUTIONS: ((SFT, "synth solve writes it beside solutions.jsonl"),),
            SFT: ((SOLUTIONS, "synth solve writes it beside sft.jsonl; without it the card has no verifier pass "
                              "rates for these records"),),
            MUTANTS: ((REPAIR, "synth repair writes it beside mutants.jsonl"),
                      (REVIEWER, "synth repair writes it beside mutants.jsonl")),
            REPAIR: ((MUTANTS, "synth repair writes it beside repair.jsonl"),),
            REVIEWER: ((MUTANTS, "synth repair writes it beside reviewer.jsonl"),)}
UNKNOWN = "not recorded"
# what a line is parsed as once its fields say which role it has (training records: `validate`, as training reads them)
MODELS = {"tasks": TaskRecord, "dropped": DroppedTask, "solutions": SolutionRecord, "judged": JUDGED}
SHOWN = 20  # lines of a long list shown in card.md (the JSON has them all)


class CardError(ValueError):
    """A given path that does not exist or holds nothing the card can read."""


@dataclass
class Scan:
    """One file: what it was read as, its records (slimmed to what the card counts) and the lines not read."""

    path: Path
    role: str = "unknown"
    lines: int = 0
    records: list[dict] = field(default_factory=list)
    problems: Counter = field(default_factory=Counter)  # why a line was not read -> lines
    first: dict[str, int] = field(default_factory=dict)  # why -> first such line
    report: dict | None = None  # decontam report
    copy_of: str | None = None  # the decontam input this file is the kept copy of (counted under decontam only)

    def bad(self, line: int, why: str) -> None:
        self.problems[why] += 1
        self.first.setdefault(why, line)


class _Unread(ValueError):
    """A line the card does not read; the message says why (lines are counted by it)."""


def _dict(x) -> dict:
    return x if isinstance(x, dict) else {}


def _shape(rec: dict) -> str | None:
    if "messages" in rec:
        return "sft"
    if "name" in rec and "problems" in rec:
        return "dropped"
    if "name" in rec and "code" in rec:
        return "tasks"
    if "kept" in rec and "dropped" in rec:
        return "judged"
    if {"task", "teacher", "status"} <= rec.keys() and "solution" not in rec:  # profiles.jsonl names its solution
        return "solutions"
    return None


def _category(reason) -> str:
    """'<category>: <detail>' -> category, the writers' own grouping of reasons."""
    return str(reason).split(":", 1)[0].strip()


def _verdict(v: dict | None) -> dict:
    """A verdict's provenance (Verdict.to_dict(): the verifier's schema, read as it is)."""
    v = v or {}
    versions = _dict(v.get("versions"))
    return {"versions": json.dumps(versions, sort_keys=True) if versions else None, "device": v.get("device") or None,
            "verdict_backend": v.get("backend") or None}


def _slim(rec) -> dict:
    """The fields the card counts of a parsed record, so that a large solutions file is not held in memory."""
    if isinstance(rec, TaskRecord):  # a dropped task too
        meta = rec.metadata
        return {"key": rec.key, "source": "variants" if meta.variant is not None else meta.generator or "other",
                "seed": meta.seed, "families": meta.families or [],
                "problems": [_category(p) for p in rec.problems] if isinstance(rec, DroppedTask) else [],
                "spec": json.dumps(meta.spec, sort_keys=True) if meta.spec is not None else None,
                "variant": meta.variant, "lib": meta.source if meta.generator == "harvest" else None}
    if isinstance(rec, SolutionRecord):
        return {"task": rec.task, "teacher": str(rec.teacher), "backend": str(rec.backend), "status": rec.status,
                "reason": _category(rec.reason or ""), "prompt": rec.prompt, **_verdict(rec.verdict)}
    if isinstance(rec, Record):  # metadata is free in a training record: what it names, if anything
        meta = rec.metadata
        return {"kind": rec.kind, "task": rec.task,
                "teacher": str(meta.get("teacher") or meta.get("source") or UNKNOWN), "backend": meta.get("backend"),
                "mutant": meta.get("mutant")}
    # a judged item: the kinds share kept and dropped; operator, mutant and verdict are a mutant's, backend the others'
    return {"kept": rec.kept, "dropped": None if rec.kept else str(rec.dropped),
            "operator": getattr(rec, "operator", None), "seed": getattr(rec, "seed", None),
            "mutant": getattr(rec, "mutant", None), "backend": getattr(rec, "backend", None),
            **_verdict(rec.verdict if isinstance(rec, MutantRecord) else None)}


def _glued(line: str) -> bool:
    """A cut line that a later run appended its next record to: a JSON object starts inside it and ends the line."""
    dec, end = json.JSONDecoder(), len(line.rstrip())
    i = line.find('{"', 1)
    while i > 0:
        try:
            if dec.raw_decode(line, i)[1] == end:
                return True
        except ValueError:
            pass
        i = line.find('{"', i + 1)
    return False


def _record(line: str, last: bool) -> tuple[str, object]:
    """(role, the parsed record) of one line, or _Unread saying why it is not read; `last`: the file's last line,
    without its newline (an interrupted run may have cut it)."""
    try:
        rec = json.loads(line)
    except ValueError:
        raise _Unread(CUT if last or _glued(line) else NOT_JSON) from None
    if not isinstance(rec, dict):
        raise _Unread(f"a JSON {type(rec).__name__}, not an object")
    shape = _shape(rec)
    if shape is None:
        raise _Unread("not a synth record (fields: " + ", ".join(sorted(rec)[:6]) + ")")
    try:
        return shape, validate(rec) if shape == "sft" else parse(MODELS[shape], rec)
    except RecordError as e:
        raise _Unread(f"training would refuse it: {e}") from None
    except ValidationError as e:
        raise _Unread(f"a malformed record of {ROLES[shape]}: {brief(e)}") from None


def _lines(path: Path) -> tuple[list[str], bool]:
    """A file's lines, and whether its last one has no newline (so it may be cut)."""
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")  # a bad byte spoils one line, not all
    open_end = lines[-1] != ""
    if not open_end:
        lines.pop()
    return lines, open_end


def _parsed(lines: list[str], open_end: bool) -> tuple[list[tuple[int, str, object]], list[tuple[int, str]]]:
    """(line, role, record) of every line read, and (line, why) of every other non-blank one."""
    read, unread = [], []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                read.append((n, *_record(line, n == len(lines) and open_end)))
            except _Unread as e:
                unread.append((n, str(e)))
    return read, unread


def read_jsonl(path: Path) -> Scan:
    lines, open_end = _lines(path)
    read, unread = _parsed(lines, open_end)
    scan = Scan(path, lines=len(lines))
    for n, why in unread:
        scan.bad(n, why)
    shapes = Counter(s for _, s, _ in read)
    # nothing readable: the name alone says which stage wrote it
    scan.role = shapes.most_common(1)[0][0] if shapes else _named(path) or ("unknown" if unread else "empty")
    for n, shape, rec in read:
        if shape == scan.role:
            scan.records.append(_slim(rec))
        else:
            scan.bad(n, f"{ROLES[shape]}, in a file of {ROLES[scan.role]}")
    return scan


def _named(path: Path) -> str | None:
    if path.name.endswith(".dropped.jsonl"):
        return "dropped"
    return BY_NAME.get(path.name)


def read_report(path: Path) -> Scan:
    scan = Scan(path, "decontam", lines=1)
    try:
        rep = json.loads(path.read_text(errors="replace"))
    except ValueError:
        scan.bad(1, NOT_JSON)
        return scan
    numbers = ("records", "kept", "dropped")
    per_detector = ("matched_by_detector", "dropped_by_first_detector")
    rep = _dict(rep)
    if wrong := [k for k in numbers if type(rep.get(k)) is not int] + [
            k for k in per_detector if not _dict(rep.get(k)) or any(type(n) is not int for n in rep[k].values())]:
        scan.bad(1, f"not a decontam report (no counts in {', '.join(wrong)})")
        return scan
    scan.report = rep
    return scan


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted({*path.rglob("*.jsonl"), *path.rglob(REPORT)})


def collect(paths: list[Path]) -> list[Scan]:
    """Every file under `paths`, read; CardError for a path that does not exist or holds nothing recognisable."""
    scans, seen = [], set()
    for p in paths:
        if not p.exists():
            raise CardError(f"{p} does not exist")
        mine = []
        for f in _files(p):
            if f.resolve() in seen:  # a directory given twice, or inside another given one
                continue
            seen.add(f.resolve())
            try:
                mine.append(read_report(f) if f.name == REPORT else read_jsonl(f))
            except OSError as e:  # unreadable (permissions, a dangling link): said in the card like a bad line
                scan = Scan(f, _named(f) or "unknown")
                scan.bad(0, f"cannot be read: {e.strerror or e}")
                mine.append(scan)
        if not any(s.role not in ("unknown", "empty") for s in mine):
            raise CardError(f"{p}: no synth output in it (no tasks, solutions, mutants, training records or "
                            f"{REPORT})")
        scans += mine
    _mark_copies(scans)
    return scans


def _mark_copies(scans: list[Scan]) -> None:
    """The kept output of a `synth decontam` run whose input is read too: the file beside its report with the
    report's kept count, all of whose tasks are the input's, so that its records are not counted twice. Without
    the input, the copy is the data and counts as itself."""
    def tasks(s: Scan) -> Counter:
        return Counter(r.get("key", r.get("task")) for r in s.records)

    for rep in (s for s in scans if s.report and isinstance(s.report.get("input"), str)):
        given = Path(rep.report["input"])
        source = next((s for s in scans if s.path.resolve() == given.resolve()
                       or s.path.parts[-len(given.parts):] == given.parts), None)
        if source is None or source.role not in ("tasks", "sft"):
            continue
        found = [s for s in scans if s.path.parent == rep.path.parent and s is not source and s.role == source.role
                 and len(s.records) == rep.report["kept"] and not tasks(s) - tasks(source)]
        if len(found) == 1:
            found[0].copy_of = str(given)


def _missing(scans: list[Scan]) -> list[dict]:
    out = []

    def want(path: Path, why: str):
        if not path.exists():
            out.append({"path": str(path), "why": why})

    for s in scans:
        for name, why in SIBLINGS.get(s.path.name, ()):
            want(s.path.with_name(name), why)
        if s.role == "tasks" and not s.copy_of:
            variants = {r["source"] == "variants" for r in s.records}
            if True in variants:
                want(dropped_path(s.path), f"synth variants writes it beside {s.path.name}")
            # a decontaminated copy of a tasks file has no dropped.jsonl of its own
            if False in variants and not (s.path.parent / REPORT).exists():
                want(s.path.with_name(DROPPED), f"synth tasks writes it beside {s.path.name}")
        if s.role == "dropped" and s.path.name.endswith(".dropped.jsonl"):
            want(s.path.with_name(s.path.name.removesuffix(".dropped.jsonl") + ".jsonl"),
                 f"the kept variants beside {s.path.name}")
        if s.role == "dropped" and s.path.name == DROPPED and not any(
                t.role == "tasks" and t.path.parent == s.path.parent for t in scans):
            out.append({"path": str(s.path.parent / "*.jsonl"), "why": f"no kept tasks file beside {DROPPED}"})
    return out


def _range(seeds) -> dict | None:
    ints = sorted({s for s in seeds if isinstance(s, int) and not isinstance(s, bool)})
    return {"min": ints[0], "max": ints[-1], "distinct": len(ints)} if ints else None


def _sorted(c: Counter) -> dict:
    return dict(c.most_common())


@dataclass
class _Records:
    """What the counts are over: the files of each role, decontaminated copies left out, and their records."""

    of: dict[str, list[Scan]]
    tasks: list[dict]
    dropped: list[dict]
    sols: list[dict]
    sft: list[tuple[Scan, dict]]
    judged: list[dict]
    reports: list[Scan]

    @classmethod
    def of_scans(cls, scans: list[Scan]) -> _Records:
        of = defaultdict(list)
        for s in scans:
            if not s.copy_of:
                of[s.role].append(s)
        return cls(of, tasks=[r for s in of["tasks"] for r in s.records],
                   dropped=[r for s in of["dropped"] for r in s.records],
                   sols=[r for s in of["solutions"] for r in s.records],
                   sft=[(s, r) for s in of["sft"] for r in s.records],
                   judged=[r for s in of["judged"] for r in s.records],
                   reports=[s for s in of["decontam"] if s.report])


def _stages(rd: _Records) -> tuple[dict, dict]:
    """Per stage: its records, kept and dropped; and its drop reasons."""
    stages, reasons = {}, {}
    for stage in ("tasks", "variants"):
        kept = [r for r in rd.tasks if (r["source"] == "variants") == (stage == "variants")]
        lost = [r for r in rd.dropped if (r["source"] == "variants") == (stage == "variants")]
        if kept or lost:
            stages[stage] = {"records": len(kept) + len(lost), "kept": len(kept), "dropped": len(lost)}
            reasons[stage] = _sorted(Counter(p for r in lost for p in r["problems"]))
    if rd.of["solutions"]:
        ok = sum(r["status"] == "ok" for r in rd.sols)
        stages["solve"] = {"records": len(rd.sols), "kept": ok, "dropped": len(rd.sols) - ok}
        reasons["solve"] = _sorted(Counter(f"{r['status']}: {r['reason']}" if r["status"] in NO_CANDIDATE
                                           else r["status"] for r in rd.sols if r["status"] != "ok"))
    judged_by: dict[str, list] = defaultdict(list)  # the stage is the file: mutants (repair), rewrite_pairs, ...
    for s in rd.of["judged"]:
        judged_by[s.path.stem] += s.records
    for stage, rs in judged_by.items():
        kept = sum(r["kept"] for r in rs)
        stages[stage] = {"records": len(rs), "kept": kept, "dropped": len(rs) - kept}
        reasons[stage] = _sorted(Counter(r["dropped"] for r in rs if not r["kept"]))
    if rd.reports:
        stages["decontam"] = {k: sum(s.report[k] for s in rd.reports) for k in ("records", "kept", "dropped")}
        first = Counter()
        for s in rd.reports:
            first.update({d: n for d, n in s.report["dropped_by_first_detector"].items() if n})
        reasons["decontam"] = _sorted(first)
    return stages, reasons


def _families(rd: _Records) -> dict:
    """Operator families: of kept tasks per source, of dropped tasks, and of training records through their task."""
    fam_of = {r["key"]: r["families"] for r in rd.tasks}
    kept_fam: dict[str, Counter] = defaultdict(Counter)
    for r in rd.tasks:
        for f in r["families"]:
            kept_fam[f][r["source"]] += 1
    lost_fam = Counter(f for r in rd.dropped for f in r["families"])
    rec_fam = Counter(f for _, r in rd.sft for f in fam_of.get(r["task"], ["(task not in these files)"]))
    return {f: {"kept": dict(kept_fam.get(f, {})), "dropped": lost_fam.get(f, 0), "records": rec_fam.get(f, 0)}
            for f in sorted(set(kept_fam) | set(lost_fam) | set(rec_fam),
                            key=lambda f: -sum(kept_fam.get(f, {}).values()) - rec_fam.get(f, 0))}


def _backends(rd: _Records) -> dict:
    """Backends of the solutions, the training records and the judged items."""
    # a training record's backend: its metadata, else the solution or mutant it came from in its own directory
    sol_backend: dict[tuple, set] = defaultdict(set)
    for s in rd.of["solutions"]:
        for r in s.records:
            if r["status"] == "ok":
                sol_backend[(s.path.parent, r["task"], r["teacher"])].add(r["backend"])
    mut_backend = {(s.path.parent, r["mutant"]): r["backend"] or r["verdict_backend"]
                   for s in rd.of["judged"] for r in s.records if r["mutant"]}

    def backend(s: Scan, r: dict) -> str:
        if r["backend"]:
            return str(r["backend"])
        found = sol_backend.get((s.path.parent, r["task"], r["teacher"]), set())
        if len(found) == 1:
            return next(iter(found))
        return str(mut_backend.get((s.path.parent, r["mutant"])) or UNKNOWN)

    return {"solutions": _sorted(Counter(r["backend"] for r in rd.sols)),
            "records": _sorted(Counter(backend(s, r) for s, r in rd.sft)),
            "judged": _sorted(Counter(str(r["backend"] or r["verdict_backend"] or UNKNOWN) for r in rd.judged))}


def _verifier(sols: list[dict]) -> list[dict]:
    """Per teacher and backend: the tries, their verdicts and the pass rate."""
    per: dict[tuple, Counter] = defaultdict(Counter)
    for r in sols:
        per[(r["teacher"], r["backend"])][r["status"]] += 1
    verifier = []
    for (teacher, be), st in per.items():
        tries = sum(st.values())
        none = sum(st[s] for s in NO_CANDIDATE)
        verified = tries - none
        verifier.append({"teacher": teacher, "backend": be, "records": tries, "no_candidate": none,
                         "verified": verified, "ok": st["ok"], "pass_rate": st["ok"] / verified if verified else None,
                         "status": _sorted(st)})
    return verifier


def _operators(judged: list[dict]) -> dict:
    """Per mutation operator: its items kept and dropped."""
    operators: dict[str, Counter] = defaultdict(Counter)
    for r in judged:
        if r["operator"]:
            operators[str(r["operator"])]["kept" if r["kept"] else "dropped"] += 1
    return {k: dict(v) for k, v in sorted(operators.items())}


def _decontam(s: Scan) -> dict:
    """One decontam report's numbers, and the eval tasks each record it dropped matched."""
    rep = s.report
    return {"path": str(s.path), "input": rep.get("input"), "against": rep.get("against"),
            "eval_tasks": rep.get("eval_tasks"), "records": rep["records"], "kept": rep["kept"],
            "dropped": rep["dropped"], "unchecked": rep.get("unchecked"),
            "matched_by_detector": rep["matched_by_detector"],
            "dropped_by_first_detector": rep["dropped_by_first_detector"],
            "per_eval_task": _dict(rep.get("per_eval_task")),
            "dropped_records": [{"name": d.get("name"), "reason": d.get("reason"),
                                 "eval_tasks": sorted({m.get("eval_task") for m in d.get("matches", [])
                                                       if isinstance(m, dict)})}
                                for d in rep.get("dropped_records", []) if isinstance(d, dict)],
            "near_misses": len(rep.get("near_misses") or []),
            "not_applied": len(rep.get("record_problems") or []) + len(rep.get("eval_problems") or [])}


def _provenance(rd: _Records) -> dict:
    """Where the data came from: teachers, sources, seeds, specs, prompts, versions and devices."""
    tasks, dropped, sols, sft, judged = rd.tasks, rd.dropped, rd.sols, rd.sft, rd.judged
    seeds = defaultdict(list)
    for r in tasks + dropped:
        seeds[r["source"]].append(r["seed"])
    for s in rd.of["judged"]:
        seeds[s.path.stem] += [r["seed"] for r in s.records]
    versions = Counter(r["versions"] for r in sols + judged if r["versions"])
    return {
        "teachers": _sorted(Counter(r["teacher"] for r in sols)),
        "record_sources": _sorted(Counter(r["teacher"] for _, r in sft)),
        "task_sources": {src: {"kept": sum(r["source"] == src for r in tasks),
                               "dropped": sum(r["source"] == src for r in dropped)}
                         for src in dict.fromkeys(r["source"] for r in tasks + dropped)},
        "seeds": {k: rng for k, v in seeds.items() if (rng := _range(v))},
        "graph_specs": _sorted(Counter(r["spec"] for r in tasks + dropped if r["spec"])),
        "harvest_libs": _sorted(Counter(r["lib"] for r in tasks + dropped if r["lib"])),
        "variant_kinds": _sorted(Counter(r["variant"] for r in tasks if r["variant"])),
        "prompts": _sorted(Counter(r["prompt"] for r in sols if r["prompt"])),
        "versions": [{"versions": json.loads(v), "verdicts": n} for v, n in versions.most_common()],
        "devices": _sorted(Counter(r["device"] for r in sols + judged if r["device"])),
    }


def counts(scans: list[Scan]) -> dict:
    """Everything the card says, as JSON-ready counts."""
    rd = _Records.of_scans(scans)
    stages, reasons = _stages(rd)
    files = [{"path": str(s.path), "role": s.role, "copy_of": s.copy_of, "lines": s.lines,
              "records": len(s.records) + bool(s.report),
              "not_read": {why: {"lines": n, "first_line": s.first[why]} for why, n in s.problems.items()}}
             for s in scans]
    return {"files": files, "missing": _missing(scans), "stages": stages, "drop_reasons": reasons,
            "kinds": {"total": _sorted(Counter(r["kind"] for _, r in rd.sft)),
                      "per_file": {str(s.path): _sorted(Counter(r["kind"] for r in s.records)) for s in rd.of["sft"]}},
            "families": _families(rd), "backends": _backends(rd), "verifier": _verifier(rd.sols),
            "solution_status": _sorted(Counter(r["status"] for r in rd.sols)),
            "operators": _operators(rd.judged), "decontam": [_decontam(s) for s in rd.reports],
            "provenance": _provenance(rd)}


# ---- card.md and plots ---------------------------------------------------------------------------------------------

def _task_codes(scans: list[Scan]) -> list[tuple[str, str]]:
    """(file:line, task code) of the task and training records the counts are over (read as they were)."""
    from musacoder.data.decontam import task_code

    mine = []
    for s in scans:
        if s.copy_of or s.role not in ("sft", "tasks"):
            continue
        for n, role, rec in _parsed(*_lines(s.path))[0]:
            if role != s.role:  # counted among the lines not read
                continue
            code = rec.code if isinstance(rec, TaskRecord) else task_code(rec.to_dict())
            if code is not None:
                mine.append((f"{s.path}:{n}", code))
    return mine


def eval_twins(scans: list[Scan], sources: list[str]) -> list[dict]:
    """Per eval set: how many training records and tasks of the scanned files copy one of its tasks (the same
    computation or program), by key, and which eval tasks are copied. Decontaminated copies count once, as the
    counts do."""
    from musacoder.data.keys import Keys
    from musacoder.synth.twins import eval_records, task_key

    keys = Keys()
    mine = _task_codes(scans)
    out = []
    for src in sources:
        evals = eval_records(src)
        by_graph, by_ast = defaultdict(list), defaultdict(list)
        for i, r in enumerate(evals):
            f = keys.facts(r["code"])
            if f.graph is not None:
                by_graph[f.graph].append(task_key(r, i))
            if f.ast is not None:
                by_ast[f.ast].append(task_key(r, i))
        twins, copied, per_key = [], set(), Counter()
        for origin, code in mine:
            f = keys.facts(code)
            hits = {"opgraph": by_graph.get(f.graph, []), "ast": by_ast.get(f.ast, [])}
            if any(hits.values()):
                per_key.update(k for k, v in hits.items() if v)
                tasks = sorted({t for v in hits.values() for t in v})
                twins.append({"record": origin, "eval_tasks": tasks})
                copied.update(tasks)
        out.append({"eval": src, "eval_tasks": len(evals), "records": len(mine), "twins": len(twins),
                    "by_key": dict(per_key), "eval_tasks_copied": sorted(copied), "twin_records": twins})
    return out


def _rate(n: int, d: int) -> str:
    return pct(n / d) if d else "-"


def _counter_table(name: str, c: dict, total_label: str = "count") -> str:
    return _table([name, total_label], [[_cell(k), str(v)] for k, v in c.items()])


def plot(out: Path, c: dict) -> list[str]:
    """Stages, kinds, families, verifier statuses, drop reasons, decontamination: the PNG names written (only those
    with something to show)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    written = []

    def save(fig, name: str):
        fig.savefig(out / name, dpi=120, bbox_inches="tight")
        plt.close(fig)
        written.append(name)

    def stacked(name: str, labels: list[str], series: dict[str, list[int]], xlabel: str, title: str,
                legend: bool = True):
        fig, ax = plt.subplots(figsize=(6, 0.35 * len(labels) + 1.2))
        left = [0] * len(labels)
        for label, values in series.items():
            ax.barh(labels, values, left=left, label=label)
            left = [a + b for a, b in zip(left, values)]
        ax.invert_yaxis()  # the first (largest) row on top
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # counts
        ax.set(xlabel=xlabel, title=title)
        if legend:
            ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: never over a bar
        save(fig, name)

    if st := c["stages"]:
        stacked("stages.png", list(st), {"kept": [v["kept"] for v in st.values()],
                                         "dropped": [v["dropped"] for v in st.values()]}, "records", "per stage")
    if kinds := c["kinds"]["total"]:
        stacked("kinds.png", list(kinds), {"records": list(kinds.values())}, "training records", "per record kind",
                legend=False)
    kept_fams = {f: v["kept"] for f, v in c["families"].items() if v["kept"]}
    if kept_fams:
        sources = list(dict.fromkeys(s for v in kept_fams.values() for s in v))
        stacked("families.png", list(kept_fams), {s: [v.get(s, 0) for v in kept_fams.values()] for s in sources},
                "kept tasks with an operator of the family", "operator families")
    if ver := c["verifier"]:
        statuses = list(dict.fromkeys(s for v in ver for s in v["status"]))
        stacked("verifier.png", [f"{v['teacher']} @ {v['backend']}" for v in ver],
                {s: [v["status"].get(s, 0) for v in ver] for s in statuses}, "solutions (tries)",
                "solutions by verdict, per teacher and backend")
    drops = {f"{stage}: {_cell(why, 50)}": n for stage, rs in c["drop_reasons"].items() for why, n in rs.items()}
    if drops:
        stacked("drops.png", list(drops), {"dropped": list(drops.values())}, "dropped (a task can have several "
                "reasons)", "drop reasons per stage", legend=False)
    if c["decontam"]:
        dets = list(dict.fromkeys(d for r in c["decontam"] for d in r["matched_by_detector"]))
        stacked("decontam.png", dets, {
            "dropped (first reason)": [sum(r["dropped_by_first_detector"].get(d, 0) for r in c["decontam"])
                                       for d in dets],
            "matched, dropped by a stronger one": [sum(r["matched_by_detector"].get(d, 0)
                                                       - r["dropped_by_first_detector"].get(d, 0)
                                                       for r in c["decontam"]) for d in dets]},
            "records", "decontamination per detector")
    return written


def _more(lines: list[str], total: int) -> list[str]:
    return lines + ([f"- ... and {total - len(lines)} more (all of them in `--json`)"] if total > len(lines) else [])


def _files_md(c: dict, inputs: list[str]) -> list[str]:
    """The card's head: what was read, the files, their lines not read, the files missing."""
    files = c["files"]
    unread = sum(p["lines"] for f in files for p in f["not_read"].values())
    cut = sum(f["not_read"].get(CUT, {}).get("lines", 0) for f in files)
    parts = ["# Data card", "", f"From {', '.join(f'`{p}`' for p in inputs)}: {len(files)} files, "
             f"{sum(f['records'] for f in files)} records read, {unread} lines not read ({cut} cut by an "
             f"interrupted run), {len(c['missing'])} expected files missing.", "",
             "## Files", "", _table(["file", "read as", "lines", "records", "not read"],
                                    [[f"`{f['path']}`", ROLES.get(f["role"], f["role"])
                                      + (f" (decontaminated copy of `{f['copy_of']}`)" if f["copy_of"] else ""),
                                      str(f["lines"]),
                                      str(f["records"]), str(sum(p["lines"] for p in f["not_read"].values()))]
                                     for f in files]), ""]
    if any(f["copy_of"] for f in files):
        parts += ["A decontaminated copy is counted under decontam only: its input is read too.", ""]
    problems = [[f"`{f['path']}`", str(p["first_line"] or "-"), str(p["lines"]), _cell(why)]
                for f in files for why, p in f["not_read"].items()]
    if problems:
        parts += ["## Lines not read", "", _table(["file", "first line", "lines", "why"], problems), ""]
    if c["missing"]:
        parts += ["## Missing files", "", *[f"- `{m['path']}`: {m['why']}" for m in c["missing"]], ""]
    return parts


def _stages_md(c: dict) -> list[str]:
    if not (st := c["stages"]):
        return []
    return ["## Stages", "", _table(["stage", "records", "kept", "dropped", "kept %"],
                                    [[k, str(v["records"]), str(v["kept"]), str(v["dropped"]),
                                      _rate(v["kept"], v["records"])] for k, v in st.items()]),
            "", "solve: every try with its verdict, kept = `ok`; mutants: a kept mutant is one that fails "
                "(it becomes repair and reviewer records).", ""]


def _kinds_md(c: dict) -> list[str]:
    if not (kinds := c["kinds"]["total"]):
        return []
    per = c["kinds"]["per_file"]
    return ["## Training records per kind", "",
            _table(["file"] + list(kinds), [[f"`{p}`"] + [str(k.get(kind, 0)) for kind in kinds]
                                            for p, k in per.items()]
                   + [["total"] + [str(n) for n in kinds.values()]]),
            ""]


def _sources_md(c: dict) -> list[str]:
    prov = c["provenance"]
    if not (prov["task_sources"] or prov["record_sources"]):
        return []
    parts = ["## Sources", ""]
    if prov["task_sources"]:
        parts += [_table(["task source", "kept", "dropped"], [[k, str(v["kept"]), str(v["dropped"])]
                                                              for k, v in prov["task_sources"].items()]), ""]
    if prov["record_sources"]:
        parts += [_counter_table("training records from (teacher or source)", prov["record_sources"], "records"), ""]
    return parts


def _families_md(c: dict) -> list[str]:
    if not (fams := c["families"]):
        return []
    sources = list(dict.fromkeys(s for v in fams.values() for s in v["kept"]))
    return ["## Operator families", "",
            _table(["family"] + [f"kept: {s}" for s in sources] + ["dropped tasks", "training records"],
                   [[f] + [str(v["kept"].get(s, 0)) for s in sources] + [str(v["dropped"]), str(v["records"])]
                    for f, v in fams.items()]),
            "", "A task counts once in each family of the aten ops it runs; a training record counts in its "
                "task's families when the task is in these files.", ""]


def _backends_md(c: dict) -> list[str]:
    be = c["backends"]
    if not any(be.values()):
        return []
    names = list(dict.fromkeys(b for v in be.values() for b in v))
    return ["## Backends", "", _table(["backend", "solutions", "training records", "judged items"],
                                      [[b, str(be["solutions"].get(b, 0)), str(be["records"].get(b, 0)),
                                        str(be["judged"].get(b, 0))] for b in names]), ""]


def _verifier_md(c: dict) -> list[str]:
    if not (ver := c["verifier"]):
        return []
    statuses = list(c["solution_status"])
    return ["## Verifier", "", _table(
        ["teacher", "backend", "tries", "no candidate", "verified", "ok", "pass rate %"],
        [[_cell(v["teacher"], 50), v["backend"], str(v["records"]), str(v["no_candidate"]), str(v["verified"]),
          str(v["ok"]), pct(v["pass_rate"])] for v in ver]),
        "", "Pass rate: `ok` among the verified tries (a multi-turn sample counts each turn); no candidate: the "
            "teacher gave nothing to verify.", "",
        _table(["status"] + [f"{_cell(v['teacher'], 30)} @ {v['backend']}" for v in ver],
               [[s] + [str(v["status"].get(s, 0)) for v in ver] for s in statuses]), ""]


def _operators_md(c: dict) -> list[str]:
    if not (ops := c["operators"]):
        return []
    return [_table(["mutation operator", "kept (fails)", "dropped"],
                   [[k, str(v.get("kept", 0)), str(v.get("dropped", 0))] for k, v in ops.items()]), ""]


def _drops_md(c: dict) -> list[str]:
    if not any(c["drop_reasons"].values()):
        return []
    parts = ["## Drop reasons", "", "A dropped task counts once for each of its reasons; decontam: the strongest "
             "detector that matched.", ""]
    for stage, rs in c["drop_reasons"].items():
        if rs:
            parts += [f"### {stage}", "", _counter_table("reason", rs), ""]
    return parts


def _decontam_md(c: dict) -> list[str]:
    parts = []
    for d in c["decontam"]:
        dets = list(d["matched_by_detector"])
        lines = [f"- `{r['name']}`: {r['reason']} ({', '.join(map(str, r['eval_tasks']))})"
                 for r in d["dropped_records"][:SHOWN]]
        against = ", ".join(map(str, d["against"] or []))
        parts += [f"## Decontamination: `{d['path']}`", "",
                  f"Input `{d['input']}` against {d['eval_tasks']} eval tasks ({against}): {d['records']} records, "
                  f"{d['kept']} kept, {d['dropped']} dropped, {d['unchecked']} without a task (kept); "
                  f"{d['near_misses']} near misses to review; {d['not_applied']} times a detector could "
                  "not be applied.", "",
                  _table(["detector", "matched", "dropped (first reason)"],
                         [[k, str(d["matched_by_detector"].get(k, 0)), str(d["dropped_by_first_detector"].get(k, 0))]
                          for k in dets]), "", *_more(lines, len(d["dropped_records"])), ""]
    return parts


def _twins_md(c: dict) -> list[str]:
    parts = []
    for t in c.get("eval_twins", []):
        lines = [f"- `{r['record']}`: {', '.join(r['eval_tasks'])}" for r in t["twin_records"][:SHOWN]]
        parts += [f"## Eval twins: `{t['eval']}`", "",
                  f"{t['twins']} of {t['records']} training records and tasks are the same computation (opgraph) or "
                  f"program (ast) as one of its {t['eval_tasks']} tasks"
                  + (f" ({', '.join(f'{k} {v}' for k, v in t['by_key'].items())})" if t["by_key"] else "")
                  + f"; {len(t['eval_tasks_copied'])} eval tasks are copied"
                  + (": " + ", ".join(t["eval_tasks_copied"][:SHOWN]) if t["eval_tasks_copied"] else "") + ".", "",
                  *_more(lines, len(t["twin_records"])), ""]
    return parts


def _provenance_md(c: dict) -> list[str]:
    prov = c["provenance"]
    bullets = []
    if prov["teachers"]:
        bullets.append("teachers (solutions tried): " + ", ".join(f"`{k}` {v}" for k, v in prov["teachers"].items()))
    if prov["prompts"]:
        bullets.append("prompts: " + ", ".join(f"{k} {v}" for k, v in prov["prompts"].items()))
    for src, r in prov["seeds"].items():
        bullets.append(f"seeds of {src}: {r['min']}..{r['max']} ({r['distinct']} distinct)")
    for spec, n in prov["graph_specs"].items():
        bullets.append(f"graph spec of {n} tasks: `{spec}`")
    if prov["harvest_libs"]:
        bullets.append("harvested from: " + ", ".join(f"{k} {v}" for k, v in prov["harvest_libs"].items()))
    if prov["variant_kinds"]:
        bullets.append("variant kinds (kept): " + ", ".join(f"{k} {v}" for k, v in prov["variant_kinds"].items()))
    for v in prov["versions"]:
        bullets.append("versions: " + ", ".join(f"{k} {x}" for k, x in v["versions"].items())
                       + f" ({v['verdicts']} verdicts)")
    if not prov["versions"] and (c["verifier"] or c["operators"]):
        bullets.append("versions: not recorded in any verdict")
    if prov["devices"]:
        bullets.append("devices: " + ", ".join(f"{k} ({v} verdicts)" for k, v in prov["devices"].items()))
    return ["## Provenance", "", *([f"- {b}" for b in bullets] or ["Nothing recorded."]), ""]


# card.md's sections after its head, in order; each is empty when it has nothing to show
_SECTIONS = (_stages_md, _kinds_md, _sources_md, _families_md, _backends_md, _verifier_md, _operators_md, _drops_md,
             _decontam_md, _twins_md, _provenance_md)


def render(c: dict, plots: list[str], inputs: list[str]) -> str:
    """card.md: its head, the sections with something to show, the plots."""
    parts = _files_md(c, inputs)
    for section in _SECTIONS:
        parts += section(c)
    if plots:
        parts += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(parts)


def write_card(out: Path, c: dict, inputs: list[str]) -> list[str]:
    """card.md and its plots under `out`; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        plots = plot(out, c)
        note = []
    except ImportError:
        plots, note = [], ["(plots skipped: matplotlib is not installed)", ""]
    (out / "card.md").write_text(render(c, plots, inputs) + "\n".join(note))
    return ["card.md", *plots]
