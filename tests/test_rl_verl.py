"""The verl adapter on CPU against verl's own structures: the registered MirrorPop policy loss, the reward manager
on a DataProto, the multi-turn agent loop, and the BDR buffer actor's group bookkeeping. No LLM server can run
here, so the agent loop's server is a scripted stand-in (only it); verification is the real cpu verifier."""

import asyncio

import pytest
import torch

verl = pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.agent_loop.agent_loop import DictConfigWrap  # noqa: E402
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, get_policy_loss_fn  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.config.actor import ActorConfig, PolicyLossConfig  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from musacoder.tasks import Task, builtin_task  # noqa: E402
from musacoder.train.rl.verl_adapter import KernelAgentLoop, MooreEvalRewardManager, RetryBufferActor, task_rows  # noqa: E402

RELU = builtin_task("level1/19_ReLU")
NO_CODE = "I would loop over the elements."


def actor_config():
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2,
                       clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="token-mean",
                       policy_loss=PolicyLossConfig(loss_mode="mirrorpop"))


def test_mirrorpop_policy_loss_drops_the_cancelling_sequence(monkeypatch):
    monkeypatch.setenv("MUSACODER_MIRRORPOP", "mirror:0.1")
    old = torch.zeros(2, 4)
    logp = torch.tensor([[0.1, -0.1, 0.0, 0.0], [0.2, 0.0, 0.1, 0.0]])
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4])
    mask = torch.ones(2, 4)
    # token ratios pi_train / pi_rollout: sequence 1 swings +-0.5 in log space (signed mean 0)
    w = torch.exp(torch.tensor([[0.01, -0.01, 0.0, 0.0], [0.5, -0.5, 0.5, -0.5]]))
    loss, m = get_policy_loss_fn("mirrorpop")(old, logp, adv, mask, "token-mean", actor_config(), w)
    assert m["mirrorpop/drop_frac"] == 0.5 and m["mirrorpop/signed_drop_frac"] == 0.0
    assert m["mirrorpop/mean_abs_log_ratio"] == pytest.approx((0.005 + 0.5) / 2)
    kept = torch.tensor([[1.0] * 4, [0.0] * 4])
    expect, _ = compute_policy_loss_vanilla(old, logp, adv, kept, "token-mean", actor_config())
    assert loss.item() == pytest.approx(expect.item())
    monkeypatch.setenv("MUSACODER_MIRRORPOP", "signed:0.1")
    _, m = get_policy_loss_fn("mirrorpop")(old, logp, adv, mask, "token-mean", actor_config(), w)
    assert m["mirrorpop/drop_frac"] == 0.0


def verl_config(cache_dir, **musacoder):
    return OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": 4096, "response_length": 64, "n": 2}},
        "reward": {"reward_kwargs": {"musacoder": {"verify": {"backend": "cpu", "timing_enabled": False,
                                                              "cache_dir": cache_dir}, **musacoder}}}})


def test_settings_hold_a_verify_config():
    """`verify:` under the verl config's `musacoder` node is a VerifyConfig once loaded; a typo names its path."""
    import yaml

    from musacoder.config import VerifyConfig
    from musacoder.train.rl.verl_adapter import VerlSettings

    s = VerlSettings.from_dict(OmegaConf.create({"verify": {"backend": "cpu", "timing_enabled": False}}))
    assert isinstance(s.verify, VerifyConfig) and s.verify.backend == "cpu" and not s.verify.timing_enabled
    assert VerlSettings.from_dict(yaml.safe_load(yaml.safe_dump(s.to_dict()))) == s
    with pytest.raises(ValueError, match=r"under musacoder.verify: \['timng_enabled'\]"):
        VerlSettings.from_dict({"verify": {"timng_enabled": False}})
    with pytest.raises(ValueError, match=r"under musacoder.verify: \['timng_enabled'\]"):
        VerlSettings(verify={"timng_enabled": False})


@pytest.fixture(scope="module")
def tok():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator([RELU.code, NO_CODE], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|pad|>", "<|end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<|pad|>", eos_token="<|end|>")
    fast.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    return fast


def test_reward_manager_scores_a_dataproto(tok, cache_dir):
    rm = MooreEvalRewardManager(verl_config(cache_dir), tok)
    prompt = torch.tensor([tok.encode("write relu")])
    resp = torch.tensor([tok.encode(NO_CODE)])
    data = DataProto.from_dict(
        tensors={"prompts": prompt, "responses": resp,
                 "attention_mask": torch.ones(1, prompt.shape[1] + resp.shape[1], dtype=torch.long)},
        non_tensors={"extra_info": [task_rows([RELU], "cpu")[0]["extra_info"]]})
    out = asyncio.run(rm.run_single(data))
    assert out["reward_score"] == -1.0 and out["reward_extra_info"]["status"] == "format_error"


class ScriptedServer:
    """Stands in for verl's LLM server: replies in turn order, with made-up engine log-probs."""

    def __init__(self, tok, replies):
        self.tok, self.replies, self.prompts = tok, list(replies), []

    async def generate(self, request_id, prompt_ids, sampling_params, **kw):
        self.prompts.append(prompt_ids)
        ids = self.tok.encode(self.replies.pop(0)) + [self.tok.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.25] * len(ids))


def test_agent_loop_multi_turn_primeecho_first_turn_only(tok, cache_dir):
    cfg = verl_config(cache_dir, max_turns=2, bdr={"enabled": False})
    server = ScriptedServer(tok, [NO_CODE, "still " + NO_CODE])
    loop = KernelAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=server, tokenizer=tok,
                           processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(OmegaConf.create({})))
    row = task_rows([RELU], "cpu", one_shot=False)[0]
    run = loop.run({"temperature": 1.0}, raw_prompt=row["prompt"], extra_info=row["extra_info"], uid="g0")
    out = loop.loop.run_until_complete(run)  # verl's agent loops run on the loop they were built with
    assert out.reward_score == -1.0 and out.num_turns == 4
    assert out.extra_fields["turn_statuses"] == ["format_error", "format_error"]
    first = tok.encode(NO_CODE) + [tok.eos_token_id]
    assert out.response_ids == first and out.response_logprobs == [-0.25] * len(first)  # turn 1 only
    assert out.prompt_ids == server.prompts[0]
    assert "=== System Feedback for Round 1 ===" in tok.decode(server.prompts[1])


def test_buffer_actor_buffers_only_all_failed_groups(tmp_path):
    a = RetryBufferActor({"prob": 1.0}, state_path=str(tmp_path / "bdr.json"))
    item = {"task": "level1/19_ReLU", "messages": [], "code": "x", "feedback": "Status: incorrect", "score": -0.5}
    assert not a.report("g1", 2, False, item)  # waits for the group
    assert not a.report("g1", 2, True, None)  # one passed: not dead
    assert not a.report("g2", 2, False, {**item, "score": -1.0})
    assert a.report("g2", 2, False, item)  # both failed: buffered, the better answer kept
    assert [i["score"] for i in a.state()["items"]] == [-0.5]
    b = RetryBufferActor({"prob": 1.0}, state_path=str(tmp_path / "bdr.json"))  # a restarted run reloads it
    assert b.draw()["code"] == "x" and b.draw() is None


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_bdr_dataset_turns_an_item_into_the_buffered_repair_task(local_ray, tok, tmp_path):
    import pandas as pd

    from musacoder.train.rl.verl_adapter import BDRDataset, VerlSettings, buffer, buffer_actor

    path = tmp_path / "train.parquet"
    pd.DataFrame(task_rows([RELU, builtin_task("level1/23_Softmax")], "cpu", one_shot=False)).to_parquet(path)
    musacoder = {"bdr": {"prob": 1.0}}
    ds = BDRDataset(data_files=[str(path)], tokenizer=tok,
                    config=OmegaConf.create({"filter_overlong_prompts": False, "musacoder": musacoder}))
    buffer._actor.clear()
    actor = buffer_actor(VerlSettings.from_dict(musacoder))
    relu_prompt = ds[0]["raw_prompt"]
    item = {"task": RELU.key, "messages": relu_prompt, "code": "bad", "feedback": "Status: incorrect", "score": -0.5}
    for _ in range(2):  # a group of two, both failed
        local_ray.get(actor.report.remote("g", 2, False, item))
    row = ds[1]  # a Softmax slot becomes the buffered ReLU repair task
    assert row["extra_info"]["repair"] and Task(**row["extra_info"]["task"]).key == RELU.key
    assert row["raw_prompt"][-1]["content"].startswith("=== System Feedback for Round 1 ===\nStatus: incorrect")
    assert row["extra_info"]["first_messages"] == relu_prompt
    assert "repair" not in ds[1]["extra_info"]  # the buffer is empty again: the fresh prompt
