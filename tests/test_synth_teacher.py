"""LLM teachers (issue 14, 2b) and stage-2 prompts (2c): k samples per task from a generation client, each verified by
the real verifier (cpu backend), rejection into SFT records, resume; the stage-2 prompt's tensor metadata measured
from the reference. The model is the replay client (a real part of the project): no model server can run here."""

import json

import pytest
from test_bench_clients import dead_url, fast

from musacoder.bench.clients import ReplayClient
from musacoder.bench.clients.openai import OpenAIClient
from musacoder.cli import app
from musacoder.conversation import task_messages
from musacoder.data.records import load_records
from musacoder.examples_catalog import EXAMPLES_DIR
from musacoder.synth.prompts import STEPS, Item, prompt_messages, tensor_metadata
from musacoder.synth.solve import SFT, SOLUTIONS, TeacherConfig, teach_tasks
from musacoder.tasks import Task, builtin_task

RELU, GEMM = builtin_task("level1/19_ReLU"), builtin_task("level2/76_Gemm_Add_ReLU")
HONEST = "```python\n" + (EXAMPLES_DIR / "cpu/honest_relu.py").read_text() + "\n```"
WRONG = HONEST.replace("return relu_ext.relu(x)", "return relu_ext.relu(x).reshape(-1)")  # same build, wrong shape
NO_CODE = "<think>a loop will do</think>I would write a loop over the elements."  # format_error, decided statically
THINK = "<think>" + "\n".join(f"{n}. {name}: ..." for n, (name, _) in enumerate(STEPS, 1)) + "</think>\n"
TRANSPOSE = """import torch
class Model(torch.nn.Module):
    def forward(self, x, k):
        return x.t() * k, x.sum(0).to(torch.int64)
def get_inputs():
    return [torch.randn(12, 5), 3]
def get_init_inputs():
    return []
"""


def replay(path, answers: dict, task=RELU) -> ReplayClient:
    """A replay file answering (sample, turn) with the text given."""
    path.write_text("".join(json.dumps({"task": task.key, "sample": s, "turn": t, "output": text}) + "\n"
                            for (s, t), text in answers.items()))
    return ReplayClient(path)


def lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_k_samples_verified_rejected_into_sft_and_not_redone(tmp_path, cpu_config):
    out = tmp_path / "out"
    client = replay(tmp_path / "r.jsonl", {(0, 1): THINK + HONEST, (1, 1): WRONG, (2, 1): NO_CODE})
    spec = f"replay:{tmp_path / 'r.jsonl'}"
    cfg = TeacherConfig(samples=3, prompt="stage2")
    summary = teach_tasks([RELU], out, cpu_config, client, spec, cfg)
    assert summary["teacher"] == {"answered": 3} and summary["unfinished"] == 0 and summary["sft"] == 1
    assert summary["verdicts"] == {"ok": 1, "incorrect": 1, "format_error": 1}, summary
    rows = {r["sample"]: r for r in lines(out / SOLUTIONS)}
    assert len(lines(out / SOLUTIONS)) == 3 and {r["teacher"] for r in rows.values()} == {spec}
    assert [rows[s]["status"] for s in range(3)] == ["ok", "incorrect", "format_error"]
    assert rows[0]["verdict"]["trials_passed"] > 0 and "load_inline" in rows[0]["code"]
    assert "expected (16, 16384)" in rows[1]["reason"] and rows[2]["code"] is None
    assert all(r["backend"] == "cpu" and r["prompt"] == "stage2" and r["turn"] == 1 for r in rows.values())

    records, problems = load_records([out / SFT])
    assert not problems and len(records) == 1
    rec = records[0]
    assert rec.kind == "generation" and rec.task == RELU.key and rec.metadata["sample"] == 0
    assert rec.messages[-1] == {"role": "assistant", "content": THINK + HONEST}  # the reasoning is kept
    assert "- x: shape (16, 16384), stride (16384, 1), dtype torch.float32" in rec.messages[1]["content"]

    before = (out / SOLUTIONS).read_text(), (out / SFT).read_text()
    again = teach_tasks([RELU], out, cpu_config, client, spec, cfg)
    assert again["tried"] == 0 and again["skipped_existing"] == 3
    assert ((out / SOLUTIONS).read_text(), (out / SFT).read_text()) == before


def test_failed_answer_repaired_on_turn_two_is_a_repair_record(tmp_path, cpu_config):
    client = replay(tmp_path / "r.jsonl", {(0, 1): NO_CODE, (0, 2): THINK + HONEST})
    summary = teach_tasks([RELU], tmp_path, cpu_config, client, "t", TeacherConfig(samples=1, turns=2))
    assert summary["verdicts"] == {"format_error": 1, "ok": 1} and summary["sft"] == 1
    assert [(r["turn"], r["status"]) for r in lines(tmp_path / SOLUTIONS)] == [(1, "format_error"), (2, "ok")]
    (rec,), problems = load_records([tmp_path / SFT])
    assert not problems and rec.kind == "repair" and rec.metadata["turns"] == 2
    m = rec.messages
    assert m[:2] == task_messages(RELU, "cpu") and [x["role"] for x in m[2:]] == ["assistant", "user", "assistant"]
    assert m[2]["content"] == "I would write a loop over the elements."  # earlier reasoning stripped
    assert m[3]["content"].startswith("=== System Feedback for Round 1 ===\nStatus: format_error")
    assert m[4]["content"] == THINK + HONEST  # the trained turn keeps its reasoning


def test_failed_generations_and_a_dead_server_are_redone_not_recorded(tmp_path, cpu_config):
    two = TeacherConfig(samples=2)
    summary = teach_tasks([RELU], tmp_path, cpu_config, replay(tmp_path / "a.jsonl", {(0, 1): NO_CODE}), "t", two)
    assert summary["unfinished"] == 1 and summary["teacher"] == {"answered": 1, "generation_error": 1}
    assert "no replay sample for level1/19_ReLU sample 1" in summary["first_error"]
    assert [r["sample"] for r in lines(tmp_path / SOLUTIONS)] == [0]

    dead = OpenAIClient("m", fast(base_url=dead_url(), retries=0))
    summary = teach_tasks([RELU], tmp_path, cpu_config, dead, "t", two)
    assert summary["tried"] == 1 and summary["unfinished"] == 1 and "not answering" in summary["fatal"]
    assert len(lines(tmp_path / SOLUTIONS)) == 1

    full = replay(tmp_path / "b.jsonl", {(0, 1): NO_CODE, (1, 1): NO_CODE})
    summary = teach_tasks([RELU], tmp_path, cpu_config, full, "t", two)
    assert summary["tried"] == 1 and summary["unfinished"] == 0
    assert sorted(r["sample"] for r in lines(tmp_path / SOLUTIONS)) == [0, 1]

    broken = Task(name="broken", code=TRANSPOSE.replace("x.t() * k", "x.t() @ x.t()"))  # shapes do not match
    summary = teach_tasks([broken], tmp_path, cpu_config, full, "t", TeacherConfig(samples=2, prompt="stage2"))
    assert summary["teacher"] == {"no_prompt": 2} and summary["unfinished"] == 0
    assert all("does not run on the cpu: RuntimeError" in r["reason"] for r in lines(tmp_path / SOLUTIONS)[2:])


def test_stage2_prompt_states_measured_metadata_and_the_six_steps():
    meta = tensor_metadata(GEMM)
    assert meta.inputs == [Item("x", (64, 256), (256, 1), "torch.float32")]
    assert meta.weights == [Item("self.bias", (128,), (1,), "torch.float32"),
                            Item("self.gemm.weight", (128, 256), (256, 1), "torch.float32")]
    assert meta.outputs == [Item("output", (64, 128), (128, 1), "torch.float32")]

    odd = tensor_metadata(Task(name="transpose", code=TRANSPOSE), precision="bf16")
    assert odd.inputs == [Item("x", (12, 5), (5, 1), "torch.bfloat16"), Item("k", value="3")] and not odd.weights
    assert odd.outputs == [Item("output[0]", (5, 12), (1, 5), "torch.bfloat16"),  # measured, not assumed contiguous
                           Item("output[1]", (5,), (1,), "torch.int64")]

    bench = task_messages(GEMM, "cpu")
    msgs = prompt_messages(GEMM, "cpu", "stage2")
    assert prompt_messages(GEMM, "cpu") == bench and msgs[0] == bench[0]
    user = msgs[1]["content"]
    assert user.startswith(bench[1]["content"]) and "<think>...</think>" in user
    assert "- self.gemm.weight: shape (128, 256), stride (256, 1), dtype torch.float32" in user
    assert "- output: shape (64, 128), stride (128, 1), dtype torch.float32" in user
    names = ["Semantic decomposition", "Scalar math", "Shape computation", "Index mapping", "Boundary handling",
             "Error pre-analysis"]
    assert [s for s, _ in STEPS] == names and all(f"{n}. {s}: " in user for n, s in enumerate(names, 1))


def test_solve_cli_teacher_errors_and_unfinished_samples(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MUSACODER_CACHE", str(tmp_path / "cache"))
    replay(tmp_path / "r.jsonl", {(0, 1): NO_CODE, (0, 2): NO_CODE})
    base = ["synth", "solve", "--names", RELU.key, "--out", str(tmp_path / "out")]

    def call(*args):
        with pytest.raises(SystemExit) as e:
            app([*base, *args], prog_name="musacoder")
        return e.value.code

    assert call("--teacher", "foo:bar") == 2
    assert call("--teacher", f"replay:{tmp_path / 'missing.jsonl'}") == 2
    assert call("--prompt", "stage2") == 2
    err = capsys.readouterr().err
    assert "error: --teacher: model spec 'foo:bar': unknown kind 'foo'" in err and "does not exist" in err
    assert "error: --prompt stage2 asks for reasoning the compiler teacher does not write" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()

    assert call("--teacher", f"replay:{tmp_path / 'r.jsonl'}", "--samples", "2", "--rounds", "2") == 1
    err = capsys.readouterr().err
    assert "2 tried" in err and "'answered': 1" in err and "1 samples unfinished" in err
    assert "no replay sample for level1/19_ReLU sample 1" in err
    assert [(r["sample"], r["turn"]) for r in lines(tmp_path / "out" / SOLUTIONS)] == [(0, 1), (0, 2)]
