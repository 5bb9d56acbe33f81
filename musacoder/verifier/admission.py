"""Admission and conclusion: what happens to a candidate before any worker sees it, and the verdict at the end.

A pool calls these and only schedules: `admit` extracts the code, lets the backend prepare it (musa-on-cuda
translates it back), runs the static check, keys its build and applies the prebuild cache (a known build failure is
not rebuilt; a known build goes straight to a device); `compiled` records a compile-tier outcome and decides what the
cache keeps; `conclude` makes the verdict, once, from everything the `Case` gathered (`pipeline.decide`).
"""

from __future__ import annotations

import hashlib
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import torch

from musacoder.backends import get_backend
from musacoder.candidates import ExtractionError, code_hash, extract_code
from musacoder.config import VerifyConfig
from musacoder.tasks.model import Task
from musacoder.verifier import symbols
from musacoder.verifier.cache import Cache
from musacoder.verifier.pipeline import decide
from musacoder.verifier.protocol import EvaluateJob, Facts, PrebuildResult
from musacoder.verifier.static import StaticResult, check_source, needs_build
from musacoder.verifier.verdict import Status, Verdict
from musacoder.version import __version__

TASK_CONFIG = "verify_config"  # Task.metadata key: settings this task is verified under instead of the pool's


class Route(Enum):
    DONE = "done"  # decided at admission: conclude it
    COMPILE = "compile"  # its native code must be built first
    DEVICE = "device"  # nothing to build, or its build is cached


@dataclass
class Case:
    """One candidate on its way to a verdict: what admission, the compile tier and the judge found."""

    task: Task
    raw: str  # what the model wrote
    t0: float = field(default_factory=time.perf_counter)
    code: str = ""  # the candidate as the backend verifies it
    candidate_hash: str = ""
    portability: list[str] = field(default_factory=list)
    static: StaticResult = field(default_factory=StaticResult)
    pkey: str = ""  # the prebuild cache's key
    prebuild: PrebuildResult | None = None
    failure: tuple[Status, str] | None = None  # a worker-level failure (died, timed out, never started)
    facts: dict | None = None  # the judge's answer
    stage_seconds: dict[str, float] = field(default_factory=dict)
    details: dict = field(default_factory=dict)
    device: str = ""
    versions: dict[str, str] = field(default_factory=dict)


class Admission:
    """Admits and concludes the candidates of one pool (`cfg`: the pool's settings, its backend resolved)."""

    def __init__(self, cfg: VerifyConfig, cache: Cache, arch_env: Callable[[], dict[str, str]]):
        """`arch_env`: the device's arch settings, part of what gets built (it may wait for the first device)."""
        self.cfg, self.cache, self._arch_env = cfg, cache, arch_env
        self.backend = get_backend(cfg.backend)  # for what runs in this process: preparation, arch settings

    def admit(self, case: Case, loadable: Callable[[str], bool] = lambda key: True) -> Route:
        """Where the case goes next. `loadable(key)`: whether a device can load a cached build without compiling it
        again (a shared cache: always; a cluster: while its artifact is remembered)."""
        t = time.perf_counter()
        try:
            case.code = extract_code(case.raw)
        except ExtractionError as e:
            case.static = StaticResult(Status.FORMAT_ERROR, [str(e)])
            return Route.DONE
        case.candidate_hash = code_hash(case.code)  # of what the model wrote
        # the backend's view of the candidate (musa-on-cuda: translated m2c), and its portability notes
        prepared = self.backend.prepare(case.code)
        case.code, case.portability = prepared.code, prepared.notes
        case.static = check_source(case.code)
        if case.static.ok and prepared.refusal:
            case.static = StaticResult(Status.COMPILE_ERROR, [prepared.refusal])
        case.stage_seconds["static"] = round(time.perf_counter() - t, 4)
        if not case.static.ok:
            return Route.DONE
        if not needs_build(case.code):  # nothing to compile (Triton, pure Python): straight to a device
            case.prebuild = PrebuildResult()
            return Route.DEVICE
        case.pkey = self.prebuild_key(case.code)
        case.prebuild = _cached(self.cache.get("prebuild", case.pkey))
        if case.prebuild is None or not (_refused(case.prebuild) or loadable(case.pkey)):
            return Route.COMPILE
        case.stage_seconds["compile"] = 0.0  # known: a failure is not rebuilt, a build is not built again
        case.details["build_cached"] = True
        return Route.DONE if _refused(case.prebuild) else Route.DEVICE

    def prebuild_key(self, code: str) -> str:
        h = hashlib.sha256()
        arch = self._arch_env().get(self.backend.arch_env_var or "TORCH_CUDA_ARCH_LIST", "")
        for part in (code, self.cfg.backend, torch.__version__, arch, symbols.policy()):
            h.update(part.encode() + b"\0")
        return h.hexdigest()[:32]

    def compiled(self, case: Case, res: PrebuildResult | None, failure: tuple[Status, str] | None,
                 seconds: float) -> bool:
        """Record a compile-tier outcome; True when the case goes on to a device, False when it is decided."""
        if failure:
            case.failure = failure
            return False
        case.stage_seconds["compile"] = round(seconds, 4)
        if not res.infra_error:
            case.prebuild = res
            # only outcomes that do not depend on the device are cached (import errors may be device-only)
            if res.build_error or not res.import_error:
                self.cache.put("prebuild", case.pkey, res.model_dump(include=_CACHED))
        return not (case.prebuild and _refused(case.prebuild))

    def config_for(self, task: Task) -> VerifyConfig:
        """The pool's settings, or the task's own (`Task.metadata[TASK_CONFIG]`: a service request that asks for
        other trial counts or a shorter limit). The backend and cache stay the pool's."""
        own = task.metadata.get(TASK_CONFIG)
        if own is None:
            return self.cfg
        return VerifyConfig.from_dict({**own, "backend": self.cfg.backend, "cache_dir": self.cfg.cache_dir})

    def evaluate_job(self, case: Case) -> dict:
        """The judge's job for this case, as the message a device worker reads."""
        return EvaluateJob(task_code=case.task.code, task_key=case.task.key, candidate_code=case.code,
                           config=self.config_for(case.task), build_env=self._arch_env()).model_dump()

    def conclude(self, case: Case) -> Verdict:
        """The verdict: made once, complete, from what the case gathered."""
        case.stage_seconds["total"] = round(time.perf_counter() - case.t0, 4)
        return decide(self.config_for(case.task), case.static, case.prebuild, _facts(case.facts), case.failure,
                      task=case.task.key, backend=self.cfg.backend, emulated=self.backend.emulated,
                      candidate_hash=case.candidate_hash, portability=case.portability, device=case.device,
                      versions={**case.versions, "musacoder": __version__, "python": platform.python_version()},
                      stage_seconds=case.stage_seconds, details=case.details)


_CACHED = {"build_error", "builds", "symbol_problems", "kernels"}  # what a prebuild cache entry keeps


def _cached(entry: dict | None) -> PrebuildResult | None:
    """A prebuild cache entry; None where there is none, or one this version cannot read (it is built again)."""
    try:
        return None if entry is None else PrebuildResult.model_validate(entry)
    except ValueError:
        return None


def _refused(prebuild: PrebuildResult) -> bool:
    return bool(prebuild.build_error or prebuild.symbol_problems)


def _facts(d: dict | None) -> Facts | None:
    """A judge's answer as typed facts; an answer that is not facts (a harness crash) becomes an infra error."""
    if d is None:
        return None
    try:
        return Facts.model_validate(d)
    except ValueError as e:
        return Facts(infra_error=d.get("infra_error") or f"malformed facts from the judge: {e}")
