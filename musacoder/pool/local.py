"""One-node pool: compile workers on the CPU cores, one device worker (and one clean baseline worker) per device.

Jobs flow static check (in this process) -> compile tier (prebuild into the content-hash cache; skipped when this
exact candidate was built before) -> device tier (correctness, legality, timing) -> verdict. Both tiers run
concurrently, so the device works on one candidate while the CPUs build the next ones.
"""

from __future__ import annotations

import queue
import threading

from musacoder.backends import resolve
from musacoder.config import VerifyConfig
from musacoder.pool.base import Job, PoolBase
from musacoder.pool.slots import CompileSlot, DeviceSlot
from musacoder.proc.process import usable_cores
from musacoder.proc.scratch import remove_dir
from musacoder.verifier.devlock import lock_dir, shared_devices
from musacoder.verifier.verdict import Status


class LocalPool(PoolBase):
    def __init__(self, config: VerifyConfig | None = None, compile_workers: int | None = None,
                 devices: int | None = None):
        super().__init__(config)
        self.cfg.backend = resolve(self.cfg.backend)
        self.backend = self.cfg.backend
        # device worker i runs on visible device self._on[i]
        self._on = list(self.cfg.devices) if self.cfg.devices and not devices else \
            list(range(devices or max(1, self.admission.backend.device_count())))
        self.n_devices = len(self._on)
        seen = self.admission.backend.device_count()
        if self.cfg.devices and seen and max(self.cfg.devices) >= seen:
            raise ValueError(f"verify.devices {list(self.cfg.devices)} names a device this host does not have "
                             f"({seen} visible)")
        # judges sharing a device take its lock (correctness side by side, timing alone unless timing.exclusive is
        # off, whose-work-is-it alone always); the path is secret
        shared = shared_devices(self._on)
        self._lock_dir = lock_dir() if shared else None
        self._locks = [str(self._lock_dir / f"device-{d}") if d in shared else "" for d in self._on]
        cores = len(self.cfg.cpus) or usable_cores()  # the verifier's own cores, not the host's
        self.n_compile = compile_workers or max(1, cores - self.n_devices)
        self._compile_q: queue.Queue = queue.Queue()
        self._device_q: queue.Queue = queue.Queue(maxsize=max(4, 2 * self.n_devices))
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()
        self._busy_each = [0.0] * self.n_devices  # per device, to see an unbalanced schedule

    def stats(self) -> dict:
        return {**super().stats(), "device_busy_s_each": list(self._busy_each)}

    def _start_tiers(self):
        """Workers start with the first job that needs one: a static refusal answers without them."""
        with self._start_lock:
            if self._threads:
                return
            for i in range(self.n_devices):
                self._spawn(self._device_loop, i)
            for i in range(self.n_compile):
                self._spawn(self._compile_loop, i)

    def _spawn(self, fn, i):
        t = threading.Thread(target=fn, args=(i,), daemon=True, name=f"{fn.__name__}-{i}")
        t.start()
        self._threads.append(t)

    def close(self):
        for _ in range(self.n_compile if self._threads else 0):
            self._compile_q.put(None)
        for _ in range(self.n_devices if self._threads else 0):
            self._device_q.put(None)
        for t in self._threads:
            t.join(timeout=30)
        self.cache.close()
        remove_dir(self._lock_dir)  # after the judges: one still finishing a job would open its lock files

    def _to_compile(self, job: Job):
        self._compile_q.put(job)

    def _to_device(self, job: Job):
        self._device_q.put(job)  # blocks when the devices are behind: that is the backpressure

    def _queue_depths(self) -> dict:
        return {"queued_compile": self._compile_q.qsize(), "queued_device": self._device_q.qsize()}

    # ---- tiers -------------------------------------------------------------------------------------------------
    def _compile_loop(self, i: int):
        self._device_ready.wait(timeout=600)
        slot = CompileSlot(self.backend, self.cfg, self.cfg.cache_dir, self._arch_env)
        while (job := self._compile_q.get()) is not None:
            if self._compiled(job, *slot.run(job.case.code)):
                self._to_device(job)
        slot.kill()

    def _device_loop(self, i: int):
        slot = DeviceSlot(self.backend, self.cfg, self.cfg.cache_dir, self._on[i], self._locks[i],
                          self._on.count(self._on[i]))
        hello = slot.start()
        if i == 0:
            self._device_info = hello
            cap = hello.versions.get("capability")
            self._arch_env = self.admission.backend.arch_env([cap] if cap else [])
            self._device_ready.set()
        while (job := self._device_q.get()) is not None:
            self._on_device(job, hello)
            if hello.error is not None:
                job.case.failure = (Status.INFRA_ERROR, hello.error[:500])
                self._finish(job)
                continue
            facts, failure, seconds = slot.evaluate(self.admission.evaluate_job(job.case))
            self._busy_each[i] += seconds
            self._evaluated(job, facts, failure, seconds)
        slot.kill()
