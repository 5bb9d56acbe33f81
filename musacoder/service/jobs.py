"""Jobs between HTTP and the pool: idempotent ids, the bounded queue, hand-over to the pool off the event loop, and
waking waiters when verdicts land.

Only unfinished jobs live in memory; finished verdicts are read back from the store, so memory stays flat however
long the service runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from starlette.concurrency import run_in_threadpool

from musacoder.candidates import ExtractionError, extract_code
from musacoder.service.settings import ServiceSettings
from musacoder.service.store import VerdictStore
from musacoder.tasks.model import Task
from musacoder.verifier.pipeline import unusable
from musacoder.verifier.verdict import Status, Verdict
from musacoder.version import __version__

log = logging.getLogger("musacoder.service")


class QueueFull(Exception):
    """The submission would put more than max_queue jobs in flight; `retryable` is False when it never can fit."""

    def __init__(self, message: str, retryable: bool):
        super().__init__(message)
        self.retryable = retryable


class UnknownJob(KeyError):
    pass


@dataclass
class Entry:
    job_id: str
    task: Task
    accepted: float = field(default_factory=time.monotonic)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    verdict: Verdict | None = None


def job_id(task: Task, candidate: str, config: dict, backend: str) -> str:
    """Same task + same code + same verifier settings + same musacoder = same job. The extracted code is hashed, so
    two model outputs that differ only in their prose share a verdict; the task's key is in too, since the verdict
    names it."""
    try:
        code = extract_code(candidate)
    except ExtractionError:
        code = candidate
    payload = json.dumps([task.key, task.code, code, config, backend, __version__], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


class JobManager:
    def __init__(self, pool, store: VerdictStore, settings: ServiceSettings,
                 on_verdict: Callable[[Verdict, float], None]):
        self.pool, self.store, self.settings = pool, store, settings
        self._on_verdict = on_verdict
        self._config = {k: v for k, v in pool.cfg.to_dict().items() if k != "cache_dir"}  # where builds live
        self._pending: dict[str, Entry] = {}  # changes only on the event loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dispatch: ThreadPoolExecutor | None = None

    def start(self):
        """Bind to the running event loop (call from the app's lifespan)."""
        self._loop = asyncio.get_running_loop()
        self._dispatch = ThreadPoolExecutor(self.settings.dispatch_threads, thread_name_prefix="musacoder-dispatch")

    def stop(self):
        self._dispatch.shutdown(wait=False, cancel_futures=True)

    @property
    def queue_length(self) -> int:
        return len(self._pending)

    async def submit(self, items: list[tuple[Task, str]]) -> list[tuple[str, Verdict | None, bool]]:
        """Accept all items or none; -> (job id, verdict or None while it runs, whether it was already known)."""
        ids, stored = await run_in_threadpool(self._lookup, items)
        # No await from here on: the capacity check and the registration are atomic on the event loop. (A job that
        # finished during the lookup is only run again, to the same verdict.)
        new: dict[str, tuple[Task, str]] = {}
        for jid, (task, cand) in zip(ids, items):
            if jid not in self._pending and jid not in stored:
                new.setdefault(jid, (task, cand))
        limit = self.settings.max_queue
        if len(new) > limit:
            raise QueueFull(f"{len(new)} new jobs in one request exceed max_queue {limit}; split the batch", False)
        if new and len(self._pending) + len(new) > limit:
            raise QueueFull(f"queue full: {len(self._pending)} accepted jobs are unfinished and this request adds "
                            f"{len(new)} (max_queue {limit}); retry later", True)
        for jid, (task, cand) in new.items():
            entry = self._pending[jid] = Entry(jid, task)
            self._dispatch.submit(self._hand_over, entry, cand)
        return [(jid, stored.get(jid), jid not in new) for jid in ids]

    async def wait(self, jid: str, timeout: float | None) -> Verdict | None:
        """The verdict, waiting up to `timeout` seconds (None: until done); None if still running."""
        entry = self._pending.get(jid)
        if entry is None:
            verdict = await run_in_threadpool(self.store.get, jid)
            if verdict is None:
                raise UnknownJob(jid)
            return verdict
        if timeout != 0:
            try:
                await asyncio.wait_for(entry.done.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        return entry.verdict

    async def stream(self, job_ids: list[str]) -> AsyncIterator[tuple[int, str, Verdict | None]]:
        """(index, job id, verdict) in completion order; verdict None for a job this service does not know."""
        async def one(i: int, jid: str):
            try:
                return i, jid, await self.wait(jid, None)
            except UnknownJob:
                return i, jid, None

        for nxt in asyncio.as_completed([one(i, jid) for i, jid in enumerate(job_ids)]):
            yield await nxt

    # ---- worker threads -----------------------------------------------------------------------------------------
    def _lookup(self, items: list[tuple[Task, str]]) -> tuple[list[str], dict[str, Verdict]]:
        ids = [job_id(t, c, self._config, self.pool.backend) for t, c in items]
        stored = {jid: v for jid in set(ids) if (v := self.store.get(jid, reusable=True)) is not None}
        return ids, stored

    def _hand_over(self, entry: Entry, candidate: str):
        try:
            fut = self.pool.submit(entry.task, candidate)
        except Exception as e:  # the pool itself failed (e.g. lost its cluster): a verdict, never a hang
            return self._finished(entry, self._infra(entry, f"the pool refused the job: {e!r}"))
        fut.add_done_callback(lambda f: self._finished(entry, self._result(entry, f)))

    def _result(self, entry: Entry, fut: Future) -> Verdict:
        try:
            return fut.result()
        except Exception as e:
            return self._infra(entry, f"the verifier failed: {e!r}")

    def _infra(self, entry: Entry, reason: str) -> Verdict:
        return unusable(reason, task=entry.task.key, status=Status.INFRA_ERROR, backend=self.pool.backend)

    def _finished(self, entry: Entry, verdict: Verdict):
        try:  # stored before the job leaves memory, so a poll always finds it in one place or the other
            self.store.put(entry.job_id, verdict)
        except Exception:
            log.exception("could not store the verdict of job %s", entry.job_id)
        try:
            self._loop.call_soon_threadsafe(self._wake, entry, verdict)
        except RuntimeError:  # the loop is closed: the service is shutting down
            pass

    def _wake(self, entry: Entry, verdict: Verdict):
        entry.verdict = verdict
        self._pending.pop(entry.job_id, None)
        entry.done.set()
        self._on_verdict(verdict, time.monotonic() - entry.accepted)
