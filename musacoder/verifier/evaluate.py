"""What a worker process does for one job. Candidate code runs only here, never where the verdict is decided:
this module measures and reports facts as plain JSON; `pipeline.decide` turns facts into a verdict."""

from __future__ import annotations

import os
import time
import traceback
from contextlib import contextmanager

import torch

from musacoder.config import VerifyConfig
from musacoder.verifier import legality
from musacoder.verifier.build import BuildError, LaunchCounter, install
from musacoder.verifier.correctness import compare, inputs_unchanged, spot_compare
from musacoder.verifier.inputs import (DTYPES, Shape, clone_tree, init_inputs, load_module, make_inputs,
                                       scaled_constants, tensor_bytes)
from musacoder.verifier.timing import SpotCheckFailed, time_callable

WEIGHT_SEED = 42
INPUT_SEED = 1000
TIMING_SEED = 5000


def _short_tb(e: BaseException, limit: int = 6) -> str:
    lines = traceback.format_exception(type(e), e, e.__traceback__)
    text = "".join(lines[-limit:])
    return text[-3000:]


class Worker:
    """Per-process harness state: the backend, the patched load_inline, the integrity baseline."""

    def __init__(self, backend, cache_dir):
        # Modules that patch torch functions when first imported (dynamo wraps torch.manual_seed) are imported
        # before the integrity baseline is taken, so their patches are not blamed on a candidate.
        import torch._dynamo  # noqa: F401
        import torch.profiler  # noqa: F401
        import torch.utils.flop_counter  # noqa: F401

        self.backend = backend
        self.counter = LaunchCounter()
        self.loader = install(cache_dir, backend, self.counter)
        backend.install_launch_hook(self.counter)
        torch.backends.cuda.matmul.allow_tf32 = False  # TF32 off for reference and candidate alike
        torch.backends.cudnn.allow_tf32 = False
        self.device = backend.device()
        self.baseline_snapshot = legality.snapshot()
        self.cache_dir = cache_dir
        self._rates = None

    # ---- jobs -------------------------------------------------------------------------------------------------
    def prebuild(self, job: dict) -> dict:
        """Compile tier: import the candidate so its load_inline calls build into the shared cache."""
        self.loader.records.clear()
        t0 = time.perf_counter()
        out = {"build_error": None, "import_error": None}
        try:
            load_module(job["candidate_code"], "cand", self.cache_dir)
        except BuildError as e:
            out["build_error"] = str(e)
        except BaseException as e:  # not a build failure: the device worker decides what it means
            out["import_error"] = _short_tb(e)
        out["builds"] = [r.__dict__ for r in self.loader.records]
        out["seconds"] = time.perf_counter() - t0
        return out

    def evaluate(self, job: dict) -> dict:
        try:
            return self._evaluate(job)
        finally:
            self._model_pair = None  # let the worker loop give this job's GPU memory back

    def _evaluate(self, job: dict) -> dict:
        cfg = VerifyConfig.from_dict(job["config"])
        # Build with the arch list the compile tier used, so the candidate's builds are found in the cache.
        os.environ.update(job.get("build_env", {}))
        facts = {"stage_seconds": {}, "trials": [], "fatal": False}
        self.loader.records.clear()
        with _stage(facts, "load_task"):
            try:
                task_mod = load_module(job["task_code"], "task", self.cache_dir)
            except BaseException as e:
                facts["task_error"] = f"task {job['task_key']} failed to load: {_short_tb(e, 2)}"
                return facts
        threads_before = legality.thread_count()
        with _stage(facts, "import"):
            try:
                cand_mod = load_module(job["candidate_code"], "cand", self.cache_dir)
            except BuildError as e:
                facts["compile_error"] = str(e)
            except BaseException as e:
                facts["import_error"] = "importing the candidate failed: " + _short_tb(e)
                facts["fatal"] = self.backend.is_fatal(e)
            facts["builds"] = [r.__dict__ for r in self.loader.records]
        if "compile_error" in facts or "import_error" in facts:
            facts["integrity"] = legality.integrity_changes(self.baseline_snapshot, legality.snapshot())
            return facts
        if not hasattr(cand_mod, "ModelNew"):
            facts["import_error"] = "the candidate module defines no ModelNew"
            return facts
        trace = legality.OpTrace(self.backend.torch_namespaces)
        self.counter.reset()
        self._model_pair = None
        with _stage(facts, "correctness"):
            ok = self._trials(task_mod, cand_mod, cfg, facts, trace, job["task_key"])
        facts["ops"] = dict(trace.ops)
        facts["illegal_ops"] = trace.illegal()
        facts["launches"] = self.counter.launches + trace.own_ops()
        facts["launch_names"] = sorted(self.counter.names)
        facts["host_share"] = None
        facts["threads_started"] = legality.thread_count() - threads_before
        facts["integrity"] = legality.integrity_changes(self.baseline_snapshot, legality.snapshot())
        if facts["integrity"]:
            facts["fatal"] = True  # a patched harness is not trusted for the next job
        if not ok or facts["fatal"]:
            return facts
        legal = not (facts["illegal_ops"] or facts["integrity"] or facts["threads_started"] > 0)
        passed = all(t["passed"] for t in facts["trials"]) and self._model_pair is not None
        if legal and passed and self.backend.device_type != "cpu":
            with _stage(facts, "profile"):
                facts["profile"] = self._safe_profile(facts, self._model_pair)
        if legal and passed and cfg.timing_enabled and facts["launches"] > 0:
            with _stage(facts, "timing"):
                self._time_candidate(task_mod, cfg, facts, trace)
            facts["illegal_ops"] = trace.illegal()
            facts["integrity"] = legality.integrity_changes(self.baseline_snapshot, legality.snapshot())
        return facts

    def baseline(self, job: dict) -> dict:
        """Eager and torch.compile timings of the reference, in a process that never ran candidate code."""
        cfg = VerifyConfig.from_dict(job["config"])
        facts = {"stage_seconds": {}}
        try:
            mod = load_module(job["task_code"], "task", self.cache_dir)
            model = self._build(mod, mod.Model, Shape(), cfg)
            make_set = self._set_maker(mod, cfg)
            first = make_set(0)
        except BaseException as e:
            facts["error"] = f"task {job['task_key']}: reference failed: {_short_tb(e, 3)}"
            return facts
        with torch.no_grad():
            out = model(*clone_tree(first))
        facts["bytes"] = tensor_bytes(first) + tensor_bytes(out)
        facts["flops"] = _flops(model, first)
        del first, out
        n = cfg.timing.input_sets
        if self._rates is None:
            self._rates = self.backend.peak_rates()
        facts["rates"] = self._rates
        # What the protocol costs on its own (sync, events, launch of nothing): the floor under every timing.
        facts["timer_floor"] = time_callable(lambda *a: None, make_set, n, self.backend, cfg.timing).to_dict()
        for kind in cfg.timing.baselines:
            with _stage(facts, kind):
                try:
                    fn = model if kind == "eager" else torch.compile(model)
                    facts[kind] = time_callable(fn, make_set, n, self.backend, cfg.timing).to_dict()
                except BaseException as e:
                    facts[f"{kind}_error"] = _short_tb(e, 2)
        return facts

    # ---- pieces -----------------------------------------------------------------------------------------------
    def _set_maker(self, task_mod, cfg):
        """Timing input set k, generated on the device from its own seed (the same sets for candidate and baselines)."""
        return lambda k: make_inputs(task_mod, Shape(), TIMING_SEED + k, self.device, cfg.precision)

    def _build(self, task_mod, cls, shape: Shape, cfg):
        """Instantiate cls with the task's init inputs right after the same seed, so weights match."""
        init = init_inputs(task_mod, shape)
        torch.manual_seed(WEIGHT_SEED)
        with torch.device(self.device):
            m = cls(*init)
        m = m.to(self.device)
        if cfg.precision != "fp32":
            m = m.to(DTYPES[cfg.precision])
        return m.eval()

    def _trials(self, task_mod, cand_mod, cfg, facts, trace, task_key) -> bool:
        """Run all correctness trials; False when the job must stop (fatal error or nothing could run)."""
        tol = cfg.tolerance()
        plan = [("seed", Shape(), INPUT_SEED + i, "") for i in range(cfg.correctness.seeds)]
        if cfg.correctness.distribution_variants:
            plan.append(("sign-symmetric inputs", Shape(), INPUT_SEED + 100, "sign"))
            plan += [(f"inputs x{f:g}", Shape(), INPUT_SEED + 101 + i, f"scale{f:g}")
                     for i, f in enumerate(cfg.correctness.rescale_factors)]
        if cfg.correctness.shape_variants:
            over = scaled_constants(task_mod, cfg.correctness.shape_scale, cfg.correctness.shape_min_size)
            if over:
                plan.append(("shape " + ", ".join(f"{k}={v}" for k, v in over.items()), Shape(over), INPUT_SEED, ""))
        models: dict[str, tuple] = {}
        for i, (kind, shape, seed, transform) in enumerate(plan):
            base_trial = kind == "seed"
            try:
                if shape.key not in models:
                    models[shape.key] = (self._build(task_mod, task_mod.Model, shape, cfg), None)
                ref_model = models[shape.key][0]
                inputs = make_inputs(task_mod, shape, seed, self.device, cfg.precision, transform)
                with torch.no_grad():
                    ref_out = ref_model(*clone_tree(inputs))
                self.backend.synchronize()
            except BaseException as e:
                if base_trial:
                    facts["task_error"] = f"reference of {task_key} failed: {_short_tb(e, 2)}"
                    return False
                continue  # the reference does not accept this variant: skip it
            if not base_trial and not _finite(ref_out):
                continue
            trial = {"kind": kind, "passed": False}
            facts["trials"].append(trial)
            try:
                if models[shape.key][1] is None:
                    models[shape.key] = (ref_model, self._build(task_mod, cand_mod.ModelNew, shape, cfg))
                cand_model = models[shape.key][1]
                if i == 0:
                    self._model_pair = (cand_model, inputs)
                pristine = clone_tree(inputs)
                self.backend.poison(tensor_bytes(ref_out))
                with torch.no_grad(), trace:
                    out = cand_model(*inputs)
                early = compare(out, ref_out, tol)  # before a device-wide sync: stream-ordered reads only
                self.backend.synchronize()
                res = compare(out, ref_out, tol)
                if res.ok and not early.ok:
                    res.ok, res.reason = False, ("output was not complete when forward returned (work left on "
                                                 "another stream): " + early.reason)
                if res.ok:
                    changed = inputs_unchanged(pristine, inputs)
                    if changed:
                        res.ok, res.reason = False, changed
                if res.ok and i == 0:
                    with torch.no_grad(), trace:
                        again = cand_model(*clone_tree(pristine))
                    self.backend.synchronize()
                    rerun = compare(again, out, tol)
                    if not rerun.ok:
                        res.ok, res.reason = False, "two runs on the same inputs disagree: " + rerun.reason
                trial.update(passed=res.ok, reason=res.reason, max_abs=res.max_abs, mean_abs=res.mean_abs,
                             where=res.where)
            except BaseException as e:
                trial.update(error=_short_tb(e), reason=f"{type(e).__name__}: {str(e)[:500]}")
                if self.backend.is_fatal(e):
                    facts["fatal"] = True
                    return False
        if not facts["trials"]:
            facts["task_error"] = f"no correctness trial of {task_key} could run"
            return False
        return True

    def _safe_profile(self, facts, pair):
        cand_model, inputs = pair
        try:
            with torch.no_grad():
                return self.backend.kernel_profile(cand_model, clone_tree(inputs))
        except BaseException as e:
            facts["profile_error"] = _short_tb(e, 2)
            return None

    def _time_candidate(self, task_mod, cfg, facts, trace):
        cand_model = self._model_pair[0]
        ref_model = self._build(task_mod, task_mod.Model, Shape(), cfg)
        make_set = self._set_maker(task_mod, cfg)
        n = cfg.timing.input_sets
        with torch.no_grad():
            refs = [ref_model(*make_set(k)) for k in range(n)]
        del ref_model
        tol = cfg.tolerance()

        def check(out, k):
            res = spot_compare(out, refs[k], tol, seed=k)
            return None if res.ok else res.reason

        def traced(args):
            with torch.no_grad(), trace:
                out = cand_model(*args)
            self.backend.synchronize()
            return out

        self.counter.reset()
        try:
            facts["timing"] = time_callable(cand_model, make_set, n, self.backend, cfg.timing, check, traced).to_dict()
            if self.backend.device_type == "cpu":
                total = facts["timing"]["mean_ms"] * (facts["timing"]["reps"] + cfg.timing.warmup + 1) / 1e3
                facts["host_share"] = min(1.0, self.counter.seconds / total) if total > 0 else None
        except SpotCheckFailed as e:
            facts["spot_check"] = str(e)
        except BaseException as e:
            facts["timing_error"] = _short_tb(e)
            facts["fatal"] = self.backend.is_fatal(e)


@contextmanager
def _stage(facts: dict, name: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        facts["stage_seconds"][name] = round(time.perf_counter() - t0, 4)


def _finite(obj) -> bool:
    if isinstance(obj, torch.Tensor):
        return not obj.is_floating_point() or bool(torch.isfinite(obj).all())
    if isinstance(obj, (list, tuple)):
        return all(_finite(o) for o in obj)
    return True


def _flops(model, inputs) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            model(*clone_tree(inputs))
        return float(fc.get_total_flops())
    except Exception:
        return 0.0
