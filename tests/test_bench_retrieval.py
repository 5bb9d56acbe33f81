"""Honest baselines (issue 44, B): `retrieval:TRAIN` answers with the nearest training answer renamed to the task's
names; `fewshot:K:TRAIN:SPEC` shows a model its K nearest training examples first. Cheap but the end-to-end
verification (slow: a C++ build)."""

import json

import pytest

from musacoder.bench.clients import make_client
from musacoder.bench.clients.base import Request
from musacoder.bench.clients.retrieval import RetrievalClient, adapt
from musacoder.conversation import task_messages
from musacoder.tasks import Task, builtin_task

RELU = builtin_task("level1/19_ReLU")

TRAIN_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n_feat):
        super(Model, self).__init__()
        self.offset = nn.Parameter(torch.randn(n_feat) * 0.1)
        self.gain = nn.Parameter(torch.randn(n_feat))

    def forward(self, inp):
        return torch.relu(inp * self.gain + self.offset)


rows = 16
n_feat = 64


def get_inputs():
    return [torch.rand(rows, 3, n_feat)]


def get_init_inputs():
    return [n_feat]
'''
# an answer in plain PyTorch: the verifier would refuse it, but it shows the renaming computes the same thing
TRAIN_ANSWER = '''import torch
import torch.nn as nn

SCALE = 1.0
n_feat = 64


class ModelNew(nn.Module):
    def __init__(self, n_feat):
        super().__init__()
        self.offset = nn.Parameter(torch.randn(n_feat) * 0.1)
        self.gain = nn.Parameter(torch.randn(n_feat))

    def forward(self, inp):
        y = inp * self.gain * SCALE + self.offset
        return torch.where(y > 0, y, torch.zeros_like(y)) + 0 * n_feat
'''
EVAL_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.b = nn.Parameter(torch.randn(features) * 0.1)
        self.w = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return torch.relu(x * self.w + self.b)


batch = 8
n_feat = 32


def get_inputs():
    return [torch.rand(batch, n_feat)]


def get_init_inputs():
    return [n_feat]
'''


def sft(task_code: str, answer: str, name: str) -> dict:
    return {"messages": task_messages(Task(name, task_code), "cpu")
            + [{"role": "assistant", "content": f"<think>...</think>\n```python\n{answer}```"}],
            "kind": "generation", "task": name}


def load(code: str):
    import types

    m = types.ModuleType("m")
    exec(compile(code, "m", "exec"), m.__dict__)
    return m


def test_adapt_renames_the_answer_to_the_task_and_computes_the_same():
    import torch

    program = adapt(TRAIN_ANSWER, TRAIN_TASK, EVAL_TASK)
    assert "def forward(self, x)" in program and "self.w" in program and "self.gain" not in program
    assert "n_feat = 32" in program  # a constant the answer shares with its training task takes the task's value
    task, new = load(EVAL_TASK), load(program)
    torch.manual_seed(0)
    ref = task.Model(*task.get_init_inputs())
    torch.manual_seed(0)
    cand = new.ModelNew(*task.get_init_inputs())
    x = torch.randn(8, 32)
    torch.testing.assert_close(cand(x), ref(x))  # the same weights under the same seed, the same function
    assert adapt("not python (", TRAIN_TASK, EVAL_TASK) == "not python ("


@pytest.fixture
def train_file(tmp_path):
    tanh = TRAIN_TASK.replace("torch.relu(", "torch.tanh(")
    records = [sft(tanh, TRAIN_ANSWER.replace("torch.where(y > 0, y, torch.zeros_like(y))", "torch.tanh(y)"), "tanh"),
               sft(TRAIN_TASK, TRAIN_ANSWER, "bias_relu"),
               {"messages": [{"role": "user", "content": "What is a warp?"}, {"role": "assistant", "content": "32"}],
                "kind": "qa"}]
    f = tmp_path / "train.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in records))
    return f


def test_retrieval_answers_with_the_same_computation_first(train_file):
    client = make_client(f"retrieval:{train_file}")
    assert isinstance(client, RetrievalClient) and client.model_id.startswith("retrieval:")
    task = Task("bias_relu_eval", EVAL_TASK)
    got = dict(client.generate([Request(task, s, 1, [], 0.7, 1.0, 100, 0) for s in (0, 1, 5)]))
    assert got[0].text.startswith(f"Nearest training answer (same computation): {train_file}:2")
    assert "def forward(self, x)" in got[0].text and "torch.where" in got[0].text
    assert f"{train_file}:1" in got[1].text and "Jaccard" in got[1].text  # sample 1: the next nearest
    assert f"{train_file}:1" in got[2].text  # sample 5, past the last: the last
    qa_only = train_file.with_name("qa.jsonl")
    qa_only.write_text('{"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]}\n')
    with pytest.raises(ValueError, match="no training record with a task"):
        RetrievalClient(qa_only)
    with pytest.raises(ValueError, match="expected fewshot:K:TRAIN.jsonl:SPEC"):
        make_client(f"fewshot:two:{train_file}:hf:x")


def test_fewshot_leads_each_prompt_with_the_nearest_examples(train_file, tmp_path):
    from musacoder.bench.clients.retrieval import FewShotClient

    (tmp_path / "replay.jsonl").write_text(json.dumps({"task": "bias_relu_eval", "sample": 0, "output": "x"}) + "\n")
    client = make_client(f"fewshot:2:{train_file}:replay:{tmp_path / 'replay.jsonl'}")
    assert isinstance(client, FewShotClient) and client.model_id.startswith("fewshot:2:") and not client.local
    first = task_messages(Task("bias_relu_eval", EVAL_TASK), "cpu")
    (_, gen), = client.generate([Request(Task("bias_relu_eval", EVAL_TASK), 0, 1, first, 0.7, 1.0, 100, 0)])
    assert gen.text == "x" and [m["role"] for m in gen.messages] == ["system"] + ["user", "assistant"] * 2 + ["user"]
    assert "torch.relu(inp * self.gain" in gen.messages[1]["content"]  # the nearest first: the same computation
    assert "torch.tanh(inp" in gen.messages[3]["content"] and gen.messages[-1] == first[-1]


def test_fewshot_shows_only_the_nearest_examples_that_leave_room_for_the_answer(train_file, tmp_path):
    """Four shots of issue 44's training answers took up to 8,882 tokens of SmolLM2's 8,192: the farthest examples
    are dropped until the prompt leaves the request's max_tokens of the inner model's context."""
    (tmp_path / "replay.jsonl").write_text(json.dumps({"task": "bias_relu_eval", "sample": 0, "output": "x"}) + "\n")
    client = make_client(f"fewshot:2:{train_file}:replay:{tmp_path / 'replay.jsonl'}")
    task = Task("bias_relu_eval", EVAL_TASK)
    r = Request(task, 0, 1, task_messages(task, "cpu"), 0.7, 1.0, 100, 0)
    both = client.prompt(r)
    assert len(both) == len(r.messages) + 4  # no context known: every shot
    one_shot = len(r.messages) + 2
    client.inner.context_len = client.inner.prompt_tokens(both) + 99  # one token short of both shots and the answer
    assert len(client.prompt(r)) == one_shot and "torch.relu(inp * self.gain" in client.prompt(r)[1]["content"]
    client.inner.context_len = 10  # not even the task: the task alone, for the inner client to fit or refuse
    assert client.prompt(r) == r.messages


@pytest.mark.slow
def test_fewshot_prompts_a_tiny_model_with_its_nearest_examples(train_file, tmp_path, cache_dir):
    from musacoder.bench.runner import run_bench
    from musacoder.bench.store import Store
    from musacoder.config import VerifyConfig
    from musacoder.data.records import load_records
    from musacoder.train.sft import SFTConfig, _bpe_tokenizer, _load_model

    # a model built from a config, as the SFT tests and configs/sft-tiny.yaml build theirs (nothing downloaded)
    cfg = SFTConfig(data=[str(train_file)], init={"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                                                  "num_hidden_layers": 1, "num_attention_heads": 2,
                                                  "num_key_value_heads": 2, "max_position_embeddings": 4096})
    tok = _bpe_tokenizer(load_records(train_file)[0], 300)
    final = tmp_path / "tiny"
    _load_model(cfg, tok).save_pretrained(final)
    tok.save_pretrained(final)
    client = make_client(f"fewshot:1:{train_file}:hf:{final}", batch_size=1)
    assert client.local and client.model_id.endswith(str(final))
    m = run_bench([RELU], client, tmp_path / "run", samples=1, max_tokens=4, backend="cpu",
                  verify=VerifyConfig(backend="cpu", timing_enabled=False, cache_dir=cache_dir))
    (row,) = Store(tmp_path / "run" / "samples.sqlite").rows()
    roles = [msg["role"] for msg in row.messages]
    assert roles == ["system", "user", "assistant", "user"]  # one example, then the benchmark prompt
    assert "torch.relu(inp * self.gain + self.offset)" in row.messages[1]["content"]  # the nearest: bias_relu
    assert row.messages[-1]["content"] == task_messages(RELU, "cpu")[1]["content"]
    assert m["unfinished"] == 0 and row.verdict is not None and row.completion_tokens <= 4


@pytest.mark.slow
def test_retrieval_of_a_real_kernel_passes_the_verifier(tmp_path, cache_dir):
    """The shipped honest cpu ReLU, trained on as the answer to ReLU at rank 3, answers the rank-2 eval task."""
    from pathlib import Path

    from musacoder.bench.runner import run_bench
    from musacoder.config import VerifyConfig

    honest = (Path(__file__).parent.parent / "musacoder/examples/cpu/honest_relu.py").read_text()
    rank3 = RELU.code.replace("torch.rand(batch_size, dim)", "torch.rand(batch_size, 2, dim)")
    f = tmp_path / "train.jsonl"
    f.write_text(json.dumps(sft(rank3, honest, "relu3")) + "\n")
    m = run_bench([RELU], make_client(f"retrieval:{f}"), tmp_path / "run", samples=1, backend="cpu",
                  verify=VerifyConfig(backend="cpu", timing_enabled=False, cache_dir=cache_dir))
    assert m["overall"]["pass_at_k"]["1"] == 1.0
