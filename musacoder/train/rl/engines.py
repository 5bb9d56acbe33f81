"""Generation engines for rollouts: chat conversations in, token ids and the engine's own log-probs out.

The log-probs are pi_rollout for MirrorPop. `HFEngine` takes them from the raw logits divided by the temperature,
which is how TRL scores the same tokens under pi_train, so on-policy samples differ only by numerics. `VLLMEngine`
uses the vLLM server (or colocated engine) that TRL's GRPOTrainer set up and keeps in sync with the weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import StoppingCriteria

from musacoder.hfdecode import decoding_attention


@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]  # up to and including the end-of-sequence token when one was generated
    logprobs: list[float]  # the engine's log-prob of each completion token
    text: str
    truncated: bool  # hit the token limit before end-of-sequence

    @property
    def n_tokens(self) -> int:
        return len(self.completion_ids)


class Engine(Protocol):
    def encode(self, messages: list[dict]) -> list[int]:
        """Token ids of a conversation rendered with the chat template, ready for the assistant's turn."""

    def generate(self, conversations: Sequence[list[dict]],
                 on_text: Callable[[int, str], None] | None = None) -> list[Sample]:
        """One sampled reply per conversation, in order; `on_text(i, text)` as soon as reply i has ended, where the
        engine can tell (the verifier starts on it while the others generate)."""


def _encode(tokenizer, messages: list[dict]) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"])


@dataclass
class Sampling:
    temperature: float = 0.9  # the paper's RL sampling
    top_p: float = 0.95
    top_k: int = 0  # 0: off
    max_new_tokens: int = 32768


class HFEngine:
    """`model_ctx()` yields the model to generate with (TRL's unwrap_model_for_generation inside a trainer)."""

    def __init__(self, tokenizer, model_ctx: Callable[[], AbstractContextManager], sampling: Sampling,
                 eos_ids: Sequence[int], batch_size: int = 16):
        self.tok, self.model_ctx, self.sampling, self.batch_size = tokenizer, model_ctx, sampling, batch_size
        self.eos = set(eos_ids)

    def encode(self, messages: list[dict]) -> list[int]:
        return _encode(self.tok, messages)

    def generate(self, conversations: Sequence[list[dict]],
                 on_text: Callable[[int, str], None] | None = None) -> list[Sample]:
        prompts = [self.encode(m) for m in conversations]
        out: list[Sample] = []
        with self.model_ctx() as model, torch.no_grad(), _eval_mode(model), decoding_attention():
            for s in range(0, len(prompts), self.batch_size):
                ended = _Ended(self, s, on_text) if on_text else None
                out.extend(self._batch(model, prompts[s:s + self.batch_size], ended))
                for r in range(len(out) - s) if ended else ():  # replies cut at the token limit are final now
                    if r not in ended.done:
                        on_text(s + r, out[s + r].text)
        if torch.cuda.is_available():
            # the KV cache grows a step at a time and leaves tens of GB cached in the allocator; a verifier
            # sharing the GPU needs that memory now (measured on an H100: 64 GB held by a 31M model's rollout)
            torch.cuda.empty_cache()
        return out

    def _batch(self, model, prompts: list[list[int]], ended=None) -> list[Sample]:
        from transformers import GenerationConfig, StoppingCriteriaList

        width = max(map(len, prompts))
        pad = self.tok.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
        s = self.sampling
        gen = GenerationConfig(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                               max_new_tokens=s.max_new_tokens, pad_token_id=pad, eos_token_id=sorted(self.eos),
                               output_logits=True, return_dict_in_generate=True)
        if ended is not None:
            ended.width = width
        res = model.generate(input_ids=ids, attention_mask=attn, generation_config=gen,
                             stopping_criteria=StoppingCriteriaList([ended] if ended is not None else []))
        tokens = res.sequences[:, width:]
        logits = torch.stack(res.logits, dim=1).float() / s.temperature  # (B, L, V), before top-p/top-k
        logps = torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        out = []
        for p, row, lp in zip(prompts, tokens.tolist(), logps.tolist()):
            stop = next((k for k, t in enumerate(row) if t in self.eos), None)
            n = len(row) if stop is None else stop + 1
            out.append(Sample(p, row[:n], lp[:n], self.tok.decode(row[:n], skip_special_tokens=True), stop is None))
        return out


@contextmanager
def _eval_mode(model):
    """The trainer leaves the policy in train mode between updates: sampling there would apply the model's dropout
    (vLLM samples without it)."""
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


class _Ended(StoppingCriteria):
    """A stopping criterion that never stops: after each generation step it hands every row that has just produced
    its end-of-sequence token to `on_text`, decoded exactly as `_batch` decodes it at the end."""

    def __init__(self, engine: HFEngine, offset: int, on_text: Callable[[int, str], None]):
        self.engine, self.offset, self.on_text = engine, offset, on_text
        self.width, self.done = 0, set()

    def __call__(self, input_ids, scores, **kwargs):
        eos = self.engine.eos
        for r, t in enumerate(input_ids[:, -1].tolist()):
            if t in eos and r not in self.done:
                self.done.add(r)
                row = input_ids[r, self.width:].tolist()
                n = next(k for k, t in enumerate(row) if t in eos) + 1
                self.on_text(self.offset + r, self.engine.tok.decode(row[:n], skip_special_tokens=True))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class VLLMEngine:
    """Generation through the trainer's vLLM backend (`use_vllm`), which TRL syncs to the weights every step."""

    def __init__(self, trainer):
        self.trainer, self.tok = trainer, trainer.processing_class
        self.eos = set(trainer.eos_token_ids)

    def encode(self, messages: list[dict]) -> list[int]:
        return _encode(self.tok, messages)

    def generate(self, conversations: Sequence[list[dict]],
                 on_text: Callable[[int, str], None] | None = None) -> list[Sample]:
        """All replies come back together from the server: `on_text` is not called (verification starts after)."""
        prompts = [self.encode(m) for m in conversations]
        _, completions, logprobs, _ = self.trainer.vllm_generation.generate(prompts=prompts, images=None,
                                                                            num_generations=1)
        return [Sample(p, list(c), [lp[0] for lp in lps], self.tok.decode(c, skip_special_tokens=True),
                       not c or c[-1] not in self.eos)
                for p, c, lps in zip(prompts, completions, logprobs)]
