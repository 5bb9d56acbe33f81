"""Benchmark metrics as small pure functions, and the per-level / overall summary written to metrics.json.

Rates are fractions in [0, 1]. Every rate is a mean over tasks of the per-task fraction of samples, so a task
counts the same whatever number of its samples finished (with equal samples per task this equals the pooled rate).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from musacoder.bench.store import Row

FAST_PS = (0.0, 0.5, 1.0, 1.5, 2.0)  # KernelBench's fast_p thresholds


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def faster(correct: bool, speedup: float | None, p: float) -> bool:
    """Correct and measured faster than p x the baseline. An untimed sample is never counted as faster."""
    return correct and speedup is not None and speedup > p


def geomean(xs: Iterable[float]) -> float | None:
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


@dataclass(frozen=True)
class Outcome:
    """One sample, decided from its verified turns: the best passing turn (fastest vs eager) or else the last."""

    task: str
    level: int | None
    status: str
    compiled: bool  # reached the device: extracted, passed the static checks, built
    speedup_eager: float | None
    speedup_compile: float | None
    first_turn_ok: bool
    success_turn: int | None  # first turn that passed

    @property
    def correct(self) -> bool:
        return self.status == "ok"


def outcome(turns: list[Row]) -> Outcome | None:
    """None while the sample has no verified turn (still to generate or verify)."""
    done = [r for r in sorted(turns, key=lambda r: r.turn) if r.verified]
    if not done:
        return None
    ok = [r for r in done if r.passed]
    best = max(ok, key=lambda r: r.verdict.get("speedup_eager") or 0.0) if ok else done[-1]
    v = best.verdict
    return Outcome(task=best.task, level=best.level, status=best.status,
                   compiled="device" in v.get("stage_seconds", {}) and best.status not in ("compile_error",
                                                                                             "format_error"),
                   speedup_eager=v.get("speedup_eager"), speedup_compile=v.get("speedup_compile"),
                   first_turn_ok=done[0].turn == 1 and done[0].passed, success_turn=ok[0].turn if ok else None)


def task_fractions(outcomes: list[Outcome], pred: Callable[[Outcome], bool]) -> list[float]:
    """Each task's fraction of its samples for which pred holds."""
    by_task: dict[str, list[bool]] = defaultdict(list)
    for o in outcomes:
        by_task[o.task].append(bool(pred(o)))
    return [sum(v) / len(v) for v in by_task.values()]


def _mean(vals: list[float]) -> float | None:
    return sum(vals) / len(vals) if vals else None


def task_mean(outcomes: list[Outcome], pred: Callable[[Outcome], bool]) -> float | None:
    """Mean over tasks of the fraction of each task's samples for which pred holds."""
    return _mean(task_fractions(outcomes, pred))


def std_error(vals: list[float]) -> float | None:
    """Standard error of a mean over tasks. Tasks are the independent units: a task's samples are not (four passing
    samples of one task are one solved task, not four independent successes)."""
    if len(vals) < 2:
        return None
    m = sum(vals) / len(vals)
    return math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1) / len(vals))


def wilson_interval(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95% at z 1.96) of a rate `p` over `n` independent units. Unlike mean +- z x SE it
    stays inside [0, 1] and is not empty at 0 or 1 (0 of 84 tasks: 0-4.4%). For Pass@k the units are tasks and a
    task's value is a fraction; a fraction's variance is at most p(1 - p), the Bernoulli variance this assumes, so
    the interval errs on the wide side."""
    if n < 1:
        raise ValueError(f"need at least one unit, got n={n}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"a rate is in [0, 1], got {p}")
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_at_k_values(outcomes: list[Outcome]) -> dict[str, list[float]]:
    """Each task's Pass@k, for every k up to the largest sample count (tasks with at least k samples)."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for o in outcomes:
        counts[o.task][0] += 1
        counts[o.task][1] += o.correct
    top = max((n for n, _ in counts.values()), default=0)
    return {str(k): [pass_at_k(n, c, k) for n, c in counts.values() if n >= k] for k in range(1, top + 1)}


def pass_at_ks(outcomes: list[Outcome]) -> dict[str, float]:
    """Pass@k for every k up to the largest sample count, averaged over the tasks with at least k samples."""
    return {k: _mean(v) for k, v in pass_at_k_values(outcomes).items()}


def summarize(outcomes: list[Outcome], statuses: Counter, threshold: float = 1.1, ps=FAST_PS,
              multi_turn: bool = False) -> dict:
    """One block of metrics.json. `statuses` counts every sample's current status, unfinished ones included."""
    rates = {"avg": lambda o: o.correct,  # Avg@n: mean fraction of a task's samples that pass
             "faster_rate_eager": lambda o: faster(o.correct, o.speedup_eager, threshold),
             "faster_rate_compile": lambda o: faster(o.correct, o.speedup_compile, threshold),
             "compile_rate": lambda o: o.compiled}
    rates |= {f"fast_{p:g}": lambda o, p=p: faster(o.correct, o.speedup_eager, p) for p in ps}
    per_task = {k: task_fractions(outcomes, f) for k, f in rates.items()}
    per_task |= {f"pass@{k}": v for k, v in pass_at_k_values(outcomes).items()}
    means = {k: _mean(v) for k, v in per_task.items()}
    block = {
        "tasks": len({o.task for o in outcomes}),
        "samples": len(outcomes),
        "pass_at_k": {k[5:]: v for k, v in means.items() if k.startswith("pass@")},
        # 95% interval over tasks (the tasks with at least k samples), for every k
        "pass_at_k_ci": {k[5:]: list(wilson_interval(means[k], len(v))) for k, v in per_task.items()
                         if k.startswith("pass@") and v},
        **{k: means[k] for k in ("avg", "faster_rate_eager", "faster_rate_compile")},
        "fast_p": {f"{p:g}": means[f"fast_{p:g}"] for p in ps},
        "compile_rate": means["compile_rate"],
        "correct_timed": sum(o.correct and o.speedup_eager is not None for o in outcomes),
        "geomean_speedup_eager": geomean(o.speedup_eager for o in outcomes if o.correct),
        "geomean_speedup_compile": geomean(o.speedup_compile for o in outcomes if o.correct),
        "status": dict(sorted(statuses.items())),
        "se": {k: std_error(v) for k, v in per_task.items()},  # of each rate's mean over tasks (bench compare)
    }
    if multi_turn:
        tts = Counter(str(o.success_turn) if o.success_turn else "never" for o in outcomes)
        block["multi_turn"] = {"first_turn_accuracy": task_mean(outcomes, lambda o: o.first_turn_ok),
                               "best_turn_accuracy": task_mean(outcomes, lambda o: o.correct),
                               "turns_to_success": dict(sorted(tts.items()))}
    return block


def level_name(level: int | None) -> str:
    return f"level{level}" if level is not None else "unlevelled"


def by_sample(rows: list[Row]) -> list[list[Row]]:
    """The store's rows grouped per (task, sample)."""
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for r in rows:
        groups[(r.task, r.sample)].append(r)
    return list(groups.values())


def failure_reason(r: Row) -> str | None:
    """Why a stored step failed: the generation error (e.g. a dead server's ConnectError) or the verdict's reason."""
    if r.error:
        return r.error
    if r.verdict and r.status != "ok":
        return r.verdict.get("reason") or r.status
    return None


def per_task(rows: list[Row]) -> dict:
    """Per task: current status counts (one per sample), best eager speedup of a pass, first failing reason."""
    out: dict[str, dict] = {}
    for turns in sorted(by_sample(rows), key=lambda t: (t[0].task, t[0].sample)):
        last = max(turns, key=lambda r: r.turn)
        o = outcome(turns)
        status = o.status if o and last.verified else last.status
        d = out.setdefault(last.task, {"level": last.level, "status": Counter(), "best_speedup": None,
                                       "first_failure": None})
        d["status"][status] += 1
        if o and o.correct and o.speedup_eager is not None:
            d["best_speedup"] = max(d["best_speedup"] or 0.0, o.speedup_eager)
        for r in sorted(turns, key=lambda r: r.turn):
            if d["first_failure"] is None and failure_reason(r):
                d["first_failure"] = f"{r.status}: {failure_reason(r)}"
    for d in out.values():
        d["status"] = dict(sorted(d["status"].items()))
    return out


def failures(rows: list[Row], top: int = 10) -> list[list]:
    """The most frequent failure reasons over every stored step: [count, status, reason (first line)]."""
    c = Counter()
    for r in rows:
        why = failure_reason(r)
        if why:
            c[(r.status, why.strip().splitlines()[0][:200] if why.strip() else r.status)] += 1
    return [[n, st, why] for (st, why), n in c.most_common(top)]


def compute_metrics(rows: list[Row], threshold: float = 1.1, ps=FAST_PS, multi_turn: bool = False) -> dict:
    """Overall and per-level blocks from the store's rows, plus token and time totals."""
    outcomes, statuses = [], Counter()
    for turns in by_sample(rows):
        o = outcome(turns)
        if o:
            outcomes.append(o)
        # a sample's status is its outcome's, unless a later step is unfinished (generation error, unverified)
        last = max(turns, key=lambda r: r.turn)
        statuses[(turns[0].level, last.status if not last.verified else o.status)] += 1

    def block(level_filter) -> dict:
        sel = [o for o in outcomes if level_filter(o.level)]
        st = Counter()
        for (lv, s), n in statuses.items():
            if level_filter(lv):
                st[s] += n
        return summarize(sel, st, threshold, ps, multi_turn)

    levels = sorted({r.level for r in rows}, key=lambda lv: (lv is None, lv or 0))
    return {
        "overall": block(lambda lv: True),
        "levels": {level_name(lv): block(lambda x, lv=lv: x == lv) for lv in levels},
        "tokens": {"prompt": sum(r.prompt_tokens or 0 for r in rows),
                   "completion": sum(r.completion_tokens or 0 for r in rows)},
        "truncated": sum(r.finish_reason == "length" for r in rows),  # answers cut at max_tokens
        "seconds": {"generation": round(sum(r.gen_seconds or 0 for r in rows), 3),
                    "verification": round(sum(r.verify_seconds or 0 for r in rows), 3)},
        "threshold": threshold,
        "per_task": per_task(rows),
        "failures": failures(rows),
    }
