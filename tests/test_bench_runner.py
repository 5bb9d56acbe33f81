"""The runner end to end on the cpu backend, through a real HTTP server and the real verifier: failures recorded and
retried, resume without redoing finished samples, multi-turn feedback, and the CLI interrupted and resumed."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console
from test_bench_clients import FakeServer, dead_url, fast

from musacoder.bench.clients.openai import OpenAIClient
from musacoder.bench.runner import request_seed, run_bench
from musacoder.bench.store import RunMismatch, Store
from musacoder.config import VerifyConfig
from musacoder.conversation import FIX, strip_reasoning
from musacoder.examples_catalog import EXAMPLES_DIR
from musacoder.tasks import builtin_task
from musacoder.tasks.loaders import BUILTIN_DIR

RELU, GEMM = "level1/19_ReLU", "level2/76_Gemm_Add_ReLU"
EXEC_REFERENCE = """```python
import torch
import torch.nn as nn
ns = {}
exec("import torch\\nR = lambda x: torch.relu(x)", ns)
class ModelNew(nn.Module):
    def forward(self, x):
        return ns["R"](x)
```"""  # refused statically (exec): decided without building anything
NO_CODE = "I am not able to write this kernel."  # format_error
SYNTAX_ERROR = "```python\nclass ModelNew(nn.Module):\n    def forward(self, x) return x\n```"
QUIET = Console(file=open("/dev/null", "w"))


def tasks():
    return [builtin_task(RELU), builtin_task(GEMM)]


def config(cache_dir):
    return VerifyConfig(backend="cpu", timing_enabled=False, cache_dir=cache_dir)


def by_task(body):
    return EXEC_REFERENCE if "a ReLU activation" in body["messages"][1]["content"] else NO_CODE


def stored(out):
    return {(r.task, r.sample, r.turn): r for r in Store(Path(out) / "samples.sqlite").rows()}


def test_dead_server_is_recorded_then_resumed_without_redoing(tmp_path, cache_dir):
    out = tmp_path / "run"
    client = OpenAIClient("m", fast(base_url=dead_url(), retries=1))
    m = run_bench(tasks(), client, out, samples=2, backend="cpu", verify=config(cache_dir), console=QUIET)
    assert m["unfinished"] == 4 and m["overall"]["samples"] == 0
    assert m["overall"]["status"] == {"generation_error": 4}
    rows = stored(out)
    assert len(rows) == 4 and all("ConnectError" in r.error for r in rows.values())
    assert (out / "metrics.json").exists() and "4 samples are unfinished" in (out / "report.md").read_text()

    server = FakeServer(by_task)
    try:
        client = OpenAIClient("m", fast(base_url=server.url))
        m = run_bench(tasks(), client, out, samples=2, backend="cpu", verify=config(cache_dir), console=QUIET)
        assert len(server.requests) == 4 and m["unfinished"] == 0
        assert m["overall"]["status"] == {"format_error": 2, "illegal": 2}
        assert m["levels"]["level1"]["status"] == {"illegal": 2} and m["overall"]["pass_at_k"]["2"] == 0.0
        rows = stored(out)
        assert len(rows) == 4 and all(r.attempts == 2 and r.verdict for r in rows.values())
        assert rows[(RELU, 0, 1)].code.startswith("import torch") and rows[(GEMM, 0, 1)].code is None
        assert rows[(RELU, 0, 1)].verdict["status"] == "illegal" and "exec" in rows[(RELU, 0, 1)].verdict["reason"]
        assert rows[(RELU, 0, 1)].prompt_tokens == 100 and rows[(RELU, 0, 1)].finish_reason == "stop"

        again = run_bench(tasks(), client, out, samples=2, backend="cpu", verify=config(cache_dir), console=QUIET)
        assert len(server.requests) == 4 and again["overall"] == m["overall"]  # nothing redone
        more = run_bench(tasks(), client, out, samples=3, backend="cpu", verify=config(cache_dir), console=QUIET)
        assert len(server.requests) == 6 and more["overall"]["samples"] == 6  # only the new samples
        with pytest.raises(RunMismatch, match="temperature"):
            run_bench(tasks(), client, out, samples=2, temperature=0.2, backend="cpu", verify=config(cache_dir),
                      console=QUIET)
    finally:
        server.close()


def test_multi_turn_feedback_end_to_end(tmp_path, cache_dir):
    """Turn 1 fails, the verifier's feedback goes back as round 1 feedback, turn 2 passes (one C++ build)."""
    honest = EXAMPLES_DIR / "cpu" / "honest_relu.py"
    if not honest.exists():
        pytest.skip("the shipped cpu examples are missing")
    good = f"<think>a plan</think>Here it is:\n```python\n{honest.read_text()}\n```"
    seeds = {request_seed(0, t, s, k): (t, s, k) for t in (RELU, GEMM) for s in range(2) for k in (1, 2)}
    answers = {(RELU, 0, 1): "<think>cheat?</think>" + EXEC_REFERENCE, (RELU, 0, 2): good, (RELU, 1, 1): good,
               (GEMM, 0, 1): NO_CODE, (GEMM, 1, 1): NO_CODE, (GEMM, 0, 2): SYNTAX_ERROR, (GEMM, 1, 2): SYNTAX_ERROR}
    failed_once = set()

    def answer(body):
        key = seeds[body["seed"]]
        if key == (RELU, 1, 1) and key not in failed_once:
            failed_once.add(key)
            return 503, "warming up"
        return answers[key]

    server = FakeServer(answer)
    try:
        client = OpenAIClient("m", fast(base_url=server.url))
        m = run_bench(tasks(), client, tmp_path, samples=2, turns=2, backend="cpu", verify=config(cache_dir),
                      console=QUIET)
    finally:
        server.close()
    asked = [seeds[b["seed"]] for b in server.requests]
    assert sorted(asked) == sorted([*answers, (RELU, 1, 1)])  # no turn 2 after a pass; one retry after the 503
    second = next(b for b in server.requests if seeds[b["seed"]] == (RELU, 0, 2))["messages"]
    assert [x["role"] for x in second] == ["system", "user", "assistant", "user"]
    assert second[2]["content"] == strip_reasoning(answers[(RELU, 0, 1)]) and "<think>" not in second[2]["content"]
    fb = second[3]["content"]
    assert fb.startswith("=== System Feedback for Round 1 ===") and "Status: illegal" in fb and fb.endswith(FIX)

    rows = stored(tmp_path)
    assert rows[(RELU, 0, 2)].status == "ok" and rows[(RELU, 1, 1)].status == "ok"
    assert rows[(GEMM, 1, 2)].status == "format_error" and "syntax" in rows[(GEMM, 1, 2)].verdict["reason"].lower()
    mt = m["overall"]["multi_turn"]
    assert mt["first_turn_accuracy"] == pytest.approx(0.25) and mt["best_turn_accuracy"] == pytest.approx(0.5)
    assert mt["turns_to_success"] == {"1": 1, "2": 1, "never": 2}
    assert m["overall"]["pass_at_k"] == {"1": pytest.approx(0.5), "2": pytest.approx(0.5)}
    assert m["levels"]["level1"]["compile_rate"] == 1.0 and m["unfinished"] == 0
    report = (tmp_path / "report.md").read_text()
    assert "## Multi-turn" in report and "| level1 | 100.0 | 100.00 |" in report


def _cli(*args):
    return [sys.executable, "-c", "from musacoder.bench.cli import bench_app; bench_app()", *args]


def _run_args(spec, out):
    return ["run", "--tasks", str(BUILTIN_DIR), "--levels", "1", "--model", spec, "--samples", "2", "--out", str(out),
            "--backend", "cpu", "--no-timing", "--concurrency", "1"]


N_SAMPLES = 2 * len(list((BUILTIN_DIR / "level1").glob("*.py")))  # _run_args' run: level-1 tasks x 2 samples


def _generated(db: Path) -> int:
    """Samples generated so far; 0 while the run has not created its store yet."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:  # read-only: never creates the file
            return c.execute("SELECT count(*) FROM samples WHERE raw IS NOT NULL").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def test_cli_interrupted_and_resumed(tmp_path, cache_dir):
    gate = threading.Event()  # the fifth answer waits for the interrupt: a busy CI host once let the run finish first

    def answer(body):
        if len(server.requests) >= 5:
            gate.wait(60)
        return NO_CODE

    server = FakeServer(answer, delay=0.3)
    out = tmp_path / "run"
    args = _run_args(f"openai:m@{server.url}", out)
    env = {**os.environ, "MUSACODER_CACHE": cache_dir}
    try:
        # SIGINT back to its default: a shell without job control starts background commands with it ignored
        proc = subprocess.Popen(_cli(*args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        db = out / "samples.sqlite"
        deadline = time.time() + 60
        # the server's count, not the database's: polling SQLite beside its writer can read "locked" (0) until the
        # run has ended; one request at a time, so the fifth request means four answers came back
        while time.time() < deadline and proc.poll() is None and len(server.requests) < 5:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        gate.set()
        proc.communicate(timeout=60)
        assert proc.returncode != 0
        before = len(server.requests)
        done = _generated(db)
        assert 3 <= done < N_SAMPLES  # interrupted part way

        r = subprocess.run(_cli(*args), env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert len(server.requests) - before == N_SAMPLES - done  # only what was not finished is asked again
        rows = Store(db).rows()
        assert len(rows) == N_SAMPLES and len({(x.task, x.sample, x.turn) for x in rows}) == N_SAMPLES
        assert all(x.status == "format_error" for x in rows)
        assert "Pass@2" in r.stdout and json.loads((out / "metrics.json").read_text())["unfinished"] == 0

        r = subprocess.run(_cli("compare", str(out), str(out)), env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "| Pass@2 | 0.0 | 0.0 | +0.0 |" in r.stdout
    finally:
        server.close()

    refusing = FakeServer(lambda body: (400, "model not found"))  # not transient: failed at once, not retried
    try:
        r = subprocess.run(_cli(*_run_args(f"openai:m@{refusing.url}", tmp_path / "down")), env=env,
                           capture_output=True, text=True, timeout=120)
    finally:
        refusing.close()
    assert r.returncode == 1 and f"{N_SAMPLES} samples unfinished" in r.stderr
    assert "generation_error" in (tmp_path / "down" / "report.md").read_text()
    r = subprocess.run(_cli(*_run_args("nonsense", tmp_path / "bad")), env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "model spec" in r.stderr
