"""The HTTP reward service on the real one-node pool (cpu backend). Candidates are judged by the static check in
microseconds (no code block: format_error; `import subprocess`: illegal) except SLOW, which passes the static check and
sleeps at import, so it stays unfinished for seconds without compiling anything."""

import json
import time
from concurrent.futures import Future
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from musacoder.config import VerifyConfig
from musacoder.pool.local import LocalPool
from musacoder.service.app import create_app
from musacoder.service.settings import ServiceSettings
from musacoder.tasks import builtin_task

RELU = builtin_task("level1/19_ReLU")
TASK = {"name": RELU.name, "code": RELU.code, "level": RELU.level}
NO_CODE = "I could not write this kernel."
ILLEGAL = "Here is my kernel:\n```python\nimport subprocess\nclass ModelNew:\n    pass\n```\n"
SLOW = '''import time
import torch
import torch.nn as nn
time.sleep({s})
class ModelNew(nn.Module):
    def forward(self, x):
        return torch.empty_like(x).copy_(x)
'''
TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def pool(cache_dir):
    cfg = VerifyConfig(backend="cpu", cache_dir=cache_dir, timing_enabled=False, run_timeout_s=60)
    with LocalPool(cfg, compile_workers=1) as p:
        p.wait_ready()
        yield p


@contextmanager
def service(pool, db, **kw):
    with TestClient(create_app(pool, ServiceSettings(token=TOKEN, db_path=db, **kw)), headers=AUTH) as c:
        yield c


@pytest.fixture
def client(pool, tmp_path):
    with service(pool, tmp_path / "v.sqlite") as c:
        yield c


def job(candidate, task=TASK):
    return {"task": task, "candidate": candidate}


def submitted(pool):
    return pool.stats()["submitted"]


def test_token_required_everywhere_but_healthz(client):
    for method, path in (("POST", "/v1/jobs"), ("GET", "/v1/jobs/abc"), ("POST", "/v1/batches"),
                         ("GET", "/v1/batches/abc/verdicts"), ("GET", "/metrics")):
        for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic dDBrZW4="}):
            r = client.request(method, path, headers=headers, json=job(NO_CODE))
            assert r.status_code == 401, (method, path, headers)
            assert r.headers["WWW-Authenticate"] == "Bearer"
    r = client.get("/healthz", headers={"Authorization": ""})
    assert r.status_code == 200 and r.json()["ready"] and r.json()["device"]
    assert client.post("/v1/jobs", json=job(NO_CODE)).status_code in (200, 202)


def test_healthz_says_the_device_worker_is_not_up_and_why(cache_dir, tmp_path):
    """Before the first device worker says hello, and after it failed to start, /healthz is 503 with the same keys
    (the pool's workers are not started: its hello is given)."""
    from musacoder.verifier.protocol import WorkerHello

    keys = {"ready", "version", "backend", "device", "error", "queue_length", "max_queue", "pool"}
    failed = WorkerHello(pid=0, role="device", error="device worker failed to start: no answer within 300s")
    with LocalPool(VerifyConfig(backend="cpu", cache_dir=cache_dir), compile_workers=1) as p:
        for hello in (None, failed):
            p.wait_ready = lambda timeout=600, hello=hello: hello
            with service(p, tmp_path / "v.sqlite") as c:
                r = c.get("/healthz")
            assert r.status_code == 503 and set(r.json()) == keys, r.json()
            assert (r.json()["ready"], r.json()["device"], r.json()["error"]) == (False, "", hello and hello.error)


def test_body_over_limit_is_413_declared_or_streamed(pool, tmp_path):
    with service(pool, tmp_path / "v.sqlite", max_body_mb=0.01) as c:
        before = submitted(pool)
        r = c.post("/v1/jobs", json=job("x" * 20_000))  # Content-Length over the limit
        assert r.status_code == 413 and "max_body_mb" in r.json()["detail"]

        def chunks():  # no Content-Length: the bytes are counted as they arrive
            yield json.dumps(job("y" * 6_000))[:-2].encode()
            yield b"z" * 6_000 + b'"}'
        r = c.post("/v1/jobs", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "0.01 MiB" in r.json()["detail"]
        assert submitted(pool) == before
        assert c.post("/v1/jobs", json=job("small")).status_code in (200, 202)


def test_bad_task_is_422_with_the_reason_and_a_bad_batch_is_refused_whole(client, pool):
    before = submitted(pool)
    r = client.post("/v1/jobs", json=job(NO_CODE, {"name": "broken", "code": "def f(:\n"}))
    assert r.status_code == 422 and "broken" in r.json()["detail"] and "syntax error" in r.json()["detail"]
    r = client.post("/v1/batches", json={"items": [job(NO_CODE), job(NO_CODE, {"name": "nomodel", "code": "x = 1\n"})]})
    assert r.status_code == 422 and "missing Model" in r.json()["detail"]
    assert client.post("/v1/jobs", json={"task": TASK}).status_code == 422  # no candidate
    assert submitted(pool) == before


def test_same_code_and_task_is_the_same_job_and_is_not_rerun(client, pool):
    r1 = client.post("/v1/jobs?wait=10", json=job(ILLEGAL))
    assert r1.status_code == 200 and r1.json()["verdict"]["status"] == "illegal" and not r1.json()["known"]
    before = submitted(pool)
    # different prose around the same code block: same job
    r2 = client.post("/v1/jobs?wait=10", json=job("Thinking...\n</think>\n" + ILLEGAL))
    assert r2.json()["job_id"] == r1.json()["job_id"] and r2.json()["known"]
    assert r2.json()["verdict"] == r1.json()["verdict"]
    assert submitted(pool) == before
    other = dict(TASK, name="19_ReLU_copy")  # another task name is another job
    assert client.post("/v1/jobs", json=job(ILLEGAL, other)).json()["job_id"] != r1.json()["job_id"]


def test_verdicts_survive_a_restart_and_infra_errors_are_retried(pool, tmp_path, monkeypatch):
    db = tmp_path / "v.sqlite"
    with service(pool, db) as c:
        jid = c.post("/v1/jobs?wait=10", json=job(NO_CODE)).json()["job_id"]
        real_submit = pool.submit
        failed = Future()
        failed.set_exception(RuntimeError("worker node lost"))
        monkeypatch.setattr(pool, "submit", lambda task, cand: failed)  # what no real pool does on demand
        r = c.post("/v1/jobs?wait=10", json=job(ILLEGAL))
        assert r.json()["verdict"]["status"] == "infra_error" and "worker node lost" in r.json()["verdict"]["reason"]

        def refuse(task, cand):
            raise ConnectionError("cluster gone")
        monkeypatch.setattr(pool, "submit", refuse)
        r = c.post("/v1/jobs?wait=10", json=job(NO_CODE + "!"))
        assert r.json()["verdict"]["status"] == "infra_error" and "cluster gone" in r.json()["verdict"]["reason"]
        monkeypatch.setattr(pool, "submit", real_submit)
    before = submitted(pool)
    with service(pool, db) as c:  # a new app: nothing in memory, only the SQLite store
        r = c.get(f"/v1/jobs/{jid}")
        assert r.status_code == 200 and r.json()["verdict"]["status"] == "format_error"
        assert c.post("/v1/jobs", json=job(NO_CODE)).json()["known"]
        assert submitted(pool) == before
        r = c.post("/v1/jobs?wait=10", json=job(ILLEGAL))  # the infra_error was not reused: it runs again
        assert r.json()["verdict"]["status"] == "illegal" and submitted(pool) == before + 1
        assert c.get("/v1/jobs/0123abcd").status_code == 404


def test_queue_full_is_429_with_retry_after_and_a_batch_is_refused_whole(pool, tmp_path):
    with service(pool, tmp_path / "v.sqlite", max_queue=1) as c:
        slow = c.post("/v1/jobs", json=job(SLOW.format(s=1)))
        assert slow.status_code == 202 and slow.json()["state"] == "queued"
        before = submitted(pool)
        r = c.post("/v1/jobs", json=job(NO_CODE))
        assert r.status_code == 429 and r.headers["Retry-After"] == "2" and "max_queue 1" in r.json()["detail"]
        again = c.post("/v1/jobs", json=job(SLOW.format(s=1)))  # joins the running job: no new work, no 429
        assert again.status_code == 202 and again.json()["job_id"] == slow.json()["job_id"] and again.json()["known"]
        # refused whole: its known item is fine, its new one does not fit
        r = c.post("/v1/batches", json={"items": [job(SLOW.format(s=1)), job(ILLEGAL)]})
        assert r.status_code == 429 and r.headers["Retry-After"] == "2"
        assert submitted(pool) == before
        jid = slow.json()["job_id"]
        while (r := c.get(f"/v1/jobs/{jid}?wait=5")).status_code == 202:
            pass
        assert r.json()["verdict"]["status"] not in ("infra_error", "timeout")
        assert c.post("/v1/jobs", json=job(NO_CODE)).status_code in (200, 202)  # room again
        r = c.post("/v1/batches", json={"items": [job("a"), job("b")]})  # can never fit: not worth retrying
        assert r.status_code == 413 and "split the batch" in r.json()["detail"]


def test_batch_streams_ndjson_in_completion_order(client, pool):
    items = [job(SLOW.format(s=2)), job(NO_CODE), job(ILLEGAL), job(NO_CODE)]
    r = client.post("/v1/batches", json={"items": items})
    assert r.status_code == 202
    ids = r.json()["job_ids"]
    assert len(ids) == 4 and ids[1] == ids[3] and len(set(ids)) == 3
    t = time.monotonic()
    with client.stream("GET", f"/v1/batches/{r.json()['batch_id']}/verdicts") as s:
        assert s.headers["content-type"].startswith("application/x-ndjson")
        lines = [(json.loads(line), time.monotonic() - t) for line in s.iter_lines() if line]
    assert sorted(x["index"] for x, _ in lines) == [0, 1, 2, 3]
    assert lines[-1][0]["index"] == 0  # the slow one comes last, the instant ones did not wait for it
    assert lines[0][1] < 1.5 < lines[-1][1]
    status = {x["index"]: x["verdict"]["status"] for x, _ in lines}
    assert status[1] == status[3] == "format_error" and status[2] == "illegal"
    assert all(x["job_id"] == ids[x["index"]] for x, _ in lines)
    assert client.get("/v1/batches/nope/verdicts").status_code == 404


def test_metrics_parse_and_count(client, pool):
    for cand in (NO_CODE + " 1", NO_CODE + " 2", ILLEGAL):
        client.post("/v1/jobs?wait=10", json=job(cand))
    client.post("/v1/jobs?wait=10", json=job(ILLEGAL))  # idempotent hit: no new verdict
    jid = client.post("/v1/jobs", json=job(ILLEGAL)).json()["job_id"]
    client.get(f"/v1/jobs/{jid}")
    samples = {}
    for fam in text_string_to_metric_families(client.get("/metrics").text):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert samples[("musacoder_verdicts_total", (("status", "format_error"),))] == 2
    assert samples[("musacoder_verdicts_total", (("status", "illegal"),))] == 1
    assert samples[("musacoder_idempotent_hits_total", ())] == 2
    assert samples[("musacoder_verification_seconds_count", ())] == 3
    assert samples[("musacoder_http_requests_total", (("code", "200"), ("method", "GET"),
                                                       ("route", "/v1/jobs/{job_id}")))] == 1
    assert samples[("musacoder_http_requests_total", (("code", "200"), ("method", "POST"), ("route", "/v1/jobs")))] == 5
    assert samples[("musacoder_queue_length", ())] == 0
    assert samples[("musacoder_tier_workers", (("tier", "compile"),))] == 1
    assert samples[("musacoder_tier_workers", (("tier", "device"),))] == 1
    assert 0 <= samples[("musacoder_tier_busy_fraction", (("tier", "device"),))] <= 1
    assert samples[("musacoder_pool_jobs_total", (("event", "submitted"),))] == submitted(pool)
    assert samples[("musacoder_http_in_flight", ())] == 1  # this scrape
