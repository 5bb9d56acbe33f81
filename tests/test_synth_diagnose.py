"""Mixing by prior diagnosis (issue 14, item 4): `synth diagnose` measures a model per operator family through the
bench runner and the real verifier (cpu backend, the replay client: no model can run here), and `mix` draws more
items of the families it is weak at. Kept cheap: no answer here needs a C++ build (a plain-PyTorch answer reaches
the device and is refused there, a prose answer never compiles); correctness and fast_1 are aggregated from
stored rows directly."""

import json
import random
from collections import Counter

import pytest
from test_bench_clients import dead_url, fast

from musacoder.bench.clients.openai import OpenAIClient
from musacoder.bench.store import Row
from musacoder.cli import app
from musacoder.data.records import DataError
from musacoder.data.schema import SolveMeta, line
from musacoder.synth.clean import known_families, measure_families, with_families
from musacoder.synth.diagnose import FAMILIES_JSON, WeightRule, family_stats, family_weights
from musacoder.tasks import builtin_task
from musacoder.tasks.loaders import load_tasks
from musacoder.train.data import item_families, mix
from musacoder.train.sft import SFTConfig

RELU, GEMM = builtin_task("level1/19_ReLU"), builtin_task("level2/76_Gemm_Add_ReLU")
PLAIN_TORCH = "```python\nimport torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n" \
              "    def forward(self, x):\n        return torch.clamp(x, min=0)\n```"  # compiles, refused: illegal
NO_CODE = "I would write a loop over the elements."  # format_error: never compiles


def call(*args) -> int:
    with pytest.raises(SystemExit) as e:
        app(["synth", "diagnose", *args], prog_name="musacoder")
    return e.value.code


def test_diagnose_weighs_the_weak_family_up_and_mix_draws_it_more(tmp_path, capsys, monkeypatch, cache_dir):
    monkeypatch.setenv("MUSACODER_CACHE", cache_dir)
    replay = tmp_path / "r.jsonl"
    replay.write_text("".join(json.dumps({"task": t.key, "sample": s, "output": a}) + "\n"
                              for t, a in ((RELU, PLAIN_TORCH), (GEMM, NO_CODE)) for s in range(2)))
    out = tmp_path / "diag"
    args = ["--model", f"replay:{replay}", "--out", str(out), "--names", f"{RELU.key},{GEMM.key}", "--samples", "2",
            "--backend", "cpu", "--no-timing", "--min-samples", "2"]
    assert call(*args) == 0
    res = json.loads((out / FAMILIES_JSON).read_text())
    fam = res["per_family"]
    assert res["task_families"] == {RELU.key: ["activation"], GEMM.key: ["matmul", "elementwise", "activation"]}
    assert fam["activation"] == {"samples": 4, "tasks": 2, "tasks_selected": 2, "compile": 0.5, "correct": 0.0,
                                 "fast_1": None, "score": 0.25, "weight": fam["activation"]["weight"],
                                 "few_samples": False}
    assert fam["matmul"]["compile"] == 0.0 and fam["matmul"]["score"] == 0.0
    assert fam["matmul"]["weight"] > 1 > fam["activation"]["weight"]  # the weak family up, the easier one down
    assert res["samples"] == 4 and res["unfinished"] == 0 and res["rule"]["score"] == "mean of compile, correct"
    err = capsys.readouterr().err
    assert "matmul" in err and "untimed" in err and "families.json" in err
    assert json.loads((out / "metrics.json").read_text())["overall"]["samples"] == 4  # bench's own run, resumable
    assert call(*args) == 0 and json.loads((out / FAMILIES_JSON).read_text())["per_family"] == fam  # resumed as is

    # SFT records carry their task's families; mix weighs them by families.json
    data = tmp_path / "sft.jsonl"
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    data.write_text("".join(json.dumps({"messages": msgs, "metadata": {"families": f, "i": i}}) + "\n"
                            for i in range(20) for f in (["matmul"], ["activation"], [])))
    m = mix([str(data)], seed=3, family_weights=out / FAMILIES_JSON)
    drawn = Counter(tuple(item_families(x)) for x in m.items)
    assert drawn[("matmul",)] > drawn[()] == 20 > drawn[("activation",)]
    assert abs(drawn[("matmul",)] - 20 * fam["matmul"]["weight"]) < 1  # one weight: within one of expected
    assert abs(drawn[("activation",)] - 20 * fam["activation"]["weight"]) < 1
    assert m.stats[0]["families"]["matmul"] == {"items": 20, "drawn": drawn[("matmul",)]}
    assert m.stats[0]["families"]["(none)"] == {"items": 20, "drawn": 20}
    assert m.family_weights["matmul"] == fam["matmul"]["weight"]
    again = mix([str(data)], seed=3, family_weights=out / FAMILIES_JSON)
    assert [x[0].origin for x in again.items] == [x[0].origin for x in m.items]  # reproducible from the seed
    assert len(mix([str(data)], seed=3).items) == 60  # without weights: as before
    cfg = SFTConfig.from_dict({"data": [str(data)], "init": {"model_type": "llama"},
                               "family_weights": str(out / FAMILIES_JSON)})
    assert cfg.family_weights == str(out / FAMILIES_JSON)  # what build_trainer hands to mix
    (tmp_path / "bad.json").write_text('{"matmul": -1}')
    with pytest.raises(DataError, match="family weights"):
        mix([str(data)], family_weights=tmp_path / "bad.json")


def test_bad_input_and_nothing_generated_write_no_weights(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MUSACODER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "diag"
    base = ["--out", str(out), "--names", RELU.key, "--samples", "1", "--backend", "cpu", "--no-timing"]
    assert call("--model", "foo:bar", *base) == 2
    assert call("--model", f"replay:{tmp_path / 'missing.jsonl'}", *base) == 2
    assert call("--model", "replay:x", "--out", str(out), "--names", "no_such_task") == 2
    err = capsys.readouterr().err
    assert "error: --model: model spec 'foo:bar': unknown kind 'foo'" in err and "does not exist" in err
    assert "error: no task in the shipped tasks matches --names no_such_task" in err and "Traceback" not in err

    (tmp_path / "empty.jsonl").write_text("")
    assert call("--model", f"replay:{tmp_path / 'empty.jsonl'}", *base) == 2
    err = capsys.readouterr().err
    assert "error: no sample of the 1 task(s) was generated and verified (no replay sample for level1/19_ReLU" in err
    assert not (out / FAMILIES_JSON).exists() and (out / "samples.sqlite").exists()

    import musacoder.bench.clients as clients

    monkeypatch.setattr(clients, "make_client", lambda spec, **kw: OpenAIClient("m", fast(base_url=dead_url(),
                                                                                          retries=0)))
    assert call("--model", "openai:m", *[*base[:1], str(tmp_path / "dead"), *base[2:]]) == 2
    err = capsys.readouterr().err
    assert "error: no sample of the 1 task(s) was generated and verified" in err and "Connect" in err
    assert not (tmp_path / "dead" / FAMILIES_JSON).exists()


def _row(task: str, sample: int, status: str, speedup: float | None = None) -> Row:
    verdict = {"status": status, "stage_seconds": {"device": 1.0}, "speedup_eager": speedup}
    return Row(task, 1, sample, 1, status, [], "x", "x", None, verdict, None, None, None, None, None, 1, 0.0)


def test_family_stats_count_a_task_in_each_of_its_families():
    rows = [_row("a", 0, "ok", 1.5), _row("a", 1, "ok", 0.8), _row("b", 0, "incorrect"), _row("b", 1, "ok", 2.0),
            _row("c", 0, "ok", None)]
    fams = {"a": ["matmul", "activation"], "b": ["activation"], "c": ["softmax"], "d": ["loss"]}
    s = family_stats(rows, fams)
    assert s["matmul"] == {"samples": 2, "tasks": 1, "tasks_selected": 1, "compile": 1.0, "correct": 1.0,
                           "fast_1": 0.5}
    assert s["activation"]["samples"] == 4 and s["activation"]["correct"] == 0.75  # mean over tasks of (1, 0.5)
    assert s["activation"]["fast_1"] == 0.5 and s["softmax"]["fast_1"] == 0.0  # untimed is never faster
    assert s["loss"] == {"samples": 0, "tasks": 0, "tasks_selected": 1, "compile": None, "correct": None,
                         "fast_1": None}
    assert family_stats(rows, fams, timed=False)["matmul"]["fast_1"] is None
    w = family_weights(s, WeightRule(min_samples=2))
    assert w["loss"] == {"score": None, "weight": 1.0, "few_samples": True}
    assert w["softmax"]["few_samples"] and w["softmax"]["weight"] == 1.0  # one sample: not enough to weigh
    assert w["activation"]["weight"] > w["matmul"]["weight"]  # less often correct and fast: weaker


def test_weights_are_monotone_clipped_and_neutral_when_families_are_alike():
    rng = random.Random(0)
    for _ in range(50):
        stats = {f"f{i}": {"samples": 10, "compile": rng.random(), "correct": rng.random(), "fast_1": rng.random()}
                 for i in range(rng.randint(1, 8))}
        rule = WeightRule(w_min=rng.choice([0.25, 0.5, 1.0]), w_max=rng.choice([1.0, 2.0, 4.0]))
        w = family_weights(stats, rule)
        by_score = sorted(w.values(), key=lambda x: x["score"])
        assert all(a["weight"] >= b["weight"] for a, b in zip(by_score, by_score[1:]))  # weaker: never smaller
        assert all(rule.w_min <= x["weight"] <= rule.w_max for x in w.values())
    same = {f: {"samples": 9, "compile": 0.5, "correct": 0.5, "fast_1": 0.5} for f in "ab"}
    assert {x["weight"] for x in family_weights(same).values()} == {1.0}
    solved = {f: {"samples": 9, "compile": 1.0, "correct": 1.0, "fast_1": 1.0} for f in "ab"}
    assert {x["weight"] for x in family_weights(solved).values()} == {1.0}
    extreme = {"easy": {"samples": 99, "compile": 1, "correct": 1, "fast_1": 1},
               **{f"hard{i}": {"samples": 99, "compile": 0, "correct": 0, "fast_1": 0} for i in range(9)}}
    w = family_weights(extreme, WeightRule(w_min=0.25, w_max=4.0))
    assert w["easy"]["weight"] == 0.25 and w["hard0"]["weight"] == pytest.approx(1.05 / 0.95, abs=1e-4)
    with pytest.raises(ValueError):
        WeightRule(w_min=2.0)


def test_task_records_keep_their_families_and_records_carry_them(tmp_path):
    f = tmp_path / "tasks.jsonl"
    meta = {"families": ["matmul", "activation"], "verify_config": {"profile": "kernelbench"}, "seed": 1}
    f.write_text(json.dumps({"name": "t", "code": RELU.code, "metadata": meta}) + "\n"
                 + json.dumps({"name": "u", "code": RELU.code}) + "\n")
    t, u = load_tasks(f)
    assert t.metadata == {"families": ["matmul", "activation"]}  # nothing else of a file's metadata
    assert known_families(t) == ["matmul", "activation"] and known_families(u) == [] and u.metadata == {}
    meta = SolveMeta(teacher="x", status="ok", speedup_eager=None)
    assert json.loads(line(with_families(meta, t))) == {"teacher": "x", "status": "ok", "speedup_eager": None,
                                                        "families": ["matmul", "activation"]}
    assert json.loads(line(with_families(meta, u))) == {"teacher": "x", "status": "ok", "speedup_eager": None}
    assert measure_families(GEMM.code, 0.25, 8) == ["matmul", "elementwise", "activation"]


def test_weighted_draws_are_unbiased_per_item_and_tight_per_weight():
    from musacoder.data.records import Record
    from musacoder.train.data import _draw_weighted

    items = [[Record([], metadata={"i": i})] for i in range(7)]
    weights = [1.3, 0.25, 0.25, 0.25, 0.25, 2.0, 0.0]
    counts = Counter()
    for seed in range(2000):
        got = Counter(x[0].metadata["i"] for x in _draw_weighted(items, weights, random.Random(seed)))
        assert got[5] == 2 and got[6] == 0 and got[0] in (1, 2)
        assert sum(got[i] for i in range(1, 5)) == 1  # four items of weight 0.25: exactly one of them
        counts.update(got)
    assert counts[0] / 2000 == pytest.approx(1.3, abs=0.03)  # a lone 1.3 is drawn twice 30% of the time
    assert all(counts[i] / 2000 == pytest.approx(0.25, abs=0.03) for i in range(1, 5))
