"""One-node pool: compile workers on the CPU cores, one device worker (and one clean baseline worker) per device.

Jobs flow static check (in this process) -> compile tier (prebuild into the content-hash cache; skipped when this
exact candidate was built before) -> device tier (correctness, legality, timing) -> verdict. Both tiers run
concurrently, so the device works on one candidate while the CPUs build the next ones.
"""

from __future__ import annotations

import hashlib
import os
import platform
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

from musacoder import __version__
from musacoder.candidates import ExtractionError, code_hash, extract_code
from musacoder.config import VerifyConfig
from musacoder.pool.process import WorkerDied, WorkerProcess, WorkerTimeout
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
    prebuild: dict | None = None
    t0: float = 0.0


def _device_count(backend: str) -> int:
    if backend == "cpu":
        return 1
    return max(1, torch.cuda.device_count())


class LocalPool:
    def __init__(self, config: VerifyConfig | None = None, compile_workers: int | None = None,
                 devices: int | None = None):
        self.cfg = config or VerifyConfig()
        if self.cfg.backend == "auto":
            self.cfg.backend = "cuda" if torch.cuda.is_available() else "cpu"
        self.backend = self.cfg.backend
        self.n_devices = devices or _device_count(self.backend)
        cores = os.cpu_count() or 2
        self.n_compile = compile_workers or max(1, cores - self.n_devices)
        self.cache = Cache(self.cfg.cache_dir / "musacoder.sqlite")
        self._compile_q: queue.Queue = queue.Queue()
        self._device_q: queue.Queue = queue.Queue(maxsize=max(4, 2 * self.n_devices))
        self._baseline_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._arch_env: dict[str, str] = {}
        self._device_info: dict = {}
        self._device_ready = threading.Event()
        for i in range(self.n_devices):
            self._spawn(self._device_loop, i)
        for i in range(self.n_compile):
            self._spawn(self._compile_loop, i)

    def _spawn(self, fn, i):
        t = threading.Thread(target=fn, args=(i,), daemon=True, name=f"{fn.__name__}-{i}")
        t.start()
        self._threads.append(t)

    # ---- public ------------------------------------------------------------------------------------------------
    def submit(self, task: Task, candidate: str, index: int = 0) -> Future:
        fut: Future = Future()
        job = Job(task, candidate, index, fut, t0=time.perf_counter())
        self._admit(job)
        return fut

    def wait_ready(self, timeout: float = 600) -> dict:
        """Block until the first device worker is up; returns its hello (device name, versions)."""
        self._device_ready.wait(timeout)
        return self._device_info

    def verify_many(self, pairs: Iterable[tuple[Task, str]]) -> Iterator[tuple[int, Verdict]]:
        """Yield (index, verdict) as verdicts complete, keeping compile and device tiers busy."""
        pairs = list(pairs)
        done_q: queue.Queue = queue.Queue()

        def feed():  # submission blocks when the device queue is full (backpressure); verdicts stream meanwhile
            for i, (task, cand) in enumerate(pairs):
                self.submit(task, cand, i).add_done_callback(lambda f, i=i: done_q.put((i, f.result())))

        threading.Thread(target=feed, daemon=True, name="feeder").start()
        for _ in range(len(pairs)):
            yield done_q.get()

    def close(self):
        self._closed = True
        for _ in range(self.n_compile):
            self._compile_q.put(None)
        for _ in range(self.n_devices):
            self._device_q.put(None)
        for t in self._threads:
            t.join(timeout=30)
        self.cache.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- stages ------------------------------------------------------------------------------------------------
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
        pkey = self._prebuild_key(job.code)
        job.prebuild = self.cache.get("prebuild", pkey)
        if job.prebuild is not None:
            v.stage_seconds["compile"] = 0.0
            if job.prebuild.get("build_error"):
                return self._finish(job, job.static)
            self._device_q.put(job)
        else:
            self._compile_q.put((job, pkey))

    def _prebuild_key(self, code: str) -> str:
        self._device_ready.wait(timeout=600)  # the arch list of the device is part of what gets built
        h = hashlib.sha256()
        for part in (code, self.backend, torch.__version__, self._arch_env.get("TORCH_CUDA_ARCH_LIST", "")):
            h.update(part.encode() + b"\0")
        return h.hexdigest()[:32]

    def _compile_loop(self, i: int):
        from musacoder.backends import get_backend

        self._device_ready.wait(timeout=600)
        env = {**get_backend(self.backend).build_env(), **self._arch_env} if self.backend != "cpu" else {}
        worker = WorkerProcess("compile", self.backend, self.cfg.cache_dir, env=env, max_jobs=self.cfg.worker_max_jobs)
        while True:
            item = self._compile_q.get()
            if item is None:
                break
            job, pkey = item
            t = time.perf_counter()
            try:
                res = worker.call({"candidate_code": job.code}, timeout=self.cfg.compile_timeout_s)
            except WorkerTimeout:
                job.verdict.status = Status.TIMEOUT
                job.verdict.reason = f"compilation exceeded {self.cfg.compile_timeout_s:.0f}s"
                self._finish(job, job.static)
                continue
            except WorkerDied as e:
                job.verdict.status = Status.COMPILE_ERROR
                job.verdict.reason = f"the compiler process died: {str(e)[:300]}"
                self._finish(job, job.static)
                continue
            job.verdict.stage_seconds["compile"] = round(time.perf_counter() - t, 4)
            if not res.get("infra_error"):
                job.prebuild = res
                # only outcomes that do not depend on the device are cached (import errors may be device-only)
                if res.get("build_error") or not res.get("import_error"):
                    self.cache.put("prebuild", pkey, {"build_error": res.get("build_error"),
                                                      "builds": res.get("builds", [])})
            if job.prebuild and job.prebuild.get("build_error"):
                self._finish(job, job.static)
            else:
                self._device_q.put(job)
        worker.kill()

    def _device_loop(self, i: int):
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        env = ({"MUSACODER_WORKER_MEM_GB": str(self.cfg.worker_mem_gb)} if self.backend == "cpu"
               else {"CUDA_VISIBLE_DEVICES": visible[i] if i < len(visible) else str(i)})
        dev = WorkerProcess("device", self.backend, self.cfg.cache_dir, env=env, max_jobs=self.cfg.worker_max_jobs)
        base = WorkerProcess("baseline", self.backend, self.cfg.cache_dir, env=env, max_jobs=10**9)
        try:
            hello = dev.start()
        except WorkerDied as e:
            hello = {"error": str(e)}
        if i == 0:
            self._device_info = hello
            cap = hello.get("versions", {}).get("capability")
            if cap and "TORCH_CUDA_ARCH_LIST" not in os.environ:
                self._arch_env = {"TORCH_CUDA_ARCH_LIST": cap}
            self._device_ready.set()
        while True:
            job = self._device_q.get()
            if job is None:
                break
            v = job.verdict
            v.device, v.versions = hello.get("device", ""), {**hello.get("versions", {}), "musacoder": __version__}
            if "error" in hello:
                v.status, v.reason = Status.INFRA_ERROR, hello["error"][:500]
                self._finish(job, job.static)
                continue
            facts = self._run_device(dev, job)
            baseline = None
            if facts and facts.get("timing"):
                baseline = self._baseline(base, job.task, hello)
            self._finish(job, job.static, facts, baseline)
        dev.kill()
        base.kill()

    def _run_device(self, dev: WorkerProcess, job: Job) -> dict | None:
        v = job.verdict
        req = {"task_code": job.task.code, "task_key": job.task.key, "candidate_code": job.code,
               "config": self.cfg.to_dict()}
        t = time.perf_counter()
        try:
            return dev.call(req, timeout=self.cfg.run_timeout_s)
        except WorkerTimeout:
            v.status, v.reason = Status.TIMEOUT, f"evaluation exceeded {self.cfg.run_timeout_s:.0f}s (killed)"
        except WorkerDied as e:
            v.status, v.reason = Status.RUNTIME_ERROR, f"the candidate crashed its process: {str(e)[:500]}"
        finally:
            v.stage_seconds["device"] = round(time.perf_counter() - t, 4)
        return None

    def _baseline(self, base: WorkerProcess, task: Task, hello: dict) -> dict | None:
        key = "|".join([task.code_hash, self.cfg.precision, hello.get("device", ""), torch.__version__,
                        repr(self.cfg.timing.baselines)])
        with self._lock:
            lock = self._baseline_locks.setdefault(key, threading.Lock())
        with lock:
            cached = self.cache.get("baseline", key)
            if cached is not None:
                return cached
            try:
                res = base.call({"task_code": task.code, "task_key": task.key, "config": self.cfg.to_dict()},
                                timeout=max(self.cfg.run_timeout_s, 900))
            except (WorkerTimeout, WorkerDied) as e:
                return {"error": str(e)}
            if "error" not in res and "infra_error" not in res:
                self.cache.put("baseline", key, res)
            return res

    def _finish(self, job: Job, static: StaticResult | None, facts: dict | None = None,
                baseline: dict | None = None):
        v = job.verdict
        decide(v, self.cfg, static or StaticResult(), job.prebuild, facts, baseline)
        if job.prebuild and job.prebuild.get("build_error") and not v.compile_log:
            v.compile_log = job.prebuild["build_error"][-20000:]
        v.stage_seconds["total"] = round(time.perf_counter() - job.t0, 4)
        v.versions.setdefault("python", platform.python_version())
        job.future.set_result(v)
