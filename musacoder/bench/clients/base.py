"""The generation interface every client implements: requests in, (index, Generation) out as they complete."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from musacoder import conversation
from musacoder.tasks.model import Task


@dataclass(frozen=True)
class Request:
    task: Task
    sample: int
    turn: int
    messages: list  # chat messages [{"role": ..., "content": ...}]
    temperature: float
    top_p: float
    max_tokens: int
    seed: int  # per (task, sample, turn): servers that honour seeds (vLLM, SGLang) then reproduce the sample


@dataclass
class Generation:
    text: str = ""
    error: str | None = None  # set when the request failed; the runner records it and retries on the next run
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    seconds: float = 0.0  # wall time of the request (its share of its batch, for batched local generation)
    attempts: int = 1
    finish_reason: str | None = None
    messages: list | None = None  # what was sent, when the client cut earlier answers to fit the model's context


class Client(ABC):
    model_id: str = ""  # what the run's results belong to; resuming with another model is refused
    local: bool = False  # generates on this machine: verifying meanwhile would disturb the kernel timings
    fatal: str | None = None  # set when the model server is gone: the run should end with this message
    context_len: int | None = None  # the model's context in tokens, where known

    def prompt_tokens(self, messages: list) -> int:
        """The prompt's length in the model's tokens: a conservative estimate unless the client has its tokenizer."""
        return conversation.estimate_tokens(messages)

    def cancel(self) -> None:
        """Called from another thread when the run stops (Ctrl-C): stop waiting on what is in flight."""

    @abstractmethod
    def generate(self, requests: Sequence[Request]) -> Iterator[tuple[int, Generation]]:
        """Yield (index into requests, generation) in completion order. A failure is a Generation with `error`."""
