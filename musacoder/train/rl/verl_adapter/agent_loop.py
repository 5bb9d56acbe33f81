"""Agent loop `musacoder_agent`: the multi-turn rollout against the verifier, scored by PrimeEcho."""

from __future__ import annotations

from dataclasses import asdict
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput
from verl.experimental.agent_loop.agent_loop import register as register_agent_loop

from musacoder.episode import Episode, Round
from musacoder.train.rl.algos import episode_reward
from musacoder.train.rl.bdr import offered
from musacoder.train.rl.verl_adapter.buffer import buffer_actor
from musacoder.train.rl.verl_adapter.common import SharedVerifier, VerlSettings, task_of, verdict


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
        # a repair task keeps its own prompt
        ep = Episode(task_of(info), info.get("first_messages") or list(kwargs["raw_prompt"]),
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
            ep.record(text, await verdict(self.verifier, ep.task, text))
        scores, passed = ep.scores, ep.passed
        reward = episode_reward(scores, passed, self.s.primeecho)
        if self.s.bdr.enabled and "uid" in kwargs:
            item = offered(ep)
            item = item and asdict(item)
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
