"""Held-out sets that hold: the computation keys of tasks and training records, caps per computation (`synth dedupe`:
one task per op sequence, at most N per sequence), a split that holds out whole operator families or op sequences
(`synth split`), and a rotating hidden evaluation set generated from a secret seed (`synth hidden`).

A record's keys (`Facts`): `graph`, the canonical op graph of data/opgraph.py (the same computation at any rank,
size or spelling: what the `opgraph` detector of decontamination compares); `ast`, the canonical program of the `ast`
detector; `ops`, the generator's own op sequence (`metadata.ops` of `synth tasks` records, e.g. `relu -> bias_add`,
a repeated op once), which is what a reader of the task's name sees; `sequence`, the former `opgraph` key (aten op
sequence over the same input ranks), kept to show what keying on ranks let through. A record is a task record
(`code`) or an SFT record (the task in its first user turn, as decontamination reads it).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import re
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from musacoder.data.decontam import record_name, task_code
from musacoder.data.keys import Keys
from musacoder.data.schema import TaskMeta, TaskRecord, line, parse

KEYS = ("graph", "ops")  # what dedupe and split group by
SPLIT_BY = ("family", "ops", "graph")
HIDDEN_SEED_BASE = 10**9  # hidden seeds start here: above every public seed range the docs use (0 .. 300,127)
SECRET_ENV = "MUSACODER_HIDDEN_SECRET"


class HeldoutError(ValueError):
    """Input that cannot be used (no secret, a record without a task, an unknown key); the message says why."""


def read_records(path: str | Path) -> list[dict]:
    """The JSON objects of a JSONL file, or of every *.jsonl under a directory; HeldoutError naming the line of one
    that is not an object. Not parsed as a data/schema.py kind: dedupe, split and twins take task records, training
    records and task files from elsewhere alike, and find the task in each as decontamination does."""
    path = Path(path)
    files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    if not path.exists():
        raise HeldoutError(f"{path} does not exist")
    out = []
    for f in files:
        for n, text in enumerate(f.read_text().splitlines(), 1):
            if not text.strip():
                continue
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as e:
                raise HeldoutError(f"{f} line {n}: invalid JSON: {e}") from e
            if not isinstance(rec, dict):
                raise HeldoutError(f"{f} line {n}: not a JSON object")
            out.append(rec)
    return out


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


# ---- dedupe and caps ------------------------------------------------------------------------------------------------

@dataclass
class Capped:
    kept: list[dict]
    dropped: list[dict]  # {"index", "name", "key", "rank"}: the rank-th record of its key (1-based), over the cap
    unkeyed: list[dict]  # {"index", "name", "problem"}: kept, no key to group by
    keys: int  # distinct keys among the kept records


def cap(records: list[dict], per_key: int, by: str, keys: Keys) -> Capped:
    """At most `per_key` records per key (`graph` or `ops`), the first ones in file order (so a rerun keeps the same
    ones); records without a key are kept and listed."""
    if by not in KEYS:
        raise HeldoutError(f"unknown key {by!r}; known: {', '.join(KEYS)}")
    if per_key < 1:
        raise HeldoutError(f"per_key must be at least 1, not {per_key}")
    seen: Counter = Counter()
    out = Capped([], [], [], 0)
    for i, rec in enumerate(records):
        k = keys.key(rec, by)
        if k is None:
            out.unkeyed.append({"index": i, "name": record_name(rec, i), "problem": _why_unkeyed(rec, by, keys)})
            out.kept.append(rec)
            continue
        seen[k] += 1
        if seen[k] <= per_key:
            out.kept.append(rec)
        else:
            out.dropped.append({"index": i, "name": record_name(rec, i), "key": k[:16] if by == "graph" else k,
                                "rank": seen[k]})
    out.keys = len(seen)
    return out


def _why_unkeyed(rec: dict, by: str, keys: Keys) -> str:
    if by == "ops":
        return "no metadata.ops (not a `synth tasks` record)"
    code = task_code(rec)
    return "no task in the record" if code is None else keys.facts(code).problem


# ---- split ----------------------------------------------------------------------------------------------------------

@dataclass
class Split:
    train: list[dict]
    eval: list[dict]
    held: list[str]  # the held-out units: families, op sequences or graph keys
    twins_dropped: list[dict]  # train records that were the same computation or program as an eval record
    unkeyed: list[dict]  # in neither set: without a unit to assign them by
    settings: dict = field(default_factory=dict)

    def manifest(self) -> dict:
        fams = Counter(f for r in self.eval for f in (r.get("metadata") or {}).get("families") or [])
        return {"settings": self.settings, "records": len(self.train) + len(self.eval) + len(self.twins_dropped)
                + len(self.unkeyed), "train": len(self.train), "eval": len(self.eval),
                "held_out": self.held, "eval_families": dict(fams.most_common()),
                "twins_dropped_from_train": self.twins_dropped, "unkeyed": self.unkeyed}


def split(records: list[dict], by: str, fraction: float, seed: int, keys: Keys,
          hold_out: list[str] | None = None) -> Split:
    """Hold out whole units: every record of a held-out operator family (`family`: a record with any held-out family
    goes to eval), op sequence (`ops`) or computation (`graph`). Units are drawn with `seed` until about `fraction`
    of the records are held out (families: added in a seeded order while the eval share stays at most `fraction`),
    or named in `hold_out`. Train records that are still the same computation (graph) or program (ast) as an eval
    record are dropped from train and listed."""
    if by not in SPLIT_BY:
        raise HeldoutError(f"unknown unit {by!r}; known: {', '.join(SPLIT_BY)}")
    if not 0 < fraction < 1:
        raise HeldoutError(f"fraction must be in (0, 1), not {fraction}")
    units: list[tuple[str, ...] | None] = []
    unkeyed = []
    for i, rec in enumerate(records):
        if by == "family":
            u = keys.families(rec) or None
        else:
            k = keys.key(rec, by)
            u = (k,) if k is not None else None
        units.append(u)
        if u is None:
            unkeyed.append({"index": i, "name": record_name(rec, i),
                            "problem": "no operator family" if by == "family" else _why_unkeyed(rec, by, keys)})
    keyed = [u for u in units if u is not None]
    if not keyed:
        raise HeldoutError(f"no record has a {by} to split by")
    names = list(dict.fromkeys(x for u in keyed for x in u))
    if hold_out:
        if unknown := [h for h in hold_out if h not in names]:
            raise HeldoutError(f"--hold-out {', '.join(unknown)}: no record has it; there are "
                               + ", ".join(names[:20]) + (" ..." if len(names) > 20 else ""))
        held = list(hold_out)
    else:
        held = _draw_units(keyed, names, by, fraction, random.Random(seed))
    chosen = set(held)
    train, evals = [], []
    for i, (rec, u) in enumerate(zip(records, units)):
        if u is not None:
            (evals if chosen & set(u) else train).append((i, rec))
    eval_graph = {keys.key(r, "graph") for _, r in evals} - {None}
    eval_ast = {keys.facts(c).ast for _, r in evals if (c := task_code(r)) is not None} - {None}
    kept, twins = [], []
    for i, rec in train:
        code = task_code(rec)
        f = keys.facts(code) if code is not None else None
        why = [d for d, hit in (("opgraph", f and f.graph in eval_graph), ("ast", f and f.ast in eval_ast)) if hit]
        if why:
            twins.append({"index": i, "name": record_name(rec, i), "detectors": why})
        else:
            kept.append(rec)
    evals = [r for _, r in evals]
    return Split(kept, evals, held, twins, unkeyed,
                 {"by": by, "fraction": fraction, "seed": seed, "hold_out": hold_out or None})


def _draw_units(keyed: list[tuple[str, ...]], names: list[str], by: str, fraction: float,
                rng: random.Random) -> list[str]:
    order = rng.sample(sorted(names), len(names))
    n = len(keyed)

    def share(held: set) -> float:
        return sum(1 for u in keyed if held & set(u)) / n

    held: list[str] = []
    if by == "family":  # a family of nearly every task (elementwise) would take everything: skip what overshoots
        for f in order:
            if share(set(held) | {f}) <= fraction:
                held.append(f)
        if not held:
            held = [min(order, key=lambda f: share({f}))]
        return held
    counts = Counter(u[0] for u in keyed)
    total = 0
    for k in order:
        if total >= fraction * n:
            break
        held.append(k)
        total += counts[k]
    return held


# ---- the rotating hidden evaluation set -----------------------------------------------------------------------------

def read_secret(env: str = SECRET_ENV, file: Path | None = None) -> str:
    import os

    if file is not None:
        try:
            secret = file.read_text().strip()
        except OSError as e:
            raise HeldoutError(f"--secret-file {file}: {e.strerror or e}") from e
    else:
        secret = os.environ.get(env, "").strip()
    if len(secret) < 16:
        where = f"--secret-file {file}" if file is not None else f"the environment variable {env}"
        raise HeldoutError(f"{where} must hold a secret of at least 16 characters (e.g. `python -c \"import secrets; "
                           "print(secrets.token_hex(16))\"`), kept outside the repository")
    return secret


def hidden_seed(secret: str, rotation: str) -> int:
    """The first generator seed of a rotation: keyed by the secret, so no one without it can generate the set."""
    digest = hmac.new(secret.encode(), f"musacoder-hidden|{rotation}".encode(), hashlib.sha256).hexdigest()
    return HIDDEN_SEED_BASE + int(digest[:12], 16) % HIDDEN_SEED_BASE


def fingerprint(secret: str) -> str:
    """Tells whether two runs used the same secret, without revealing it."""
    return hmac.new(secret.encode(), b"musacoder-hidden-fingerprint", hashlib.sha256).hexdigest()[:16]


_SEED_RE = re.compile(r" \(generated, seed \d+\)")


def anonymise(rec: TaskRecord, rotation: str, i: int) -> TaskRecord:
    """A hidden task without its seed (name, docstring, metadata): the file does not say how to regenerate it."""
    meta = rec.metadata.model_dump(exclude_unset=True, exclude={"seed"})
    return TaskRecord(name=f"hidden-{rotation}-{i:03d}", problem_id=i, level=None,
                      code=_SEED_RE.sub(" (generated)", rec.code), metadata=TaskMeta(**meta, rotation=rotation))


def tracked_by_git(path: Path) -> bool:
    """True when `path` lies in a git work tree and is not ignored there: a hidden set must not be committed."""
    where = path.resolve()
    probe = where if where.is_dir() else where.parent
    while not probe.exists():
        probe = probe.parent
    try:
        top = subprocess.run(["git", "-C", str(probe), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=10)
        if top.returncode != 0:
            return False
        ignored = subprocess.run(["git", "-C", top.stdout.strip(), "check-ignore", "-q", str(where)],
                                 capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return ignored.returncode != 0


@dataclass
class HiddenResult:
    tasks: list[TaskRecord]
    manifest: dict


def hidden_set(out: Path, secret: str, rotation: str, n: int, spec, against: list, against_generated: list,
               keys: Keys, check_scale: float = 1.0, oversample: float = 2.0,
               progress: Callable[[int, int], None] | None = None) -> HiddenResult:
    """Generate `n * oversample` tasks from the rotation's secret seeds (into OUT/generated.jsonl, resumable), drop
    every one that is an eval twin of `against` (all detectors: KernelBench) or of `against_generated` (ast and
    opgraph: training data of the same generator, where near-copy text means nothing), keep one task per
    computation, and write the first `n` (anonymised) to OUT/tasks.jsonl with OUT/manifest.json."""
    from musacoder.data.decontam import DecontamSettings, run
    from musacoder.synth.tasks import synth_tasks

    seed = hidden_seed(secret, rotation)
    total = max(n, round(n * oversample))
    generated = out / "generated.jsonl"
    synth_tasks(generated, total, seed, spec, check_scale, progress)
    records = read_records(generated)
    drops: Counter = Counter()
    for sources, detectors in ((against, ("ast", "opgraph", "minhash")), (against_generated, ("ast", "opgraph"))):
        if sources:
            res = run(records, sources, DecontamSettings(detectors=detectors))
            drops.update(d["reason"] for d in res.dropped)
            records = res.kept
    capped = cap(records, 1, "graph", keys)
    # generated.jsonl is `synth tasks` output: its records are task records
    chosen = [anonymise(parse(TaskRecord, r), rotation, i) for i, r in enumerate(capped.kept[:n])]
    (out / "tasks.jsonl").write_text("".join(map(line, chosen)))

    def describe(tasks) -> dict:
        return {"tasks": len(tasks), "sources": sorted({t.source.split("#")[0] for t in tasks})}

    manifest = {"rotation": rotation, "secret_fingerprint": fingerprint(secret), "requested": n,
                "tasks": len(chosen), "generated": total, "kept_by_cleaning": len(read_records(generated)),
                "spec": asdict(spec), "dropped_as_eval_twins": dict(drops),
                "dropped_same_computation": len(capped.dropped), "against": describe(against),
                "against_generated": describe(against_generated),
                "families": dict(Counter(f for t in chosen for f in t.metadata.families or []).most_common()),
                "judge_with": f"musacoder bench run --tasks {out / 'tasks.jsonl'} --levels all --profile strict "
                              "--samples 8 --model ... --out ..."}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return HiddenResult(chosen, manifest)
