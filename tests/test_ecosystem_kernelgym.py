"""The KernelGYM routes honour the request: trial counts and timeout reach the judge, requests with other settings
never share a verdict, and client task ids survive a restart (the service's SQLite store). cpu backend, timing off;
one build (the honest ReLU, shared with the other ecosystem tests)."""

import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from musacoder.api import get_pool
from musacoder.config import TimingConfig, VerifyConfig
from musacoder.service.app import create_app
from musacoder.service.kernelgym import (
    EvaluationRequest,
    request_config,
    request_task,
)
from musacoder.service.settings import ServiceSettings
from musacoder.tasks import builtin_task
from musacoder.verifier.admission import TASK_CONFIG, Case

RELU = builtin_task("level1/19_ReLU")
HONEST = (Path(__file__).parents[1] / "musacoder" / "examples" / "cpu" / "honest_relu.py").read_text()
SLEEPY = '''import time
import torch
import torch.nn as nn
class ModelNew(nn.Module):
    def forward(self, x):
        time.sleep(60)
        return torch.empty_like(x).copy_(x)
'''
DONE = ("completed", "failed", "timeout", "cancelled")


def req(**kw):
    return EvaluationRequest(reference_code=RELU.code, kernel_code=HONEST, **kw)


def test_request_settings_map_onto_the_services_config():
    base = VerifyConfig(backend="cpu", run_timeout_s=120)
    cfg = request_config(base, req(num_correct_trials=3, num_perf_trials=7, timeout=30))
    assert (cfg.correctness.seeds, cfg.timing.max_reps, cfg.timing.min_reps, cfg.run_timeout_s) == (3, 7, 7, 30)
    cfg = request_config(base, req(num_correct_trials=0, num_perf_trials=0, timeout=10_000))
    assert (cfg.correctness.seeds, cfg.timing.max_reps, cfg.timing.min_reps) == (1, 1, 1)
    assert cfg.run_timeout_s == 120  # never above the service's limit
    cfg = request_config(base, req(num_perf_trials=500))
    assert (cfg.timing.min_reps, cfg.timing.max_reps) == (base.timing.min_reps, 500)
    assert base.correctness.seeds == 5 and base.timing.max_reps == TimingConfig().max_reps  # the service's own config is untouched
    # other settings, other task name (part of the job id); same settings, same name
    names = {request_task(req(num_correct_trials=n), request_config(base, req(num_correct_trials=n))).name
             for n in (1, 1, 2)}
    assert len(names) == 2


def test_the_request_config_reaches_the_device_request(cache_dir):
    pool = get_pool(VerifyConfig(backend="cpu", cache_dir=cache_dir, timing_enabled=False))
    cfg = request_config(pool.cfg, req(num_correct_trials=2, num_perf_trials=9, timeout=11))
    task = request_task(req(), cfg)
    got = pool.admission.evaluate_job(Case(task, HONEST, code=HONEST))["config"]
    assert got == task.metadata[TASK_CONFIG]
    assert (got["correctness"]["seeds"], got["timing"]["max_reps"], got["run_timeout_s"]) == (2, 9, 11)
    plain = pool.admission.evaluate_job(Case(RELU, HONEST, code=HONEST))["config"]  # other routes: unchanged
    assert plain == pool.cfg.to_dict()


@contextmanager
def service(db: Path):
    """The service on the API's shared pool (the one the other ecosystem tests use); `db` is in the build cache."""
    pool = get_pool(VerifyConfig(backend="cpu", cache_dir=str(db.parent), timing_enabled=False))
    with TestClient(create_app(pool, ServiceSettings(db_path=db))) as c:
        yield c


def finished(c, task_id, limit=300):
    t = time.monotonic()
    while (s := c.get(f"/status/{task_id}").json())["status"] not in DONE:
        assert time.monotonic() - t < limit, s
        time.sleep(0.2)
    return c.get(f"/results/{task_id}").json()


@pytest.fixture
def db(cache_dir, tmp_path):
    return Path(cache_dir) / f"kg-{tmp_path.name}.sqlite"


def test_trials_and_timeout_are_honoured_and_never_share_a_verdict(db):
    with service(db) as c:
        body = {"reference_code": RELU.code, "kernel_code": HONEST, "num_perf_trials": 100, "timeout": 300}
        one = c.post("/evaluate", json={**body, "num_correct_trials": 1}).json()["task_id"]  # no task_id: the job's
        three = c.post("/evaluate", json={**body, "num_correct_trials": 3}).json()["task_id"]
        assert one != three
        assert c.post("/evaluate", json={**body, "num_correct_trials": 1}).json()["task_id"] == one  # same job
        a, b = finished(c, one), finished(c, three)
        assert a["correctness"] and b["correctness"], (a, b)
        n1, n3 = (int(x["metadata"]["correctness_trials"].split("/")[1].strip(" )")) for x in (a, b))
        assert n3 - n1 == 2  # two more seeds; the strict profile's variant trials run in both
        r = c.post("/evaluate", json={"task_id": "sleepy", "reference_code": RELU.code, "kernel_code": SLEEPY,
                                      "timeout": 2}).json()
        assert r["task_id"] == "sleepy"
        t = time.monotonic()
        r = finished(c, "sleepy")
        assert r["status"] == "timeout" and r["metadata"]["status"] == "timeout", r
        assert "2s" in r["error_message"] and time.monotonic() - t < 50


def test_task_ids_survive_a_restart(db):
    body = {"task_id": "kg-restart", "reference_code": RELU.code, "kernel_code": "no code here"}
    with service(db) as c:
        c.post("/evaluate", json=body)
        before = finished(c, "kg-restart")
        assert before["metadata"]["status"] == "format_error"
    with service(db) as c:  # a new app: nothing in memory, only the SQLite store
        assert c.get("/status/kg-restart").json()["status"] == "completed"
        assert c.get("/results/kg-restart").json() == before
        assert c.get("/results/never-submitted").status_code == 404
