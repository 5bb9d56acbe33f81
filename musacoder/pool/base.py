"""What every pool does on the caller's side: admit a job (extract, static check, prebuild cache), turn compile
outcomes and device facts into a verdict, stream results, count. Subclasses only schedule: `LocalPool` with threads,
`RayPool` with actors; the verdict is decided by the same code, so both give the same verdicts."""

from __future__ import annotations

import copy
import functools
import hashlib
import platform
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from musacoder import __version__
from musacoder.backends import get_backend
from musacoder.candidates import ExtractionError, code_hash, extract_code
from musacoder.config import VerifyConfig
from musacoder.tasks.model import Task
from musacoder.verifier import legality, symbols
from musacoder.verifier.cache import Cache
from musacoder.verifier.pipeline import decide
from musacoder.verifier.protocol import EvaluateJob, Facts
from musacoder.verifier.static import StaticResult, check_source, needs_build
from musacoder.verifier.verdict import Status, Verdict

TASK_CONFIG = "verify_config"  # Task.metadata key: settings this task is verified under instead of the pool's


@dataclass
class Job:
    task: Task
    raw: str
    index: int
    future: Future
    verdict: Verdict | None = None
    static: StaticResult | None = None
    code: str = ""
    pkey: str = ""
    prebuild: dict | None = None
    t0: float = 0.0
    extra: dict = field(default_factory=dict)  # scheduler-private state (Ray: artifact ref, retries)


class PoolBase(ABC):
    def __init__(self, config: VerifyConfig | None):
        self.cfg = copy.deepcopy(config) if config else VerifyConfig()  # resolving `auto` must not touch the caller's
        self.cache = Cache(self.cfg.cache_dir / "musacoder.sqlite")
        # the op tracer built and named before any worker starts: the symbol policy (and the prebuild cache's key)
        # depends on whether dispatcher calls are seen
        legality.use_tracer(self.cfg.cache_dir)
        self._arch_env: dict[str, str] = {}
        self._device_info: dict = {}
        self._device_ready = threading.Event()
        self._busy = {"compile": 0.0, "device": 0.0}  # seconds the tiers spent working, for stats()
        self._counts = {"submitted": 0, "completed": 0}
        self._count_lock = threading.Lock()  # submit() is called from several threads (the service's dispatchers)
        self._started = time.monotonic()

    # ---- public ------------------------------------------------------------------------------------------------
    def submit(self, task: Task, candidate: str, index: int = 0) -> Future:
        """Queue one verification; may block while the pool is full (backpressure)."""
        with self._count_lock:
            self._counts["submitted"] += 1
        fut: Future = Future()
        self._admit(Job(task, candidate, index, fut, t0=time.perf_counter()))
        return fut

    def _failed(self, task, e: Exception) -> Verdict:
        v = self._verdict(getattr(task, "key", str(task)[:80]))
        v.status, v.reason = Status.INFRA_ERROR, f"verifier error while admitting: {type(e).__name__}: {e}"[:500]
        return decide(v, self.cfg, StaticResult(), None, None)

    def _verdict(self, task_key: str) -> Verdict:
        return Verdict(status=None, reason="", task=task_key, backend=self.backend, emulated=self.backend_impl.emulated)

    @functools.cached_property
    def backend_impl(self):
        """The backend object, for what runs in this process (candidate preparation, arch settings); no device."""
        return get_backend(self.backend)

    def wait_ready(self, timeout: float = 600) -> dict:
        """Block until the first device worker is up; returns its hello (device name, versions)."""
        self._start_tiers()
        self._device_ready.wait(timeout)
        return self._device_info

    def verify_many(self, pairs: Iterable[tuple[Task, str]]) -> Iterator[tuple[int, Verdict]]:
        """Yield (index, verdict) as verdicts complete, keeping compile and device tiers busy."""
        pairs = list(pairs)
        done_q: queue.Queue = queue.Queue()

        def feed():  # submission blocks when the pool is full (backpressure); verdicts stream meanwhile
            for i, (task, cand) in enumerate(pairs):
                try:
                    self.submit(task, cand, i).add_done_callback(lambda f, i=i: done_q.put((i, f.result())))
                except Exception as e:  # never leave the caller waiting on a verdict nobody will produce
                    done_q.put((i, self._failed(task, e)))

        threading.Thread(target=feed, daemon=True, name="feeder").start()
        for _ in range(len(pairs)):
            yield done_q.get()

    def stats(self) -> dict:
        """Counters for monitoring: tier sizes, busy seconds, queue depths, jobs submitted/completed."""
        return {"backend": self.backend, "compile_workers": self.n_compile, "devices": self.n_devices,
                "compile_busy_s": self._busy["compile"], "device_busy_s": self._busy["device"],
                **self._queue_depths(), **self._counts, "uptime_s": time.monotonic() - self._started}

    @abstractmethod
    def close(self): ...

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- for subclasses ----------------------------------------------------------------------------------------
    backend: str
    n_compile: int
    n_devices: int

    def _start_tiers(self):
        """Start the workers if they are not running yet (a pool that schedules elsewhere starts them itself)."""

    @abstractmethod
    def _to_compile(self, job: Job): ...

    @abstractmethod
    def _to_device(self, job: Job): ...

    @abstractmethod
    def _queue_depths(self) -> dict: ...

    def _admit(self, job: Job):
        v = job.verdict = self._verdict(job.task.key)
        t = time.perf_counter()
        try:
            job.code = extract_code(job.raw)
        except ExtractionError as e:
            return self._finish(job, StaticResult(Status.FORMAT_ERROR, [str(e)]))
        v.candidate_hash = code_hash(job.code)  # of what the model wrote
        # the backend's view of the candidate (musa-on-cuda: translated m2c), and its portability notes
        prepared = self.backend_impl.prepare(job.code)
        job.code, v.portability = prepared.code, prepared.notes
        job.static = check_source(job.code)
        if job.static.ok and prepared.refusal:
            job.static = StaticResult(Status.COMPILE_ERROR, [prepared.refusal])
        v.stage_seconds["static"] = round(time.perf_counter() - t, 4)
        if not job.static.ok:
            return self._finish(job, job.static)
        self._start_tiers()
        if not needs_build(job.code):  # nothing to compile (Triton, pure Python): straight to a device
            job.prebuild = {}
            return self._to_device(job)
        job.pkey = self._prebuild_key(job.code)
        job.prebuild = self.cache.get("prebuild", job.pkey)
        if job.prebuild is not None and (job.prebuild.get("build_error") or job.prebuild.get("symbol_problems")):
            v.stage_seconds["compile"] = 0.0  # a known failure is not rebuilt
            v.details["build_cached"] = True
            return self._finish(job, job.static)
        if job.prebuild is not None and self._has_artifacts(job):
            v.stage_seconds["compile"] = 0.0
            v.details["build_cached"] = True
            self._to_device(job)
        else:
            self._to_compile(job)

    def _has_artifacts(self, job: Job) -> bool:
        """Whether the device side can load this candidate's builds without compiling (shared cache: yes)."""
        return True

    def _prebuild_key(self, code: str) -> str:
        self._device_ready.wait(timeout=600)  # the arch list of the device is part of what gets built
        h = hashlib.sha256()
        arch = self._arch_env.get(self.backend_impl.arch_env_var or "TORCH_CUDA_ARCH_LIST", "")
        for part in (code, self.backend, torch.__version__, arch, symbols.policy()):
            h.update(part.encode() + b"\0")
        return h.hexdigest()[:32]

    def _compiled(self, job: Job, res: dict | None, failure, seconds: float) -> bool:
        """Record a compile-tier outcome; True when the job goes on to a device, else it is finished here."""
        self._busy["compile"] += seconds
        if failure:
            job.verdict.status, job.verdict.reason = failure
            self._finish(job, job.static)
            return False
        job.verdict.stage_seconds["compile"] = round(seconds, 4)
        if not res.get("infra_error"):
            job.prebuild = res
            # only outcomes that do not depend on the device are cached (import errors may be device-only)
            if res.get("build_error") or not res.get("import_error"):
                self.cache.put("prebuild", job.pkey, {k: res.get(k) for k in
                                                      ("build_error", "builds", "symbol_problems", "kernels")})
        if job.prebuild and (job.prebuild.get("build_error") or job.prebuild.get("symbol_problems")):
            self._finish(job, job.static)
            return False
        return True

    def job_config(self, job: Job) -> VerifyConfig:
        """The pool's settings, or the task's own (`Task.metadata[TASK_CONFIG]`: a service request that asks for
        other trial counts or a shorter limit). The backend and cache stay the pool's."""
        own = job.task.metadata.get(TASK_CONFIG)
        if own is None:
            return self.cfg
        return VerifyConfig.from_dict({**own, "backend": self.cfg.backend, "cache_dir": self.cfg.cache_dir})

    def device_request(self, job: Job) -> dict:
        return EvaluateJob(task_code=job.task.code, task_key=job.task.key, candidate_code=job.code,
                           config=self.job_config(job).to_dict(), build_env=self._arch_env).model_dump()

    def _stamp(self, job: Job, hello: dict):
        job.verdict.device = hello.get("device", "")
        job.verdict.versions = {**hello.get("versions", {}), "musacoder": __version__}

    def _finish(self, job: Job, static: StaticResult | None, facts: dict | None = None):
        v = job.verdict
        decide(v, self.job_config(job), static or StaticResult(), job.prebuild, _facts(facts))
        if job.prebuild and job.prebuild.get("build_error") and not v.compile_log:
            v.compile_log = job.prebuild["build_error"][-20000:]
        v.stage_seconds["total"] = round(time.perf_counter() - job.t0, 4)
        v.versions.setdefault("python", platform.python_version())
        with self._count_lock:
            self._counts["completed"] += 1
        self._released(job)
        job.future.set_result(v)

    def _released(self, job: Job):
        """Hook: a job left the pool (RayPool frees a backpressure slot)."""


def _facts(d: dict | None) -> Facts | None:
    """A judge's answer as typed facts; an answer that is not facts (a harness crash) becomes an infra error."""
    if d is None:
        return None
    try:
        return Facts.model_validate(d)
    except ValueError as e:
        return Facts(infra_error=d.get("infra_error") or f"malformed facts from the judge: {e}")
