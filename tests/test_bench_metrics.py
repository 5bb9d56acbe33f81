"""Benchmark metrics: exact values on hand-made samples, and the report and comparison built from them."""

import json
from collections import Counter
from fractions import Fraction
from itertools import combinations

import pytest

from musacoder.bench.metrics import (
    Outcome,
    compute_metrics,
    faster,
    geomean,
    outcome,
    pass_at_k,
    pass_at_ks,
    summarize,
    task_mean,
    wilson_interval,
)
from musacoder.bench.report import compare, write_report
from musacoder.bench.store import Row


def row(task="level1/1_A", sample=0, turn=1, status="ok", level=1, se=None, sc=None, device=True, **kw):
    verdict = None
    if status not in ("generated", "generation_error"):
        verdict = {"status": status, "speedup_eager": se, "speedup_compile": sc, "feedback": f"fb {status}",
                   "stage_seconds": {"static": 0.0, **({"device": 1.0} if device else {})}}
    base = dict(task=task, level=level, sample=sample, turn=turn, status=status, messages=[], raw="x", code="x",
                error=None, verdict=verdict, prompt_tokens=10, completion_tokens=5, finish_reason="stop", gen_seconds=1.0,
                verify_seconds=2.0, attempts=1, updated=0.0)
    return Row(**{**base, **kw})


def oc(task="t", correct=True, se=None, sc=None, compiled=True, level=1, first=None, success=None):
    return Outcome(task, level, "ok" if correct else "incorrect", compiled, se, sc,
                   correct if first is None else first, success)


def test_pass_at_k_exact():
    assert pass_at_k(8, 0, 1) == 0.0
    assert pass_at_k(8, 1, 1) == 0.125
    assert pass_at_k(8, 1, 8) == 1.0
    assert pass_at_k(8, 8, 3) == 1.0
    assert pass_at_k(8, 2, 2) == pytest.approx(13 / 28, abs=1e-15)  # 1 - C(6,2)/C(8,2)
    assert pass_at_k(8, 6, 3) == 1.0  # fewer than k wrong samples: some draw always passes
    for n in range(1, 9):  # against brute force: the share of all k-subsets holding a correct sample
        for c in range(n + 1):
            for k in range(1, n + 1):
                subsets = list(combinations(range(n), k))
                hit = Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))
                assert pass_at_k(n, c, k) == pytest.approx(float(hit), abs=1e-15)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_pass_at_ks_averages_tasks_with_enough_samples():
    outs = [oc("a", True), oc("a", False), oc("b", False), oc("b", False), oc("c", True)]  # c has only 1 sample
    p = pass_at_ks(outs)
    assert set(p) == {"1", "2"}
    assert p["1"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert p["2"] == pytest.approx((1 + 0) / 2)  # c is not in the k=2 average


def test_faster_and_geomean():
    assert faster(True, 1.2, 1.1) and not faster(True, 1.1, 1.1) and not faster(False, 9.0, 1.1)
    assert not faster(True, None, 0.0)  # an untimed sample is never faster
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([None, 4.0]) == pytest.approx(4.0)
    assert geomean([]) is None


def test_task_mean_weights_tasks_equally():
    outs = [oc("a", True), oc("a", True), oc("a", True), oc("b", False)]
    assert task_mean(outs, lambda o: o.correct) == pytest.approx(0.5)  # pooled would be 0.75
    assert task_mean([], lambda o: True) is None


def test_summarize_rates_and_fast_p():
    outs = [oc("a", True, se=1.5, sc=0.9), oc("a", True, se=1.05, sc=1.2), oc("a", False, compiled=False),
            oc("a", True, se=None, sc=None), oc("b", True, se=3.0, sc=2.5), oc("b", False)]
    m = summarize(outs, Counter(ok=4, incorrect=2), threshold=1.1)
    assert m["tasks"] == 2 and m["samples"] == 6
    assert m["avg"] == pytest.approx((3 / 4 + 1 / 2) / 2)
    assert m["faster_rate_eager"] == pytest.approx((1 / 4 + 1 / 2) / 2)
    assert m["faster_rate_compile"] == pytest.approx((1 / 4 + 1 / 2) / 2)
    assert m["fast_p"]["0"] == pytest.approx((2 / 4 + 1 / 2) / 2)  # timed correct samples only
    assert m["fast_p"]["1"] == pytest.approx((2 / 4 + 1 / 2) / 2)
    assert m["fast_p"]["1.5"] == pytest.approx((0 + 1 / 2) / 2)  # strictly above p
    assert m["fast_p"]["2"] == pytest.approx(0.25)
    assert m["compile_rate"] == pytest.approx((3 / 4 + 1) / 2)
    assert m["geomean_speedup_eager"] == pytest.approx((1.5 * 1.05 * 3.0) ** (1 / 3))
    assert m["correct_timed"] == 3
    assert m["status"] == {"incorrect": 2, "ok": 4}
    assert "multi_turn" not in m
    assert summarize(outs, Counter(), threshold=1.0)["faster_rate_eager"] == pytest.approx((2 / 4 + 1 / 2) / 2)


def test_wilson_interval_of_pass_at_k():
    lo, hi = wilson_interval(0.0, 84)
    assert lo == 0.0 and hi == pytest.approx(1.96**2 / (84 + 1.96**2))  # 0 of 84 is not [0, 0]
    lo, hi = wilson_interval(30 / 84, 84)
    assert lo == pytest.approx(0.2630, abs=1e-4) and hi == pytest.approx(0.4638, abs=1e-4)  # by hand
    assert wilson_interval(1.0, 5)[1] == 1.0 and wilson_interval(0.5, 10)[0] < 0.5 < wilson_interval(0.5, 10)[1]
    assert wilson_interval(0.3, 400)[1] - wilson_interval(0.3, 400)[0] < wilson_interval(0.3, 40)[1] - \
        wilson_interval(0.3, 40)[0]  # narrower with more tasks
    with pytest.raises(ValueError):
        wilson_interval(0.5, 0)
    # in metrics.json: per k, over the tasks with at least k samples, around the mean
    outs = [oc("a", True), oc("a", False), oc("b", False), oc("b", False), oc("c", True)]
    m = summarize(outs, Counter())
    assert set(m["pass_at_k_ci"]) == {"1", "2"}
    lo, hi = m["pass_at_k_ci"]["2"]  # a and b have 2 samples: Pass@2 1 and 0
    assert (lo, hi) == pytest.approx(wilson_interval(0.5, 2)) and lo < m["pass_at_k"]["2"] < hi
    assert m["pass_at_k_ci"]["1"] == pytest.approx(list(wilson_interval(m["pass_at_k"]["1"], 3)))


def test_outcome_picks_fastest_passing_turn_and_first_success():
    o = outcome([row(turn=1, status="incorrect"), row(turn=2, status="ok", se=1.2), row(turn=3, status="ok", se=2.0)])
    assert o.correct and o.speedup_eager == 2.0 and o.success_turn == 2 and not o.first_turn_ok
    o = outcome([row(turn=2, status="generation_error"), row(turn=1, status="compile_error", device=False)])
    assert o.status == "compile_error" and not o.compiled and o.success_turn is None
    assert outcome([row(status="generated")]) is None
    assert not outcome([row(status="illegal", device=False)]).compiled  # refused statically: never built
    assert outcome([row(status="illegal")]).compiled


def test_compute_metrics_levels_statuses_multi_turn():
    rows = [
        row("level1/1_A", 0, 1, "ok", se=2.0), row("level1/1_A", 1, 1, "incorrect"), row("level1/1_A", 1, 2, "ok"),
        row("level1/2_B", 0, 1, "format_error", device=False), row("level1/2_B", 0, 2, "generation_error"),
        row("level1/2_B", 1, 1, "compile_error", device=False), row("level1/2_B", 1, 2, "incorrect"),
        row("level2/3_C", 0, 1, "generation_error", level=2), row("level2/3_C", 1, 1, "ok", level=2, se=0.5),
    ]
    m = compute_metrics(rows, multi_turn=True)
    ov, l1, l2 = m["overall"], m["levels"]["level1"], m["levels"]["level2"]
    assert list(m["levels"]) == ["level1", "level2"]
    assert ov["status"] == {"generation_error": 2, "incorrect": 1, "ok": 3}
    assert l1["status"] == {"generation_error": 1, "incorrect": 1, "ok": 2}
    assert ov["samples"] == 5 and ov["tasks"] == 3  # 3_C sample 0 never generated: not evaluated
    assert l1["pass_at_k"] == {"1": pytest.approx(0.5), "2": pytest.approx(0.5)}
    assert l2["pass_at_k"] == {"1": 1.0}
    assert l1["multi_turn"]["first_turn_accuracy"] == pytest.approx(0.25)
    assert l1["multi_turn"]["best_turn_accuracy"] == pytest.approx(0.5)
    assert l1["multi_turn"]["turns_to_success"] == {"1": 1, "2": 1, "never": 2}
    assert m["tokens"] == {"prompt": 90, "completion": 45} and m["truncated"] == 0
    assert m["seconds"]["verification"] == pytest.approx(18.0)


def _metrics_for(rows, samples, turns=1):
    m = compute_metrics(rows, multi_turn=turns > 1)
    m["unfinished"] = 0
    m["run"] = {"model": "m", "tasks": 2, "samples": samples, "turns": turns, "temperature": 0.7, "backend": "cpu",
                "profile": "strict", "precision": "fp32", "timing": True}
    return m


def test_report_and_compare(tmp_path):
    rows_a = [row("level1/1_A", 0, 1, "ok", se=1.5, sc=1.2), row("level1/1_A", 1, 1, "incorrect"),
              row("level2/2_B", 0, 1, "incorrect", level=2), row("level2/2_B", 1, 1, "incorrect", level=2)]
    rows_b = rows_a[:3] + [row("level2/2_B", 1, 1, "ok", level=2, se=1.0)]
    a, b = tmp_path / "a", tmp_path / "b"
    for d, rows in ((a, rows_a), (b, rows_b)):
        d.mkdir()
        m = _metrics_for(rows, 2)
        (d / "metrics.json").write_text(json.dumps(m))
        write_report(d, m, rows)
    text = (a / "report.md").read_text()
    assert "| overall | 50.0 | 25.00 | 25.0 | 25.0 |" in text  # Pass@2, Avg@2, faster vs eager, vs compile
    assert "| level1 | 100.0 | 50.00 | 50.0 | 50.0 |" in text
    assert "| level2 | 0.0 | 0.00 | 0.0 | 0.0 |" in text
    for png in ("fast_p.png", "levels.png", "status.png"):
        assert (a / png).read_bytes()[:4] == b"\x89PNG"
    cmp = compare(a, b)
    assert "| Pass@2 | 50.0 | 100.0 | +50.0 |" in cmp
    assert "| Avg@2 | 25.0 | 50.0 | +25.0 |" in cmp
    assert "## level2 (%)" in cmp and "| Faster vs eager | 25.0 | 25.0 | +0.0 |" in cmp
    with pytest.raises(FileNotFoundError):
        compare(a, tmp_path / "missing")


def test_compare_takes_tasks_not_samples_as_the_unit(tmp_path):
    """One task solved 4 times of 4, out of 38 (a bench of a small SFT model, 2026-11-25): per-sample counting called
    Pass@1 2.6% against 0 'beyond noise'; over tasks it is one solved task, within noise. 20 of 38 is beyond it."""
    def run(name, solved, per_task=4):
        outs = [oc(f"t{i}", i < solved) for i in range(38) for _ in range(per_task)]
        block = summarize(outs, Counter())
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(
            {"run": {"model": name, "samples": per_task}, "overall": block, "levels": {}}))

    run("base", 0)
    run("one", 1)
    run("many", 20)
    assert "| Pass@1 | 0.0 | 2.6 | +2.6 | within noise |" in compare(tmp_path / "base", tmp_path / "one")
    assert "| Pass@1 | 0.0 | 52.6 | +52.6 | beyond noise |" in compare(tmp_path / "base", tmp_path / "many")
