"""Local generation with Hugging Face transformers, batched (left padding, sampling settings per batch); each
request fitted into the model's context as the OpenAI client fits it (conversation.fit_prompt), counted exactly."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

import torch

from musacoder import conversation
from musacoder.bench.clients.base import Client, Generation, Request
from musacoder.hfdecode import decoding_attention


@dataclass
class HFConfig:
    batch_size: int = 8  # sequences generated together
    device: str = "auto"  # auto: cuda when available, else cpu
    dtype: str = "auto"  # the checkpoint's own dtype


def model_dir(path: str) -> str:
    """`path` checked where it is a local directory: one without a model (a training run's output directory, whose
    model is in final/) would otherwise fail in transformers with a message about tokenizer libraries."""
    p = Path(path)
    if p.is_dir() and not (p / "config.json").exists():
        final = p / "final"
        hint = f"; the run's model is in {final}" if (final / "config.json").exists() else ""
        raise ValueError(f"{path} holds no model (no config.json){hint}")
    return path


class HFClient(Client):
    local = True

    def __init__(self, path: str, config: HFConfig | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = model_dir(path)
        self.cfg = config or HFConfig()
        self.model_id = str(path)
        device = self.cfg.device if self.cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.tok = AutoTokenizer.from_pretrained(path)
        self.tok.padding_side = "left"  # generation continues from the right end of every row
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=self.cfg.dtype).to(device).eval()
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos if eos is not None else self.tok.eos_token_id])

    def _render(self, messages: list) -> str:
        if self.tok.chat_template:
            return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return "\n\n".join(m["content"] for m in messages) + "\n\n"

    @property
    def context_len(self) -> int | None:
        n = getattr(self.model.config, "max_position_embeddings", None)
        return n if isinstance(n, int) and n > 0 else None

    def prompt_tokens(self, messages: list) -> int:
        return len(self.tok(self._render(messages), add_special_tokens=not self.tok.chat_template)["input_ids"])

    def generate(self, requests: Sequence[Request]) -> Iterator[tuple[int, Generation]]:
        # (messages, max_tokens) each: past the context a model computes on positions it never learned, silently
        fitted = {}
        for i, r in enumerate(requests):
            try:
                fitted[i] = conversation.fit_prompt(r.messages, self.context_len, r.max_tokens, self.prompt_tokens) \
                    if self.context_len else (r.messages, r.max_tokens)
            except conversation.BudgetError as e:
                yield i, Generation(error=f"prompt does not fit: {e}", attempts=0)
        params = {i: (requests[i].temperature, requests[i].top_p, fitted[i][1]) for i in fitted}
        order = sorted(fitted, key=lambda i: (params[i], len(str(fitted[i][0]))))
        for key, group in groupby(order, key=params.__getitem__):
            group = list(group)
            for s in range(0, len(group), self.cfg.batch_size):
                batch = group[s:s + self.cfg.batch_size]
                t0 = time.perf_counter()
                torch.manual_seed(requests[batch[0]].seed)  # reproducible for the same batches
                try:
                    gens = self._batch([fitted[i][0] for i in batch], *key)
                except Exception as e:  # noqa: BLE001 -- e.g. out of memory: this batch fails, the run goes on
                    gens = [Generation(error=f"{type(e).__name__}: {str(e)[:1000]}") for _ in batch]
                if torch.cuda.is_available():
                    # the batch's KV cache back to the device: judges verifying on the same GPU are other processes,
                    # and KernelBench-size references ran out of memory beside it (H100, 2026-11-26)
                    torch.cuda.empty_cache()
                seconds = (time.perf_counter() - t0) / len(batch)  # each its share: the report sums them
                for i, g in zip(batch, gens):
                    g.seconds = seconds
                    if fitted[i][0] != requests[i].messages:
                        g.messages = fitted[i][0]
                    yield i, g

    @torch.inference_mode()
    def _batch(self, conversations: list, temperature: float, top_p: float, max_tokens: int) -> list[Generation]:
        texts = [self._render(m) for m in conversations]
        enc = self.tok(texts, return_tensors="pt", padding=True,
                       add_special_tokens=not self.tok.chat_template).to(self.model.device)
        sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p} if temperature > 0 else \
            {"do_sample": False}
        with decoding_attention():
            out = self.model.generate(**enc, max_new_tokens=max_tokens, pad_token_id=self.tok.pad_token_id,
                                      **sampling)
        gens = []
        for row, n_prompt in zip(out[:, enc["input_ids"].shape[1]:].tolist(), enc["attention_mask"].sum(1).tolist()):
            stop = next((k for k, t in enumerate(row) if t in self.eos), None)
            kept = row if stop is None else row[:stop]
            gens.append(Generation(text=self.tok.decode(kept, skip_special_tokens=True), prompt_tokens=int(n_prompt),
                                   completion_tokens=len(kept) + (stop is not None),
                                   finish_reason="length" if stop is None else "stop"))
        return gens
