"""Cluster pool on Ray: compile actors on any node with CPUs, one executor actor per device on every node.

The driver (this process) admits jobs and decides verdicts with the same code as the one-node pool; actors only
produce facts. A compile actor returns its built libraries as a Ray object, and the executor that gets the job
fetches them from the object store into its node's cache, so nodes need no shared filesystem. Infrastructure
failures (a lost node, a dead actor, a lost object) are retried on another actor; a candidate's own failures
(crash, hang, compiler blow-up) are caught inside the actor by its worker processes and are verdicts, never retried.

Devices: `num_gpus=1` per executor for cuda/triton. For the cpu backend, nodes advertise a custom resource
(`ray start --resources='{"musacoder_device": 1}'`); without it, one executor runs on the head's CPUs.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from pathlib import Path

import ray

from musacoder.config import VerifyConfig
from musacoder.pool.base import Job, PoolBase
from musacoder.pool.slots import CompileSlot, DeviceSlot
from musacoder.verifier.build import export_artifacts, import_artifacts
from musacoder.verifier.protocol import PrebuildResult, WorkerHello
from musacoder.verifier.verdict import Status

DEVICE_RESOURCE = "musacoder_device"


def _node_cache(cache_root: str) -> Path:
    """Each node builds into its own directory: a cache on NFS would share flocks across hosts, and the
    simulated multi-node test must not let nodes see each other's builds."""
    return Path(cache_root) / "nodes" / ray.get_runtime_context().get_node_id()[:12]


@ray.remote(num_cpus=1, max_restarts=0)
class CompileActor:
    def __init__(self, backend: str, cfg: dict, arch_env: dict):
        self.cache = _node_cache(cfg["cache_dir"])
        self.slot = CompileSlot(backend, VerifyConfig.from_dict(cfg), self.cache, arch_env)

    def ready(self) -> dict:
        return {"node": ray.get_runtime_context().get_node_id()}

    @ray.method(num_returns=2)
    def compile(self, code: str):
        res, failure, seconds = self.slot.run(code)
        keys = [b.key for b in (res.builds if res else []) if b.key and not b.error]
        meta = {"res": res and res.model_dump(), "failure": [failure[0].value, failure[1]] if failure else None,
                "seconds": seconds}
        return meta, export_artifacts(self.cache, keys)


@ray.remote(max_restarts=0)
class DeviceActor:
    def __init__(self, backend: str, cfg: dict):
        self.cache = _node_cache(cfg["cache_dir"])
        # Ray already pinned this actor to its GPU through CUDA_VISIBLE_DEVICES: the workers inherit it.
        self.slot = DeviceSlot(backend, VerifyConfig.from_dict(cfg), self.cache, index=None)
        self.hello = self.slot.start()

    def ready(self) -> WorkerHello:
        return self.hello.model_copy(update={"node": ray.get_runtime_context().get_node_id()})

    def run(self, request: dict, blobs: dict) -> dict:
        import_artifacts(self.cache, blobs)
        facts, failure, seconds = self.slot.evaluate(request)
        return {"facts": facts, "failure": [failure[0].value, failure[1]] if failure else None, "seconds": seconds}

    def shutdown(self):
        self.slot.kill()


class RayPool(PoolBase):
    def __init__(self, config: VerifyConfig | None = None, address: str | None = "auto",
                 compile_workers: int | None = None, devices: int | None = None, max_infra_retries: int = 3,
                 artifact_cache: int = 1024, max_pending: int | None = None, ready_timeout: float = 600):
        super().__init__(config)
        if not ray.is_initialized():
            ray.init(address=None if address in (None, "local") else address, log_to_driver=False,
                     ignore_reinit_error=True)
        total = ray.cluster_resources()
        if self.cfg.backend == "auto":  # the cluster's GPUs, not this process's (a driver may have none)
            self.cfg.backend = "cuda" if total.get("GPU", 0) >= 1 else "cpu"
        self.backend = self.cfg.backend
        self._fixed_devices = devices
        self.n_devices = self._wanted_devices()
        self.n_compile = compile_workers or max(1, int(total.get("CPU", 2)) - self.n_devices)
        self.max_infra_retries = max_infra_retries
        self._artifacts: collections.OrderedDict = collections.OrderedDict()  # pkey -> ObjectRef of blobs
        self._artifact_cap = artifact_cache
        self._incoming: queue.Queue = queue.Queue()
        self._slots = threading.BoundedSemaphore(max_pending or 4 * (self.n_devices + self.n_compile))
        self._pending = {"compile": collections.deque(), "device": collections.deque()}
        self._idle = {"compile": collections.deque(), "device": collections.deque()}
        self._actors = {"compile": set(), "device": set()}
        self._hello: dict = {}  # device actor -> its WorkerHello
        self._inflight: dict = {}  # ObjectRef -> (kind, actor, job)
        self.infra_retries = 0
        self._stop = threading.Event()
        self._start_devices(ready_timeout)
        self._sched = threading.Thread(target=self._loop, daemon=True, name="ray-scheduler")
        self._sched.start()

    # ---- actors ------------------------------------------------------------------------------------------------
    def _wanted_devices(self) -> int:
        if self._fixed_devices:
            return self._fixed_devices
        total = ray.cluster_resources()
        if self.backend == "cpu":
            return int(total.get(DEVICE_RESOURCE, 0)) or 1
        return int(total.get("GPU", 0)) or 1

    def _new_device_actor(self):
        opts = {"num_gpus": 1} if self.backend != "cpu" else (
            {"num_cpus": 1, "resources": {DEVICE_RESOURCE: 1}}
            if ray.cluster_resources().get(DEVICE_RESOURCE) else {"num_cpus": 1})
        return DeviceActor.options(**opts).remote(self.backend, self.cfg.to_dict())

    def _start_devices(self, timeout: float):
        """Start the executors first: their hello carries the GPU arch the compile actors must build for."""
        actors = [self._new_device_actor() for _ in range(self.n_devices)]
        hellos = ray.get([a.ready.remote() for a in actors], timeout=timeout)
        for a, h in zip(actors, hellos):
            self._add("device", a, h)
        self._device_info = hellos[0]
        caps = sorted({h.versions.get("capability") for h in hellos} - {None})
        self._arch_env = self.admission.backend.arch_env(caps)
        self._device_ready.set()
        for _ in range(self.n_compile):
            self._launch("compile")

    def _launch(self, kind: str):
        a = (CompileActor.remote(self.backend, self.cfg.to_dict(), self._arch_env) if kind == "compile"
             else self._new_device_actor())
        self._actors[kind].add(a)
        self._inflight[a.ready.remote()] = ("ready-" + kind, a, None)

    def _add(self, kind: str, actor, hello: WorkerHello | dict):  # a compile actor's: {"node": ...}
        self._actors[kind].add(actor)
        self._idle[kind].append(actor)
        if kind == "device":
            self._hello[actor] = hello

    def _drop(self, kind: str, actor):
        """An actor that failed for infrastructure reasons is discarded; _reconcile starts a replacement."""
        self._actors[kind].discard(actor)
        self._hello.pop(actor, None)
        try:
            self._idle[kind].remove(actor)
        except ValueError:
            pass
        ray.kill(actor, no_restart=True)

    def _reconcile(self):
        """Keep one executor per device resource in the cluster (nodes come and go) and the compile tier full."""
        self.n_devices = self._wanted_devices()
        for kind, want in (("device", self.n_devices), ("compile", self.n_compile)):
            for _ in range(want - len(self._actors[kind])):
                self._launch(kind)

    # ---- scheduling --------------------------------------------------------------------------------------------
    def _to_compile(self, job: Job):
        self._enqueue("compile", job)

    def _to_device(self, job: Job):
        self._enqueue("device", job)

    def _enqueue(self, kind: str, job: Job):
        if "slot" not in job.extra:  # first entry into the pool: wait for room (backpressure)
            self._slots.acquire()
            job.extra["slot"] = True
        self._incoming.put((kind, job))

    def _has_artifacts(self, key: str) -> bool:
        return key in self._artifacts

    def _released(self, job: Job):
        if job.extra.pop("slot", None):
            self._slots.release()

    def _queue_depths(self) -> dict:
        return {"queued_compile": len(self._pending["compile"]), "queued_device": len(self._pending["device"]),
                "infra_retries": self.infra_retries}

    def _loop(self):
        next_reconcile = 0.0
        while not self._stop.is_set() and ray.is_initialized():
            while True:
                try:
                    kind, job = self._incoming.get_nowait()
                except queue.Empty:
                    break
                self._pending[kind].append(job)
            if time.monotonic() > next_reconcile:
                self._reconcile()
                next_reconcile = time.monotonic() + 2.0
            self._dispatch()
            if not self._inflight:
                time.sleep(0.02)
                continue
            ready, _ = ray.wait(list(self._inflight), num_returns=1, timeout=0.05)
            for ref in ready:
                self._collect(ref)

    def _dispatch(self):
        while self._pending["compile"] and self._idle["compile"]:
            job, actor = self._pending["compile"].popleft(), self._idle["compile"].popleft()
            meta, blobs = actor.compile.remote(job.case.code)
            job.extra["blobs"] = blobs
            self._inflight[meta] = ("compile", actor, job)
        while self._pending["device"] and self._idle["device"]:
            job, actor = self._pending["device"].popleft(), self._idle["device"].popleft()
            hello = self._hello[actor]
            self._on_device(job, hello)
            blobs = job.extra.get("blobs") or self._artifacts.get(job.case.pkey) or {}
            self._inflight[actor.run.remote(self.admission.evaluate_job(job.case), blobs)] = ("device", actor, job)

    def _collect(self, ref):
        kind, actor, job = self._inflight.pop(ref)
        try:
            out = ray.get(ref)
        except ray.exceptions.RayError as e:  # infrastructure: the actor, its node or an object is gone
            self._drop(kind.removeprefix("ready-"), actor)
            if job is not None:
                self._retry(job, f"{type(e).__name__}: {str(e)[:300]}")
            return
        if kind.startswith("ready-"):
            self._add(kind.removeprefix("ready-"), actor, out)
            return
        self._idle[kind].append(actor)
        failure = (Status(out["failure"][0]), out["failure"][1]) if out["failure"] else None
        if kind == "compile":
            res = None if out["res"] is None else PrebuildResult.model_validate(out["res"])
            if self._compiled(job, res, failure, out["seconds"]):
                self._remember(job.case.pkey, job.extra["blobs"])
                self._pending["device"].append(job)
            return
        job.extra.pop("blobs", None)
        self._evaluated(job, out["facts"], failure, out["seconds"])

    def _remember(self, pkey: str, blobs_ref):
        self._artifacts[pkey] = blobs_ref
        self._artifacts.move_to_end(pkey)
        while len(self._artifacts) > self._artifact_cap:
            self._artifacts.popitem(last=False)

    def _retry(self, job: Job, why: str):
        self.infra_retries += 1
        job.extra["retries"] = job.extra.get("retries", 0) + 1
        self._artifacts.pop(job.case.pkey, None)  # its artifact may have lived on the lost node: build again
        job.extra.pop("blobs", None)
        if job.extra["retries"] > self.max_infra_retries:
            job.case.failure = (Status.INFRA_ERROR, f"cluster failure {job.extra['retries']} times; last: {why}")
            self._finish(job)
        else:
            self._pending["compile"].append(job)

    def close(self):
        self._stop.set()
        self._sched.join(timeout=30)
        for a in list(self._actors["device"]):
            try:
                ray.get(a.shutdown.remote(), timeout=30)
            except ray.exceptions.RayError:
                pass
        for kind in ("compile", "device"):
            for a in list(self._actors[kind]):
                ray.kill(a, no_restart=True)
        self.cache.close()
