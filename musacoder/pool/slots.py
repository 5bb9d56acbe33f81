"""What one compile worker or one device does, independent of who schedules it (a local thread or a Ray actor).

A slot owns worker processes and turns their answers or their deaths into facts or a (status, reason) failure.
Failures here are the candidate's own (it hung, crashed, blew up the compiler): they become verdicts, never retries.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from musacoder.config import VerifyConfig
from musacoder.pool.worker import worker_argv
from musacoder.proc.process import WorkerDied, WorkerProcess, WorkerTimeout
from musacoder.verifier.protocol import PrebuildJob, PrebuildResult, WorkerHello
from musacoder.verifier.verdict import Status


def compile_env(backend: str, cfg: VerifyConfig, arch_env: dict) -> dict:
    from musacoder.backends import get_backend

    env = {**get_backend(backend).build_env(), **arch_env} if backend != "cpu" else {}
    if cfg.compile_mem_gb > 0:
        env["MUSACODER_WORKER_MEM_GB"] = str(cfg.compile_mem_gb)
    return {**env, **worker_env(cfg)}


def worker_env(cfg: VerifyConfig) -> dict:
    """What every worker reads at start: the cores it pins itself to first thing (`verify.cpus`; what it starts
    inherits them) and how its judge starts subjects (`verify.fork_subjects`, `verify.spares`)."""
    env = {"MUSACODER_WORKER_CPUS": ",".join(map(str, cfg.cpus))} if cfg.cpus else {}
    if cfg.spares:
        env["MUSACODER_SPARES"] = str(cfg.spares)
    return env if cfg.fork_subjects else {**env, "MUSACODER_FORK_SUBJECTS": "0"}


class CompileSlot:
    def __init__(self, backend: str, cfg: VerifyConfig, cache_dir: Path, arch_env: dict):
        self.cfg = cfg
        self.worker = WorkerProcess("compile", backend, cache_dir, worker_argv("compile", backend, cache_dir),
                                    env=compile_env(backend, cfg, arch_env), max_jobs=cfg.worker_max_jobs)

    def run(self, code: str) -> tuple[PrebuildResult | None, tuple[Status, str] | None, float]:
        """-> (prebuild result, failure, seconds)."""
        t = time.perf_counter()
        try:
            job = PrebuildJob(candidate_code=code, config=self.cfg).model_dump()
            res = PrebuildResult.model_validate(self.worker.call(job, timeout=self.cfg.compile_timeout_s + 60))
            if res.timeout:
                raise WorkerTimeout(res.timeout)
        except ValueError as e:  # not a PrebuildResult: a worker that answers nonsense is a broken verifier
            return PrebuildResult(infra_error=f"malformed answer from the compile worker: {str(e)[:300]}"), None, \
                time.perf_counter() - t
        except WorkerTimeout:
            return None, (Status.TIMEOUT, f"compilation exceeded {self.cfg.compile_timeout_s:.0f}s"), \
                time.perf_counter() - t
        except WorkerDied as e:
            return None, (Status.COMPILE_ERROR, f"the compiler process died: {str(e)[:300]}"), time.perf_counter() - t
        return res, None, time.perf_counter() - t

    def kill(self):
        self.worker.kill()


def device_env(backend: str, cfg: VerifyConfig, index: int | None, sharing: int = 1) -> dict:
    """Pin the worker to one device through the backend's visible-devices variable (CUDA_VISIBLE_DEVICES,
    MUSA_VISIBLE_DEVICES); `index` None means the scheduler (Ray) already set it. `sharing`: how many judges the
    device has (their automatic spares are split among them: judge.auto_spares)."""
    from musacoder.backends import get_backend

    if backend == "cpu":
        # the judge's own OpenMP threads must not spin on the cores its subjects are timed on
        return {"MUSACODER_WORKER_MEM_GB": str(cfg.worker_mem_gb), "OMP_WAIT_POLICY": "PASSIVE", **worker_env(cfg)}
    env = {**worker_env(cfg), **({"MUSACODER_JUDGES_SHARING": str(sharing)} if sharing > 1 else {})}
    if index is None:
        return env
    var = get_backend(backend).visible_devices_var
    visible = [d for d in os.environ.get(var, "").split(",") if d.strip()]
    return {var: visible[index] if index < len(visible) else str(index), **env}


class DeviceSlot:
    """One device: its judge process (which starts the reference and candidate subjects itself)."""

    def __init__(self, backend: str, cfg: VerifyConfig, cache_dir: Path, index: int | None, device_lock: str = "",
                 sharing: int = 1):
        env = device_env(backend, cfg, index, sharing)
        self.cfg, self.device_lock = cfg, device_lock
        self.dev = WorkerProcess("device", backend, cache_dir, worker_argv("device", backend, cache_dir), env=env,
                                 max_jobs=cfg.worker_max_jobs)
        self.hello: WorkerHello | None = None

    def start(self) -> WorkerHello:
        try:
            self.hello = WorkerHello.model_validate(self.dev.start())
        except (WorkerDied, ValueError) as e:  # ValueError: a hello that is not a WorkerHello
            self.hello = WorkerHello(pid=0, role="device", error=str(e)[:500])
        return self.hello

    def evaluate(self, request: dict) -> tuple[dict | None, tuple[Status, str] | None, float]:
        """-> (facts, failure, seconds). The judge enforces the candidate's time limit itself; the margin here
        covers the reference's own work, so only a judge that stopped answering is killed."""
        t = time.perf_counter()
        request = {**request, "device_lock": self.device_lock}
        try:
            return self.dev.call(request, timeout=self.cfg.run_timeout_s + 900), None, time.perf_counter() - t
        except (WorkerTimeout, WorkerDied) as e:
            failure = (Status.INFRA_ERROR, f"the judge process failed: {str(e)[:500]}")
        return None, failure, time.perf_counter() - t

    def kill(self):
        self.dev.kill()
