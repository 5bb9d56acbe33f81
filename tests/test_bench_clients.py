"""Generation clients without GPU or network: a real HTTP server on loopback, replay files, a tiny local model."""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from musacoder.bench.clients import ReplayClient, ReplayError, Request, make_client
from musacoder.bench.clients.openai import OpenAIClient, OpenAIConfig
from musacoder.tasks import Task, builtin_task


class FakeServer:
    """An OpenAI-compatible /v1/chat/completions on loopback. `answer(body)` returns the content string, or an
    (HTTP status, body text) tuple for an error; every request body is kept in `requests`."""

    def __init__(self, answer, delay=0.0):
        self.answer, self.delay = answer, delay
        self.requests, self.in_flight, self.max_in_flight = [], 0, 0
        lock, server = threading.Lock(), self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    server.requests.append(body)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                time.sleep(server.delay)
                res = server.answer(body) if self.path == "/v1/chat/completions" else (404, "not found")
                with lock:
                    server.in_flight -= 1
                if isinstance(res, tuple):
                    status, payload = res
                else:
                    status, payload = 200, json.dumps({
                        "choices": [{"message": {"role": "assistant", "content": res}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 100, "completion_tokens": len(res.split())}})
                data = payload.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def dead_url() -> str:
    """A loopback address where nothing listens (connections are refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/v1"


def fast(**kw) -> OpenAIConfig:
    return OpenAIConfig(**{"backoff_s": 0.01, "retries": 2, "timeout_s": 5, **kw})


def req(task=None, sample=0, turn=1, content="write a kernel"):
    return Request(task or builtin_task("level1/19_ReLU"), sample, turn, [{"role": "user", "content": content}],
                   0.7, 1.0, 64, seed=sample)


@pytest.fixture
def server():
    calls = {"flaky": 0}

    def answer(body):
        text = body["messages"][-1]["content"]
        if text == "flaky":  # 500 once, then fine
            calls["flaky"] += 1
            return (500, "overloaded") if calls["flaky"] == 1 else "recovered"
        if text == "bad request":
            return 400, '{"error": "context too long"}'
        if text == "think":
            return 200, json.dumps({"choices": [{"message": {"content": "```python\ncode\n```",
                                                             "reasoning_content": "let me think"}}]})
        return f"answer to {text} seed {body['seed']} T {body['temperature']} max {body['max_tokens']}"

    s = FakeServer(answer, delay=0.05)
    yield s
    s.close()


def test_openai_client_answers_retries_and_records_usage(server):
    client = OpenAIClient("my-model", fast(base_url=server.url, concurrency=3))
    reqs = [req(sample=i, content=f"task {i}") for i in range(8)] + [req(content="flaky"), req(content="think"),
                                                                      req(content="bad request")]
    got = dict(client.generate(reqs))
    assert sorted(got) == list(range(len(reqs)))
    assert got[5].text == "answer to task 5 seed 5 T 0.7 max 64" and got[5].error is None
    assert got[5].prompt_tokens == 100 and got[5].completion_tokens == 10 and got[5].attempts == 1
    assert got[8].text == "recovered" and got[8].attempts == 2
    assert got[9].text == "<think>let me think</think>```python\ncode\n```"
    assert got[10].error.startswith("HTTP 400") and got[10].attempts == 1  # a client error is not retried
    assert server.max_in_flight <= 3  # the concurrency limit holds
    assert all(b["model"] == "my-model" for b in server.requests)


def test_openai_client_survives_a_dead_server():
    client = OpenAIClient("m", fast(base_url=dead_url(), dead_after=2, concurrency=1))
    t0 = time.perf_counter()
    got = dict(client.generate([req(sample=i) for i in range(6)]))
    assert time.perf_counter() - t0 < 10
    assert all(g.error and not g.text for g in got.values())
    assert "ConnectError" in got[0].error and got[0].attempts == 3
    assert sum(g.error.startswith("skipped: server unreachable") for g in got.values()) == 4  # after 2 failures


def test_openai_client_times_out():
    slow = FakeServer(lambda body: "late", delay=2.0)
    try:
        got = dict(OpenAIClient("m", fast(base_url=slow.url, timeout_s=0.3, retries=0)).generate([req()]))
        assert "Timeout" in got[0].error
    finally:
        slow.close()


def test_make_client_specs(tmp_path):
    c = make_client("openai:Qwen/Qwen3-8B@http://10.0.0.1:30000/v1", concurrency=5)
    assert c.model == "Qwen/Qwen3-8B" and c.cfg.base_url == "http://10.0.0.1:30000/v1" and c.cfg.concurrency == 5
    c = make_client("openai:org/model@v2")  # an '@' that is not a URL stays in the name
    assert c.model == "org/model@v2" and c.cfg.base_url == "http://localhost:8000/v1"
    (tmp_path / "r.jsonl").write_text("")
    assert isinstance(make_client(f"replay:{tmp_path / 'r.jsonl'}"), ReplayClient)
    for bad in ("gpt4", "foo:bar"):
        with pytest.raises(ValueError):
            make_client(bad)


def test_replay_jsonl_and_kernelbench_directory(tmp_path):
    relu = builtin_task("level1/19_ReLU")
    f = tmp_path / "gen.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"task": "level1/19_ReLU", "sample": 0, "output": "by key", "usage": {"completion_tokens": 7}},
        {"task": "19_ReLU", "sample": 1, "turn": 2, "response": "by name, turn 2"},
        {"level": 1, "problem_id": 19, "sample": 2, "completion": "by level and problem"},
    ]) + "\n")
    got = dict(ReplayClient(f).generate([req(relu, 0), req(relu, 1, 2), req(relu, 2), req(relu, 3)]))
    assert got[0].text == "by key" and got[0].completion_tokens == 7
    assert got[1].text == "by name, turn 2" and got[2].text == "by level and problem"
    assert "no replay sample for level1/19_ReLU sample 3 turn 1" in got[3].error

    d = tmp_path / "runs"
    d.mkdir()
    (d / "level_1_problem_19_sample_0_kernel.py").write_text("kernel 0")
    (d / "level_1_problem_19_sample_1_turn_2_kernel.py").write_text("kernel 1 turn 2")
    (d / "more.jsonl").write_text(json.dumps({"task": "level1/19_ReLU", "sample": 5, "output": "from jsonl"}))
    got = dict(ReplayClient(d).generate([req(relu, 0), req(relu, 1, 2), req(relu, 5),
                                         req(Task("19_ReLU", relu.code), 0)]))
    assert [got[i].text for i in range(3)] == ["kernel 0", "kernel 1 turn 2", "from jsonl"]
    assert got[3].error  # a task without level and problem id cannot match KernelBench file names

    (tmp_path / "bad.jsonl").write_text('{"sample": 0, "output": "no task"}\n')
    with pytest.raises(ReplayError, match="line 1"):
        ReplayClient(tmp_path / "bad.jsonl")
    with pytest.raises(ReplayError, match="does not exist"):
        ReplayClient(tmp_path / "nope.jsonl")


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A 2-layer Llama with a word-level tokenizer, built offline and saved like a real checkpoint."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = ["```python", "class", "ModelNew", "(", "nn.Module", ")", ":", "def", "forward", "self", "x", "return", "import", "torch", "kernel"]
    vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>", "system:", "user:", "assistant:"] + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()
    fast_tok = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                       unk_token="<unk>")
    fast_tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}"
                              "{% if add_generation_prompt %}assistant: {% endif %}")
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512, pad_token_id=0,
                      bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(cfg).save_pretrained(path)
    fast_tok.save_pretrained(path)
    return path


def test_hf_client_generates_in_batches(tiny_checkpoint):
    import torch

    from musacoder.bench.clients.hf import HFClient, HFConfig

    client = HFClient(str(tiny_checkpoint), HFConfig(batch_size=2, device="cpu"))
    reqs = [req(sample=i, content="class ModelNew " * (i + 1)) for i in range(3)]
    cudnn, forward = set(), client.model.forward
    client.model.forward = lambda *a, **k: cudnn.add(torch.backends.cuda.cudnn_sdp_enabled()) or forward(*a, **k)
    t0 = time.perf_counter()
    got = dict(client.generate(reqs))
    client.model.forward = forward
    assert sorted(got) == [0, 1, 2]
    assert cudnn == {False} and torch.backends.cuda.cudnn_sdp_enabled()  # no cuDNN attention while decoding
    assert sum(g.seconds for g in got.values()) <= time.perf_counter() - t0  # a batch's time is shared, not repeated
    for i, g in got.items():
        assert g.error is None and isinstance(g.text, str)
        assert 0 < g.completion_tokens <= 64
        assert g.prompt_tokens == len(client.tok(client._render(reqs[i].messages), add_special_tokens=False)
                                      ["input_ids"])  # padding is not counted
    greedy = [Request(r.task, r.sample, 1, r.messages, 0.0, 1.0, 16, 0) for r in reqs[:1] * 2]
    a, b = dict(client.generate(greedy)).values()
    assert a.text == b.text and a.finish_reason in ("stop", "length")
    assert make_client(f"hf:{tiny_checkpoint}").model_id == str(tiny_checkpoint)


def test_hf_client_fits_each_request_into_the_models_context(tiny_checkpoint):
    """Past its context (512 positions here) a model computes on positions it never learned, silently: a prompt that
    cannot fit is an error, an earlier answer is cut in the middle until the prompt leaves room, as the OpenAI
    client does against a server's context."""
    from musacoder.bench.clients.hf import HFClient, HFConfig
    from musacoder.conversation import CUT

    client = HFClient(str(tiny_checkpoint), HFConfig(batch_size=2, device="cpu"))
    assert client.context_len == 512
    task = [{"role": "user", "content": "write a kernel"}]
    long_answer = {"role": "assistant", "content": "class ModelNew " * 400}
    again = task + [long_answer, {"role": "user", "content": "it failed: try again"}]
    reqs = [req(content="class ModelNew " * 400), Request(req().task, 1, 2, again, 0.7, 1.0, 64, 1), req(sample=2)]
    got = dict(client.generate(reqs))
    assert got[0].error.startswith("prompt does not fit: the prompt is") and got[0].attempts == 0
    cut = got[1].messages
    assert got[1].error is None and cut[0] == again[0] and cut[2:] == again[2:] and "cut to fit" in cut[1]["content"]
    assert CUT.split("{n}")[0] in cut[1]["content"]
    assert got[1].prompt_tokens + 64 <= 512 and got[1].prompt_tokens == client.prompt_tokens(cut)
    assert got[2].error is None and got[2].messages is None  # a prompt that fits goes as it is


def test_hf_client_through_the_runner(tiny_checkpoint, tmp_path, cache_dir):
    """Local generation is not overlapped with verification; its token counts reach the store and the metrics."""
    from musacoder.bench.clients.hf import HFClient, HFConfig
    from musacoder.bench.runner import run_bench
    from musacoder.bench.store import Store
    from musacoder.config import VerifyConfig

    client = HFClient(str(tiny_checkpoint), HFConfig(batch_size=4, device="cpu"))
    m = run_bench([builtin_task("level1/19_ReLU")], client, tmp_path, samples=3, max_tokens=8, backend="cpu",
                  verify=VerifyConfig(backend="cpu", timing_enabled=False, cache_dir=cache_dir))
    rows = Store(tmp_path / "samples.sqlite").rows()
    assert len(rows) == 3 and all(r.verdict and 0 < r.completion_tokens <= 8 and r.prompt_tokens > 300 for r in rows)
    assert m["unfinished"] == 0 and m["overall"]["samples"] == 3 and m["overall"]["pass_at_k"]["3"] == 0.0
    assert m["tokens"]["completion"] == sum(r.completion_tokens for r in rows)


def test_a_model_directory_without_a_model_says_where_the_model_is(tmp_path):
    """`hf:RUN` given a training run's output directory: an `error:` naming RUN/final, not transformers' message about
    tokenizer libraries (the first dry run of scripts/issue44_gpu.sh, 2026-11-29)."""
    from musacoder.bench.clients.hf import model_dir

    (tmp_path / "final").mkdir()
    with pytest.raises(ValueError, match="holds no model") as e:
        model_dir(str(tmp_path))
    assert "the run's model" not in str(e.value)  # no model in final/ either: no hint
    (tmp_path / "final" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=f"the run's model is in {tmp_path / 'final'}"):
        model_dir(str(tmp_path))
    assert model_dir(str(tmp_path / "final")) == str(tmp_path / "final")
    assert model_dir("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"  # a hub id: not checked here
