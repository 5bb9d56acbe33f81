"""The generation interface every client implements: requests in, (index, Generation) out as they complete."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterator, Sequence

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
    seconds: float = 0.0  # wall time of the request (of its batch, for batched local generation)
    attempts: int = 1
    finish_reason: str | None = None


class Client(ABC):
    model_id: str = ""  # what the run's results belong to; resuming with another model is refused
    local: bool = False  # generates on this machine: verifying meanwhile would disturb the kernel timings

    @abstractmethod
    def generate(self, requests: Sequence[Request]) -> Iterator[tuple[int, Generation]]:
        """Yield (index into requests, generation) in completion order. A failure is a Generation with `error`."""
