"""OpenAI-compatible chat completions (vLLM, SGLang, hosted APIs) over async httpx."""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import httpx

from musacoder.bench.clients.base import Client, Generation, Request

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}  # transient; other 4xx are the request's fault


@dataclass
class OpenAIConfig:
    base_url: str = "http://localhost:8000/v1"  # vLLM's and SGLang's default OpenAI route
    concurrency: int = 16  # requests in flight
    retries: int = 4  # extra attempts after the first
    backoff_s: float = 2.0  # first retry delay, doubled each time (with jitter), capped at 60 s
    timeout_s: float = 1800.0  # per request: a 32K-token reasoning answer can take many minutes
    connect_timeout_s: float = 10.0
    # After this many consecutive requests end unreachable, skip the rest (recorded as errors, retried next run)
    # instead of spending every request's full retry budget against a dead server.
    dead_after: int = 4
    api_key: str | None = None  # default: $OPENAI_API_KEY


class Transient(Exception):
    """A failure worth retrying (5xx, 429, malformed body)."""


async def _drain(cancelled: set, http: httpx.AsyncClient) -> None:
    await asyncio.gather(*cancelled, return_exceptions=True)
    await http.aclose()


class OpenAIClient(Client):
    def __init__(self, model: str, config: OpenAIConfig | None = None):
        self.model = self.model_id = model
        self.cfg = config or OpenAIConfig()
        self._failed_in_a_row = 0

    def generate(self, requests: Sequence[Request]) -> Iterator[tuple[int, Generation]]:
        # A private event loop stepped from this (sync) generator, so results stream out as they complete.
        loop = asyncio.new_event_loop()
        http = loop.run_until_complete(self._open())
        sem = asyncio.Semaphore(self.cfg.concurrency)
        self._failed_in_a_row = 0
        jobs = {loop.create_task(self._limited(sem, http, r)): i for i, r in enumerate(requests)}
        pending = set(jobs)
        try:
            while pending:
                done, pending = loop.run_until_complete(asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED))
                for job in done:
                    yield jobs[job], job.result()
        finally:
            for job in pending:  # the consumer stopped early: drop what is still in flight
                job.cancel()
            loop.run_until_complete(_drain(pending, http))
            loop.close()

    async def _open(self) -> httpx.AsyncClient:
        key = self.cfg.api_key or os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        timeout = httpx.Timeout(self.cfg.timeout_s, connect=self.cfg.connect_timeout_s)
        limits = httpx.Limits(max_connections=self.cfg.concurrency)
        return httpx.AsyncClient(base_url=self.cfg.base_url.rstrip("/") + "/", headers=headers, timeout=timeout,
                                 limits=limits)

    async def _limited(self, sem: asyncio.Semaphore, http: httpx.AsyncClient, req: Request) -> Generation:
        async with sem:
            return await self.complete(http, req)

    async def complete(self, http: httpx.AsyncClient, req: Request) -> Generation:
        """One chat completion with retries; never raises."""
        body = {"model": self.model, "messages": req.messages, "temperature": req.temperature, "top_p": req.top_p,
                "max_tokens": req.max_tokens, "seed": req.seed}
        t0 = time.perf_counter()
        error = ""
        for attempt in range(1, self.cfg.retries + 2):
            if self._failed_in_a_row >= self.cfg.dead_after:
                return Generation(error=f"skipped: server unreachable ({error or 'earlier requests failed'})",
                                  seconds=time.perf_counter() - t0, attempts=attempt - 1)
            try:
                gen = await self._post(http, body)
                self._failed_in_a_row = 0
                gen.seconds, gen.attempts = time.perf_counter() - t0, attempt
                return gen
            except Transient as e:
                error = str(e)
            except httpx.TransportError as e:  # refused, reset, timed out
                error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            if attempt <= self.cfg.retries:
                delay = min(60.0, self.cfg.backoff_s * 2 ** (attempt - 1))
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
        self._failed_in_a_row += 1
        return Generation(error=error, seconds=time.perf_counter() - t0, attempts=self.cfg.retries + 1)

    async def _post(self, http: httpx.AsyncClient, body: dict) -> Generation:
        r = await http.post("chat/completions", json=body)
        if r.status_code in RETRY_STATUS:
            raise Transient(f"HTTP {r.status_code}: {r.text[:300]}")
        if r.status_code != 200:  # not transient: give up on this request now
            return Generation(error=f"HTTP {r.status_code}: {r.text[:1000]}")
        try:
            data = r.json()
            choice = data["choices"][0]
            msg = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise Transient(f"malformed response ({e!r}): {r.text[:300]}") from e
        text = msg.get("content") or ""
        # vLLM/SGLang reasoning parsers move the thinking out of `content`; keep it, marked so extraction skips it
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        if reasoning:
            text = f"<think>{reasoning}</think>{text}"
        usage = data.get("usage") or {}
        return Generation(text=text, prompt_tokens=usage.get("prompt_tokens"),
                          completion_tokens=usage.get("completion_tokens"), finish_reason=choice.get("finish_reason"))
