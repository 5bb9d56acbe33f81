"""The rewards' HTTP path (`MUSACODER_VERIFIER_URL` set): `trl_reward` and `compute_score`, sync and async, against a
real `musacoder serve` app (uvicorn on 127.0.0.1 in a thread, with a bearer token) on the cpu backend. Candidates: a
format error and the shipped honest ReLU (its build is shared with the other ecosystem tests)."""

import asyncio
import socket
import threading
import time
from pathlib import Path

import pytest
import uvicorn

from musacoder import rewards
from musacoder.api import get_pool, verify
from musacoder.config import VerifyConfig
from musacoder.service.app import create_app
from musacoder.service.client import VerifierError
from musacoder.service.settings import ServiceSettings
from musacoder.tasks import builtin_task

RELU = builtin_task("level1/19_ReLU")
HONEST = (Path(rewards.__file__).parent / "examples" / "cpu" / "honest_relu.py").read_text()
NO_CODE = "I could not write this kernel."
TOKEN = "s3cret"


@pytest.fixture(scope="module")
def server(cache_dir):
    """`musacoder serve` as the command runs it (uvicorn around create_app), on a free loopback port."""
    cfg = VerifyConfig(backend="cpu", cache_dir=cache_dir, timing_enabled=False)
    app = create_app(get_pool(cfg), ServiceSettings(token=TOKEN, db_path=Path(cache_dir) / "http-reward.sqlite"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    t = time.monotonic()
    while not srv.started:
        assert thread.is_alive() and time.monotonic() - t < 60, "the service did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", cfg
    srv.should_exit = True
    thread.join(30)
    sock.close()


@pytest.fixture
def remote(server, monkeypatch):
    url, cfg = server
    monkeypatch.setenv("MUSACODER_VERIFIER_URL", url)
    monkeypatch.setenv("MUSACODER_TOKEN", TOKEN)
    return cfg


def test_trl_reward_over_http(remote):
    local = verify(RELU, HONEST, remote)  # the same pool, locally: the service must give the same verdict
    assert local.status.value == "ok"
    logged = {}
    completions = [[{"role": "assistant", "content": NO_CODE}],  # conversational, as TRL hands them
                   f"Here:\n```python\n{HONEST}```"]
    r = rewards.trl_reward(prompts=["p", "p"], completions=completions, task=[RELU.code] * 2,
                           log_extra=lambda k, v: logged.setdefault(k, v))
    assert r == [-1.0, float(local.reward)] and logged["verdict"] == ["format_error", "ok"]
    r_async = asyncio.run(rewards.trl_reward_async(prompts=["p", "p"], completions=[NO_CODE, HONEST],
                                                   task=RELU.code))
    assert r_async == r


def test_compute_score_over_http(remote):
    bad = rewards.compute_score("kernelbench", NO_CODE, ground_truth=RELU.code)
    good = rewards.compute_score("kernelbench", f"```python\n{HONEST}```", ground_truth="",
                                 extra_info={"reference_code": RELU.code})
    assert bad["status"] == "format_error" and bad["score"] == -1.0 and bad["acc"] == 0.0
    assert good["status"] == "ok" and good["acc"] == 1.0 and good["score"] >= 1.0 and good["correctness"] == 1.0
    assert asyncio.run(rewards.compute_score_async("kernelbench", HONEST, RELU.code))["status"] == "ok"


def test_a_wrong_token_is_an_error_not_a_reward(server, monkeypatch):
    monkeypatch.setenv("MUSACODER_VERIFIER_URL", server[0])
    monkeypatch.setenv("MUSACODER_TOKEN", "wrong")
    with pytest.raises(VerifierError, match="HTTP 401"):
        rewards.trl_reward(prompts=["p"], completions=[HONEST], task=[RELU.code])
