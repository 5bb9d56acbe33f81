"""The Python API: `verify(task, candidate, config)` and `verify_many(pairs, config)`."""

from __future__ import annotations

import atexit
from pathlib import Path
from typing import Iterable, Iterator

from musacoder.config import VerifyConfig
from musacoder.tasks.model import Task
from musacoder.verifier.verdict import Verdict

_pools: dict = {}


def _as_text(candidate) -> str:
    return Path(candidate).read_text() if isinstance(candidate, Path) else candidate


def get_pool(config: VerifyConfig | None = None):
    """A pool per (backend, cache dir, settings), kept for the life of the process."""
    from musacoder.pool.local import LocalPool

    config = config or VerifyConfig()
    key = repr(sorted(config.to_dict().items()))
    if key not in _pools:
        _pools[key] = LocalPool(config)
    return _pools[key]


@atexit.register
def close_pools():
    for pool in _pools.values():
        pool.close()
    _pools.clear()


def verify(task: Task, candidate: str | Path, config: VerifyConfig | None = None) -> Verdict:
    """Verify one candidate (source, raw model output, or a path) against a task."""
    return get_pool(config).submit(task, _as_text(candidate)).result()


def verify_many(pairs: Iterable[tuple[Task, str | Path]], config: VerifyConfig | None = None
                ) -> Iterator[tuple[int, Verdict]]:
    """Stream (index, verdict) pairs in completion order."""
    return get_pool(config).verify_many((t, _as_text(c)) for t, c in pairs)
