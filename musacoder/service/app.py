"""The HTTP reward service: FastAPI in front of a verifier pool (one node or a Ray cluster).

The verifier config is the pool's and fixed for the life of the service: requests cannot change it, so every
verdict a service gives was produced under one set of rules, and the config is part of each job's id.
"""

from __future__ import annotations

import hmac
import json
import logging
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from musacoder.service.jobs import JobManager, QueueFull, UnknownJob
from musacoder.service.metrics import Metrics
from musacoder.service.settings import ServiceSettings
from musacoder.service.store import VerdictStore
from musacoder.tasks.model import Task, TaskLoadError
from musacoder.verifier.verdict import Verdict
from musacoder.version import __version__

log = logging.getLogger("musacoder.service")


class TaskIn(BaseModel):
    name: str = Field(min_length=1, max_length=256, examples=["19_ReLU"])
    code: str = Field(description="KernelBench-format source: class Model, get_inputs(), get_init_inputs()")
    level: int | None = None
    problem_id: int | None = None


class JobIn(BaseModel):
    task: TaskIn
    candidate: str = Field(description="raw model output (the last python block is used) or candidate source")


Wait = Annotated[float, Query(ge=0, description="long poll: seconds to wait for the verdict (capped at max_wait_s)")]


class BatchIn(BaseModel):
    items: list[JobIn] = Field(min_length=1)


def _tasks(items: list[JobIn]) -> list[tuple[Task, str]]:
    out = []
    for i, it in enumerate(items):
        t = it.task
        task = Task(name=t.name, code=t.code, level=t.level, problem_id=t.problem_id, source=f"request item {i}")
        out.append((task.validate(), it.candidate))
    return out


def _job(jid: str, verdict: Verdict | None, known: bool | None = None) -> JSONResponse:
    body = {"job_id": jid, "state": "queued" if verdict is None else "done",
            "verdict": None if verdict is None else verdict.to_dict()}
    if known is not None:
        body["known"] = known  # True: answered from a stored verdict or joined to the same job already running
    return JSONResponse(body, status_code=202 if verdict is None else 200)


class _BodyLimit:
    """413 for a body over the limit: at once when Content-Length says so, else as soon as the bytes that actually
    arrive (chunked uploads) pass it. (FastAPI's own `max_body_size` answers a declared overrun in plain text.)"""

    def __init__(self, app: ASGIApp, max_bytes: int, message: str):
        self.app, self.max_bytes, self.message = app, max_bytes, message

    async def __call__(self, scope: Scope, receive: Receive, send: Send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            return await JSONResponse({"detail": self.message}, status_code=413)(scope, receive, send)
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            msg = await receive()
            seen += len(msg.get("body", b""))
            if seen > self.max_bytes:  # raised inside the route: FastAPI's exception handling answers it
                raise HTTPException(413, self.message)
            return msg

        await self.app(scope, counted, send)


def _error_handlers(app: FastAPI, settings: ServiceSettings) -> None:
    """422 for a task that does not load; for a full queue, 429 with Retry-After (413 when it never fits)."""
    @app.exception_handler(TaskLoadError)
    async def bad_task(request: Request, exc: TaskLoadError):
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(QueueFull)
    async def queue_full(request: Request, exc: QueueFull):
        if not exc.retryable:
            return JSONResponse({"detail": str(exc)}, status_code=413)
        return JSONResponse({"detail": str(exc)}, status_code=429,
                            headers={"Retry-After": str(settings.retry_after_s)})


def _token_check(settings: ServiceSettings):
    """The dependency that refuses a request without the service's bearer token (none configured: no check)."""
    bearer = HTTPBearer(auto_error=False)

    def require_token(creds: HTTPAuthorizationCredentials | None = Depends(bearer)):
        if settings.token is None:
            return
        if creds is None or not hmac.compare_digest(creds.credentials.encode(), settings.token.encode()):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    return require_token


def _v1_router(jobs: JobManager, store: VerdictStore, metrics: Metrics, settings: ServiceSettings,
               require_token) -> APIRouter:
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_token)])

    @v1.post("/jobs", summary="Submit one verification")
    async def submit_job(body: JobIn, wait: Wait = 0.0):
        pairs = await run_in_threadpool(_tasks, [body])
        (jid, verdict, known), = await jobs.submit(pairs)
        metrics.known.inc(known)
        if verdict is None and wait:
            verdict = await jobs.wait(jid, min(wait, settings.max_wait_s))
        return _job(jid, verdict, known)

    @v1.get("/jobs/{job_id}", summary="A job's state and verdict")
    async def get_job(job_id: str, wait: Wait = 0.0):
        try:
            return _job(job_id, await jobs.wait(job_id, min(wait, settings.max_wait_s)))
        except UnknownJob:
            raise HTTPException(404, f"unknown job {job_id} (never submitted, or unfinished when the service "
                                     "restarted: resubmit it)") from None

    @v1.post("/batches", status_code=202, summary="Submit a batch (accepted whole or refused whole)")
    async def submit_batch(body: BatchIn):
        pairs = await run_in_threadpool(_tasks, body.items)
        accepted = await jobs.submit(pairs)
        metrics.known.inc(sum(known for _, _, known in accepted))
        ids = [jid for jid, _, _ in accepted]
        batch_id = await run_in_threadpool(store.put_batch, ids)
        return {"batch_id": batch_id, "job_ids": ids}

    @v1.get("/batches/{batch_id}/verdicts", summary="A batch's verdicts as NDJSON, in completion order")
    async def stream_batch(batch_id: str):
        ids = await run_in_threadpool(store.get_batch, batch_id)
        if ids is None:
            raise HTTPException(404, f"unknown batch {batch_id}")
        return StreamingResponse(_verdict_lines(jobs, ids), media_type="application/x-ndjson")

    return v1


async def _verdict_lines(jobs: JobManager, ids: list[str]):
    async for i, jid, verdict in jobs.stream(ids):
        line = {"index": i, "job_id": jid}
        if verdict is None:
            line["error"] = "unknown job (unfinished when the service restarted): resubmit the batch"
        else:
            line["verdict"] = verdict.to_dict()
        yield json.dumps(line) + "\n"


def _operator_routes(app: FastAPI, pool, jobs: JobManager, metrics: Metrics, settings: ServiceSettings,
                     require_token) -> None:
    """/healthz (no auth) and /metrics."""
    @app.get("/healthz", summary="Liveness and readiness (no auth)")
    async def healthz():
        hello = pool.wait_ready(timeout=0)
        ready = hello is not None and hello.error is None
        body = {"ready": ready, "version": __version__, "backend": pool.backend,
                "device": hello.device if hello else "", "error": hello.error if hello else None,
                "queue_length": jobs.queue_length, "max_queue": settings.max_queue,
                "pool": await run_in_threadpool(pool.stats)}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics", dependencies=[Depends(require_token)], summary="Prometheus metrics")
    async def prometheus():
        return Response(await run_in_threadpool(metrics.render), media_type="text/plain; version=0.0.4")


def create_app(pool, settings: ServiceSettings | None = None) -> FastAPI:
    """The service around `pool` (which the caller owns and closes)."""
    settings = settings or ServiceSettings()
    store = VerdictStore(settings.db_path or pool.cfg.cache_dir / "service.sqlite")
    metrics = Metrics(pool, lambda: jobs.queue_length)
    jobs = JobManager(pool, store, settings, on_verdict=metrics.verdict)
    too_large = f"request body is over the limit of {settings.max_body_mb:g} MiB (max_body_mb)"

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        jobs.start()
        yield
        jobs.stop()
        store.close()

    app = FastAPI(title="MooreEval reward service", version=__version__, lifespan=lifespan)
    app.add_middleware(_BodyLimit, max_bytes=settings.max_body_bytes, message=too_large)
    app.add_middleware(metrics.middleware)
    app.state.jobs, app.state.metrics = jobs, metrics
    _error_handlers(app, settings)
    require_token = _token_check(settings)
    _operator_routes(app, pool, jobs, metrics, settings, require_token)
    app.include_router(_v1_router(jobs, store, metrics, settings, require_token))
    from musacoder.service.kernelgym import (
        kernelgym_router,  # KernelGYM's reward-server API (docs/ecosystem-kernelgym.md)
    )
    app.include_router(kernelgym_router(jobs), dependencies=[Depends(require_token)])
    return app


def serve(config, settings: ServiceSettings, host: str = "127.0.0.1", port: int = 8000,
          ray_address: str | None = None, compile_workers: int | None = None, log_level: str = "info"):
    """Start the pool and serve until interrupted (the `musacoder serve` command)."""
    import uvicorn

    from musacoder.pool import make_pool

    if settings.token is None and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("no token: anyone who can reach %s:%d can use this verifier", host, port)
    pool = make_pool(config, ray_address=ray_address, compile_workers=compile_workers)
    try:
        uvicorn.run(create_app(pool, settings), host=host, port=port, log_level=log_level,
                    timeout_graceful_shutdown=10)
    finally:
        pool.close()
