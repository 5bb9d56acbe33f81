"""KernelGYM's reward-server API on the MooreEval service, so a KernelGYM or Dr.Kernel trainer points its reward
client at `musacoder serve` unchanged: `POST /evaluate` (submit; answers at once), `GET /status/{task_id}`,
`GET /results/{task_id}`.

Verdicts come from the service's job machinery (same dedupe, queue, store and metrics as `/v1`). The request's
knobs are honoured on top of the service's settings: `num_correct_trials` is the number of correctness seeds (at
least 1; the strict profile's distribution and shape variants run besides), `num_perf_trials` caps the timed
repetitions, `timeout` is the run time limit in seconds (at most the service's `run_timeout_s`). Requests that
differ in these are different jobs: they never share a verdict. `backend` and the other KernelGYM knobs are accepted
and not applied (the service's backend, profile and precision judge every request). `decoy_kernel` is true for any
illegal verdict (PyTorch fallbacks, decoys and the other cheats), which KernelGYM's reward clients score as reward
hacking. Client task ids are kept in the service's SQLite store, so they survive a restart.
"""

from __future__ import annotations

import copy
import hashlib
import json

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from musacoder.config import VerifyConfig
from musacoder.service.jobs import JobManager, UnknownJob
from musacoder.tasks.model import Task
from musacoder.verifier.admission import TASK_CONFIG
from musacoder.verifier.verdict import Status, Verdict


class EvaluationRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # KernelGYM sends many more knobs; they do not change our rules

    task_id: str | None = Field(default=None, max_length=200)
    reference_code: str
    kernel_code: str
    num_correct_trials: int = Field(default=5, ge=0, le=1000)
    num_perf_trials: int = Field(default=100, ge=0, le=100_000)
    timeout: float = Field(default=300, gt=0)
    entry_point: str = "Model"


def request_config(base: VerifyConfig, body: EvaluationRequest) -> VerifyConfig:
    """The service's settings with the request's trial counts and time limit applied."""
    cfg = copy.deepcopy(base)
    cfg.correctness.seeds = max(1, body.num_correct_trials)
    cfg.timing.max_reps = max(1, body.num_perf_trials)
    cfg.timing.min_reps = min(cfg.timing.min_reps, cfg.timing.max_reps)
    # never above the service's limit: the operator bounds how long one job may hold a device (and the pool's
    # watchdog, which kills a judge that stops answering, is sized from the service's limit)
    cfg.run_timeout_s = float(min(body.timeout, base.run_timeout_s))
    return cfg


def _config_digest(cfg: VerifyConfig) -> str:
    d = {k: v for k, v in cfg.to_dict().items() if k != "cache_dir"}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:10]


def request_task(body: EvaluationRequest, cfg: VerifyConfig) -> Task:
    """The reference as a task named by its code and the request's settings, not the client's task id: equal
    requests share one job and its stored verdict, requests with other settings never do (the name is part of the
    job id)."""
    code_hash = Task(name="", code=body.reference_code).code_hash[:12]
    return Task(name=f"kernelgym_{code_hash}_{_config_digest(cfg)}", code=body.reference_code, source="kernelgym",
                metadata={TASK_CONFIG: cfg.to_dict()}).validate()


def _status(v: Verdict | None) -> str:
    if v is None:
        return "processing"
    return {Status.TIMEOUT: "timeout", Status.INFRA_ERROR: "failed"}.get(v.status, "completed")


def _answer(task_id: str, v: Verdict | None) -> dict:
    body = {"task_id": task_id, "status": _status(v)}
    if v is None:
        return body
    speedup = v.speedup_eager if v.passed else None
    return {**body, "compiled": v.status not in (Status.FORMAT_ERROR, Status.COMPILE_ERROR, Status.INFRA_ERROR),
            "correctness": v.passed, "decoy_kernel": v.status is Status.ILLEGAL,
            "reference_runtime": v.eager_ms, "kernel_runtime": v.candidate_ms if v.passed else None,
            "speedup": speedup, "error_message": None if v.passed else v.reason,
            "metadata": {"status": v.status.value, "reason": v.reason, "reward": v.reward, "feedback": v.feedback,
                         "device": v.device, "backend": v.backend, "correctness": v.correctness,
                         "correctness_trials": f"({v.trials_passed} / {v.trials_total})", "timing_reps": v.timing_reps}}


def kernelgym_router(jobs: JobManager) -> APIRouter:
    """The routes, over the service's `JobManager` (include them with the service's auth dependency)."""
    router = APIRouter(tags=["KernelGYM"])
    store = jobs.store

    async def job(task_id: str) -> str:
        jid = await run_in_threadpool(store.get_alias, task_id)
        if jid is None:
            raise HTTPException(404, f"unknown task {task_id}")
        return jid

    @router.post("/evaluate", summary="KernelGYM: submit one evaluation")
    async def evaluate(body: EvaluationRequest):
        task = await run_in_threadpool(request_task, body, request_config(jobs.pool.cfg, body))
        (jid, verdict, _), = await jobs.submit([(task, body.kernel_code)])
        task_id = body.task_id or jid
        await run_in_threadpool(store.put_alias, task_id, jid)
        return _answer(task_id, verdict)

    async def current(task_id: str) -> Verdict | None:
        try:
            return await jobs.wait(await job(task_id), 0)
        except UnknownJob:  # unfinished when the service restarted
            raise HTTPException(404, f"task {task_id} was lost in a restart: submit it again") from None

    @router.get("/status/{task_id}", summary="KernelGYM: a task's status")
    async def status(task_id: str):
        v = await current(task_id)
        return {"task_id": task_id, "status": _status(v), "error_message": None if v is None or v.passed else v.reason}

    @router.get("/results/{task_id}", summary="KernelGYM: a task's result")
    async def results(task_id: str):
        return _answer(task_id, await current(task_id))

    return router
