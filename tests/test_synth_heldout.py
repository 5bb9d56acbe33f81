"""Held-out sets that hold (issue 44): `synth dedupe` (one task per computation, at most N), `synth split` (whole
families or op sequences held out, reproducible from a seed), `synth twins` (eval twins in training data, at any
rank) and `synth hidden` (a rotating set from a secret seed). Cheap: tasks traced on the meta device, generated at
a quarter of their sizes."""

import json

import pytest

from musacoder import cli
from musacoder.data.keys import Keys, ops_of
from musacoder.synth.graphs import GraphSpec, generate, render, task_name
from musacoder.synth.heldout import cap, hidden_seed, split
from musacoder.tasks import builtin_task

RELU = builtin_task("level1/19_ReLU")


def relu(rank: int, spelling: str = "torch.relu(x)", name: str = "") -> dict:
    shape = {2: "batch_size, dim", 3: "batch_size, 4, dim", 4: "batch_size, 2, 4, dim"}[rank]
    code = RELU.code.replace("torch.rand(batch_size, dim)", f"torch.rand({shape})").replace("torch.relu(x)", spelling)
    return {"name": name or f"relu{rank}", "code": code, "metadata": {"ops": ["relu"], "families": ["activation"]}}


def tanh(name="tanh") -> dict:
    return {"name": name, "code": RELU.code.replace("torch.relu(x)", "torch.tanh(x)"),
            "metadata": {"ops": ["tanh"], "families": ["activation"]}}


def generated(n: int, first: int = 0) -> list[dict]:
    gs = [generate(s, GraphSpec(size=0.25, min_ops=1, max_ops=2, fusion_depth=0)) for s in range(first, first + n)]
    return [{"name": task_name(g), "level": None, "problem_id": g.seed, "code": render(g),
             "metadata": {"seed": g.seed, "ops": g.ops, "families": sorted(set(g.families))}} for g in gs]


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as e:
        cli.app(args, prog_name="musacoder")
    return e.value.code


def jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def read(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_cap_keeps_the_first_per_computation_whatever_the_rank_or_spelling():
    records = [relu(2, name="a"), relu(3, name="b"), tanh("t"), relu(4, "x.relu()", name="c"),
               {"name": "broken", "code": "class Model(:\n"}]
    keys = Keys()
    one = cap(records, 1, "graph", keys)
    assert [r["name"] for r in one.kept] == ["a", "t", "broken"] and one.keys == 2
    assert [(d["name"], d["rank"]) for d in one.dropped] == [("b", 2), ("c", 3)]
    assert one.unkeyed[0]["name"] == "broken" and "SyntaxError" in one.unkeyed[0]["problem"]
    assert [r["name"] for r in cap(records, 2, "graph", keys).kept] == ["a", "b", "t", "broken"]
    by_ops = cap(records[:4], 1, "ops", keys)  # the generator's names: the same here
    assert [r["name"] for r in by_ops.kept] == ["a", "t"]


def test_dedupe_command(tmp_path, capsys):
    inp = jsonl(tmp_path / "in.jsonl", [relu(2, name="a"), relu(3, name="b"), tanh("t")])
    out = tmp_path / "out.jsonl"
    assert run_cli(["synth", "dedupe", "--input", str(inp), "--out", str(out), "--per-key", "1"]) == 0
    assert [r["name"] for r in read(out)] == ["a", "t"]
    report = json.loads(out.with_suffix(".dedupe.json").read_text())
    assert report["distinct_keys"] == 2 and [d["name"] for d in report["dropped"]] == ["b"]
    assert "3 records, 2 distinct graph keys: kept 2, dropped 1" in capsys.readouterr().err
    assert run_cli(["synth", "dedupe", "--input", str(inp), "--out", str(out), "--key", "seed"]) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("by", ["family", "ops"])
def test_split_holds_out_whole_units_and_no_eval_twin_stays_in_train(by):
    records = generated(40)
    keys = Keys()
    s = split(records, by, 0.25, seed=3, keys=keys)
    assert s.eval and s.train and s.held
    unit = (lambda r: set(r["metadata"]["families"])) if by == "family" else (lambda r: {ops_of(r)})
    held = set(s.held)
    assert all(unit(r) & held for r in s.eval) and not any(unit(r) & held for r in s.train)
    if by == "family":
        assert len(s.eval) <= 0.25 * len(records)
    eval_graphs = {keys.key(r, "graph") for r in s.eval}
    assert not any(keys.key(r, "graph") in eval_graphs for r in s.train)  # twins under another unit: dropped
    again = split(records, by, 0.25, seed=3, keys=keys)
    assert [r["name"] for r in again.eval] == [r["name"] for r in s.eval]  # reproducible from the seed
    other = split(records, by, 0.25, seed=4, keys=keys)
    assert {r["name"] for r in other.eval} != {r["name"] for r in s.eval}


def test_split_command_and_named_units(tmp_path, capsys):
    records = generated(20)
    fam = records[0]["metadata"]["families"][0]
    inp = jsonl(tmp_path / "tasks.jsonl", records)
    assert run_cli(["synth", "split", "--input", str(inp), "--out", str(tmp_path / "s"), "--hold-out", fam]) == 0
    manifest = json.loads((tmp_path / "s" / "split.json").read_text())
    assert manifest["held_out"] == [fam] and manifest["eval"] == len(read(tmp_path / "s" / "eval.jsonl"))
    assert all(fam not in r["metadata"]["families"] for r in read(tmp_path / "s" / "train.jsonl"))
    assert run_cli(["synth", "split", "--input", str(inp), "--out", str(tmp_path / "t"), "--hold-out", "nope"]) == 2
    assert "error: --hold-out nope: no record has it" in capsys.readouterr().err


def test_twins_finds_the_same_computation_at_another_rank(tmp_path, capsys):
    train = jsonl(tmp_path / "train.jsonl", [relu(3, name="relu3"), tanh("tanh2")])
    sigmoid = {**tanh("sig"), "code": RELU.code.replace("torch.relu(x)", "torch.sigmoid(x)"),
               "metadata": {"ops": ["sigmoid"]}}
    evals = jsonl(tmp_path / "eval.jsonl", [relu(2, name="relu2"), sigmoid])
    out = tmp_path / "tw"
    assert run_cli(["synth", "twins", "--train", str(train), "--eval", str(evals), "--eval", "builtin",
                    "--out", str(out)]) == 0
    report = json.loads((out / "twins.json").read_text())
    mine, shipped = report["sets"]
    assert mine["summary"]["with_twin"] == {"graph": 1, "ast": 0, "ops": 1, "ops_other_rank": 1, "sequence": 0}
    assert mine["summary"]["graph_twin_missed_by_sequence_key"] == 1 and mine["summary"]["single_op"] == 2
    row = mine["rows"][0]
    assert row["twins"]["graph"]["first"] == ["relu3"] and row["ops_other_rank"] == ["(3,)"]
    assert shipped["summary"]["with_twin"]["graph"] == 1  # level1/19_ReLU
    assert [r["name"] for r in read(out / "eval.twin.jsonl")] == ["relu2"]
    assert [r["name"] for r in read(out / "eval.no_twin.jsonl")] == ["sig"]
    assert "relu2" in (out / "twins.md").read_text() and "graph 1" in capsys.readouterr().err


def test_hidden_set_rotates_with_a_secret_and_excludes_eval_twins(tmp_path, monkeypatch, capsys):
    args = ["synth", "hidden", "--n", "3", "--min-ops", "1", "--max-ops", "2", "--fusion-depth", "0",
            "--families", "elementwise,activation", "--size", "0.25", "--check-scale", "0.25",
            "--against", "builtin"]
    monkeypatch.delenv("MUSACODER_HIDDEN_SECRET", raising=False)
    assert run_cli(args + ["--out", str(tmp_path / "none"), "--rotation", "r1"]) == 2
    assert "error: the environment variable MUSACODER_HIDDEN_SECRET must hold a secret" in capsys.readouterr().err

    secret = "0123456789abcdef-test-secret"
    monkeypatch.setenv("MUSACODER_HIDDEN_SECRET", secret)
    train = jsonl(tmp_path / "train.jsonl", [relu(3), tanh()])
    for out, rotation in (("a", "r1"), ("b", "r1"), ("c", "r2")):
        assert run_cli(args + ["--out", str(tmp_path / out), "--rotation", rotation,
                               "--against-generated", str(train)]) == 0
    a, b, c = (read(tmp_path / d / "tasks.jsonl") for d in "abc")
    assert len(a) == 3 and a == b and [t["code"] for t in c] != [t["code"] for t in a]
    assert [t["name"] for t in a] == ["hidden-r1-000", "hidden-r1-001", "hidden-r1-002"]
    keys = Keys()
    banned = {keys.key(r, "graph") for r in [relu(3), tanh()]} | {keys.facts(RELU.code).graph}
    assert not {keys.key(t, "graph") for t in a} & banned  # no twin of the training data or the eval tasks
    assert len({keys.key(t, "graph") for t in a}) == 3  # one task per computation
    seed = hidden_seed(secret, "r1")
    for d in "abc":  # neither the secret nor the seeds are written out
        for f in (tmp_path / d).iterdir():
            if f.name != "generated.jsonl" and f.name != "dropped.jsonl":
                text = f.read_text()
                assert secret not in text and str(seed) not in text, f
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["tasks"] == 3 and manifest["rotation"] == "r1" and "--profile strict" in manifest["judge_with"]


@pytest.mark.parametrize("args, message", [
    (["dedupe", "--input", "nowhere.jsonl", "--out", "o.jsonl"], "nowhere.jsonl does not exist"),
    (["split", "--input", "IN", "--out", "s", "--by", "seed"], "--by must be one of family, ops, graph"),
    (["twins", "--train", "IN", "--eval", "nowhere.jsonl", "--out", "t"], "nowhere.jsonl"),
    (["hidden", "--out", "h", "--rotation", "r", "--secret-file", "no-secret"], "--secret-file no-secret"),
])
def test_bad_input_is_one_error_line(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    jsonl(tmp_path / "IN", [tanh()])
    assert run_cli(["synth", *args]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and message in err and "Traceback" not in err
