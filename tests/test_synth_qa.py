"""Stage 3d (issue 14): qa records, questions built from a task's measured facts and a verified kernel, answered by an
LLM teacher and marked unverified. The teacher is the replay client (a real part of the project) or the loopback
OpenAI-compatible stub of test_bench_clients; no verifier runs (the answers are prose, nothing executes them)."""

import json

import pytest
from test_bench_clients import FakeServer, dead_url, fast

from musacoder.bench import clients
from musacoder.bench.clients import ReplayClient
from musacoder.bench.clients.openai import OpenAIClient
from musacoder.cli import app
from musacoder.data.records import load_records
from musacoder.examples_catalog import EXAMPLES_DIR
from musacoder.synth.qa import (
    ANSWERS,
    EMPTY,
    GENERATION,
    QA,
    REFUSED,
    SOLUTION_TEMPLATES,
    TASK_TEMPLATES,
    TRUNCATED,
    Material,
    QAConfig,
    judge_answer,
    plan,
    qa_records,
)
from musacoder.synth.solve import SOLUTIONS
from musacoder.tasks import builtin_task

RELU = builtin_task("level1/19_ReLU")
KERNEL = (EXAMPLES_DIR / "cpu/honest_relu.py").read_text()
GOOD = ("<think>16 x 16384 floats in and out.</think>It reads and writes each element once: 2 x 4 B x 262144 = "
        "2 MiB and 262144 comparisons, so it is memory bound.")


def lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def replay_file(path, materials, per_task, answer) -> str:
    """A replay file answering every planned question of `materials` with answer(template id, sample)."""
    rows = [{"task": m.question_id(t.id), "sample": s, "output": answer(t.id, s)}
            for m in materials for t, s in plan(m, per_task, 0)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f"replay:{path}"


def test_judge_answer_reasons():
    assert judge_answer(GOOD, "stop") is None
    assert judge_answer("fine", "length") == TRUNCATED
    assert judge_answer("<think>still thinking about the tiles", None) == TRUNCATED
    assert judge_answer("<think>done</think>  \n", None) == EMPTY and judge_answer("", None) == EMPTY
    assert judge_answer("I'm sorry, but I can't help with that.", None) == REFUSED
    assert judge_answer("<think>hm</think>I cannot assist with this request.", None) == REFUSED
    assert judge_answer("I cannot see the launch configuration, but each thread reads one row.", None) is None


def test_questions_from_material_answered_validated_and_not_redone(tmp_path):
    out = tmp_path / "out"
    task, sol = Material(RELU), Material(RELU, KERNEL)
    bad = {"boundaries": "<think>the tails</think>", "access": "I'm sorry, but I cannot help with that.",
           "numerics": "<think>accumulate in fp32 and"}  # empty, refusal, truncated
    spec = replay_file(tmp_path / "r.jsonl", [task, sol], 5, lambda t, s: bad.get(t, GOOD))
    summary = qa_records([task, sol], out, ReplayClient(spec[7:]), spec, "cuda", QAConfig(per_task=5))

    assert summary["asked"] == 10 and summary["kept"] == 7 and summary["generation_failed"] == 0, summary
    assert summary["dropped"] == {EMPTY: 1, REFUSED: 1, TRUNCATED: 1}
    # every task template once (5 of 5), the solution's 4 templates then the first again with sample 1
    assert sorted(summary["templates"]) == sorted({t.id for t in TASK_TEMPLATES + SOLUTION_TEMPLATES})
    records, problems = load_records(out / QA)
    assert not problems and len(records) == 7 and {r.kind for r in records} == {"qa"}
    for r in records:
        m = r.metadata
        assert m["verified"] is False and m["teacher"] == spec and m["families"] == ["activation"]
        assert m["seed"] == 0 and m["backend"] == "cuda" and m["source"] in (task.source, sol.source)
        assert [x["role"] for x in r.messages] == ["system", "user", "assistant"] and r.messages[-1]["content"] == GOOD
        user = r.messages[1]["content"]
        assert "- x: shape (16, 16384), stride (16384, 1), dtype torch.float32" in user and RELU.code.strip() in user
        assert "Operator families: activation." in user and "CUDA" in user
        assert (KERNEL.strip() in user) == (m["source"] != "task")
    access = next(r for r in records if r.metadata["template"] == "explain").messages[1]["content"]
    assert "Question: Explain what this kernel does line by line" in access
    tried = lines(out / ANSWERS)
    assert len(tried) == 10 and sum(t["kept"] for t in tried) == 7
    assert {t["template"]: t["dropped"] for t in tried if not t["kept"]} == {"boundaries": EMPTY, "access": REFUSED,
                                                                             "numerics": TRUNCATED}
    assert [t["sample"] for t in tried if t["source"] != "task"].count(1) == 1

    before = {f: (out / f).read_bytes() for f in (QA, ANSWERS)}
    again = qa_records([task, sol], out, ReplayClient(spec[7:]), spec, "cuda", QAConfig(per_task=5))
    assert again["asked"] == 0 and again["skipped_existing"] == 10
    assert {f: (out / f).read_bytes() for f in (QA, ANSWERS)} == before  # a rerun appends nothing

    # an interrupted run: the last answers line and the last record cut in half; that question alone is asked
    # again, and its lines start on lines of their own
    text = (out / ANSWERS).read_text()
    cut = text.rstrip("\n").rsplit("\n", 1)[-1]
    assert json.loads(cut)["kept"] and json.loads(cut)["source"] == sol.source and json.loads(cut)["sample"] == 1
    (out / ANSWERS).write_text(text[:len(text) - len(cut) // 2 - 1])
    (out / QA).write_text((out / QA).read_text()[:-100])
    third = qa_records([task, sol], out, ReplayClient(spec[7:]), spec, "cuda", QAConfig(per_task=5))
    assert third["asked"] == 1 and third["skipped_existing"] == 9 and third["kept"] == 1
    records, problems = load_records(out / QA)
    assert len(records) == 7 and len(problems) == 1 and "not valid JSON" in problems[0].message  # the cut record
    assert (out / ANSWERS).read_text().splitlines()[-1] == cut


def test_openai_stub_teacher_sees_the_material(tmp_path):
    server = FakeServer(lambda body: f"About {body['messages'][-1]['content'].split('Question: ')[1][:30]}: memory.")
    try:
        client = OpenAIClient("stub", fast(base_url=server.url))
        summary = qa_records([Material(RELU)], tmp_path, client, "openai:stub", "cpu", QAConfig(per_task=2, seed=3))
    finally:
        server.close()
    assert summary["kept"] == 2 and len(server.requests) == 2
    assert all(b["messages"][0]["role"] == "system" and "16384" in b["messages"][1]["content"] for b in server.requests)
    assert len({b["seed"] for b in server.requests}) == 2  # a sampling seed per question
    assert [r.metadata["seed"] for r in load_records(tmp_path / QA)[0]] == [3, 3]
    assert "multi-core CPU" in server.requests[0]["messages"][1]["content"]


def call(*args) -> int:
    with pytest.raises(SystemExit) as e:
        app(["synth", "qa", *args], prog_name="musacoder")
    return e.value.code


def test_qa_cli_replay_solutions_rerun_and_bad_input(tmp_path, capsys, monkeypatch):
    sols = tmp_path / SOLUTIONS
    sols.write_text(json.dumps({"task": RELU.key, "teacher": "inductor", "backend": "cpu", "status": "ok",
                                "code": KERNEL}) + "\n" + json.dumps({"task": RELU.key, "status": "no_solution"}) + "\n")
    out = tmp_path / "out"
    spec = replay_file(tmp_path / "r.jsonl", [Material(RELU), Material(RELU, KERNEL)], 2, lambda t, s: GOOD)
    base = ["--names", RELU.key, "--out", str(out), "--backend", "cpu", "--per-task", "2"]
    assert call(*base, "--model", spec, "--solutions", str(sols)) == 0
    err = capsys.readouterr().err
    assert "4 questions asked about 2 tasks and solutions: 4 kept, 0 dropped" in err, err
    assert "skipped 1 solutions: status no_solution" in err
    assert len(load_records(out / QA)[0]) == 4
    assert call(*base, "--model", spec, "--solutions", str(sols)) == 0
    assert "0 questions asked about 2 tasks and solutions: 0 kept, 0 dropped, 4 already done" in capsys.readouterr().err
    assert len(lines(out / QA)) == 4

    # bad input: unknown spec, missing replay file, missing solutions, nothing to ask about
    assert call(*base, "--model", "foo:bar") == 2
    assert call(*base, "--model", f"replay:{tmp_path / 'missing.jsonl'}") == 2
    assert call(*base, "--model", spec, "--solutions", str(tmp_path / "none.jsonl")) == 2
    assert call(*base, "--model", spec, "--no-task-questions") == 2
    err = capsys.readouterr().err
    assert "error: --model: model spec 'foo:bar': unknown kind 'foo'" in err and "missing.jsonl does not exist" in err
    assert "none.jsonl does not exist" in err and "error: --no-task-questions leaves nothing to ask about" in err
    assert "Traceback" not in err

    # a dead server: every failure recorded and counted, one error line, exit 2; the next run asks them again
    url = dead_url()
    monkeypatch.setattr(clients, "make_client", lambda s, **kw: OpenAIClient("m", fast(base_url=url, retries=0)))
    dead = ["--names", RELU.key, "--out", str(tmp_path / "dead"), "--per-task", "2", "--model", f"openai:m@{url}"]
    assert call(*dead) == 2
    err = capsys.readouterr().err
    assert f"error: the model server at {url} is not answering (ConnectError" in err, err
    assert "no qa record produced: 2 questions without an answer" in err and "Traceback" not in err
    tried = lines(tmp_path / "dead" / ANSWERS)
    assert [t["dropped"] for t in tried] == [GENERATION] * 2 and all("ConnectError" in t["reason"] for t in tried)
    assert not lines(tmp_path / "dead" / QA)
    assert call(*dead) == 2 and len(lines(tmp_path / "dead" / ANSWERS)) == 4  # asked again, not skipped
