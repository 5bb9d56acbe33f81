"""The async client against the real service behind a real uvicorn server on a loopback port. Failures the real
service does not produce on demand (503, 429 bursts) come from `Flaky`, a test wrapper that answers the first
requests itself and passes the rest to the real app."""

import asyncio
import socket
import threading
import time
from contextlib import contextmanager

import pytest
import uvicorn
from test_service import ILLEGAL, NO_CODE, RELU, TOKEN, pool  # noqa: F401  (pool: the module fixture)

from musacoder.examples_catalog import EXAMPLES_DIR
from musacoder.service.app import create_app
from musacoder.service.client import AsyncVerifierClient, VerifierError, verify_batch
from musacoder.service.settings import ServiceSettings


@contextmanager
def serving(app):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


class Flaky:
    """Answers the first requests with the given (status, headers), then hands every request to `app`."""

    def __init__(self, app, answers):
        self.app, self.answers, self.seen = app, list(answers), 0

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            self.seen += 1
            if self.answers:
                status, headers = self.answers.pop(0)
                await send({"type": "http.response.start", "status": status,
                            "headers": [(k.encode(), v.encode()) for k, v in headers.items()]})
                return await send({"type": "http.response.body", "body": b"busy"})
        await self.app(scope, receive, send)


@pytest.fixture
def service(pool, tmp_path):  # noqa: F811
    def make(answers=()):
        return Flaky(create_app(pool, ServiceSettings(token=TOKEN, db_path=tmp_path / "v.sqlite")), answers)
    return make


@pytest.mark.asyncio
async def test_verify_many_keeps_order_under_a_concurrency_limit(service):
    flaky = service()
    pairs = [(RELU, f"{NO_CODE} {i}" if i % 2 else ILLEGAL.replace("pass", f"x = {i}")) for i in range(12)]
    with serving(flaky) as url:
        async with AsyncVerifierClient(url, token=TOKEN, concurrency=3) as client:
            verdicts = await client.verify_many(pairs)
    assert [v.status.value for v in verdicts] == ["illegal" if i % 2 == 0 else "format_error" for i in range(12)]
    assert all(v.task == "level1/19_ReLU" for v in verdicts)
    assert len({v.candidate_hash for v in verdicts[::2]}) == 6  # each even pair got its own verdict


@pytest.mark.asyncio
async def test_a_remote_verifier_keeps_one_client_for_its_loop_and_closes_it(service):
    """api.get_verifier's service side: the verdicts in order, an unusable pair answered here (never sent), and one
    client with its connections across calls on a loop, not one a call; a caller on another loop (a thread of its own)
    gets its own and leaves this loop's open."""
    from musacoder.api import RemoteVerifier, get_verifier

    flaky = service()
    with serving(flaky) as url:
        v = get_verifier(url=url, token=TOKEN)
        assert isinstance(v, RemoteVerifier) and get_verifier(url=url, token=TOKEN) is v
        first = await v.verdicts_async([(RELU, NO_CODE), (42, NO_CODE), (RELU, ILLEGAL)])
        client = v._clients[asyncio.get_running_loop()]
        second = await v.verdicts_async([(RELU, ILLEGAL)])
        assert v._clients[asyncio.get_running_loop()] is client and flaky.seen == 3  # the unusable pair: not sent
        assert [x.status.value for x in first + second] == ["format_error", "format_error", "illegal", "illegal"]
        assert "unusable input" in first[1].reason
        other = await asyncio.to_thread(asyncio.run, v.verdicts_async([(RELU, NO_CODE)]))
        assert other[0].status.value == "format_error" and not client._http.is_closed
        assert v._clients[asyncio.get_running_loop()] is client
        v.close()
        for _ in range(100):  # the close runs on this (running) loop, scheduled
            if client._http.is_closed:
                break
            await asyncio.sleep(0.01)
        assert client._http.is_closed and len(v._clients) == 0


@pytest.mark.asyncio
async def test_retries_503_and_429_honouring_retry_after(service):
    flaky = service([(503, {}), (502, {}), (429, {"Retry-After": "1"})])
    with serving(flaky) as url:
        async with AsyncVerifierClient(url, token=TOKEN, retries=3, backoff_s=0.05) as client:
            t = time.monotonic()
            v = await client.verify(RELU, NO_CODE)
            elapsed = time.monotonic() - t
    assert v.status.value == "format_error"
    assert flaky.seen == 4 and 1.0 <= elapsed < 5


@pytest.mark.asyncio
async def test_gives_up_with_the_last_error_when_retries_run_out(service):
    flaky = service([(503, {})] * 5)
    with serving(flaky) as url:
        async with AsyncVerifierClient(url, token=TOKEN, retries=2, backoff_s=0.01) as client:
            with pytest.raises(VerifierError, match="after 3 attempts: HTTP 503"):
                await client.verify(RELU, NO_CODE)
    assert flaky.seen == 3


@pytest.mark.asyncio
async def test_verdict_level_errors_are_not_retried(service):
    flaky = service()
    with serving(flaky) as url:
        async with AsyncVerifierClient(url, token="wrong", retries=5) as client:
            with pytest.raises(VerifierError, match="HTTP 401: missing or wrong bearer token"):
                await client.verify(RELU, NO_CODE)
        async with AsyncVerifierClient(url, token=TOKEN, retries=5) as client:
            with pytest.raises(VerifierError, match="HTTP 422: .*missing Model"):
                await client.verify({"name": "bad", "code": "x = 1\n"}, NO_CODE)
    assert flaky.seen == 2


@pytest.mark.asyncio
async def test_dead_server_is_a_clear_error_after_the_retries():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    async with AsyncVerifierClient(url, retries=2, backoff_s=0.05) as client:
        t = time.monotonic()
        with pytest.raises(VerifierError, match=r"POST http://127\.0\.0\.1:\d+/v1/jobs failed after 3 attempts: "
                                                r"ConnectError"):
            await client.verify(RELU, NO_CODE)
    assert time.monotonic() - t < 5


def test_verify_batch_from_plain_code_and_from_inside_a_running_loop(service):
    with serving(service()) as url:
        assert [v.status.value for v in verify_batch([(RELU, NO_CODE)], url, token=TOKEN)] == ["format_error"]

        async def reward_hook():  # a sync reward function called by an async trainer
            return verify_batch([(RELU, ILLEGAL), (RELU, NO_CODE)], url, token=TOKEN)
        assert [v.status.value for v in asyncio.run(reward_hook())] == ["illegal", "format_error"]


@pytest.mark.asyncio
async def test_an_honest_kernel_passes_through_the_service(service):
    honest = (EXAMPLES_DIR / "cpu/honest_relu.py").read_text()
    with serving(service()) as url:
        async with AsyncVerifierClient(url, token=TOKEN, poll_s=2) as client:  # short polls: several 202 rounds
            verdict, again = await client.verify_many([(RELU, honest), (RELU, "```python\n" + honest + "```")])
    assert verdict.status.value == "ok" and verdict.trials_passed == verdict.trials_total > 0
    assert again.to_dict() == verdict.to_dict()  # the same code in a model's answer: the same job


def test_rl_rollout_verifies_through_the_service(service):
    """`verifier_url` in an RL config: the rollout gets its verdicts and feedback turns from the service."""
    from test_episode import Scripted

    from musacoder.api import get_verifier
    from musacoder.conversation import task_messages
    from musacoder.episode import Episode, run_episodes

    eng = Scripted({0: NO_CODE, 1: ILLEGAL})
    with serving(service()) as url:
        verifier = get_verifier(url=url, token=TOKEN)
        t = Episode(RELU, task_messages(RELU, "cpu", one_shot=False), max_turns=2)
        st = run_episodes([t], eng.generate, verifier.verdicts)
    assert [x.status for x in t.rounds] == ["format_error", "illegal"] and t.scores == [-1.0, -1.0]
    assert eng.seen[1][0][3]["content"].startswith("=== System Feedback for Round 1 ===\nStatus: format_error")
    assert st.responses == 2 and st.verify_s > 0
