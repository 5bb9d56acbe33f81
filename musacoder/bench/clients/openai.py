"""OpenAI-compatible chat completions (vLLM, SGLang, llama.cpp, hosted APIs) through the `openai` library, each
request fitted into the server's context window. Transient failures are retried by tenacity, not by the SDK: the SDK
would also re-send a request that timed out, whose answer would take as long again."""

from __future__ import annotations

import asyncio
import email.utils
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import httpx
import openai
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, stop_any, wait_random_exponential

from musacoder import conversation
from musacoder.bench.clients.base import Client, Generation, Request

RETRY_STATUS = {408, 409, 425, 429}  # and every 5xx: transient. Other 4xx (400 context length, 404 model, 422) are
# the request's fault and fail the same way again: recorded at once.
MAX_RETRY_AFTER_S = 120.0


@dataclass
class OpenAIConfig:
    base_url: str = "http://localhost:8000/v1"  # vLLM's and SGLang's default OpenAI route
    concurrency: int = 16  # requests in flight
    retries: int = 4  # extra attempts after the first, for 429, 5xx and connection errors
    backoff_s: float = 2.0  # retry delays when the server names none (Retry-After): random, up to this doubled
    # each retry, capped at 60 s
    # Per request, the whole answer (answers are not streamed: transformers serve refuses `stream_options`, without
    # which vLLM streams no token counts). A timeout is not retried: the answer would take as long again.
    timeout_s: float = 1800.0
    connect_timeout_s: float = 10.0
    # After this many consecutive requests fail for good, skip the rest (recorded as errors, retried next run) and
    # set `fatal`, instead of spending every request's full retry budget against a dead server.
    dead_after: int = 4
    max_model_len: int | None = None  # the model's context in tokens; None: ask the server (no budget if it won't say)
    extra_body: dict | None = None  # server-specific request fields, e.g. {"top_k": 20} for vLLM/SGLang
    api_key: str | None = None  # default: $OPENAI_API_KEY


def _retry_after(headers) -> float | None:
    """Seconds the server asks us to wait (Retry-After as seconds or an HTTP date, or retry-after-ms)."""
    try:
        if ms := headers.get("retry-after-ms"):
            return float(ms) / 1000
        if value := headers.get("retry-after"):
            try:
                return float(value)
            except ValueError:
                return email.utils.parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError):
        pass
    return None


class MalformedResponse(Exception):
    """The server answered, but not with a chat completion."""


def _transient(e: BaseException) -> bool:
    """Worth sending again: 429 / 408 / 409 / 425 and 5xx, a refused or reset connection, a malformed answer. A
    timeout is not (the answer would take as long again), nor another 4xx (the request's own fault)."""
    if isinstance(e, openai.APITimeoutError):
        return False
    if isinstance(e, openai.APIStatusError):
        return e.status_code >= 500 or e.status_code in RETRY_STATUS
    return isinstance(e, (openai.APIConnectionError, openai.APIError, MalformedResponse))


def _wait(backoff_s: float):
    """The server's Retry-After when it sends one (at most MAX_RETRY_AFTER_S), else a random exponential backoff."""
    backoff = wait_random_exponential(multiplier=backoff_s, max=60.0)

    def wait(state) -> float:
        e = state.outcome.exception()
        after = _retry_after(e.response.headers) if isinstance(e, openai.APIStatusError) else None
        return backoff(state) if after is None or after < 0 else min(after, MAX_RETRY_AFTER_S)
    return wait


def _detail(e: openai.APIStatusError) -> str:
    """The server's own message (vLLM: {"message"}, OpenAI: {"error": {"message"}}), else the body as sent."""
    body = e.body.get("error", e.body) if isinstance(e.body, dict) else None
    msg = body.get("message") if isinstance(body, dict) else body
    return str(msg or e.response.text)[:1000]


async def _shutdown(rest: set, api: openai.AsyncOpenAI, http: httpx.AsyncClient) -> None:
    for job in rest:
        job.cancel()
    await asyncio.gather(*rest, api.close(), http.aclose(), return_exceptions=True)


class OpenAIClient(Client):
    def __init__(self, model: str, config: OpenAIConfig | None = None):
        self.model = self.model_id = model
        self.cfg = config or OpenAIConfig()
        self.context_len = self.cfg.max_model_len  # asked of the server on first use when not given
        self._probed = False
        self._tokenize: bool | None = None  # whether the server counts tokens for us (None: not tried yet)
        self._failed_in_a_row = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._jobs: set = set()

    @property
    def root(self) -> str:
        """The server without the /v1 suffix: vLLM's /tokenize and llama.cpp's /props live there."""
        url = self.cfg.base_url.rstrip("/")
        return url.removesuffix("/v1")

    def generate(self, requests: Sequence[Request]) -> Iterator[tuple[int, Generation]]:
        # A private event loop stepped from this (sync) generator, so results stream out as they complete.
        loop = self._loop = asyncio.new_event_loop()
        key = self.cfg.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"  # local servers take any key
        api = openai.AsyncOpenAI(base_url=self.cfg.base_url, api_key=key, max_retries=0,  # `complete` retries
                                 timeout=openai.Timeout(self.cfg.timeout_s, connect=self.cfg.connect_timeout_s))
        http = httpx.AsyncClient(timeout=self.cfg.connect_timeout_s, headers={"Authorization": f"Bearer {key}"})
        sem = asyncio.Semaphore(self.cfg.concurrency)
        try:
            if not self._probed:
                loop.run_until_complete(self._probe(http))
            jobs = {loop.create_task(self._limited(sem, api, http, r)): i for i, r in enumerate(requests)}
            self._jobs = pending = set(jobs)
            while pending:  # waking every second: a Ctrl-C that lands on another thread raises here only then
                done, pending = loop.run_until_complete(asyncio.wait(pending, timeout=1.0,
                                                                     return_when=asyncio.FIRST_COMPLETED))
                for job in done:
                    if not job.cancelled():  # cancelled: `cancel()` was called, the consumer is gone
                        yield jobs[job], job.result()
        finally:  # finished, the consumer stopped early, or Ctrl-C: drop what is still in flight, at once
            loop.run_until_complete(_shutdown(asyncio.all_tasks(loop), api, http))
            self._loop, self._jobs = None, set()
            loop.close()

    def cancel(self) -> None:
        """From another thread: cancel the requests in flight; `generate` then ends without yielding them."""
        loop = self._loop
        try:
            if loop is not None:
                loop.call_soon_threadsafe(lambda: [job.cancel() for job in self._jobs])
        except RuntimeError:  # the loop closed meanwhile: nothing left to cancel
            pass

    async def _probe(self, http: httpx.AsyncClient) -> None:
        """The context length from /v1/models (vLLM: max_model_len; others: context_length, max_context_length) or
        llama.cpp's /props (n_ctx), unless given."""
        self._probed = True
        if self.context_len:
            return
        try:
            r = await http.get(f"{self.cfg.base_url.rstrip('/')}/models")
            r.raise_for_status()
            models = r.json()["data"]
            for m in models:
                if m.get("id") == self.model or len(models) == 1:
                    n = next((m[k] for k in ("max_model_len", "context_length", "max_context_length")
                              if isinstance(m.get(k), int)), None)
                    if n:
                        self.context_len = n
                        return
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            pass
        try:
            r = await http.get(f"{self.root}/props")
            r.raise_for_status()
            props = r.json()
            n = (props.get("default_generation_settings") or {}).get("n_ctx") or props.get("n_ctx")
            self.context_len = n if isinstance(n, int) and n > 0 else None
        except (httpx.HTTPError, ValueError, TypeError, AttributeError):
            pass

    async def count_tokens(self, http: httpx.AsyncClient, messages: list) -> int | None:
        """The exact prompt length from the server's /tokenize (vLLM, SGLang), chat template applied; None without."""
        if self._tokenize is False:
            return None
        try:
            r = await http.post(f"{self.root}/tokenize", json={"model": self.model, "messages": messages,
                                                               "add_generation_prompt": True})
            r.raise_for_status()
            data = r.json()
            n = data["count"] if isinstance(data.get("count"), int) else len(data["tokens"])
            self._tokenize = True
            return n
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            if self._tokenize is None:
                self._tokenize = False  # it has no such route: estimate from now on
            return None

    async def _fit(self, http: httpx.AsyncClient, req: Request) -> tuple[list, int, int | None]:
        """(messages, max_tokens, prompt tokens) that fit the context; raises conversation.BudgetError."""
        if not self.context_len:
            return req.messages, req.max_tokens, None
        exact = await self.count_tokens(http, req.messages)
        # With an exact count, scale the estimate to it, so the cut (which needs many counts) is about right.
        scale = exact / conversation.estimate_tokens(req.messages) if exact else 1.0
        msgs, max_tokens = conversation.fit_prompt(req.messages, self.context_len, req.max_tokens,
                                              lambda m: math.ceil(conversation.estimate_tokens(m) * scale - 1e-6))
        if msgs == req.messages:  # nothing cut: with an exact count, max_tokens is exact too
            return req.messages, max_tokens, exact
        n = await self.count_tokens(http, msgs) if exact else None
        if n:  # the cut prompt's exact length decides the answer room
            max_tokens = min(req.max_tokens, self.context_len - n)
            if max_tokens < 1:
                raise conversation.BudgetError(f"the prompt is {n} tokens with earlier answers cut; the model's "
                                               f"context is {self.context_len}")
        return msgs, max_tokens, n

    async def _limited(self, sem: asyncio.Semaphore, api: openai.AsyncOpenAI, http: httpx.AsyncClient,
                       req: Request) -> Generation:
        async with sem:
            t0 = time.perf_counter()
            try:
                msgs, max_tokens, n = await self._fit(http, req)
            except conversation.BudgetError as e:
                return Generation(error=f"prompt does not fit: {e}", attempts=0)
            gen = await self.complete(api, req, msgs, max_tokens)
            gen.seconds = time.perf_counter() - t0
            gen.prompt_tokens = gen.prompt_tokens or n
            if msgs is not req.messages:
                gen.messages = msgs
            return gen

    async def complete(self, api: openai.AsyncOpenAI, req: Request, messages: list, max_tokens: int) -> Generation:
        """One chat completion with retries (`_transient` failures, `cfg.retries` of them); never raises (but for
        cancellation). Once `dead_after` requests in a row failed for good, the rest are skipped at once."""
        if self._failed_in_a_row >= self.cfg.dead_after:
            return Generation(error=f"skipped: server unreachable ({self.fatal or 'earlier requests failed'})",
                              attempts=0)
        attempts = 0
        try:
            # stop retrying as soon as other requests found the server gone
            gone = lambda state: self._failed_in_a_row >= self.cfg.dead_after  # noqa: E731
            async for attempt in AsyncRetrying(stop=stop_any(stop_after_attempt(self.cfg.retries + 1), gone),
                                               wait=_wait(self.cfg.backoff_s), retry=retry_if_exception(_transient),
                                               reraise=True):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    r = await api.chat.completions.create(
                        model=self.model, messages=messages, temperature=req.temperature, top_p=req.top_p,
                        max_tokens=max_tokens, seed=req.seed, extra_body=self.cfg.extra_body)
                    try:
                        choice = r.choices[0]
                        msg = choice.message
                    except (TypeError, IndexError, AttributeError) as e:
                        raise MalformedResponse(repr(e)) from e
        except openai.APITimeoutError:
            return Generation(error=f"APITimeoutError: no answer within {self.cfg.timeout_s:g} s "
                                    "(--request-timeout)", attempts=attempts)
        except openai.APIStatusError as e:
            if not _transient(e):
                return Generation(error=f"HTTP {e.status_code}: {_detail(e)}", attempts=attempts)
            return self._failed(f"HTTP {e.status_code}: {_detail(e)[:300]}", attempts, unreachable=False)
        except openai.APIConnectionError as e:  # refused, reset
            cause = e.__cause__ or e
            return self._failed(f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__, attempts,
                                unreachable=True)
        except (openai.APIError, MalformedResponse) as e:
            return self._failed(f"malformed response: {e!r}"[:300], attempts, unreachable=False)
        self._failed_in_a_row, self.fatal = 0, None
        text = msg.content or ""
        # vLLM/SGLang reasoning parsers move the thinking out of `content`; keep it, marked so extraction skips it
        reasoning = getattr(msg, "reasoning_content", None) or getattr(msg, "reasoning", None)
        if isinstance(reasoning, str) and reasoning:
            text = f"<think>{reasoning}</think>{text}"
        usage = r.usage
        return Generation(text=text, prompt_tokens=usage and usage.prompt_tokens, attempts=attempts,
                          completion_tokens=usage and usage.completion_tokens, finish_reason=choice.finish_reason)

    def _failed(self, error: str, attempts: int, unreachable: bool) -> Generation:
        """A request that failed after its retries: after `dead_after` in a row, or a server refusing connections
        every time, the server is taken for gone (`fatal`)."""
        self._failed_in_a_row += 1
        if unreachable or self._failed_in_a_row >= self.cfg.dead_after:
            self.fatal = f"the model server at {self.cfg.base_url} is not answering ({error})"
        return Generation(error=error, attempts=attempts)
