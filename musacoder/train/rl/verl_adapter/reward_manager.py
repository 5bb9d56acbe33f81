"""Reward manager `musacoder`: one verification per response, for single-turn runs."""

from __future__ import annotations

from verl.experimental.reward_loop.reward_manager import register as register_reward_manager
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

from musacoder.train.rl.algos import episode_reward
from musacoder.train.rl.verl_adapter.common import SharedVerifier, VerlSettings, task_of, verdict


@register_reward_manager("musacoder")
class MooreEvalRewardManager(SharedVerifier, RewardManagerBase):
    """Single-turn reward: the verifier's eq.-2 score of the response, plus PrimeEcho's turn-1 bonus on a pass."""

    def __init__(self, config, tokenizer, compute_score=None, reward_router_address=None,
                 reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score)  # calls init_class
        self.s = VerlSettings.from_config(config)
        self.verifier = self.init_verifier(self.s)

    @classmethod
    def init_class(cls, config, tokenizer):
        super().init_class(config, tokenizer)
        cls.init_verifier(VerlSettings.from_config(config))

    async def run_single(self, data) -> dict:
        item = data[-1]
        response = item.batch["responses"]
        valid = int(item.batch["attention_mask"][-response.shape[-1]:].sum())
        text = self.tokenizer.decode(response[:valid], skip_special_tokens=True)
        v = await verdict(self.verifier, task_of(item.non_tensor_batch["extra_info"]), text)
        score = episode_reward([v.reward], [v.passed], self.s.primeecho)
        return {"reward_score": score, "reward_extra_info": {"verifier_reward": v.reward, "passed": v.passed,
                                                             "status": v.status.value}}
