"""Multi-node RL through verl (Ray): the same PrimeEcho, BDR and MirrorPop, plugged into verl's extension points.

Importing this module registers (set `VERL_USE_EXTERNAL_MODULES=musacoder.train.rl.verl_adapter` so every verl
process imports it; configs/verl/ has an example):
- agent loop `musacoder_agent` (`KernelAgentLoop`): the multi-turn rollout against the verifier; the output is the
  first turn only (the policy gradient goes through it alone) and carries the PrimeEcho reward, so verl's reward
  loop is skipped. It reports each trajectory to the BDR buffer.
- reward manager `musacoder` (`MooreEvalRewardManager`): one verification per response, for single-turn runs with
  verl's own single-turn agent loop.
- `BDRDataset` (`data.custom_cls`): verl's RLHFDataset whose items become repair tasks with probability p, drawn
  from one Ray actor that holds the buffer (`RetryBufferActor`). verl repeats a dataset item rollout.n times, so a
  whole group gets the same repair task.
- policy loss `mirrorpop`: drops sequences whose mean |log rho| exceeds delta, with rho the token ratio
  pi_train / pi_rollout that verl hands the loss as `rollout_is_weights` (algorithm.rollout_correction.rollout_is:
  token, with a threshold that never truncates); then verl's vanilla clipped loss on what is kept.
Settings come from `reward.reward_kwargs.musacoder` of the verl config (`VerlSettings`), MirrorPop's from the actor's
`policy_loss` node (`MirrorPopLossConfig`, see `mirrorpop_policy_loss`).
"""

from __future__ import annotations

import asyncio
import atexit
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from uuid import uuid4

import ray
import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput
from verl.experimental.agent_loop.agent_loop import register as register_agent_loop
from verl.experimental.reward_loop.reward_manager import (
    register as register_reward_manager,
)
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.trainer.ppo.core_algos import (
    compute_policy_loss_vanilla,
    register_policy_loss,
)
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.config.actor import PolicyLossConfig

from musacoder.conversation import task_messages
from musacoder.episode import Episode, Round
from musacoder.settings import Settings
from musacoder.tasks.model import Task
from musacoder.train.rl.algos import episode_reward, mirrorpop_filter
from musacoder.train.rl.bdr import BDRSettings, RetryBuffer, RetryItem
from musacoder.train.rl.config import MirrorPopSettings, PrimeEchoSettings
from musacoder.verifier.verdict import Verdict

BUFFER_ACTOR = "musacoder-bdr"


@dataclass
class VerlSettings(Settings):
    verifier_url: str | None = None  # the reward service; None: the verifier's batch API inside the worker
    token_env: str = "MUSACODER_TOKEN"
    verify: dict = field(default_factory=dict)  # VerifyConfig fields for the batch API
    max_turns: int = 3
    primeecho: PrimeEchoSettings = field(default_factory=PrimeEchoSettings)
    bdr: BDRSettings = field(default_factory=BDRSettings)
    bdr_state: str | None = None  # file the buffer actor keeps its state in (a resumed run reloads it)

    @classmethod
    def from_dict(cls, d, _path: str = "") -> VerlSettings:
        """verl hands OmegaConf nodes: plain containers first, then the common loader."""
        from omegaconf import OmegaConf

        return super().from_dict(OmegaConf.to_container(d, resolve=True) if OmegaConf.is_config(d) else dict(d), _path)

    @classmethod
    def from_config(cls, config) -> VerlSettings:
        """From the whole verl config: reward.reward_kwargs.musacoder."""
        return cls.from_dict((config.reward.get("reward_kwargs", None) or {}).get("musacoder", None) or {})


def task_rows(tasks: list[Task], backend: str, one_shot: bool = True) -> list[dict]:
    """verl dataset rows (write them to parquet): the prompt as the benchmark asks it, the task in extra_info."""
    return [{"data_source": "musacoder", "prompt": task_messages(t, backend, one_shot), "agent_name": "musacoder_agent",
             "reward_model": {"style": "verifier", "ground_truth": ""},
             "extra_info": {"index": i, "task": {"name": t.name, "code": t.code, "level": t.level,
                                                 "problem_id": t.problem_id}}}
            for i, t in enumerate(tasks)]


def _task(info: dict) -> Task:
    return Task(**info["task"])


class AsyncVerifier:
    """verify(task, text) from async code: the service's async client (one connection pool, opened on first use on
    the caller's event loop), or the batch API in a thread."""

    def __init__(self, s: VerlSettings):
        self.s, self._client, self._loop, self._local = s, None, None, None

    async def verify(self, task: Task, text: str) -> Verdict:
        if self.s.verifier_url:
            from musacoder.service.client import AsyncVerifierClient

            if self._client is None:
                self._client = AsyncVerifierClient(self.s.verifier_url, os.environ.get(self.s.token_env))
                self._loop = asyncio.get_running_loop()
            return await self._client.verify(task, text)
        if self._local is None:
            from musacoder.api import Verifier
            from musacoder.config import VerifyConfig

            self._local = Verifier(VerifyConfig.from_dict(self.s.verify))
        return (await asyncio.get_running_loop().run_in_executor(None, self._local.verdicts, [(task, text)]))[0]

    def close(self):
        """Close the client on the loop it was opened on (its connections belong to that loop)."""
        client, self._client = self._client, None
        if client is None:
            return
        try:
            if self._loop.is_running():
                asyncio.run_coroutine_threadsafe(client.aclose(), self._loop)
            elif not self._loop.is_closed():
                self._loop.run_until_complete(client.aclose())
        except RuntimeError:  # a loop closing under us: its connections go with it
            pass


class SharedVerifier:
    """verl builds an agent loop per trajectory and a reward manager per worker: one verifier per class and process
    (verl's `init_class` convention), replaced if the settings change, closed at exit or by `close_class()`."""

    _verifier: AsyncVerifier | None = None

    @classmethod
    def init_verifier(cls, s: VerlSettings) -> AsyncVerifier:
        if cls._verifier is None or cls._verifier.s != s:
            if cls._verifier is None:
                atexit.register(cls.close_class)
            cls.close_class()
            cls._verifier = AsyncVerifier(s)
        return cls._verifier

    @classmethod
    def close_class(cls):
        v, cls._verifier = cls._verifier, None
        if v is not None:
            v.close()


class RetryBufferActor:
    """The BDR buffer for the whole run: agent loops report trajectories, the dataset draws repair tasks.
    A group is all-failed once `n` trajectories of one uid came in and none passed."""

    def __init__(self, settings: dict, seed: int = 0, state_path: str | None = None):
        self.buffer = RetryBuffer(BDRSettings(**settings), seed=seed)
        self.state_path = Path(state_path) if state_path else None
        self.pending: dict[str, list] = {}
        if self.state_path and self.state_path.exists():
            self.buffer.load(self.state_path)

    def report(self, uid: str, n: int, passed: bool, item: dict | None) -> bool:
        """One trajectory of group `uid`; `item` is its best failed answer (None for a repair task, which is never
        buffered again). True when this report completed an all-failed group that was buffered."""
        got = self.pending.setdefault(uid, [])
        got.append((passed, item))
        if len(got) < n:
            return False
        del self.pending[uid]
        failed = [it for p, it in got if not p and it]
        if any(p for p, _ in got) or len(failed) < n:
            return False
        added = self.buffer.add(RetryItem(**max(failed, key=lambda it: it["score"])))
        self._save()
        return added

    def draw(self) -> dict | None:
        item = self.buffer.draw(1)[0]
        self._save()
        return asdict(item) if item else None

    def state(self) -> dict:
        return self.buffer.state_dict()

    def _save(self):
        if self.state_path:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            self.buffer.save(self.state_path)


_actor = {}


def buffer_actor(s: VerlSettings, seed: int = 0):
    """The run's one buffer actor (named, so every process finds the same), created by whoever asks first."""
    if "handle" not in _actor:
        _actor["handle"] = ray.remote(RetryBufferActor).options(name=BUFFER_ACTOR, get_if_exists=True).remote(
            asdict(s.bdr), seed, s.bdr_state)
    return _actor["handle"]


@register_agent_loop("musacoder_agent")
class KernelAgentLoop(SharedVerifier, AgentLoopBase):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.s = VerlSettings.from_config(self.config)
        self.verifier = self.init_verifier(self.s)

    async def prompt_ids(self, ep: Episode) -> list[int] | None:
        """The next turn's prompt within rollout.prompt_length, eliding earlier answers as needed; None when it does
        not fit even so. Built without verl's cap, which would left-truncate the task statement away."""
        for msgs in ep.elisions():
            ids = await self.loop.run_in_executor(None, self.continuous_token_builder.build_initial_tokens, msgs)
            if len(ids) <= self.rollout_config.prompt_length:
                return ids
        return None

    async def run(self, sampling_params: dict, **kwargs) -> AgentLoopOutput:
        info = kwargs["extra_info"]
        ep = Episode(_task(info), info.get("first_messages") or list(kwargs["raw_prompt"]),  # a repair keeps its prompt
                     [Round(*r) for r in info.get("history", [])], bool(info.get("repair")), self.s.max_turns)
        out0 = None
        while not ep.finished:
            ids = await self.prompt_ids(ep)
            if ids is None:
                if ep.rounds:
                    break  # the conversation outgrew the prompt budget
                ids = await self.ct_build_initial_tokens(ep.messages())  # verl's own cap, as a last resort
            out = await self.server_manager.generate(request_id=uuid4().hex, prompt_ids=ids,
                                                     sampling_params=sampling_params)
            out0 = out0 or (ids, out)
            text = self.tokenizer.decode(out.token_ids[:self.rollout_config.response_length], skip_special_tokens=True)
            ep.record(text, await self.verifier.verify(ep.task, text))
        scores, passed = ep.scores, ep.passed
        reward = episode_reward(scores, passed, self.s.primeecho)
        if self.s.bdr.enabled and "uid" in kwargs:
            best = ep.best()
            item = None if ep.repair else asdict(RetryItem(ep.task.key, ep.first, best.text, best.feedback, best.score))
            await buffer_actor(self.s).report.remote(str(kwargs["uid"]), self.rollout_config.n, any(passed), item)
        ids, out = out0
        merged, mask, logprobs = await self.ct_merge_assistant_token(
            ids, out.token_ids, [], [] if out.log_probs else None,
            assistant_logprobs=out.log_probs if out.log_probs else None)
        n = self.rollout_config.response_length
        response = merged.token_ids[-len(mask):] if mask else []
        return AgentLoopOutput(
            prompt_ids=merged.token_ids[:len(merged.token_ids) - len(mask)], response_ids=response[:n],
            response_mask=mask[:n], response_logprobs=logprobs[:n] if logprobs else None, reward_score=reward,
            num_turns=2 * len(scores), metrics={},
            extra_fields={"turn_scores": scores, "turn_statuses": [r.status for r in ep.rounds], "repair": ep.repair})


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
        v = await self.verifier.verify(_task(item.non_tensor_batch["extra_info"]), text)
        score = episode_reward([v.reward], [v.passed], self.s.primeecho)
        return {"reward_score": score, "reward_extra_info": {"verifier_reward": v.reward, "passed": v.passed,
                                                             "status": v.status.value}}


class BDRDataset(RLHFDataset):
    """RLHFDataset whose item becomes, with BDR's probability, a repair task from the shared buffer. Its settings
    are the data config's `musacoder` node (the same as reward.reward_kwargs.musacoder); it talks to the buffer
    actor, so it needs data.dataloader_num_workers=0 (items built in the driver, which is connected to Ray)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.s = VerlSettings.from_dict(self.config.get("musacoder", None) or {})
        self.tasks = {Task(**info["task"]).key: info["task"] for info in self.dataframe["extra_info"]}

    def __getitem__(self, item):
        row = super().__getitem__(item)
        drawn = ray.get(buffer_actor(self.s).draw.remote()) if self.s.bdr.enabled else None
        if drawn:
            it = RetryItem(**drawn)
            row["raw_prompt"] = it.repair_messages()
            row["extra_info"] = {**row["extra_info"], "repair": True, "first_messages": it.messages,
                                 "history": [r.as_tuple() for r in it.repair_history()],
                                 "task": self.tasks[it.task]}
        return row


@dataclass
class MirrorPopLossConfig(PolicyLossConfig):
    """verl's policy-loss config plus MirrorPop's settings. verl's dataclasses refuse unknown keys, so the actor's
    `policy_loss` node names this class: `{_target_: musacoder.train.rl.verl_adapter.MirrorPopLossConfig,
    loss_mode: mirrorpop, mirrorpop_mode: mirror, mirrorpop_delta: 0.1}`."""

    mirrorpop_mode: str | None = None  # mirror | signed | off
    mirrorpop_delta: float | None = None


def mirrorpop_settings(config=None) -> MirrorPopSettings:
    """From the actor config's policy_loss (MirrorPopLossConfig); unset fields fall back to the older
    MUSACODER_MIRRORPOP="mode:delta" environment variable, then to mirror:0.1."""
    mode, delta = os.environ.get("MUSACODER_MIRRORPOP", "mirror:0.1").split(":")
    pl = getattr(config, "policy_loss", None) if config is not None else None
    get = (lambda k: pl.get(k)) if pl is not None and hasattr(pl, "get") else (lambda k: None)
    return MirrorPopSettings(get("mirrorpop_mode") or mode,
                             float(get("mirrorpop_delta") if get("mirrorpop_delta") is not None else delta))


@register_policy_loss("mirrorpop")
def mirrorpop_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                          config=None, rollout_is_weights=None):
    """verl's clipped loss on the sequences MirrorPop keeps. `rollout_is_weights` are the token ratios
    pi_train / pi_rollout (verl's rollout correction, token level); without them nothing is dropped. Mode and delta
    come from the actor config's policy_loss (`MirrorPopLossConfig`)."""
    s = mirrorpop_settings(config)
    mask = response_mask
    metrics = {}
    if rollout_is_weights is not None and s.mode != "off":
        log_rho = torch.log(rollout_is_weights.clamp(min=1e-20))
        keep, metrics = mirrorpop_filter(log_rho, torch.zeros_like(log_rho), response_mask.float(), s.mode, s.delta)
        mask = response_mask * keep.unsqueeze(1).to(response_mask.dtype)
    loss, pg_metrics = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, mask, loss_agg_mode, config,
                                                   rollout_is_weights=None)  # MirrorPop replaces the IS weights
    return loss, {**pg_metrics, **metrics}
