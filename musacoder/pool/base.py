"""What every pool does on the caller's side: hand each job to the verifier's admission, send it where admission
routes it (compile tier, device tier), stream verdicts, count. Subclasses schedule: `LocalPool` with threads,
`RayPool` with actors; admission and the verdict are the verifier's (`verifier.admission`), so both give the same
verdicts."""

from __future__ import annotations

import copy
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

from musacoder.config import VerifyConfig
from musacoder.tasks.model import Task
from musacoder.verifier import legality
from musacoder.verifier.admission import Admission, Case, Route
from musacoder.verifier.cache import Cache
from musacoder.verifier.pipeline import unusable
from musacoder.verifier.protocol import PrebuildResult, WorkerHello
from musacoder.verifier.verdict import Status, Verdict


@dataclass
class Job:
    case: Case
    index: int
    future: Future
    extra: dict = field(default_factory=dict)  # scheduler-private state (Ray: artifact ref, retries)


class PoolBase(ABC):
    def __init__(self, config: VerifyConfig | None):
        self.cfg = copy.deepcopy(config) if config else VerifyConfig()  # resolving `auto` must not touch the caller's
        self.cache = Cache(self.cfg.cache_dir / "musacoder.sqlite")
        # the op tracer built and named before any worker starts: the symbol policy (and the prebuild cache's key)
        # depends on whether dispatcher calls are seen
        legality.use_tracer(self.cfg.cache_dir)
        self._arch_env: dict[str, str] = {}
        self._device_info: WorkerHello | None = None
        self._device_ready = threading.Event()
        self._busy = {"compile": 0.0, "device": 0.0}  # seconds the tiers spent working, for stats()
        self._counts = {"submitted": 0, "completed": 0}
        self._count_lock = threading.Lock()  # submit() is called from several threads (the service's dispatchers)
        self._started = time.monotonic()
        self._admission: Admission | None = None

    # ---- public ------------------------------------------------------------------------------------------------
    def submit(self, task: Task, candidate: str, index: int = 0) -> Future:
        """Queue one verification; may block while the pool is full (backpressure)."""
        with self._count_lock:
            self._counts["submitted"] += 1
        fut: Future = Future()
        job = Job(Case(task, candidate), index, fut)
        route = self.admission.admit(job.case, lambda key: self._has_artifacts(key))
        if route is Route.DONE:
            self._finish(job)
        else:
            self._start_tiers()
            (self._to_compile if route is Route.COMPILE else self._to_device)(job)
        return fut

    def _failed(self, task, why: str, e: Exception) -> Verdict:
        return unusable(f"{why}: {type(e).__name__}: {e}", self.cfg, getattr(task, "key", str(task)[:80]),
                        Status.INFRA_ERROR, self.backend)

    @property
    def admission(self) -> Admission:
        """The verifier's admission for this pool (made once the subclass has resolved the backend)."""
        with self._count_lock:  # submit() runs in several threads
            if self._admission is None:
                self._admission = Admission(self.cfg, self.cache, self._wait_arch_env)
        return self._admission

    def _wait_arch_env(self) -> dict[str, str]:
        """The first device's arch settings, part of what gets built: the workers start now if they have not (a
        candidate the static check refuses needs none)."""
        self._start_tiers()
        self._device_ready.wait(timeout=600)
        return self._arch_env

    def wait_ready(self, timeout: float = 600) -> WorkerHello | None:
        """Block until the first device worker is up; returns its hello (device name, versions), None if it is not
        up within `timeout`."""
        self._start_tiers()
        self._device_ready.wait(timeout)
        return self._device_info

    def verify_many(self, pairs: Iterable[tuple[Task, str]]) -> Iterator[tuple[int, Verdict]]:
        """Yield (index, verdict) as verdicts complete, keeping compile and device tiers busy: submitted from a feeder
        thread (submit blocks while the pool is full) while verdicts stream. A failure to submit or in a future is
        that index's infra_error verdict, so every index is answered, never left waiting."""
        pairs = list(pairs)
        done_q: queue.Queue = queue.Queue()

        def answer(i, task, f):
            try:
                done_q.put((i, f.result()))
            except Exception as e:  # noqa: BLE001 - any failure is this item's verdict
                done_q.put((i, self._failed(task, "the verifier failed", e)))

        def feed():
            for i, (task, cand) in enumerate(pairs):
                try:
                    self.submit(task, cand, i).add_done_callback(lambda f, i=i, task=task: answer(i, task, f))
                except Exception as e:  # noqa: BLE001 - as above
                    done_q.put((i, self._failed(task, "the pool refused the job", e)))

        threading.Thread(target=feed, daemon=True, name="musacoder-feeder").start()
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

    def _has_artifacts(self, key: str) -> bool:
        """Whether the device side can load the builds of this prebuild key without compiling (shared cache: yes)."""
        return True

    def _compiled(self, job: Job, res: PrebuildResult | None, failure, seconds: float) -> bool:
        """Record a compile-tier outcome; True when the job goes on to a device, else it is finished here."""
        self._busy["compile"] += seconds
        if self.admission.compiled(job.case, res, failure, seconds):
            return True
        self._finish(job)
        return False

    def _on_device(self, job: Job, hello: WorkerHello):
        """The device worker that takes the job: its device and versions go into the verdict."""
        job.case.device = hello.device
        job.case.versions = dict(hello.versions)

    def _evaluated(self, job: Job, facts: dict | None, failure: tuple[Status, str] | None, seconds: float):
        """Record a device-tier outcome (the judge's facts, or the worker's failure) and finish the job."""
        self._busy["device"] += seconds
        job.case.stage_seconds["device"] = round(seconds, 4)
        job.case.facts = facts
        if failure:
            job.case.failure = failure
        self._finish(job)

    def _finish(self, job: Job):
        v = self.admission.conclude(job.case)
        with self._count_lock:
            self._counts["completed"] += 1
        self._released(job)
        job.future.set_result(v)

    def _released(self, job: Job):
        """Hook: a job left the pool (RayPool frees a backpressure slot)."""
