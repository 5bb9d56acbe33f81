"""The Python API, the one door to verification: `verify(task, candidate, config)`, `verify_many(pairs, config)`, and
`get_verifier(config, url, token)`, the verdicts of a batch in order from a pool in this process (`LocalVerifier`) or
from the reward service (`RemoteVerifier`, `musacoder serve`), which the rewards, RL and verl use.

Inputs are normalised here, before anything reaches a pool: a task may be a `Task`, a dict (`{"code", "key"}`, a
KernelBench dataset row with `code`/`name`/`level`/`problem_id`, or `reference_code`), a `.py` path or reference
source; a candidate may be source or raw model output (a string or `Path`), one chat message, or a list of them
(TRL's conversational completions). Unusable input raises `TypeError`/`ValueError` from `verify` and becomes that
item's `format_error` verdict in `verify_many`: a bad item never stalls the others.
"""

from __future__ import annotations

import asyncio
import atexit
import copy
import re
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from musacoder.config import VerifyConfig
from musacoder.tasks.model import Task
from musacoder.verifier.pipeline import unusable
from musacoder.verifier.verdict import Verdict

_pools: dict = {}
_remotes: dict = {}
_pools_lock = threading.Lock()  # two threads asking at once must not start two pools
_KEY_RE = re.compile(r"^level(\d+)/(.+)$")


def as_task(task) -> Task:
    """A `Task` from a Task, dict / dataset row, `.py` path, or reference source; TypeError/ValueError otherwise."""
    if isinstance(task, Task):
        return task
    if isinstance(task, Path) or (isinstance(task, str) and "\n" not in task and task.endswith(".py")):
        from musacoder.tasks.loaders import load_tasks

        tasks = load_tasks(task)
        if len(tasks) != 1:
            raise ValueError(f"task path {task} holds {len(tasks)} tasks, expected one")
        return tasks[0]
    if isinstance(task, str):
        return Task(name=f"task_{Task(name='', code=task).code_hash[:8]}", code=task, source="inline").validate()
    if isinstance(task, dict) or (hasattr(task, "keys") and hasattr(task, "__getitem__")):  # also pandas rows
        d = dict(task.items()) if hasattr(task, "items") else {k: task[k] for k in task.keys()}  # noqa: SIM118
        code = d.get("code") if d.get("code") is not None else d.get("reference_code")
        if not isinstance(code, str):
            raise ValueError(f"task dict has no 'code' (or 'reference_code') string; keys: {sorted(map(str, d))}")
        name, level = d.get("name"), d.get("level")
        if not name and isinstance(d.get("key"), str):
            m = _KEY_RE.match(d["key"])
            name, level = (m.group(2), level if level is not None else int(m.group(1))) if m else (d["key"], level)
        name = str(name).removesuffix(".py") if name else f"task_{Task(name='', code=code).code_hash[:8]}"
        pid = d.get("problem_id")
        return Task(name=name, code=code, level=int(level) if level is not None else None,
                    problem_id=int(pid) if pid is not None else None, source=str(d.get("source") or "dict")).validate()
    raise TypeError(f"a task must be a Task, a dict with 'code', a .py path or source, not {type(task).__name__}")


def _content(msg) -> str:
    content = msg.get("content")
    if content is None:
        return ""
    if isinstance(content, list):  # multimodal-style parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        raise TypeError(f"message content must be a string or a list of parts, not {type(content).__name__}")
    return content


def as_candidate_text(candidate) -> str:
    """Candidate text from source / raw output (str, bytes, Path), one chat message, or a list of messages (the last
    assistant message is used, else the last message); TypeError/ValueError otherwise."""
    if isinstance(candidate, str):
        return candidate
    if isinstance(candidate, Path):
        return candidate.read_text()
    if isinstance(candidate, bytes):
        return candidate.decode("utf-8")
    if isinstance(candidate, dict):
        if "content" not in candidate:
            raise ValueError(f"a candidate message needs 'content'; keys: {sorted(map(str, candidate))}")
        return _content(candidate)
    if isinstance(candidate, (list, tuple)):
        if not candidate:
            raise ValueError("an empty list of messages has no candidate")
        if not all(isinstance(m, dict) for m in candidate):
            raise TypeError("a candidate list must hold chat messages (dicts with 'role' and 'content')")
        mine = [m for m in candidate if m.get("role") == "assistant"] or list(candidate)
        return _content(mine[-1])
    raise TypeError(f"a candidate must be a string, a Path or chat messages, not {type(candidate).__name__}")


def resolved(config: VerifyConfig | None) -> VerifyConfig:
    """A copy of `config` with backend 'auto' decided, so equal settings always share one pool."""
    config = copy.deepcopy(config) if config is not None else VerifyConfig()
    from musacoder.backends import resolve

    config.backend = resolve(config.backend)
    return config


def get_pool(config: VerifyConfig | None = None):
    """A pool per (backend, cache dir, settings), kept for the life of the process."""
    from musacoder.pool.local import LocalPool

    config = resolved(config)
    key = repr(sorted(config.to_dict().items()))
    with _pools_lock:
        if key not in _pools:
            _pools[key] = LocalPool(config)
        return _pools[key]


@atexit.register
def close_pools():
    """Close the process's pools and remote verifiers' clients (at exit)."""
    with _pools_lock:
        held = list(_pools.values()) + list(_remotes.values())
        _pools.clear()
        _remotes.clear()
    for x in held:
        x.close()


def verify(task, candidate, config: VerifyConfig | None = None) -> Verdict:
    """Verify one candidate (source, raw model output, a path or chat messages) against a task."""
    task, text = as_task(task), as_candidate_text(candidate)
    return get_pool(config).submit(task, text).result()


def verify_many(pairs: Iterable[tuple], config: VerifyConfig | None = None) -> Iterator[tuple[int, Verdict]]:
    """Stream (index, verdict) pairs in completion order; an unusable pair is that index's format_error verdict."""
    config = resolved(config)
    items, bad = [], []
    for i, pair in enumerate(pairs):
        key = ""
        try:
            t, c = pair
            task = as_task(t)
            key = task.key
            items.append((i, task, as_candidate_text(c)))
        except (TypeError, ValueError, OSError) as e:
            bad.append((i, unusable(f"unusable input: {e}", config, key, backend=config.backend)))
    yield from bad
    if items:
        for j, v in get_pool(config).verify_many([(task, text) for _, task, text in items]):
            yield items[j][0], v


class Verifier(ABC):
    """The one door for a batch: one verdict per (task, candidate) pair, in the order of the pairs. `get_verifier`
    gives the implementation: `LocalVerifier` (a pool in this process) or `RemoteVerifier` (the reward service). An
    unusable pair gets its format_error verdict here and is never verified."""

    config: VerifyConfig

    @abstractmethod
    def verdicts(self, pairs: Sequence[tuple]) -> list[Verdict]:
        """The verdicts, from sync code."""

    @abstractmethod
    async def verdicts_async(self, pairs: Sequence[tuple]) -> list[Verdict]:
        """The verdicts, from async code (an event loop is never blocked by a verification)."""

    def close(self) -> None:
        """Release what it holds (nothing, unless it says otherwise)."""

    def _usable(self, pairs) -> tuple[list, dict[int, Verdict]]:
        """(index, Task, text) of the usable pairs; the format_error verdicts of the rest."""
        good, bad = [], {}
        for i, (t, c) in enumerate(pairs):
            try:
                good.append((i, as_task(t), as_candidate_text(c)))
            except (TypeError, ValueError, OSError) as e:
                bad[i] = unusable(f"unusable input: {e}", self.config)
        return good, bad


class LocalVerifier(Verifier):
    """Verdicts from this process's pool for `config` (api.get_pool: one per settings, kept for the process)."""

    def __init__(self, config: VerifyConfig | None = None):
        self.config = config if config is not None else VerifyConfig()

    def verdicts(self, pairs: Sequence[tuple]) -> list[Verdict]:
        out: list[Verdict | None] = [None] * len(pairs)
        for i, v in verify_many(pairs, self.config):
            out[i] = v
        return out

    async def verdicts_async(self, pairs: Sequence[tuple]) -> list[Verdict]:
        return await asyncio.to_thread(self.verdicts, pairs)


class RemoteVerifier(Verifier):
    """Verdicts from the reward service at `url` (its own settings apply; `config` only shapes the format_error
    verdicts of unusable pairs; `token`: its bearer token; `concurrency`: requests in flight). From async code it keeps
    one client, and its connections, for each event loop that calls it, for as long as the loop lives: a reward called
    thousands of times an RL run does not open a connection pool each time, and callers on two loops (threads of their
    own) never close each other's client under requests in flight."""

    def __init__(self, url: str, token: str | None = None, config: VerifyConfig | None = None, concurrency: int = 64):
        self.url, self.token, self.concurrency = url, token, concurrency
        self.config = config if config is not None else VerifyConfig()
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop -> its client
        self._lock = threading.Lock()

    def verdicts(self, pairs: Sequence[tuple]) -> list[Verdict]:
        from musacoder.service.client import verify_batch

        good, bad = self._usable(pairs)
        got = verify_batch([(t, c) for _, t, c in good], self.url, self.token, concurrency=self.concurrency) \
            if good else []
        return [bad.get(i) or got.pop(0) for i in range(len(pairs))]

    async def verdicts_async(self, pairs: Sequence[tuple]) -> list[Verdict]:
        good, bad = self._usable(pairs)
        got = await self._open().verify_many([(t, c) for _, t, c in good]) if good else []
        return [bad.get(i) or got.pop(0) for i in range(len(pairs))]

    def _open(self):
        """The running loop's client (connections belong to a loop), made on its first call."""
        from musacoder.service.client import AsyncVerifierClient

        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._clients.get(loop)
            if client is None:
                client = self._clients[loop] = AsyncVerifierClient(self.url, self.token, concurrency=self.concurrency)
        return client

    def close(self) -> None:
        """Close every client on the loop it was opened on (a loop already closed took its connections along)."""
        with self._lock:
            clients, self._clients = list(self._clients.items()), weakref.WeakKeyDictionary()
        for loop, client in clients:
            try:
                if loop.is_running():
                    asyncio.run_coroutine_threadsafe(client.aclose(), loop)
                elif not loop.is_closed():
                    loop.run_until_complete(client.aclose())
            except RuntimeError:  # a loop closing under us: its connections go with it
                pass


def get_verifier(config: VerifyConfig | None = None, url: str | None = None, token: str | None = None,
                 concurrency: int = 64) -> Verifier:
    """The verifier for these settings: the service at `url` when given, else a pool in this process with `config`.
    One `RemoteVerifier` per service, token, concurrency and config in a process (like the pools), closed at exit
    (close_pools)."""
    if not url:
        return LocalVerifier(config)
    config = config if config is not None else VerifyConfig()
    key = (url, token, concurrency, repr(sorted(config.to_dict().items())))
    with _pools_lock:
        if key not in _remotes:
            _remotes[key] = RemoteVerifier(url, token, config, concurrency)
        return _remotes[key]

