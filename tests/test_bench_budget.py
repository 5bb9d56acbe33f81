"""The OpenAI client against a real loopback server that behaves like vLLM with an 8K context: requests fitted into
the context, turn 2 of a long answer cut (never the task), refusals recorded not retried, 429 retried after
Retry-After, identical samples warned about, Ctrl-C prompt."""

import io
import json
import math
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from rich.console import Console
from test_bench_clients import dead_url, fast, req

from musacoder.bench.clients.openai import OpenAIClient
from musacoder.bench.runner import identical_samples, run_bench
from musacoder.bench.store import Store
from musacoder.config import VerifyConfig
from musacoder.conversation import CUT, task_messages
from musacoder.tasks import builtin_task
from musacoder.tasks.loaders import BUILTIN_DIR

CONTEXT = 8192
NO_CODE = "I am not able to write this kernel."  # format_error: verified without building anything


def server_tokens(messages) -> int:
    """The fake server's tokenizer: 3 chars a token (denser than the client's conservative estimate)."""
    return sum(math.ceil(len(m["content"]) / 3) + 4 for m in messages) + 2


class Vllm:
    """/v1/models with max_model_len, optional /tokenize, and chat completions refused like vLLM's past the context.
    `answer(body)` returns the content, or (status, text, headers) for an error; chat bodies land in `chats`."""

    def __init__(self, answer, tokenize=True, delay=0.0):
        self.answer, self.chats, self.tokenize_calls, self.stop = answer, [], 0, threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status, payload, headers=()):
                data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (Ctrl-C test)
                    pass

            def do_GET(self):
                if self.path == "/v1/models":
                    return self.reply(200, {"data": [{"id": "m", "object": "model", "max_model_len": CONTEXT}]})
                self.reply(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize" and tokenize:
                    server.tokenize_calls += 1
                    n = server_tokens(body["messages"])
                    return self.reply(200, {"count": n, "max_model_len": CONTEXT, "tokens": list(range(n))})
                if self.path != "/v1/chat/completions":
                    return self.reply(404, {"detail": "Not Found"})
                server.chats.append(body)
                for _ in range(int(delay * 20)):  # a slow answer, bounded, that gives up when the test ends
                    if server.stop.wait(0.05):
                        break
                n = server_tokens(body["messages"])
                if n + body["max_tokens"] > CONTEXT:
                    return self.reply(400, {"object": "error", "type": "BadRequestError", "code": 400, "message":
                                            f"This model's maximum context length is {CONTEXT} tokens. However, you "
                                            f"requested {n + body['max_tokens']} tokens ({n} in the messages, "
                                            f"{body['max_tokens']} in the completion)."})
                res = server.answer(body)
                if isinstance(res, tuple):
                    return self.reply(*res)
                self.reply(200, {"choices": [{"message": {"role": "assistant", "content": res},
                                              "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": n, "completion_tokens": 7}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def big(max_tokens=32768, **kw):
    """A request as the runner makes them by default: the paper's 32K response limit, far past the context."""
    r = req(**kw)
    return type(r)(r.task, r.sample, r.turn, task_messages(r.task, "cpu"), 0.7, 1.0, max_tokens, r.seed)


@pytest.mark.parametrize("tokenize", [True, False])
def test_requests_are_fitted_into_the_servers_context(tokenize):
    with Vllm(lambda body: "ok", tokenize=tokenize) as s:
        client = OpenAIClient("m", fast(base_url=s.url))
        got = dict(client.generate([big(sample=i) for i in range(3)] + [big(max_tokens=100)]))
        assert client.context_len == CONTEXT  # from /v1/models
        assert all(g.error is None and g.text == "ok" for g in got.values())
        n = server_tokens(s.chats[0]["messages"])
        asked = sorted(b["max_tokens"] for b in s.chats)
        assert asked[0] == 100  # a small max_tokens is left alone
        if tokenize:  # exact: the answer gets all the room the prompt leaves
            assert asked[1:] == [CONTEXT - n] * 3 and s.tokenize_calls == 4
        else:  # estimated, conservatively: less room, but the server accepts it
            assert all(CONTEXT // 2 < a < CONTEXT - n for a in asked[1:]) and s.tokenize_calls == 0


def test_a_refused_request_is_recorded_not_retried():
    with Vllm(lambda body: "ok") as s:  # a context the client is told wrongly: the server refuses
        got = dict(OpenAIClient("m", fast(base_url=s.url, max_model_len=100_000)).generate([big()]))
        assert len(s.chats) == 1 and got[0].attempts == 1 and got[0].error.startswith("HTTP 400: ")
        assert f"maximum context length is {CONTEXT} tokens" in got[0].error

    with Vllm(lambda body: "ok") as s:  # the bare task does not fit: failed before asking, with the reason
        huge = big()
        huge.messages[1]["content"] += "x" * 30_000
        got = dict(OpenAIClient("m", fast(base_url=s.url)).generate([huge]))
        assert not s.chats and got[0].error.startswith("prompt does not fit: the prompt is ")
        assert f"context of {CONTEXT} tokens" in got[0].error


def test_429_is_retried_after_retry_after():
    calls = []

    def answer(body):
        calls.append(time.perf_counter())
        return (429, {"message": "slow down"}, [("Retry-After", "1")]) if len(calls) == 1 else "ok"

    with Vllm(answer) as s:
        got = dict(OpenAIClient("m", fast(base_url=s.url, backoff_s=0.01)).generate([big()]))
    assert got[0].text == "ok" and got[0].attempts == 2 and len(s.chats) == 2
    assert calls[1] - calls[0] >= 0.95  # the server's Retry-After, not the 0.01 s backoff


def test_turn_two_cuts_the_long_first_answer_but_keeps_the_task(tmp_path, cache_dir):
    long_answer = "Let me explain. " + "word " * 9000  # ~45K chars: 15K server tokens, far past the context
    task = builtin_task("level1/19_ReLU")
    with Vllm(lambda body: long_answer if len(body["messages"]) == 2 else NO_CODE) as s:
        m = run_bench([task], OpenAIClient("m", fast(base_url=s.url)), tmp_path, samples=1, turns=2, backend="cpu",
                      verify=VerifyConfig(backend="cpu", timing_enabled=False, cache_dir=cache_dir),
                      console=Console(file=io.StringIO()))
    assert [len(b["messages"]) for b in s.chats] == [2, 4] and m["unfinished"] == 0
    first, second = s.chats[0]["messages"], s.chats[1]["messages"]
    assert second[:2] == first  # system prompt and task, whole
    assert second[2]["content"].startswith("Let me explain.") and "characters of this earlier answer cut" in \
        second[2]["content"] and len(second[2]["content"]) < len(long_answer) // 2
    assert second[3]["content"].startswith("=== System Feedback for Round 1 ===")  # the feedback, whole
    assert server_tokens(second) + s.chats[1]["max_tokens"] <= CONTEXT
    rows = {r.turn: r for r in Store(tmp_path / "samples.sqlite").rows()}
    assert rows[2].messages == second and rows[2].verdict  # the store keeps what was sent
    assert CUT.split("{n}")[1] in rows[2].messages[2]["content"]


def test_identical_samples_are_warned_about(tmp_path, cache_dir):
    out = io.StringIO()
    with Vllm(lambda body: NO_CODE) as s:  # a server that ignores temperature
        run_bench([builtin_task("level1/19_ReLU")], OpenAIClient("m", fast(base_url=s.url)), tmp_path, samples=3,
                  backend="cpu", verify=VerifyConfig(backend="cpu", timing_enabled=False, cache_dir=cache_dir),
                  console=Console(file=out, width=300))
    assert len(s.chats) == 3 and "warning: the samples of 1 task(s) came back identical at temperature 0.7 " \
        "(level1/19_ReLU)" in out.getvalue()
    assert identical_samples({"a": ["x", "x"], "b": ["x", "y"], "c": ["x"]}, 0.7).startswith("the samples of 1 task")
    assert identical_samples({"a": ["x", "x"]}, 0.0) is None  # greedy decoding is meant to repeat itself


def ctrl_c(after: float):
    """SIGINT to this process, as the terminal sends it on Ctrl-C (Python's handler installed: a shell without job
    control starts background commands with SIGINT ignored, and then nothing would arrive)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(after, os.kill, (os.getpid(), signal.SIGINT)).start()


def test_ctrl_c_while_waiting_on_the_server_returns_at_once(tmp_path, cache_dir):
    with Vllm(lambda body: "late", delay=10) as s:
        client = OpenAIClient("m", fast(base_url=s.url, concurrency=2))
        ctrl_c(0.5)
        t0 = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            list(client.generate([big(sample=i) for i in range(4)]))
        assert time.perf_counter() - t0 < 3 and client._loop is None  # not the server's 10 s

        # Through the runner, generating in its own thread: the interrupt cancels what is in flight there too.
        ctrl_c(0.5)
        t0 = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            run_bench([builtin_task("level1/19_ReLU")], client, tmp_path, samples=2, backend="cpu",
                      verify=VerifyConfig(backend="cpu", timing_enabled=False, cache_dir=cache_dir),
                      console=Console(file=io.StringIO()))
        deadline = time.perf_counter() + 3
        while time.perf_counter() < deadline and any(t.name == "bench-generate" for t in threading.enumerate()):
            time.sleep(0.05)
        assert time.perf_counter() - t0 < 4 and not any(t.name == "bench-generate" for t in threading.enumerate())


def test_a_dead_server_ends_the_run_with_one_error_line(tmp_path, monkeypatch, cache_dir):
    from typer.testing import CliRunner

    from musacoder.bench import clients
    from musacoder.bench.cli import bench_app

    url = dead_url()
    monkeypatch.setenv("MUSACODER_CACHE", cache_dir)
    monkeypatch.setattr(clients, "make_client", lambda spec, **kw: OpenAIClient("m", fast(base_url=url, retries=1)))
    r = CliRunner().invoke(bench_app, ["run", "--tasks", str(BUILTIN_DIR / "level1" / "19_ReLU.py"), "--model", f"openai:m@{url}", "--samples",
                                       "2", "--out", str(tmp_path / "run"), "--backend", "cpu", "--no-timing"])
    assert r.exit_code == 1, r.output
    assert f"error: the model server at {url} is not answering (ConnectError" in r.output
    assert "2 samples unfinished" in r.output and "run the same command again" not in r.output
    assert (tmp_path / "run" / "samples.sqlite").exists()
