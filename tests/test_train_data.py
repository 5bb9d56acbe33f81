"""Training records: validation that names each bad line and keeps the rest, mixing, pools, last-turn masking."""

import json
import random

import pytest

from musacoder.data.records import DataError, RecordError, Source, load_records, validate
from musacoder.train.data import context_messages, draw, last_turn_mask, mix, render_prompt


def rec(answer="A", question="Q", kind="qa", **kw):
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
            "kind": kind, **kw}


def write(path, lines):
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


BAD = [
    ('{"messages": [', "not valid JSON"),
    ('[1, 2]', "JSON object"),
    (json.dumps({"messages": []}), "non-empty list"),
    (json.dumps({"messages": [{"role": "user", "content": "Q"}]}), "last message must be an assistant"),
    (json.dumps({"messages": [{"role": "assistant", "content": "A"}, {"role": "user", "content": "Q"}]}),
     "message 0 is 'assistant', expected 'user'"),
    (json.dumps({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "  "}]}),
     "last assistant turn is empty"),
    (json.dumps({"messages": [{"role": "tool", "content": "Q"}, {"role": "assistant", "content": "A"}]}),
     "role 'tool'"),
    (json.dumps({"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "A"}]}),
     "message 0 must be"),
    (json.dumps(rec(kind="poetry")), "kind 'poetry'"),
    (json.dumps({**rec(), "mesages": []}), "unknown field(s) ['mesages']"),
    (json.dumps(rec(metadata=[])), "'metadata' must be an object"),
    (json.dumps(rec(task=7)), "'task' must be a string"),
]


def test_every_bad_line_is_named_and_every_good_line_kept(tmp_path):
    lines = []
    for i, (bad, _) in enumerate(BAD):
        lines += [rec(answer=f"good {i}"), bad]
    lines += ["", rec(answer="last", task="level1/19_ReLU", metadata={"x": 1})]
    f = write(tmp_path / "d.jsonl", lines)
    records, problems = load_records(f)
    assert [r.messages[-1]["content"] for r in records] == [f"good {i}" for i in range(len(BAD))] + ["last"]
    assert records[-1].task == "level1/19_ReLU" and records[-1].metadata == {"x": 1} and records[-1].kind == "qa"
    assert records[0].origin == f"{f}:1"
    assert [p.origin for p in problems] == [f"{f}:{2 * i + 2}" for i in range(len(BAD))]
    for p, (_, why) in zip(problems, BAD):
        assert why in p.message, (p, why)
    assert validate({"messages": rec()["messages"]}).kind == "generation"  # the default kind


def test_sources_directories_and_weights(tmp_path):
    (tmp_path / "dir").mkdir()
    write(tmp_path / "dir" / "a.jsonl", [rec(answer=f"a{i}") for i in range(4)])
    write(tmp_path / "dir" / "b.jsonl", [rec(answer=f"b{i}") for i in range(2)])
    write(tmp_path / "c.jsonl", [rec(answer=f"c{i}") for i in range(10)] + ["oops"])
    pool = [rec(answer=f"p{i}", metadata={"pool": "t", "cluster": i % 2}) for i in range(3)]
    write(tmp_path / "p.jsonl", pool + [rec(answer="single")])

    m = mix([{"path": str(tmp_path / "dir"), "weight": 2}, Source(str(tmp_path / "c.jsonl"), 0.5),
             str(tmp_path / "p.jsonl")], seed=1)
    answers = [[r.messages[-1]["content"] for r in item] for item in m.items]
    assert sum(a == ["a0"] for a in answers) == 2 and sum(a == ["b1"] for a in answers) == 2
    halves = [a[0] for a in answers if a[0].startswith("c")]
    assert len(halves) == 5 and len(set(halves)) == 5  # half of c, no repeats
    assert ["p0", "p1", "p2"] in answers and ["single"] in answers  # a pool is one item
    assert [s["drawn"] for s in m.stats] == [12, 5, 2] and [s["bad"] for s in m.stats] == [0, 1, 0]
    assert m.stats[2]["items"] == 2 and m.stats[0]["kinds"] == {"qa": 6}
    assert len(m.problems) == 1 and m.problems[0].origin.endswith("c.jsonl:11")
    def half(seed):
        return [x[0].origin for x in mix([Source(str(tmp_path / "c.jsonl"), 0.5)], seed).items]

    assert half(1) == half(1) and half(1) != half(2)  # reproducible from the seed
    with pytest.raises(DataError, match="does not exist"):
        load_records(tmp_path / "missing.jsonl")
    with pytest.raises(DataError, match="weight"):
        mix([Source(str(tmp_path / "c.jsonl"), -1)])


def test_draw_by_cluster_and_by_member():
    clusters = [0, 0, 0, 0, 1]  # a popular strategy and a rare one
    rng = random.Random(0)
    by_cluster = [clusters[draw(clusters, rng)] for _ in range(4000)]
    by_member = [clusters[draw(clusters, rng, by_cluster=False)] for _ in range(4000)]
    assert 0.45 < sum(by_cluster) / 4000 < 0.55  # the rare strategy gets half the draws
    assert 0.15 < sum(by_member) / 4000 < 0.25
    assert draw([None, 1], random.Random(0)) in (0, 1)  # unclustered members fall back to uniform


def test_reasoning_is_stripped_from_earlier_turns_only():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q <think>user text kept</think>"},
            {"role": "assistant", "content": "<think>first\nthoughts</think>\nbad code"},
            {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": "<think>second</think>good code"}]
    out = context_messages(msgs)
    assert out[2]["content"] == "bad code" and out[4]["content"] == "<think>second</think>good code"
    assert out[1]["content"] == msgs[1]["content"] and msgs[2]["content"].startswith("<think>")  # input untouched


@pytest.fixture(scope="module")
def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = "S Q fix it bad code good <think> </think> thoughts second first system: user: assistant: bot:".split()
    vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")


def test_last_turn_mask_token_by_token(word_tokenizer):
    tok = word_tokenizer
    tok.chat_template = TEMPLATE
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "<think> first thoughts </think> bad code"},
            {"role": "user", "content": "fix it"}, {"role": "assistant", "content": "<think> second </think> good code"}]
    ids, mask = last_turn_mask(msgs, tok)
    words = tok.convert_ids_to_tokens(ids)
    assert words == ("system: S user: Q assistant: bad code user: fix it assistant: "
                     "<think> second </think> good code </s>").split()
    assert mask == [0] * 11 + [1] * 6  # exactly the last answer, its reasoning, and the end of turn
    assert tok(render_prompt(context_messages(msgs)[:-1], tok), add_special_tokens=False)["input_ids"] == ids[:11]  # as at inference

    tok.chat_template = None  # no template: the HF client's plain rendering (special tokens as it adds them)
    ids, mask = last_turn_mask(msgs[:2] + [{"role": "assistant", "content": "good code"}], tok)
    assert tok.convert_ids_to_tokens(ids) == "S Q good code </s>".split() and mask == [0, 0, 1, 1, 1]


def test_last_turn_mask_refuses_what_it_cannot_mask(word_tokenizer):
    tok = word_tokenizer
    msgs = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "good code"}]
    tok.chat_template = TEMPLATE.replace("{{ m['role'] }}:", "{{ 'bot' if m['role'] == 'assistant' else "
                                                             "m['role'] }}:")
    with pytest.raises(RecordError, match="prefix"):
        last_turn_mask(msgs, tok)
    tok.chat_template = TEMPLATE
    with pytest.raises(RecordError, match="exceed max_length 5"):
        last_turn_mask(msgs, tok, max_length=5)
    assert len(last_turn_mask(msgs, tok, max_length=6)[0]) == 6


def _sft_record(code: str, task: str) -> dict:
    from musacoder.conversation import task_messages
    from musacoder.tasks import Task

    return {"messages": task_messages(Task(task, code), "cpu") + [{"role": "assistant", "content": "```python\n...\n```"}],
            "kind": "generation", "task": task}


def test_mix_refuses_eval_twins_and_keeps_the_rest(tmp_path):
    from musacoder.tasks import builtin_task, builtin_tasks
    from musacoder.train.data import EvalSets

    relu = builtin_task("level1/19_ReLU").code
    rank4 = relu.replace("torch.rand(batch_size, dim)", "torch.rand(batch_size, 2, 3, dim)")
    tanh = relu.replace("torch.relu(x)", "torch.tanh(x)")
    f = write(tmp_path / "d.jsonl", [_sft_record(rank4, "mine/relu4"), _sft_record(tanh, "mine/tanh"),
                                     rec(task="level1/23_Softmax"), rec()])
    m = mix([f], eval_sets=EvalSets(builtin_tasks()))
    assert [(r["origin"].rsplit(":", 1)[1], r["eval_task"], r["detector"]) for r in m.refused] == [
        ("1", "level1/19_ReLU", "opgraph"), ("3", "level1/23_Softmax", "task id")]
    assert [it[0].task for it in m.items] == ["mine/tanh", None] and m.stats[0]["refused"] == 2
    assert mix([f]).refused == [] and len(mix([f]).items) == 4  # no eval sets: nothing refused


def test_shipped_training_samples_are_no_eval_twins():
    """The sample data the shipped configs train on copies no shipped eval task (issue 44: it held KernelBench
    demonstrations). KernelBench itself is not in the repository: docs/data-card-sft-sample.md has that check."""
    from pathlib import Path

    from musacoder.tasks import builtin_tasks
    from musacoder.train.data import EvalSets
    from musacoder.train.sft import SFTConfig

    configs = Path(__file__).parent.parent / "configs"
    used = {str(Path(s.path).resolve()) for c in sorted(configs.glob("sft-*.yaml"))
            for s in SFTConfig.from_yaml(c).data}
    shipped = {str(p.resolve()) for p in (configs / "data").glob("*.jsonl")}
    assert used & shipped, "no shipped config trains on the sample data any more: point this test elsewhere"
    m = mix(sorted(used & shipped), eval_sets=EvalSets(builtin_tasks()))
    assert m.refused == [], m.refused
    assert sum(s["records"] for s in m.stats) >= 20
