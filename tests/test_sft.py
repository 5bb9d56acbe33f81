"""SFT on a tiny model built from a config (no hub, no GPU): real steps, falling loss, last-turn masking in the
trainer's own batches, bad records reported, resume, LoRA, and per-epoch pool draws."""

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("trl")

from musacoder.train.data import last_turn_mask  # noqa: E402
from musacoder.train.sft import SFTConfig, build_trainer, train_sft  # noqa: E402

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 512}
REPAIR = {"messages": [{"role": "system", "content": "You write kernels."},
                       {"role": "user", "content": "Write a ReLU kernel."},
                       {"role": "assistant", "content": "<think>drop these thoughts</think>return torch.relu(x)"},
                       {"role": "user", "content": "=== System Feedback for Round 1 ===\nillegal: aten::relu"},
                       {"role": "assistant", "content": "<think>keep these</think>out[i] = in[i] > 0 ? in[i] : 0;"}],
          "kind": "repair", "task": "demo/relu"}


def qa(i):
    return {"messages": [{"role": "user", "content": f"Question {i}: what does kernel {i} compute?"},
                         {"role": "assistant", "content": f"Kernel {i} computes out[i] = max(x[i], 0) for all i."}],
            "kind": "qa"}


@pytest.fixture
def data(tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_text("\n".join([json.dumps(REPAIR)] + [json.dumps(qa(i)) for i in range(7)]
                           + ['{"messages": "broken"}']) + "\n")
    return f


def config(tmp_path, data, **kw):
    base = dict(data=[str(data)], output_dir=str(tmp_path / "out"), init=TINY, init_vocab_size=300,
                learning_rate=3e-3, warmup_ratio=0.0, max_length=512, per_device_train_batch_size=4, save_steps=1000)
    return SFTConfig(**{**base, **kw})


def test_sft_trains_with_falling_loss_and_reports_bad_records(tmp_path, data):
    from musacoder.bench.clients.base import Request
    from musacoder.bench.clients.hf import HFClient, HFConfig
    from musacoder.tasks import builtin_task

    final = train_sft(config(tmp_path, data, max_steps=16))
    out = tmp_path / "out"
    loss = [p["loss"] for p in json.loads((out / "loss.json").read_text())]
    assert len(loss) == 16 and sum(loss[-3:]) / 3 < 0.7 * sum(loss[:3]) / 3, loss
    assert (out / "loss.png").stat().st_size > 0
    problems = [json.loads(x) for x in (out / "problems.jsonl").read_text().splitlines()]
    assert [p["origin"] for p in problems] == [f"{data}:9"] and "'messages'" in problems[0]["problem"]
    report = json.loads((out / "data_report.json").read_text())
    assert report["problems"] == 1 and report["items"] == 8 and report["sources"][0]["kinds"] == {"repair": 1, "qa": 7}

    client = HFClient(str(final), HFConfig(device="cpu"))  # the result is a checkpoint the generation client loads
    req = Request(builtin_task("level1/19_ReLU"), 0, 1, REPAIR["messages"][:2], 0.0, 1.0, 8, 0)
    (_, gen), = client.generate([req])
    assert gen.error is None and gen.completion_tokens > 0


def test_trainer_batches_carry_loss_on_the_last_turn_only(tmp_path, data):
    trainer = build_trainer(config(tmp_path, data, per_device_train_batch_size=8))
    tok = trainer.processing_class
    batch = next(iter(trainer.get_train_dataloader()))
    repair_ids, mask = last_turn_mask(REPAIR["messages"], tok)
    rows = [r for r in range(8) if batch["input_ids"][r, :len(repair_ids)].tolist() == repair_ids]
    assert len(rows) == 1
    ids, labels = batch["input_ids"][rows[0]].tolist(), batch["labels"][rows[0]].tolist()
    n = len(repair_ids)
    for i in range(len(ids)):  # token by token: the label is the token on the last turn, -100 elsewhere and on padding
        assert labels[i] == (ids[i] if i < n and mask[i] else -100), i
    trained = tok.decode([t for t, lab in zip(ids, labels) if lab != -100])
    context = tok.decode([t for t, lab in zip(ids[:n], labels) if lab == -100])
    assert trained == "<think>keep these</think>out[i] = in[i] > 0 ? in[i] : 0;<|end|>\n"
    assert "return torch.relu(x)" in context and "drop these thoughts" not in context
    assert "<think>" not in context and "keep these" not in context


def test_eval_twins_are_refused_counted_and_said(tmp_path, capsys):
    from musacoder.conversation import task_messages
    from musacoder.data.records import DataError
    from musacoder.tasks import Task, builtin_task

    relu = builtin_task("level1/19_ReLU").code.replace("torch.rand(batch_size, dim)", "torch.rand(batch_size, 4, dim)")
    twin = {"messages": task_messages(Task("relu3", relu), "cpu") + [{"role": "assistant", "content": "```python\n"
                                                                                                    "...\n```"}],
            "kind": "generation", "task": "relu3"}
    f = tmp_path / "train.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [twin] + [qa(i) for i in range(3)]) + "\n")
    trainer = build_trainer(config(tmp_path, f))  # eval_sets defaults to the shipped tasks
    out = tmp_path / "out"
    report = json.loads((out / "data_report.json").read_text())
    assert len(trainer.train_dataset) == 3 and report["refused_eval_twins"] == 1
    assert report["eval_sets"] == ["builtin"] and report["sources"][0]["refused"] == 1
    refused = [json.loads(x) for x in (out / "refused.jsonl").read_text().splitlines()]
    assert refused == [{"origin": f"{f}:1", "task": "relu3", "eval_task": "level1/19_ReLU", "detector": "opgraph"}]
    err = capsys.readouterr().err
    assert "warning: 1 record(s) copy an eval task" in err and "opgraph twin of level1/19_ReLU" in err

    build_trainer(config(tmp_path, f, eval_sets=[]))
    assert "warning: eval_sets is empty" in capsys.readouterr().err
    assert json.loads((out / "data_report.json").read_text())["refused_eval_twins"] == 0
    with pytest.raises(DataError, match="eval set nowhere.jsonl"):
        build_trainer(config(tmp_path, f, eval_sets=["nowhere.jsonl"]))
    only = tmp_path / "only.jsonl"
    only.write_text(json.dumps(twin) + "\n")
    with pytest.raises(DataError, match="1 refused as eval twins"):
        build_trainer(config(tmp_path, only))


def test_resume_continues_from_the_last_checkpoint(tmp_path, data, monkeypatch, capsys):
    import trl

    steps = []
    real = trl.SFTTrainer.training_step
    monkeypatch.setattr(trl.SFTTrainer, "training_step", lambda self, *a, **k: steps.append(1) or real(self, *a, **k))
    train_sft(config(tmp_path, data, max_steps=4, save_steps=2))
    first = json.loads((tmp_path / "out" / "loss.json").read_text())
    assert len(steps) == 4 and (tmp_path / "out" / "checkpoint-4").is_dir()
    steps.clear()
    train_sft(config(tmp_path, data, max_steps=6, save_steps=2))
    assert len(steps) == 2 and "resuming from" in capsys.readouterr().err
    again = json.loads((tmp_path / "out" / "loss.json").read_text())
    assert [p["step"] for p in again] == list(range(1, 7)) and again[:4] == first


def test_lora_merges_into_a_full_checkpoint(tmp_path, data):
    import torch
    from transformers import AutoModelForCausalLM

    cfg = config(tmp_path, data, max_steps=3, learning_rate=1e-2, lora={"enabled": True, "r": 4, "alpha": 8})
    trainer = build_trainer(cfg)
    n_train = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    assert 0 < n_train < sum(p.numel() for p in trainer.model.parameters()) / 4  # adapters only
    base = trainer.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight.detach().clone()
    final = train_sft(cfg)
    assert not (final / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(final).model.layers[0].self_attn.q_proj.weight
    assert merged.shape == base.shape and not torch.allclose(merged, base)


def test_each_epoch_draws_a_pool_member(tmp_path):
    pool = [{"messages": [{"role": "user", "content": "Write ReLU."},
                          {"role": "assistant", "content": f"variant {k}: " + "x " * k}],
             "task": "demo/relu", "metadata": {"pool": "demo/relu", "cluster": k}} for k in range(4)]
    f = tmp_path / "rft.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in pool + [qa(0)]) + "\n")
    trainer = build_trainer(config(tmp_path, f))
    ds = trainer.train_dataset
    assert len(ds) == 2  # the pool is one item
    row = next(i for i in range(2) if len(ds.with_format(None)[i]["ids"]) == 4)
    drawer = next(c for c in trainer.callback_handler.callbacks if type(c).__name__ == "PoolDraw")
    targets = []
    for epoch in range(8):
        drawer.on_epoch_begin(None, SimpleNamespace(epoch=float(epoch)), None)
        targets.append(tuple(ds[row]["input_ids"]))
        assert tuple(ds[row]["input_ids"]) == targets[-1]  # the same draw within an epoch
    assert len(set(targets)) >= 3  # not one best answer


def test_a_record_the_template_rejects_is_a_problem_not_a_crash(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from musacoder.train.data import mix
    from musacoder.train.sft import tokenize_items

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "</s>": 1}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")
    tok.chat_template = ("{% for m in messages %}{% if 'forbidden' in m['content'] %}{{ raise_exception('no') }}"
                         "{% endif %}{{ m['content'] }} {% endfor %}")
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps(qa(1)) + "\n" + json.dumps(qa("forbidden")) + "\n")
    rows, problems = tokenize_items(mix([str(f)]), tok, 100)
    assert len(rows) == 1 and [p.origin for p in problems] == [f"{f}:2"] and "not tokenised" in problems[0].message
