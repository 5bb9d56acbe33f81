"""What every pool does on the caller's side: admit a job (extract, static check, prebuild cache), turn compile
outcomes and device facts into a verdict, stream results, count. Subclasses only schedule: `LocalPool` with threads,
`RayPool` with actors; the verdict is decided by the same code, so both give the same verdicts."""

from __future__ import annotations

import hashlib
import platform
import queue
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch

from musacoder import __version__
from musacoder.candidates import ExtractionError, code_hash, extract_code
from musacoder.config import VerifyConfig
from musacoder.tasks.model import Task
from musacoder.verifier.cache import Cache
from musacoder.verifier.pipeline import decide
from musacoder.verifier.static import StaticResult, check_source
from musacoder.verifier.verdict import Status, Verdict


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
        self.cfg = config or VerifyConfig()
        self.cache = Cache(self.cfg.cache_dir / "musacoder.sqlite")
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

    def wait_ready(self, timeout: float = 600) -> dict:
        """Block until the first device worker is up; returns its hello (device name, versions)."""
        self._device_ready.wait(timeout)
        return self._device_info

    def verify_many(self, pairs: Iterable[tuple[Task, str]]) -> Iterator[tuple[int, Verdict]]:
        """Yield (index, verdict) as verdicts complete, keeping compile and device tiers busy."""
        pairs = list(pairs)
        done_q: queue.Queue = queue.Queue()

        def feed():  # submission blocks when the pool is full (backpressure); verdicts stream meanwhile
            for i, (task, cand) in enumerate(pairs):
                self.submit(task, cand, i).add_done_callback(lambda f, i=i: done_q.put((i, f.result())))

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

    @abstractmethod
    def _to_compile(self, job: Job): ...

    @abstractmethod
    def _to_device(self, job: Job): ...

    @abstractmethod
    def _queue_depths(self) -> dict: ...

    def _admit(self, job: Job):
        v = Verdict(status=None, reason="", task=job.task.key, backend=self.backend)
        job.verdict = v
        t = time.perf_counter()
        try:
            job.code = extract_code(job.raw)
        except ExtractionError as e:
            return self._finish(job, StaticResult(Status.FORMAT_ERROR, [str(e)]))
        v.candidate_hash = code_hash(job.code)
        job.static = check_source(job.code)
        v.stage_seconds["static"] = round(time.perf_counter() - t, 4)
        if not job.static.ok:
            return self._finish(job, job.static)
        job.pkey = self._prebuild_key(job.code)
        job.prebuild = self.cache.get("prebuild", job.pkey)
        if job.prebuild is not None and job.prebuild.get("build_error"):  # a known failure is not rebuilt
            v.stage_seconds["compile"] = 0.0
            return self._finish(job, job.static)
        if job.prebuild is not None and self._has_artifacts(job):
            v.stage_seconds["compile"] = 0.0
            self._to_device(job)
        else:
            self._to_compile(job)

    def _has_artifacts(self, job: Job) -> bool:
        """Whether the device side can load this candidate's builds without compiling (shared cache: yes)."""
        return True

    def _prebuild_key(self, code: str) -> str:
        self._device_ready.wait(timeout=600)  # the arch list of the device is part of what gets built
        h = hashlib.sha256()
        for part in (code, self.backend, torch.__version__, self._arch_env.get("TORCH_CUDA_ARCH_LIST", "")):
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
                self.cache.put("prebuild", job.pkey, {"build_error": res.get("build_error"),
                                                      "builds": res.get("builds", [])})
        if job.prebuild and job.prebuild.get("build_error"):
            self._finish(job, job.static)
            return False
        return True

    def device_request(self, job: Job) -> dict:
        return {"task_code": job.task.code, "task_key": job.task.key, "candidate_code": job.code,
                "config": self.cfg.to_dict(), "build_env": self._arch_env}

    def baseline_key(self, task: Task, hello: dict) -> str:
        return "|".join([task.code_hash, self.cfg.precision, hello.get("device", ""), torch.__version__,
                         repr(self.cfg.timing.baselines)])

    def _stamp(self, job: Job, hello: dict):
        job.verdict.device = hello.get("device", "")
        job.verdict.versions = {**hello.get("versions", {}), "musacoder": __version__}

    def _finish(self, job: Job, static: StaticResult | None, facts: dict | None = None,
                baseline: dict | None = None):
        v = job.verdict
        decide(v, self.cfg, static or StaticResult(), job.prebuild, facts, baseline)
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
