"""Mixing by prior diagnosis (issue 14, item 4): measure a base model per operator family with the bench runner, and
turn the measurements into family weights for SFT data mixing (train/data.py `mix`).

`diagnose(tasks, client, out_dir, ...)` runs `bench.runner.run_bench` into `out_dir` (samples.sqlite, metrics.json,
report.md: the benchmark as `bench run` writes it, and resumed the same way), then aggregates its samples per
operator family: a task counts in each of its families. A task's families are the ones its record came with
(`synth tasks`, `synth variants`), else measured the way `synth tasks` measures them (clean.py: the aten ops of one
eager forward on the cpu), cached in `task_families.json`.

Per family: samples (finished ones), tasks, and three rates, each a mean over the family's tasks of the fraction of
the task's samples (as bench's metrics are): compile (reached the device), correct (passed MooreEval) and fast_1
(correct and faster than PyTorch eager: KernelBench's fast_1; not measured when timing is off).

The weights (`family_weights`, pure): score = the mean of the family's rates (compile, correct, fast_1; without
timing compile and correct), gap = 1 - score, and

    weight = clip((gap + eps) / (mean gap + eps), w_min, w_max)

with the mean over the families with at least `min_samples` samples. So a family as weak as the average keeps
weight 1, a weaker one is upsampled, an easier one downsampled, and a weaker family never gets a smaller weight
(the weight does not decrease in the gap). A family with fewer samples gets weight 1 and is flagged `few_samples`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from musacoder.bench.clients.base import Client
from musacoder.bench.metrics import by_sample, faster, outcome, task_mean
from musacoder.bench.runner import BenchConfig, run_bench
from musacoder.bench.store import Store
from musacoder.config import VerifyConfig
from musacoder.tasks.model import Task

FAMILIES_JSON = "families.json"
TASK_FAMILIES = "task_families.json"  # measured families of tasks that came without them, by key and code hash
RATES = ("compile", "correct", "fast_1")
MEASURE_SCALE = 0.25  # task sizes for measuring families (the aten ops do not depend on them); full size on failure


class NoSamples(ValueError):
    """Nothing was measured (every generation failed: a dead server, a replay without the answers): no weights."""


@dataclass(frozen=True)
class WeightRule:
    eps: float = 0.05  # keeps the ratio finite when every family is solved (then every weight is 1)
    w_min: float = 0.25
    w_max: float = 4.0
    min_samples: int = 8  # per family; fewer: weight 1, flagged

    def __post_init__(self):
        if not 0 < self.w_min <= 1 <= self.w_max:
            raise ValueError(f"weights need 0 < w_min <= 1 <= w_max, not {self.w_min}, {self.w_max}")
        if self.eps <= 0 or self.min_samples < 1:
            raise ValueError("eps must be > 0 and min_samples >= 1")

    def describe(self, timed: bool) -> dict:
        rates = RATES if timed else RATES[:2]
        return {"score": f"mean of {', '.join(rates)}", "formula": "clip((gap + eps) / (mean gap + eps), w_min, "
                "w_max), gap = 1 - score, mean over families with at least min_samples samples; fewer: weight 1",
                **asdict(self)}


def score(stats: dict, timed: bool = True) -> float | None:
    """The mean of a family's rates (fast_1 only when timed); None when it has no sample."""
    rates = [stats.get(k) for k in (RATES if timed else RATES[:2])]
    return None if any(r is None for r in rates) else sum(rates) / len(rates)


def family_weights(per_family: dict[str, dict], rule: WeightRule | None = None, timed: bool = True
                   ) -> dict[str, dict]:
    """{family: {score, weight, few_samples}} from {family: {samples, compile, correct, fast_1}} (see the module)."""
    rule = rule or WeightRule()
    scores = {f: score(s, timed) for f, s in per_family.items()}
    few = {f: s["samples"] < rule.min_samples or scores[f] is None for f, s in per_family.items()}
    gaps = [1 - scores[f] for f in per_family if not few[f]]
    mean_gap = sum(gaps) / len(gaps) if gaps else 0.0
    out = {}
    for f in per_family:
        w = 1.0 if few[f] else min(rule.w_max, max(rule.w_min, (1 - scores[f] + rule.eps) / (mean_gap + rule.eps)))
        out[f] = {"score": None if scores[f] is None else round(scores[f], 4), "weight": round(w, 4),
                  "few_samples": few[f]}
    return out


def family_stats(rows: list, families: dict[str, list[str]], fast_p: float = 1.0, timed: bool = True
                 ) -> dict[str, dict]:
    """{family: {samples, tasks, compile, correct, fast_1}} from a bench store's rows; `families`: task key -> its
    families (a task counts in each; tasks not in it count nowhere). Rates are None for a family without samples."""
    outcomes = defaultdict(list)
    for turns in by_sample(rows):
        o = outcome(turns)
        if o is not None:
            for f in families.get(o.task, []):
                outcomes[f].append(o)
    names = sorted({f for fs in families.values() for f in fs})
    out = {}
    for f in names:
        os_ = outcomes.get(f, [])
        out[f] = {"samples": len(os_), "tasks": len({o.task for o in os_}),
                  "tasks_selected": sum(f in fs for fs in families.values()),
                  "compile": task_mean(os_, lambda o: o.compiled), "correct": task_mean(os_, lambda o: o.correct),
                  "fast_1": task_mean(os_, lambda o: faster(o.correct, o.speedup_eager, fast_p)) if timed else None}
    return out


def task_families(tasks: list[Task], cache: Path | None = None,
                  progress: Callable[[int, int], None] | None = None) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(task key -> families, task key -> why its families could not be measured). Families a task record came with
    are used as they are; the others are measured (clean.measure_families at MEASURE_SCALE of the sizes, else at
    full size) and kept in `cache` by key and code hash."""
    from musacoder.synth.clean import known_families, measure_families

    stored = json.loads(cache.read_text()) if cache is not None and cache.is_file() else {}
    out, failed, changed = {}, {}, False
    for i, t in enumerate(tasks, 1):
        fams = known_families(t)
        hit = stored.get(t.key)
        if not fams and hit and hit.get("code_hash") == t.code_hash:
            fams = hit["families"]
        elif not fams:
            try:
                try:
                    fams = measure_families(t.code, MEASURE_SCALE, min_size=8)
                except Exception:  # noqa: BLE001 -- a task that does not run scaled down: at its own sizes
                    fams = measure_families(t.code)
            except Exception as e:  # noqa: BLE001 -- the task's own code failed: its samples count nowhere
                failed[t.key] = f"{type(e).__name__}: {e}"[:300]
                continue
            stored[t.key] = {"code_hash": t.code_hash, "families": fams}
            changed = True
        out[t.key] = list(fams)
        if progress:
            progress(i, len(tasks))
    if cache is not None and changed:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    return out, failed


def diagnose(tasks: list[Task], client: Client, out_dir: Path, model: str, bench: BenchConfig | None = None,
             verify: VerifyConfig | None = None, rule: WeightRule | None = None, console=None,
             progress: Callable[[int, int], None] | None = None) -> dict:
    """Run (or resume) the benchmark of `client` on `tasks` into `out_dir` and write families.json there; return its
    content plus `metrics` (bench's). NoSamples, and no families.json written, when no sample finished."""
    bench = bench or BenchConfig()
    verify = verify or VerifyConfig()
    rule = rule or WeightRule()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fams, unmeasured = task_families(tasks, out_dir / TASK_FAMILIES, progress)
    metrics = run_bench(tasks, client, out_dir, bench, verify, console=console)
    keys = {t.key for t in tasks}
    store = Store(out_dir / "samples.sqlite")
    try:
        rows = [r for r in store.rows() if r.task in keys and r.sample < bench.samples and r.turn <= bench.turns]
    finally:
        store.close()
    timed = verify.timing_enabled
    per_family = family_stats(rows, fams, timed=timed)
    finished = metrics["overall"]["samples"]
    if not finished:
        why = metrics["failures"][0][2] if metrics["failures"] else "no sample finished"
        raise NoSamples(f"no sample of the {len(tasks)} task(s) was generated and verified ({client.fatal or why}); "
                        f"nothing to weigh. The failures are kept in {out_dir} (report.md); rerun the same command "
                        "once the model answers")
    weights = family_weights(per_family, rule, timed)
    result = {"model": model, "tasks": len(tasks), "samples_per_task": bench.samples,
              "backend": metrics["run"]["backend"], "timing": timed, "samples": finished,
              "unfinished": metrics["unfinished"],
              "per_family": {f: {**s, **weights[f]} for f, s in per_family.items()},
              "rule": rule.describe(timed), "task_families": fams, "unmeasured_tasks": unmeasured}
    (out_dir / FAMILIES_JSON).write_text(json.dumps(result, indent=1) + "\n")
    return {**result, "metrics": metrics}


def table(result: dict):
    """A rich table of families.json's per_family, weakest first."""
    from rich.table import Table

    def pct(x):
        return "-" if x is None else f"{100 * x:.0f}%"

    t = Table(title=f"families of {result['tasks']} task(s), {result['samples']} sample(s)")
    for col in ("family", "tasks", "samples", "compile", "correct", "fast_1", "score", "weight"):
        t.add_column(col, justify="left" if col == "family" else "right")
    rows = sorted(result["per_family"].items(), key=lambda kv: (kv[1]["score"] is None, kv[1]["score"] or 0, kv[0]))
    for f, s in rows:
        t.add_row(f, str(s["tasks"]), str(s["samples"]), pct(s["compile"]), pct(s["correct"]),
                  pct(s["fast_1"]) if result["timing"] else "untimed",
                  "-" if s["score"] is None else f"{s['score']:.2f}",
                  f"{s['weight']:.2f}" + (" (few)" if s["few_samples"] else ""))
    return t
