"""One multi-turn episode, generate -> verify -> feedback, shared by bench, RL (TRL and verl) and synth.

An episode is a task's first-turn prompt and the rounds answered so far; each round is the model's answer and the
verifier's verdict on it. The next prompt is `conversation.conversation` over the rounds (earlier reasoning stripped,
the feedback as the next user turn); the episode ends at `max_turns` rounds or at the first that passes. A BDR
repair episode starts from an earlier round (`history`) that it does not count as its own.

`run_episodes` drives many episodes batch-wise (all live episodes' turn k generated together, then verified
together): TRL's rollouts and synthesis use it. With `early`, an answer is verified as soon as the generator says
it has ended, while the rest of its batch is still generating (`Ahead`): only the verification left when the last
answer ends is waited for. The bench runner (resumable, rows in SQLite) and the verl agent loop
(async, one episode per coroutine) keep their own scheduling and use `Episode` for every decision about the
conversation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from musacoder.conversation import conversation
from musacoder.tasks.model import Task
from musacoder.verifier.verdict import Verdict

ELIDED = "(earlier answer omitted to fit the prompt budget)"


@dataclass
class Round:
    text: str  # the model's raw answer
    feedback: str  # the verifier's feedback on it
    passed: bool
    status: str = ""
    score: float = 0.0  # the verdict's reward
    tokens: int = 0  # completion tokens
    sample: Any = None  # what the generator returned with the text (token ids, log-probs), for training

    @classmethod
    def of(cls, text: str, v: Verdict, tokens: int = 0, sample: Any = None) -> Round:
        return cls(text, v.feedback, v.passed, v.status.value, v.reward, tokens, sample)

    def as_tuple(self) -> tuple[str, str, bool]:
        return self.text, self.feedback, self.passed


@dataclass
class Episode:
    task: Task
    first: list[dict]  # the first-turn prompt
    history: list[Round] = field(default_factory=list)  # earlier rounds it starts from (a BDR repair task: one)
    repair: bool = False
    max_turns: int = 3
    stop_on_success: bool = True
    rounds: list[Round] = field(default_factory=list)

    def messages(self, elide: int = 0) -> list[dict]:
        """The next turn's prompt; `elide` earliest answers (never the latest) replaced by a note."""
        past = [r.as_tuple() for r in self.history + self.rounds]
        for i in range(min(elide, len(past) - 1)):
            past[i] = (ELIDED,) + past[i][1:]
        return conversation(self.first, past)

    def elisions(self) -> Iterator[list[dict]]:
        """Prompts from full to shortest: earlier answers omitted oldest first; the latest answer (which the last
        feedback is about), every feedback and the task statement always stay."""
        for k in range(max(1, len(self.history) + len(self.rounds))):
            yield self.messages(k)

    @property
    def finished(self) -> bool:
        return len(self.rounds) >= self.max_turns or (self.stop_on_success and bool(self.rounds)
                                                      and self.rounds[-1].passed)

    def record(self, text: str, v: Verdict, tokens: int = 0, sample: Any = None) -> Round:
        self.rounds.append(Round.of(text, v, tokens, sample))
        return self.rounds[-1]

    @property
    def scores(self) -> list[float]:
        return [r.score for r in self.rounds]

    @property
    def passed(self) -> list[bool]:
        return [r.passed for r in self.rounds]

    @property
    def first_success(self) -> int | None:
        """1-based turn of the first passing answer, None if none passed."""
        return next((k for k, p in enumerate(self.passed, 1) if p), None)

    def best(self) -> Round:
        return max(self.rounds, key=lambda r: r.score)


class Generated(Protocol):
    text: str
    n_tokens: int


@dataclass
class EpisodeStats:
    generate_s: float = 0.0
    verify_s: float = 0.0  # waiting for verdicts after generation returned
    tokens: int = 0  # completion tokens generated, all turns
    responses: int = 0
    stopped_long: int = 0  # episodes ended early because the next prompt did not fit
    verified_early: int = 0  # answers whose verification started while their batch was still generating
    # answers that went through the compile tier (built, or waited for an identical answer's build), and the longest
    # such stage: a wait on the verifier near it was the latency of a new source's build, which no judge count cuts
    compiled: int = 0
    compile_s_max: float = 0.0


class Ahead:
    """Verification that starts while generation goes on: `submit(i, text)` when answer i has ended (the
    generator's callback), `verdicts(texts)` once all have. A text that differs from the one submitted early is
    verified again, so the verdict always belongs to the final answer."""

    def __init__(self, verify: Callable[[list[tuple[Task, str]]], Sequence[Verdict]], tasks: list[Task],
                 threads: int = 32):
        self.verify, self.tasks = verify, tasks
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="musacoder-ahead")
        self.early: dict[int, tuple[str, Future]] = {}

    def submit(self, i: int, text: str) -> None:
        if i not in self.early:
            self.early[i] = (text, self.pool.submit(lambda: self.verify([(self.tasks[i], text)])[0]))

    def verdicts(self, texts: Sequence[str]) -> tuple[list[Verdict], int]:
        """Verdicts in order, and how many were started early."""
        late = [i for i, t in enumerate(texts) if self.early.get(i, (None,))[0] != t]
        rest = dict(zip(late, self.verify([(self.tasks[i], texts[i]) for i in late]))) if late else {}
        try:
            return [rest[i] if i in rest else self.early[i][1].result() for i in range(len(texts))], \
                len(texts) - len(late)
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)


def run_episodes(episodes: Sequence[Episode], generate: Callable[..., Sequence[Generated]],
                 verify: Callable[[list[tuple[Task, str]]], Sequence[Verdict]],
                 fits: Callable[[list[dict]], bool] | None = None, early: bool = False) -> EpisodeStats:
    """Play every episode to its end, turn by turn in batches. `fits(messages)` False ends an episode whose next
    prompt is too long (never its first turn). `early`: `generate(prompts, on_text)` calls `on_text(i, text)` as
    answer i ends, and its verification starts then (`Ahead`)."""
    stats = EpisodeStats()
    live = [e for e in episodes if not e.finished]
    while live:
        prompts = {id(e): e.messages() for e in live}
        if fits is not None:
            long = {id(e) for e in live if e.rounds and not fits(prompts[id(e)])}
            stats.stopped_long += len(long)
            live = [e for e in live if id(e) not in long]
            if not live:
                break
        t0 = time.perf_counter()
        if early:
            ahead = Ahead(verify, [e.task for e in live])
            samples = generate([prompts[id(e)] for e in live], ahead.submit)
            t1 = time.perf_counter()
            verdicts, n_early = ahead.verdicts([s.text for s in samples])
            stats.verified_early += n_early
        else:
            samples = generate([prompts[id(e)] for e in live])
            t1 = time.perf_counter()
            verdicts = verify([(e.task, s.text) for e, s in zip(live, samples)])
        stats.generate_s += t1 - t0
        stats.verify_s += time.perf_counter() - t1
        for e, s, v in zip(live, samples, verdicts):
            e.record(s.text, v, s.n_tokens, s)
            stats.tokens += s.n_tokens
            stats.responses += 1
            compile_s = v.stage_seconds.get("compile", 0.0)
            stats.compiled += compile_s > 0
            stats.compile_s_max = max(stats.compile_s_max, compile_s)
        live = [e for e in live if not e.finished]
    return stats
