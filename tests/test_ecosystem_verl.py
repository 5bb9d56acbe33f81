"""verl 0.9.1: the shipped configs pass verl's own validate_config (composed by Hydra as `main_ppo` does), MirrorPop
reads its settings from the config, the agent loop keeps the task statement under the prompt budget (eliding
earlier answers, ending the conversation when even that does not fit), and the verifier client is one per class."""

import asyncio
from pathlib import Path

import pytest

verl = pytest.importorskip("verl")

from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

from musacoder.tasks import builtin_task
from musacoder.train.rl import verl_adapter
from musacoder.train.rl.verl_adapter import KernelAgentLoop, VerlSettings, task_rows

CONFIGS = Path(__file__).parents[1] / "configs" / "verl"
RELU = builtin_task("level1/19_ReLU")
NO_CODE = "I would loop over the elements."
LONG = "Let me think about this kernel step by step. " * 60  # an earlier answer that does not fit twice


def compose(name, overrides=()):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return hydra_compose(config_name=name, overrides=list(overrides))


def validate(cfg):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


@pytest.mark.parametrize("name", ["musacoder_grpo", "naive_compute_score"])
def test_shipped_configs_pass_verls_validator(name):
    validate(compose(name))


def test_validator_is_not_a_formality():
    with pytest.raises(Exception, match="ppo_mini_batch_size"):  # the old mini batch, over the train batch
        validate(compose("musacoder_grpo", ["actor_rollout_ref.actor.ppo_mini_batch_size=256"]))


def test_mirrorpop_settings_come_from_the_config(monkeypatch):
    from verl.utils.config import omega_conf_to_dataclass

    monkeypatch.delenv("MUSACODER_MIRRORPOP", raising=False)
    cfg = compose("musacoder_grpo", ["actor_rollout_ref.actor.policy_loss.mirrorpop_delta=0.25"])
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, verl_adapter.MirrorPopLossConfig)
    s = verl_adapter.mirrorpop_settings(actor)
    assert (s.mode, s.delta) == ("mirror", 0.25)
    monkeypatch.setenv("MUSACODER_MIRRORPOP", "signed:0.3")  # the config wins over the old variable
    assert verl_adapter.mirrorpop_settings(actor).delta == 0.25


@pytest.fixture(scope="module")
def tok():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator([RELU.code, NO_CODE, LONG], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|pad|>", "<|end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<|pad|>", eos_token="<|end|>")
    fast.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    return fast


class ScriptedServer:
    def __init__(self, tok, replies):
        self.tok, self.replies, self.prompts = tok, list(replies), []

    async def generate(self, request_id, prompt_ids, sampling_params, **kw):
        self.prompts.append(prompt_ids)
        ids = self.tok.encode(self.replies.pop(0)) + [self.tok.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.25] * len(ids))


def run_loop(tok, cache_dir, prompt_length, replies, max_turns=3):
    cfg = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": prompt_length, "response_length": 1024, "n": 1}},
        "reward": {"reward_kwargs": {"musacoder": {
            "max_turns": max_turns, "bdr": {"enabled": False},
            "verify": {"backend": "cpu", "timing_enabled": False, "cache_dir": cache_dir}}}}})
    server = ScriptedServer(tok, replies)
    loop = KernelAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=server, tokenizer=tok, processor=None,
                           dataset_cls=RLHFDataset, data_config=DictConfigWrap(OmegaConf.create({})))
    row = task_rows([RELU], "cpu", one_shot=False)[0]
    out = loop.loop.run_until_complete(loop.run({"temperature": 1.0}, raw_prompt=row["prompt"],
                                                extra_info=row["extra_info"], uid="g0"))
    return out, server, loop


def test_prompt_budget_elides_earlier_answers_never_the_task(tok, cache_dir):
    out, server, _ = run_loop(tok, cache_dir, 100_000, [LONG, NO_CODE, NO_CODE])
    assert out.num_turns == 6
    turn2 = len(server.prompts[1])
    task_line = RELU.code.strip().splitlines()[-1]
    # budget = the turn-2 prompt: turn 3 fits only with the long first answer elided
    out, server, _ = run_loop(tok, cache_dir, turn2, [LONG, NO_CODE, NO_CODE])
    assert out.num_turns == 6 and all(len(p) <= turn2 for p in server.prompts)
    third = tok.decode(server.prompts[2])
    assert "earlier answer omitted" in third and LONG not in third and task_line in third and NO_CODE in third
    # budget = the first prompt: turn 2 cannot fit (its one answer is the latest, never elided): the check fires
    out, server, _ = run_loop(tok, cache_dir, len(server.prompts[0]), [LONG, NO_CODE, NO_CODE])
    assert out.num_turns == 2 and len(server.prompts) == 1


def test_one_verifier_per_class_closed_properly(tok, cache_dir):
    _, _, a = run_loop(tok, cache_dir, 100_000, [NO_CODE], max_turns=1)
    _, _, b = run_loop(tok, cache_dir, 100_000, [NO_CODE], max_turns=1)
    assert a.verifier is b.verifier is KernelAgentLoop._verifier
    KernelAgentLoop.close_class()
    assert KernelAgentLoop._verifier is None

    # with a service, the class's verifier is the process's RemoteVerifier for it: its client is closed with the class
    # on the loop it was opened on (this test's loop is not running any more)
    v = KernelAgentLoop.init_verifier(VerlSettings(verifier_url="http://127.0.0.1:9"))
    loop = asyncio.new_event_loop()

    async def opened():
        return v._open()

    http = loop.run_until_complete(opened())._http
    KernelAgentLoop.close_class()
    assert http.is_closed and len(v._clients) == 0
    loop.close()
