"""Buffered Dynamic Retry: a group whose rollouts all fail has zero advantage and teaches nothing. Its prompt, one
failed answer and the verifier's feedback go into a bounded FIFO; with probability `prob` a batch slot (a whole
group) becomes a repair task built from the oldest buffered item: the original prompt, the failed answer as the
assistant turn, and the feedback as the next user turn. The buffer's state (items, counters, random state) is
saved with every checkpoint, so a resumed run retries what the interrupted one had buffered.
"""

from __future__ import annotations

import json
import random
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

from musacoder.conversation import conversation
from musacoder.episode import Episode, Round
from musacoder.settings import Settings


@dataclass
class BDRSettings(Settings):
    enabled: bool = True
    capacity: int = 256  # buffer size; not published
    prob: float = 0.1  # chance that a batch slot becomes a repair task; the paper says "small", no value
    evict: str = "oldest"  # when full: "oldest" drops the head to make room, "newest" refuses the new item
    max_uses: int = 1  # times an item is re-issued before it leaves the buffer
    unique_tasks: bool = True  # a newer failure of a task replaces its older buffered one

    def __post_init__(self):
        super().__post_init__()
        if self.evict not in ("oldest", "newest"):
            raise ValueError(f"bdr.evict must be 'oldest' or 'newest', not {self.evict!r}")
        if not 0.0 <= self.prob <= 1.0 or self.capacity < 1 or self.max_uses < 1:
            raise ValueError("bdr needs 0 <= prob <= 1, capacity >= 1 and max_uses >= 1")


@dataclass
class RetryItem:
    task: str  # task key
    messages: list[dict]  # the first-turn prompt the group was given
    code: str  # the failed answer (raw model output)
    feedback: str  # the verifier's feedback on it
    score: float = -1.0  # its eq.-2 reward
    uses: int = 0

    def repair_history(self) -> list[Round]:
        """The earlier round a repair task starts from."""
        return [Round(self.code, self.feedback, False, score=self.score)]

    def repair_messages(self) -> list[dict]:
        return conversation(self.messages, [r.as_tuple() for r in self.repair_history()])


def offered(episode: Episode) -> RetryItem | None:
    """What one trajectory offers the buffer if its group fails: its best-scoring turn with that turn's feedback;
    None for a repair task, which is never buffered again."""
    if episode.repair:
        return None
    best = episode.best()
    return RetryItem(episode.task.key, episode.first, best.text, best.feedback, best.score)


def group_retry(group: list[tuple[bool, RetryItem | None]]) -> RetryItem | None:
    """BDR's rule for one finished group, each trajectory as (passed, what it offered): the group's most nearly right
    answer when every trajectory failed and none is a repair, else None. The TRL trainer and the verl adapter both
    apply it."""
    if any(passed for passed, _ in group) or not all(item for _, item in group):
        return None
    return max((item for _, item in group), key=lambda item: item.score)


@dataclass
class RetryBuffer:
    settings: BDRSettings = field(default_factory=BDRSettings)
    seed: int = 0
    items: deque = field(default_factory=deque)
    added: int = 0
    evicted: int = 0
    refused: int = 0
    issued: int = 0

    def __post_init__(self):
        self._rng = random.Random(self.seed)

    def __len__(self) -> int:
        return len(self.items)

    def add(self, item: RetryItem) -> bool:
        """Buffer an all-failed group's item; False when refused (full, evict="newest")."""
        if self.settings.unique_tasks:
            self.items = deque(i for i in self.items if i.task != item.task)
        if len(self.items) >= self.settings.capacity:
            if self.settings.evict == "newest":
                self.refused += 1
                return False
            self.items.popleft()
            self.evicted += 1
        self.items.append(item)
        self.added += 1
        return True

    def draw(self, slots: int) -> list[RetryItem | None]:
        """Per batch slot, a repair item (with probability `prob`, oldest first) or None (keep the fresh prompt)."""
        out: list[RetryItem | None] = []
        for _ in range(slots):
            if not self.items or self._rng.random() >= self.settings.prob:
                out.append(None)
                continue
            item = self.items.popleft()
            item.uses += 1
            if item.uses < self.settings.max_uses:
                self.items.append(item)  # back of the queue, to come round again
            self.issued += 1
            out.append(item)
        return out

    def state_dict(self) -> dict:
        version, internal, gauss = self._rng.getstate()
        return {"items": [asdict(i) for i in self.items], "added": self.added, "evicted": self.evicted,
                "refused": self.refused, "issued": self.issued, "seed": self.seed,
                "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict) -> None:
        self.items = deque(RetryItem(**i) for i in state["items"])
        self.added, self.evicted = state["added"], state["evicted"]
        self.refused, self.issued, self.seed = state["refused"], state["issued"], state["seed"]
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.state_dict()))

    def load(self, path: Path) -> None:
        self.load_state_dict(json.loads(Path(path).read_text()))
