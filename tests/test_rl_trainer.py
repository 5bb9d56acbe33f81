"""The TRL trainer end to end on a tiny model built offline, with the real verifier (cpu backend; a random tiny
model writes no code, so every verdict is an instant format error and nothing compiles): metrics, BDR buffering
and re-issue, checkpoints with the buffer, resume, the MirrorPop hook, and TRL's loss against `algos`."""

import contextlib
import json

import pytest
import torch

from musacoder.examples_catalog import load_catalog

pytest.importorskip("trl")

from musacoder.conversation import task_messages  # noqa: E402
from musacoder.episode import Episode, Round  # noqa: E402
from musacoder.tasks import builtin_task  # noqa: E402
from musacoder.train.rl.algos import episode_reward, mirrorpop_filter, policy_loss  # noqa: E402
from musacoder.train.rl.config import RLConfig  # noqa: E402
from musacoder.train.rl.trainer import (  # noqa: E402
    BDR_STATE,
    METRICS,
    ROLLOUTS,
    build_trainer,
    check_sft_prompts,
    train_rl,
    warm_start_records,
)

RELU = builtin_task("level1/19_ReLU")


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    """A 2-layer Llama and a byte-level BPE tokenizer trained on the task's prompt, saved like a checkpoint."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([m["content"] for m in task_messages(RELU, "cpu", one_shot=False)],
                            trainers.BpeTrainer(vocab_size=400, special_tokens=["<|pad|>", "<|end|>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|end|>")
    fast.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                      pad_token_id=fast.pad_token_id, eos_token_id=fast.eos_token_id)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-policy")
    LlamaForCausalLM(cfg).save_pretrained(path)
    fast.save_pretrained(path)
    return str(path)


def settings(tiny_policy, out, cache_dir, **kw):
    base = dict(model=tiny_policy, output_dir=str(out), backend="cpu", one_shot=False, names=["19_ReLU"],
                max_turns=2, group_size=2, prompts_per_step=2, micro_batch=2, max_steps=2, max_new_tokens=8,
                learning_rate=1e-3, save_steps=1, bdr={"prob": 1.0}, verify={"timing_enabled": False,
                                                                             "cache_dir": cache_dir})
    return RLConfig(**{**base, **kw})


def steps(out):
    return [r for r in map(json.loads, (out / METRICS).read_text().splitlines()) if "rl/reward_mean" in r]


def test_run_buffers_dead_groups_retries_them_and_resumes_with_the_buffer(tiny_policy, tmp_path, cache_dir):
    out = tmp_path / "run"
    final = train_rl(settings(tiny_policy, out, cache_dir))
    assert (final / "config.json").exists() and (out / "reward.png").exists()
    s1, s2 = steps(out)
    for s in (s1, s2):
        assert s["rl/reward_mean"] == -1.0  # two failed turns: 0.75 * -1 + 0.25 * -1
        assert s["rl/first_turn_pass"] == 0.0 and s["rl/all_failed_groups"] == 1.0 and s["rl/mean_turns"] == 2.0
        assert s["verifier/calls"] == 8 and s["rollout/tokens"] > 0 and s["rollout/tokens_per_s"] > 0
        assert 0 < s["verifier/share"] < 1
        assert s["mirrorpop/drop_frac"] == 0.0 and s["mirrorpop/mean_abs_log_ratio"] < 1e-3  # on-policy sampler
    # step 1: both groups dead, one task -> one buffered item; step 2 re-issues it (prob 1) as a repair group,
    # and the fresh group's failure refills the buffer (a failed repair is not buffered again)
    assert (s1["bdr/retries"], s1["bdr/buffer_size"]) == (0, 1)
    assert (s2["bdr/retries"], s2["bdr/buffer_size"], s2["bdr/retries_total"]) == (1, 1, 1)
    saved = json.loads((out / "checkpoint-2" / BDR_STATE).read_text())
    assert saved["issued"] == 1 and [i["task"] for i in saved["items"]] == ["level1/19_ReLU"]
    assert "=== System Feedback" not in saved["items"][0]["messages"][-1]["content"]  # the fresh prompt

    rolls = [json.loads(ln) for ln in (out / ROLLOUTS).read_text().splitlines()]
    assert [r["step"] for r in rolls] == [1] * 4 + [2] * 4  # 2 groups of 2 trajectories a step
    assert [r["repair"] for r in rolls] == [False] * 4 + [True, True, False, False]
    assert all(len(r["turns"]) == 2 and r["turns"][0]["status"] == "format_error" for r in rolls)
    assert "texts" not in rolls[0]

    with open(out / ROLLOUTS, "a") as f:  # as if a crash after checkpoint-2 left a third step's lines
        f.write(json.dumps({**rolls[0], "step": 3}) + "\n")
    train_rl(settings(tiny_policy, out, cache_dir, max_steps=3, log_texts=True))  # resumes from checkpoint-2
    s = steps(out)
    assert [r["step"] for r in s] == [1, 2, 3]
    assert s[2]["bdr/retries"] == 1 and s[2]["bdr/retries_total"] == 2  # the restored buffer was drawn from
    rolls = [json.loads(ln) for ln in (out / ROLLOUTS).read_text().splitlines()]
    assert [r["step"] for r in rolls] == [1] * 4 + [2] * 4 + [3] * 4  # the stale step-3 line is gone
    assert all(len(r["texts"]) == 2 for r in rolls[8:])


def test_ablation_switches(tiny_policy, tmp_path, cache_dir):
    out = tmp_path / "ablate"
    train_rl(settings(tiny_policy, out, cache_dir, max_steps=1, save_steps=10, bdr={"enabled": False},
                      mirrorpop={"mode": "off", "delta": 0.0}, primeecho={"enabled": False}, max_turns=1))
    (s,) = steps(out)
    assert s["bdr/buffer_size"] == 0 and s["bdr/retries"] == 0 and s["rl/mean_turns"] == 1.0
    assert s["mirrorpop/drop_frac"] == 0.0  # off keeps everything, even at delta 0


def test_episode_reward_switch():
    t = Episode(RELU, [], rounds=[Round("", "", False, "incorrect", -0.5, 1), Round("", "", True, "ok", 1.0, 1)])
    on = RLConfig(model="m")
    off = RLConfig(model="m", primeecho={"enabled": False})
    assert episode_reward(t.scores, t.passed, on.primeecho) == pytest.approx(0.75 * -0.5 + 0.25 * 1.0 + 0.1)
    assert episode_reward(t.scores, t.passed, off.primeecho) == 1.0


def test_trl_loss_is_algos_policy_loss_with_the_mirrorpop_mask(tiny_policy, tmp_path, cache_dir):
    cfg = settings(tiny_policy, tmp_path / "loss", cache_dir, beta=0.05)
    trainer, _ = build_trainer(cfg)
    model = trainer.model.eval()
    dev = model.device  # the GPU where there is one
    torch.manual_seed(1)
    prompt = torch.randint(3, 300, (3, 4), device=dev)
    completion = torch.randint(3, 300, (3, 5), device=dev)
    cmask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], device=dev)
    ids, attn = torch.cat([prompt, completion], 1), torch.cat([torch.ones_like(prompt), cmask], 1)
    with torch.no_grad():
        logp, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, attn, 5)
    old = logp + torch.tensor([[0.3, -0.4, 0.1, 0.0, 0.2]], device=dev).expand(3, 5)  # both sides of the clip
    ref = logp - 0.2
    sampling = logp.clone()
    sampling[1] += torch.tensor([0.5, -0.5, 0.0, 9.0, 9.0], device=dev)  # signed mean 0 (the 9s are padding)
    adv = torch.tensor([1.0, -0.5, -1.0], device=dev)
    inputs = {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completion,
              "completion_mask": cmask, "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
              "sampling_per_token_logps": sampling, "num_items_in_batch": cmask.sum()}
    keep, _ = mirrorpop_filter(logp, sampling, cmask.float(), cfg.mirrorpop.mode, cfg.mirrorpop.delta)
    assert keep.tolist() == [True, False, True]
    expect = policy_loss(logp, old, adv, cmask.float(), cfg.eps_low, cfg.eps_high, cfg.beta, ref, keep)
    assert trainer._compute_loss(model, inputs).item() == pytest.approx(expect.item(), rel=1e-5)

    trainer.mirrorpop.mode = "signed"  # the filter it replaces keeps the cancelling sequence
    m = trainer.get_off_policy_mask(advantages=adv.unsqueeze(1), per_token_logps=logp,
                                    sampling_per_token_logps=sampling, mask=cmask.float(), off_policy_threshold=0.1)
    assert m.squeeze(1).tolist() == [1.0, 1.0, 1.0]
    trainer.log({})
    assert trainer.state.log_history[-1]["eval_mirrorpop/mirror_drop_frac"] == pytest.approx(1 / 3)


def test_mirrorpop_metrics_reach_trls_log(tiny_policy, tmp_path, cache_dir):
    """MirrorPop's statistics reach TRL's log through its private `_metrics` (`log_loss_metrics`: TRL has no public
    way from the loss). A TRL that renames it, or no longer logs what is in it, fails here instead of the metrics
    going missing without a word."""
    trainer, _ = build_trainer(settings(tiny_policy, tmp_path / "log", cache_dir))
    trainer.model.train()
    sampling = torch.tensor([[0.0, 0.0, 0.0], [0.5, -0.5, 0.0]])  # the second sequence: mean |log rho| 1/3
    trainer.get_off_policy_mask(advantages=torch.ones(2, 1), per_token_logps=torch.zeros(2, 3),
                                sampling_per_token_logps=sampling, mask=torch.ones(2, 3), off_policy_threshold=0.1)
    trainer.log({})
    logged = trainer.state.log_history[-1]
    assert logged["mirrorpop/drop_frac"] == 0.5 and logged["mirrorpop/signed_drop_frac"] == 0.0


def test_warm_start_records_pick_catalog_examples_cheats_included():
    tasks = [RELU, builtin_task("level1/23_Softmax")]
    honest = warm_start_records(tasks, "cpu", one_shot=False)
    want = sorted(e.file for e in load_catalog("cpu") if e.honest and e.task in {t.key for t in tasks})
    assert sorted(r["metadata"]["source"] for r in honest) == want
    assert {"cpu/honest_relu.py", "cpu/honest_relu_try_except.py", "cpu/honest_softmax.py"} <= set(want)
    picked = warm_start_records(tasks, "cpu", False, ["cpu/honest_relu.py", "cpu/exploit_01_fallback_relu.py"])
    assert [(r["task"], r["metadata"]["honest"]) for r in picked] == [("level1/19_ReLU", True),
                                                                     ("level1/19_ReLU", False)]
    assert "torch.relu(x)" in picked[1]["messages"][-1]["content"]
    assert picked[1]["messages"][:-1] == task_messages(RELU, "cpu", one_shot=False)  # the prompt RL asks
    with pytest.raises(ValueError, match="honest_matmul"):  # a task this run does not train on
        warm_start_records(tasks, "cpu", False, ["cpu/honest_matmul.py"])
    with pytest.raises(ValueError, match="nope"):
        warm_start_records(tasks, "cpu", False, ["cpu/nope.py"])


def test_warm_start_repairs_are_a_cheat_its_real_feedback_and_the_honest_answer(cache_dir):
    """`warm_start_repairs`: a cheat among the warm start's examples, verified for real, becomes a conversation as
    RL's second turn builds it (Episode.messages), answered by the task's honest example."""
    from musacoder.api import get_verifier
    from musacoder.config import VerifyConfig
    from musacoder.episode import Episode
    from musacoder.train.rl.trainer import repair_records

    records = warm_start_records([RELU], "cpu", False, ["cpu/honest_relu.py", "cpu/exploit_01_fallback_relu.py"])
    verifier = get_verifier(VerifyConfig(backend="cpu", cache_dir=cache_dir, timing_enabled=False))
    try:
        (rep,) = repair_records(records, [RELU], verifier.verdicts)
        (v,) = verifier.verdicts([(RELU, records[1]["messages"][-1]["content"])])
        assert repair_records(records[:1], [RELU], verifier.verdicts) == []  # no cheat: nothing to repair
    finally:
        verifier.close()
    assert v.status.value == "illegal"
    ep = Episode(task=RELU, first=records[1]["messages"][:-1], max_turns=2)
    ep.record(records[1]["messages"][-1]["content"], v)
    assert rep["messages"][:-1] == ep.messages()  # the prompt of RL's second turn after this cheat
    assert v.feedback.strip() in rep["messages"][-2]["content"]  # the verifier's own feedback
    assert rep["messages"][-1] == records[0]["messages"][-1]  # the honest answer
    assert rep["metadata"] == {"source": "cpu/exploit_01_fallback_relu.py -> cpu/honest_relu.py", "honest": True,
                               "repair": "illegal"}


def test_warm_start_runs_sft_with_the_rl_runs_defaults(tmp_path, monkeypatch):
    import importlib

    from musacoder.train.rl.trainer import warm_start

    # the module warm_start imports from (sys.modules), not the package's attribute: a test that re-imports
    # modules can leave the two apart, and then the real SFT ran here
    sft = importlib.import_module("musacoder.train.sft")

    ran = []
    monkeypatch.setattr(sft, "train_sft", ran.append)
    init = {"model_type": "llama", "hidden_size": 8}
    cfg = RLConfig(warm_start={"init": init, "num_train_epochs": 2}, output_dir=str(tmp_path), seed=3)
    assert warm_start(cfg, [RELU], "cpu") == str(tmp_path / "warm_start" / "final")
    (s,) = ran
    assert isinstance(s, sft.SFTConfig) and (s.output_dir, s.seed, s.num_train_epochs) == (
        str(tmp_path / "warm_start"), 3, 2)
    assert [d.path for d in s.data] == [str(tmp_path / "warm_start" / "solutions.jsonl")]  # the catalog's answers
    assert (tmp_path / "warm_start" / "solutions.jsonl").exists()
    cfg = RLConfig(warm_start={"init": init, "output_dir": str(tmp_path / "mine"), "seed": 7, "data": ["a.jsonl"]},
                   output_dir=str(tmp_path), seed=3)
    assert warm_start(cfg, [RELU], "cpu") == str(tmp_path / "mine" / "final")
    assert (ran[-1].seed, [d.path for d in ran[-1].data]) == (7, ["a.jsonl"])


def test_cli_reports_a_bad_config(tmp_path):
    from typer.testing import CliRunner

    from musacoder.cli import app

    bad = tmp_path / "rl.yaml"
    bad.write_text("model: m\ngroup_sise: 8\n")
    res = CliRunner().invoke(app, ["rl", "--config", str(bad)])
    assert res.exit_code == 2 and "group_sise" in res.output
    bad.write_text("group_size: 8\n")  # neither a model nor a warm start
    res = CliRunner().invoke(app, ["rl", "--config", str(bad)])
    assert res.exit_code == 2 and "warm_start" in res.output


def test_vllm_engine_maps_trl_vllm_output(tiny_policy):
    """vLLM cannot run here (no GPU, and no wheel on the device machine): a stand-in for TRL's `VLLMGeneration`
    returns what its `generate` documents, and the engine must turn it into samples with pi_rollout log-probs."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from musacoder.train.rl.engines import VLLMEngine

    tok = AutoTokenizer.from_pretrained(tiny_policy)
    eos = tok.eos_token_id
    calls = []

    def generate(prompts, images, num_generations):
        calls.append((prompts, images, num_generations))
        completions = [[5, 6, eos], [7, 8, 9]]  # the second hit the token limit
        logprobs = [[[-0.1], [-0.2], [-0.3]], [[-1.0, -2.0], [-1.5, -0.5], [None]]]  # sampled token first
        return prompts, completions, logprobs, None

    trainer = SimpleNamespace(processing_class=tok, eos_token_ids=[eos],
                              vllm_generation=SimpleNamespace(generate=generate))
    convs = [task_messages(RELU, "cpu", one_shot=False)] * 2
    a, b = VLLMEngine(trainer).generate(convs)
    (prompts, images, n), = calls
    assert prompts == [VLLMEngine(trainer).encode(convs[0])] * 2 and images is None and n == 1
    assert (a.completion_ids, a.logprobs, a.truncated) == ([5, 6, eos], [-0.1, -0.2, -0.3], False)
    assert (b.completion_ids, b.logprobs, b.truncated) == ([7, 8, 9], [-1.0, -1.5, None], True)
    assert a.text == tok.decode([5, 6, eos], skip_special_tokens=True)


@pytest.mark.parametrize("name", ["rl-tiny-cpu.yaml", "rl-gpu.yaml"])
def test_shipped_configs_load_and_their_warm_start_data_resolve(name, tmp_path):
    from pathlib import Path

    from musacoder.data.records import write_records
    from musacoder.train.data import load_eval_sets, mix
    from musacoder.train.rl.config import WarmStartSettings
    from musacoder.train.rl.trainer import _tasks

    cfg = RLConfig.from_yaml(Path(__file__).parents[1] / "configs" / name)
    assert isinstance(cfg.warm_start, WarmStartSettings) and cfg.warm_start.init is not None  # SFT settings, checked
    tasks = _tasks(cfg)
    records = warm_start_records(tasks, cfg.backend, cfg.one_shot, cfg.warm_start_examples)
    assert {r["task"] for r in records} == {t.key for t in tasks}  # every RL task has answers to learn from
    assert any(not r["metadata"]["honest"] for r in records)  # and cheats to unlearn
    # the warm start's own eval check keeps them (the shipped eval set refused all 8 of the tiny run's as twins of
    # the tasks it trains on, and `musacoder rl` stopped before its first step, 2026-11-29)
    write_records(tmp_path / "solutions.jsonl", records)
    ws = cfg.warm_start
    m = mix([str(tmp_path / "solutions.jsonl")], 0, None, load_eval_sets(ws.eval_sets, ws.eval_detectors))
    assert not m.refused and len(m.items) > 0


def test_the_pretrained_rl_config_and_its_ablations_load():
    """configs/rl-smollm2.yaml and the three switches scripts/issue44_gpu.sh turns off, as a user types them (YAML
    reads a bare `off` as false: taken as MirrorPop's "off")."""
    from pathlib import Path

    path = Path(__file__).parents[1] / "configs" / "rl-smollm2.yaml"
    base = RLConfig.from_yaml(path)
    assert base.warm_start is None and base.max_turns >= 2 and not base.verify.timing_enabled
    assert (base.primeecho.enabled, base.bdr.enabled, base.mirrorpop.mode) == (True, True, "mirror")
    assert not RLConfig.from_yaml(path, ["primeecho.enabled=false"]).primeecho.enabled
    assert not RLConfig.from_yaml(path, ["bdr.enabled=false"]).bdr.enabled
    assert RLConfig.from_yaml(path, ["mirrorpop.mode=off"]).mirrorpop.mode == "off"
    with pytest.raises(ValueError, match="mirror, signed or off"):
        RLConfig.from_yaml(path, ["mirrorpop.mode=on"])


def test_rl_refuses_a_model_fine_tuned_on_other_prompts_and_names_the_setting_that_fits(tmp_path):
    """The SFT model's prompts are read through the sft_config.yaml `musacoder sft` writes beside final/."""
    import yaml

    from musacoder.data.records import write_records
    from musacoder.train.sft import CONFIG, FINAL

    sft = tmp_path / "sft"
    (sft / FINAL).mkdir(parents=True)
    answer = [{"role": "assistant", "content": "```python\npass\n```"}]
    write_records(tmp_path / "data.jsonl", [{"messages": task_messages(RELU, "cpu", True) + answer,
                                             "task": RELU.key}])
    model = str(sft / FINAL)
    check_sft_prompts(model, [RELU], "cpu", True)  # no sft_config.yaml: nothing to compare with
    (sft / CONFIG).write_text(yaml.safe_dump({"data": [{"path": str(tmp_path / "data.jsonl")}]}))
    check_sft_prompts(model, [RELU], "cpu", True)
    with pytest.raises(ValueError, match="backend: cpu, one_shot: true asks"):
        check_sft_prompts(model, [RELU], "cpu", False)
    with pytest.raises(ValueError, match="backend: cpu, one_shot: true asks"):
        check_sft_prompts(model, [RELU], "triton", True)
    check_sft_prompts(model, [builtin_task("level1/23_Softmax")], "cpu", False)  # no shared task: nothing to compare


def test_the_pretrained_rl_config_asks_as_synth_solve_asked_the_teacher():
    """configs/rl-smollm2.yaml starts from SFT on `synth solve`'s answers (scripts/issue44_gpu.sh): its first turn is
    theirs (RL asked without the one-shot example got 85% format errors, H200, 2026-11-29)."""
    from pathlib import Path

    cfg = RLConfig.from_yaml(Path(__file__).parents[1] / "configs" / "rl-smollm2.yaml")
    assert cfg.one_shot and cfg.check_sft_prompts  # the inductor teacher's records: task_messages(t, backend)


def test_hf_engine_hands_over_each_answer_as_it_ends(tiny_policy):
    """Early-ending rows (a wide end-of-sequence set makes a random model end at different steps) reach `on_text`
    once each, during generation, with exactly the text of the final sample; the others at their batch's end."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from musacoder.train.rl.engines import HFEngine, Sampling

    tok = AutoTokenizer.from_pretrained(tiny_policy)
    model = AutoModelForCausalLM.from_pretrained(tiny_policy)
    eos = [t for t in range(len(tok)) if t % 6 == 0]
    eng = HFEngine(tok, lambda: contextlib.nullcontext(model), Sampling(max_new_tokens=12), eos, batch_size=4)
    seen, states = [], set()
    forward = model.forward
    model.forward = lambda *a, **k: states.add((model.training, torch.backends.cuda.cudnn_sdp_enabled())) or \
        forward(*a, **k)
    model.train()  # as the trainer leaves it between updates
    torch.manual_seed(1)
    out = eng.generate([task_messages(RELU, "cpu", one_shot=False)] * 6, lambda i, t: seen.append((i, t)))
    # decoded in eval mode, without cuDNN attention (a plan for every new length); both restored after
    assert states == {(False, False)} and model.training and torch.backends.cuda.cudnn_sdp_enabled()
    assert sorted(i for i, _ in seen) == list(range(6))  # each once
    assert all(out[i].text == t for i, t in seen)
    order = {i: k for k, (i, _) in enumerate(seen)}
    for rows in (range(0, 4), range(4, 6)):  # within a batch, ended rows were handed over before the cut ones
        ended = [order[i] for i in rows if not out[i].truncated]
        cut = [order[i] for i in rows if out[i].truncated]
        assert not (ended and cut) or max(ended) < min(cut)
    assert any(s.truncated for s in out) and not all(s.truncated for s in out)
