"""Async client of the reward service, for RL reward functions.

Resubmitting is always safe (the service dedupes by task + code + config), so every transient failure is handled
the same way: back off (tenacity), then submit again. Verdict-level answers (401, 413, 422...) are never retried.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from musacoder.tasks.model import Task
from musacoder.verifier.verdict import Verdict

RETRY_STATUS = {429, 502, 503, 504}


class VerifierError(RuntimeError):
    """The service refused the request, or could not be reached within the retries."""


class _Busy(Exception):
    """A 429/502/503/504 answer: sent again after a while."""

    def __init__(self, r: httpx.Response):
        super().__init__(f"HTTP {r.status_code}: {_detail(r)}")
        self.retry_after = r.headers.get("Retry-After", "")


def _task_json(task: Task | dict) -> dict:
    if isinstance(task, dict):
        return task
    return {"name": task.name, "code": task.code, "level": task.level, "problem_id": task.problem_id}


class AsyncVerifierClient:
    def __init__(self, base_url: str, token: str | None = None, concurrency: int = 64, retries: int = 6,
                 timeout: float = 3600.0, poll_s: float = 30.0, backoff_s: float = 0.5, max_backoff_s: float = 30.0):
        """`concurrency`: verifications in flight at once; `retries`: attempts after the first for each request;
        `timeout`: seconds one verification may take, server-side queueing included; `poll_s`: long-poll length."""
        self.base_url, self.retries, self.timeout, self.poll_s = base_url.rstrip("/"), retries, timeout, poll_s
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # the read timeout outlasts a long poll, which the server holds for up to poll_s
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers,
                                       timeout=httpx.Timeout(poll_s + 30, connect=10),
                                       limits=httpx.Limits(max_connections=concurrency))
        self._sem = asyncio.Semaphore(concurrency)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    async def aclose(self):
        await self._http.aclose()

    async def verify(self, task: Task | dict, candidate: str) -> Verdict:
        """One verdict; raises VerifierError if the service refuses the request or stays unreachable."""
        async with self._sem:
            try:
                return await asyncio.wait_for(self._verify(_task_json(task), candidate), self.timeout)
            except asyncio.TimeoutError:
                raise VerifierError(f"no verdict from {self.base_url} within {self.timeout:g}s") from None

    async def verify_many(self, pairs: Iterable[tuple[Task | dict, str]]) -> list[Verdict]:
        """Verdicts in the order of `pairs`, at most `concurrency` in flight; the first error cancels the rest."""
        tasks = [asyncio.ensure_future(self.verify(t, c)) for t, c in pairs]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            raise

    async def _verify(self, task: dict, candidate: str) -> Verdict:
        body = {"task": task, "candidate": candidate}
        r = await self._request("POST", "/v1/jobs", json=body, params={"wait": self.poll_s})
        while r.status_code == 202:
            jid = r.json()["job_id"]
            r = await self._request("GET", f"/v1/jobs/{jid}", params={"wait": self.poll_s}, ok={404})
            if r.status_code == 404:  # the service restarted before this job finished: submit it again
                r = await self._request("POST", "/v1/jobs", json=body, params={"wait": self.poll_s})
        return Verdict.from_dict(r.json()["verdict"])

    async def _request(self, method: str, path: str, ok: set[int] = frozenset(), **kw) -> httpx.Response:
        """One request with retries on connection errors and 429/502/503/504; raises VerifierError otherwise."""
        backoff = wait_random_exponential(multiplier=self.backoff_s, max=self.max_backoff_s)

        def wait(state) -> float:
            e = state.outcome.exception()
            if isinstance(e, _Busy) and e.retry_after.isdigit():
                # the server says when; jitter so a crowd of clients does not return at once
                return min(self.max_backoff_s, float(e.retry_after)) * random.uniform(1.0, 1.5)
            return backoff(state)

        attempts = 0
        try:
            async for attempt in AsyncRetrying(stop=stop_after_attempt(self.retries + 1), wait=wait, reraise=True,
                                               retry=retry_if_exception_type((httpx.TransportError, _Busy))):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    r = await self._http.request(method, path, **kw)
                    if r.status_code < 400 or r.status_code in ok:
                        return r
                    if r.status_code in RETRY_STATUS:
                        raise _Busy(r)
                    raise VerifierError(f"{method} {self.base_url}{path}: HTTP {r.status_code}: {_detail(r)}")
        except httpx.TransportError as e:
            last = f"{type(e).__name__}: {e}"
        except _Busy as e:
            last = str(e)
        raise VerifierError(f"{method} {self.base_url}{path} failed after {attempts} attempts: {last}")


def _detail(r: httpx.Response) -> str:
    try:
        return str(r.json().get("detail", r.text))[:500]
    except ValueError:
        return r.text[:500]


def verify_batch(pairs: Iterable[tuple[Task | dict, str]], base_url: str, token: str | None = None,
                 **client_kw) -> list[Verdict]:
    """Blocking form for reward functions that are plain functions; works inside a running event loop too."""
    pairs = list(pairs)

    async def run():
        async with AsyncVerifierClient(base_url, token, **client_kw) as client:
            return await client.verify_many(pairs)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run())
    # called from inside a loop (e.g. an async trainer calling a sync hook): run ours in a private thread
    with ThreadPoolExecutor(1, thread_name_prefix="musacoder-verify") as ex:
        return ex.submit(asyncio.run, run()).result()
