"""The snippets of docs/ecosystem-*.md: every python block compiles and its musacoder imports exist; the KernelBench,
KernelGYM and TRL snippets run (cpu backend; the KernelGYM one against FastAPI's TestClient; the TRL one as written,
TRL's stock GRPOTrainer training 2 steps of a 2-layer Llama built offline where the snippet expects its model); the
verl YAML is the shipped config's."""

import ast
import importlib
import math
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]
DOCS = sorted((ROOT / "docs").glob("ecosystem-*.md"))


def blocks(doc: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", doc.read_text(), re.DOTALL)


def test_one_page_per_ecosystem():
    assert [d.stem for d in DOCS] == ["ecosystem-kernelbench", "ecosystem-kernelgym", "ecosystem-trl",
                                      "ecosystem-verl"]


@pytest.mark.parametrize("doc", DOCS + [ROOT / "docs" / "deploy.md"], ids=lambda d: d.stem)
def test_python_snippets_compile_and_import(doc):
    for src in blocks(doc, "python"):
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ImportFrom) and node.module.startswith("musacoder"):
                mod = importlib.import_module(node.module)
                assert all(hasattr(mod, a.name) for a in node.names), (doc.name, node.module)


@pytest.fixture
def cpu_env(monkeypatch, cache_dir):
    monkeypatch.chdir(ROOT)
    for k, v in {"MUSACODER_BACKEND": "cpu", "MUSACODER_TIMING": "0", "MUSACODER_CACHE": cache_dir}.items():
        monkeypatch.setenv(k, v)


def test_kernelbench_snippet_runs(cpu_env, capsys):
    """The snippet's one line to change on a CPU is the one its comment names."""
    src = blocks(ROOT / "docs" / "ecosystem-kernelbench.md", "python")[0]
    assert 'backend="cuda")  # backend="cpu", measure_performance=False on a machine without a GPU' in src
    src = src.replace('backend="cuda"', 'backend="cpu"').replace("measure_performance=True", "measure_performance=False")
    exec(src, {})  # noqa: S102 - our own doc snippet
    assert capsys.readouterr().out.startswith("True True")


def test_kernelbench_task_file_snippet_writes_what_bench_reads(tmp_path, monkeypatch):
    """No hub here: `datasets.load_dataset` answers with the shipped tasks in the dataset's columns (its `name` has
    the `.py` suffix, as the Hugging Face dataset's does)."""
    datasets = pytest.importorskip("datasets")
    from musacoder.tasks import load_tasks
    from musacoder.tasks.loaders import BUILTIN_DIR
    from musacoder.tasks.select import select_tasks

    def load_dataset(name, split):
        assert name == "ScalingIntelligence/KernelBench"
        level = int(split.removeprefix("level_"))
        return datasets.Dataset.from_list([{"code": t.code, "level": level, "name": f"{t.name}.py",
                                            "problem_id": t.problem_id} for t in load_tasks(BUILTIN_DIR)
                                           if t.level == level])

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.chdir(tmp_path)
    exec(blocks(ROOT / "docs" / "ecosystem-kernelbench.md", "python")[1], {})  # noqa: S102 - our own doc snippet
    got = select_tasks(tmp_path / "KernelBench.jsonl", levels="1,2")
    assert [t.key for t in got] == [t.key for t in load_tasks(BUILTIN_DIR) if t.level in (1, 2)]
    assert "level1/19_ReLU" in [t.key for t in got]


def test_replay_lines_of_the_doc_are_what_the_replay_client_reads(tmp_path):
    from musacoder.bench.clients import ReplayClient, Request
    from musacoder.tasks import builtin_task

    (lines,) = blocks(ROOT / "docs" / "ecosystem-kernelbench.md", "json")
    (tmp_path / "answers.jsonl").write_text(lines)
    relu = builtin_task("level1/19_ReLU")
    got = dict(ReplayClient(tmp_path / "answers.jsonl").generate(
        [Request(relu, s, 1, [], 0.7, 1.0, 64, 0) for s in range(3)]))
    assert got[0].text.startswith("the model's whole answer") and got[1].completion_tokens == 430
    assert not any(g.error for g in got.values())


def tiny_llama(path: Path) -> None:
    """A 2-layer Llama with a byte-level BPE tokenizer and a chat template, built offline and saved at `path`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from musacoder.tasks import builtin_task

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([builtin_task("level1/19_ReLU").code], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|pad|>", "<|end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|end|>")
    fast.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                      pad_token_id=fast.pad_token_id, eos_token_id=fast.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    fast.save_pretrained(path)


def test_trl_snippet_runs_as_written_on_a_cpu(tmp_path, monkeypatch, cache_dir):
    """Its completions are noise, so rewards are format_error's -1; the point is the wiring: conversational prompts
    and completions, the `task` column, finite rewards of the right length, TRL's logs. The environment says
    nothing: the reward is configured in the snippet's code."""
    pytest.importorskip("trl")
    from musacoder.api import LocalVerifier

    for k in ("MUSACODER_VERIFIER_URL", "MUSACODER_BACKEND", "MUSACODER_TIMING"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MUSACODER_CACHE", cache_dir)
    monkeypatch.chdir(tmp_path)
    tiny_llama(tmp_path / "runs" / "sft-tiny" / "final")
    seen = []
    real = LocalVerifier.verdicts

    def spy(self, pairs):  # the real verification, recording what TRL handed the reward
        vs = real(self, pairs)
        seen.append((self.config.backend, self.config.timing_enabled, pairs, vs))
        return vs

    monkeypatch.setattr(LocalVerifier, "verdicts", spy)
    (src,) = blocks(ROOT / "docs" / "ecosystem-trl.md", "python")
    ns: dict = {}
    exec(src, ns)  # noqa: S102 - our own doc snippet, unchanged
    assert len(seen) == 2
    for backend, timing, pairs, vs in seen:
        assert (backend, timing) == ("cpu", False) and len(pairs) == len(vs) == 2
        task, completion = pairs[0]
        assert "class Model" in task and isinstance(completion, list) and completion[0]["role"] == "assistant"
        assert all(math.isfinite(v.reward) for v in vs)
    logs = [h for h in ns["trainer"].state.log_history if "reward" in h]
    assert len(logs) == 2 and all(math.isfinite(h["reward"]) for h in logs)
    assert any("musacoder/pass_rate" in h for h in ns["trainer"].state.log_history)  # our log_metric reached TRL


def test_deploy_reward_snippet_sets_up_as_written(monkeypatch):
    """It needs a service to answer; as written it sets its client up, which is all a run without one can check
    (tests/test_ecosystem_http.py and tests/test_service_client.py verify through a real service)."""
    monkeypatch.setenv("MUSACODER_TOKEN", "t")
    src = blocks(ROOT / "docs" / "deploy.md", "python")[1]
    ns: dict = {}
    exec(src, ns)  # noqa: S102 - our own doc snippet
    assert ns["client"].base_url == "http://verifier:8000" and callable(ns["reward"]) and callable(ns["reward_fn"])


def test_kernelgym_snippet_runs(cpu_env, cache_dir, capsys):
    from fastapi.testclient import TestClient

    from musacoder.api import get_pool
    from musacoder.config import VerifyConfig
    from musacoder.service.app import create_app
    from musacoder.service.settings import ServiceSettings

    (src,) = blocks(ROOT / "docs" / "ecosystem-kernelgym.md", "python")
    pool = get_pool(VerifyConfig(backend="cpu", cache_dir=cache_dir, timing_enabled=False))
    with TestClient(create_app(pool, ServiceSettings(db_path=Path(cache_dir) / "kg-doc.sqlite"))) as client:
        src = src.replace("import httpx\n", "").replace('"http://localhost:8000"', '""')
        exec(src, {"httpx": client})  # noqa: S102 - our own doc snippet, the TestClient standing in for httpx
    out = capsys.readouterr().out
    assert "'decoy_kernel': True" in out and "'correctness': False" in out


def test_verl_dataset_snippet_writes_what_verl_reads(tmp_path, monkeypatch):
    """The snippet as written, on a KernelBench.jsonl of the shipped tasks; verl's RLHFDataset (what main_ppo's
    `data.train_files` loads) reads its rows, and compute_score finds each row's reference in them."""
    import json

    pytest.importorskip("verl")
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from musacoder.rewards import _reference
    from musacoder.tasks import load_tasks
    from musacoder.tasks.loaders import BUILTIN_DIR

    monkeypatch.chdir(tmp_path)
    shipped = load_tasks(BUILTIN_DIR)
    (tmp_path / "KernelBench.jsonl").write_text("".join(json.dumps(
        {"code": t.code, "level": t.level, "name": t.name, "problem_id": t.problem_id}) + "\n" for t in shipped))
    (src,) = blocks(ROOT / "docs" / "ecosystem-verl.md", "python")
    exec(src, {})  # noqa: S102 - our own doc snippet
    tiny_llama(tmp_path / "model")
    ds = RLHFDataset(data_files=["data/verl/train.parquet"], tokenizer=AutoTokenizer.from_pretrained(tmp_path / "model"),
                     config=OmegaConf.create({"filter_overlong_prompts": False}))
    wanted = [t for t in shipped if t.level in (1, 2)]
    assert len(ds) == len(wanted) > 0
    for i, t in enumerate(wanted):
        row = ds[i]
        assert row["agent_name"] == "single_turn_agent" and row["raw_prompt"][-1]["role"] == "user"
        assert t.code in row["raw_prompt"][-1]["content"]
        assert _reference(row["reward_model"]["ground_truth"], row["extra_info"])["code"] == t.code


def test_verl_yaml_is_the_shipped_configs():
    (snippet,) = blocks(ROOT / "docs" / "ecosystem-verl.md", "yaml")
    shipped = yaml.safe_load((ROOT / "configs" / "verl" / "naive_compute_score.yaml").read_text())
    for k, v in yaml.safe_load(snippet)["reward"].items():
        assert shipped["reward"][k] == v
