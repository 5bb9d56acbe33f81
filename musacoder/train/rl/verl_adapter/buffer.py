"""The BDR buffer of a verl run: one named Ray actor that agent loops report to and the dataset draws from."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import ray

from musacoder.train.rl.bdr import BDRSettings, RetryBuffer, RetryItem, group_retry
from musacoder.train.rl.verl_adapter.common import VerlSettings

BUFFER_ACTOR = "musacoder-bdr"


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
        item = group_retry([(p, it and RetryItem(**it)) for p, it in got])
        if item is None:
            return False
        added = self.buffer.add(item)
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
