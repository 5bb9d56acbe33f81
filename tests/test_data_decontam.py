"""Decontamination: copies of eval tasks planted among generated tasks are removed by the detector meant for each
(exact program, same op graph at other sizes, near copy of the text), genuinely different generated tasks are kept,
and SFT records are judged by the task inside their prompt. The shipped tasks stand in for KernelBench. Cheap: cpu."""

import json

import pytest

from musacoder import cli
from musacoder.conversation import task_messages
from musacoder.data.decontam import DecontamSettings, canonical_hash, decontaminate, run, task_code, trace_task
from musacoder.synth.graphs import GraphSpec, generate, render, task_name
from musacoder.tasks import Task, builtin_task, builtin_tasks

EVAL = builtin_tasks()
GEMM = builtin_task("level2/76_Gemm_Add_ReLU")
RELU = builtin_task("level1/19_ReLU")

RENAMED = '''import torch
import torch.nn as tnn


class Model(tnn.Module):
    def __init__(self, n_in, n_out, b_shape):
        super(Model, self).__init__()
        self.fc = tnn.Linear(n_in, n_out, bias=False)
        self.offset = tnn.Parameter(torch.randn(b_shape))

    def forward(self, inp):
        inp = self.fc(inp)
        inp = inp + self.offset
        inp = torch.relu(inp)
        return inp


rows = 64
n_in = 256
n_out = 128
b_shape = (n_out,)


def get_inputs():
    return [torch.rand(rows, n_in)]


def get_init_inputs():
    return [n_in, n_out, b_shape]
'''

RECOMMENTED = '''# a comment the original does not have
import torch
import torch.nn as nn

class Model(nn.Module):
    """Another docstring entirely, spread
    over two lines."""
    def __init__(self):
        super().__init__()   # super() for super(Model, self)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu( x )   # spaced out
batch_size = 16
dim = 16384
def get_inputs():
    x = torch.rand(batch_size, dim)  # same inputs
    return [x]
def get_init_inputs():
    return []
'''


def _generated(n: int) -> list[dict]:
    gs = [generate(s, GraphSpec(size=0.25)) for s in range(n)]
    return [{"name": task_name(g), "problem_id": g.seed, "level": None, "code": render(g), "metadata": {}} for g in gs]


def _planted() -> dict[str, str]:
    return {"verbatim": GEMM.code,
            "renamed": RENAMED,
            "recommented": RECOMMENTED,
            "resized": GEMM.code.replace("batch_size = 64", "batch_size = 96").replace("in_features = 256",
                                                                                    "in_features = 384"),
            "edited": GEMM.code.replace("torch.relu(x)", "torch.sigmoid(x)")}


def test_planted_copies_are_removed_by_their_detector_and_generated_tasks_kept():
    planted = _planted()
    assert planted["resized"] != GEMM.code and planted["edited"] != GEMM.code
    gen = _generated(30)
    records = gen[:10] + [{"name": k, "code": v} for k, v in planted.items()] + gen[10:]
    kept, dropped = decontaminate(records, EVAL)
    assert [r["name"] for r in kept] == [r["name"] for r in gen]  # every generated task, in order
    by_name = {d["name"]: d for d in dropped}
    assert set(by_name) == set(planted)
    detectors = {k: {m["detector"] for m in d["matches"]} for k, d in by_name.items()}
    # the reason is the strongest detector that matched
    assert {k: d["reason"] for k, d in by_name.items()} == {
        "verbatim": "ast", "renamed": "ast", "recommented": "ast", "resized": "opgraph", "edited": "minhash"}
    assert detectors["verbatim"] == {"ast", "opgraph", "minhash"}
    assert "opgraph" in detectors["renamed"] and "ast" not in detectors["resized"]
    assert detectors["edited"] == {"minhash"}  # another op: only the text is close
    assert all(m["eval_task"] == "level2/76_Gemm_Add_ReLU" for k in ("verbatim", "renamed", "resized", "edited")
               for m in by_name[k]["matches"])
    assert {m["eval_task"] for m in by_name["recommented"]["matches"]} == {"level1/19_ReLU"}
    score = next(m["score"] for m in by_name["edited"]["matches"])
    assert 0.8 <= score < 1.0


def test_canonical_form_what_exact_means():
    assert canonical_hash(RELU.code) == canonical_hash(RECOMMENTED)
    assert canonical_hash(GEMM.code) == canonical_hash(RENAMED)
    # literal values are part of the program: other sizes, or another hyper-parameter, are not the same file
    assert canonical_hash(RELU.code) != canonical_hash(RELU.code.replace("16384", "8192"))
    assert canonical_hash(RELU.code) != canonical_hash(RELU.code.replace("torch.relu", "torch.tanh"))
    with pytest.raises(SyntaxError):
        canonical_hash("class Model(:\n")


def test_op_signature_keeps_bool_flags_not_ranks():
    conv = '''import torch
import torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.{kind}(8, 8, 3)
    def forward(self, x):
        return self.conv(x)
def get_inputs():
    return [torch.rand(2, 8, {size}, {size})]
def get_init_inputs():
    return []
'''
    standard, transposed = (trace_task(conv.format(kind=k, size=16)) for k in ("Conv2d", "ConvTranspose2d"))
    assert standard.ops == ("convolution[transposed=False]",) and transposed.ops == ("convolution[transposed=True]",)
    assert standard.signature != transposed.signature
    assert standard.device == "meta" and standard.outputs == [(2, 8, 14, 14)]
    assert trace_task(conv.format(kind="Conv2d", size=64)).signature == standard.signature  # sizes do not count
    rank3 = RELU.code.replace("torch.rand(batch_size, dim)", "torch.rand(batch_size, 4, dim)")
    assert trace_task(rank3).signature == trace_task(RELU.code).signature  # nor do ranks (issue 44)
    capped = trace_task(GEMM.code, max_ops=2)
    assert capped.truncated and len(capped.ops) == 2


def test_the_same_computation_at_another_rank_is_dropped():
    rank3 = {"name": "relu3", "code": RELU.code.replace("torch.rand(batch_size, dim)", "torch.rand(batch_size, 4, dim)")}
    kept, dropped = decontaminate([rank3], EVAL, DecontamSettings(detectors=("ast", "opgraph")))
    assert kept == [] and dropped[0]["reason"] == "opgraph" and dropped[0]["matches"][0]["eval_task"] == RELU.key


def test_sft_records_are_judged_by_the_task_in_their_prompt():
    clean = _generated(1)[0]

    def sft(code: str) -> dict:
        task = Task(name="t", code=code)
        return {"messages": task_messages(task, "cpu") + [{"role": "assistant", "content": "```python\n...\n```"}],
                "kind": "generation", "task": "t"}

    # the prompt also holds the one-shot example's reference (a Model of its own): the task is the one after it
    assert task_code(sft(GEMM.code)).strip() == GEMM.code.strip()
    qa = {"messages": [{"role": "user", "content": "What is a warp?"}, {"role": "assistant", "content": "32 lanes"}],
          "kind": "qa"}
    res = run([sft(clean["code"]), sft(RENAMED), qa], EVAL)
    assert [r.get("kind") for r in res.kept] == ["generation", "qa"]
    assert res.kept[0]["messages"][1]["content"].count(clean["code"].strip()) == 1
    assert [(d["index"], d["reason"]) for d in res.dropped] == [(1, "ast")]
    assert res.unchecked == [{"index": 2, "name": "record2"}]


def test_settings_detectors_and_threshold():
    edited = {"name": "edited", "code": _planted()["edited"]}
    assert decontaminate([edited], EVAL, DecontamSettings(detectors=("ast", "opgraph")))[1] == []
    assert decontaminate([edited], EVAL, DecontamSettings(threshold=0.99))[1] == []
    with pytest.raises(ValueError, match="unknown detectors"):
        DecontamSettings(detectors=("exact",))
    with pytest.raises(ValueError, match="threshold"):
        DecontamSettings(threshold=0)


def test_cli_writes_kept_records_report_and_summary(tmp_path, capsys):
    records = _generated(5) + [{"name": "copy", "code": GEMM.code}, {"name": "broken", "code": "def f(:\n"}]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out" / "kept.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(SystemExit) as e:
        cli.app(["synth", "decontam", "--input", str(inp), "--against", "builtin", "--against",
                 str(RELU.source), "--out", str(out)], prog_name="musacoder")
    assert e.value.code == 0
    kept = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["name"] for r in kept] == [r["name"] for r in records if r["name"] != "copy"]
    report = json.loads((out.parent / "decontam_report.json").read_text())
    assert report["eval_tasks"] == len(EVAL) + 1 and report["dropped"] == 1
    assert report["dropped_by_first_detector"] == {"ast": 1, "opgraph": 0, "minhash": 0}
    assert report["per_eval_task"] == {"level2/76_Gemm_Add_ReLU": {"ast": 1, "opgraph": 1, "minhash": 1}}
    assert {p["detector"] for p in report["record_problems"]} == {"ast", "opgraph"}  # the broken one, kept
    text = (out.parent / "decontam_summary.txt").read_text()
    assert "level2/76_Gemm_Add_ReLU: ast 1, opgraph 1, minhash 1" in text and text in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--against", "builtin", "--detectors", "exact"], "unknown detectors"),
    (["--against", "nowhere.jsonl"], "does not exist"),
    (["--against", "builtin", "--threshold", "2"], "threshold"),
])
def test_cli_bad_input_is_an_error_line(tmp_path, capsys, args, message):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"name": "a", "code": RELU.code}) + "\n")
    with pytest.raises(SystemExit) as e:
        cli.app(["synth", "decontam", "--input", str(inp), "--out", str(tmp_path / "o.jsonl")] + args,
                prog_name="musacoder")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and message in err and "Traceback" not in err


def test_cli_bad_records_are_an_error_line(tmp_path, capsys):
    inp = tmp_path / "in.jsonl"
    for text, message in (("{not json\n", "line 1: invalid JSON"), ("[1, 2]\n", "record 0 is not a JSON object")):
        inp.write_text(text)
        with pytest.raises(SystemExit) as e:
            cli.app(["synth", "decontam", "--input", str(inp), "--against", "builtin", "--out",
                     str(tmp_path / "o.jsonl")], prog_name="musacoder")
        err = capsys.readouterr().err
        assert e.value.code == 2 and "error:" in err and message in err
