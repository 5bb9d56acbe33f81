"""KernelBench's harness entry point on MooreEval: a KernelBench script switches harness by changing one import,

    from kernelbench.eval import eval_kernel_against_ref
    ->  from musacoder.kernelbench import eval_kernel_against_ref

Same signature and result fields as KernelBench's (`compiled`, `correctness`, `metadata`, `runtime`,
`runtime_stats`, `ref_runtime`, `ref_runtime_stats`; times in ms). Verification runs in the verifier's isolated
workers under MooreEval's `strict` profile by default, so it gives `musacoder verify`'s verdicts: a PyTorch fallback,
a decoy kernel, a kernel that only works on the task's own inputs (`torch.rand`, one shape) or any other cheat is
`correctness=False` with the reason in `metadata["reason"]`. `profile="kernelbench"` checks only the task's own
inputs and shape, as KernelBench does (and so passes kernels that are wrong on other inputs). Differences: at least
the verifier's own number of correctness seeds (5) run even when fewer trials are asked; timing repeats until its
relative standard error is small (`num_perf_trials` is not used); `build_dir` and `device` are not
used (builds go to the verifier's content-hash cache, jobs to the pool's devices). Exploits that only misbehave
while being timed (output caches, phase detection) are caught only with `measure_performance=True`. A CUDA backend
on a machine without a CUDA device verifies nothing: the result says so in one line (`metadata["reason"]`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from musacoder.api import unusable, verify
from musacoder.cli_base import device_problem
from musacoder.config import VerifyConfig
from musacoder.verifier.verdict import Status, Verdict

_BACKENDS = {"cuda": "cuda", "triton": "triton", "cpu": "cpu", "auto": "auto"}
_PRECISIONS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "fp32": "fp32", "fp16": "fp16",
               "bf16": "bf16"}


@dataclass
class KernelExecResult:
    """KernelBench's result fields (a pydantic model there; `model_dump()`/`dict()` work the same here)."""

    compiled: bool = False
    correctness: bool = False
    metadata: dict = field(default_factory=dict)
    runtime: float = -1.0  # ms
    runtime_stats: dict = field(default_factory=dict)
    ref_runtime: float = -1.0  # ms, the eager reference timed in a clean process
    ref_runtime_stats: dict = field(default_factory=dict)

    def model_dump(self) -> dict:
        return asdict(self)

    dict = model_dump


def _precision(precision) -> str:
    name = str(precision).removeprefix("torch.")
    if name not in _PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected torch.float32/float16/bfloat16 or fp32/fp16/bf16")
    return _PRECISIONS[name]


def _stats(ms: float | None, rse: float | None, reps: int | None, device: str) -> dict:
    if ms is None:
        return {}
    return {"mean": ms, "std": ms * (rse or 0.0) * (reps or 1) ** 0.5, "num_trials": reps or 0, "device": device}


def to_exec_result(v: Verdict) -> KernelExecResult:
    """A verdict in KernelBench's terms; `metadata` keeps our status, reason and feedback."""
    compiled = v.status not in (Status.FORMAT_ERROR, Status.COMPILE_ERROR, Status.INFRA_ERROR)
    meta = {"status": v.status.value, "reason": v.reason, "feedback": v.feedback, "reward": v.reward,
            "hardware": v.device, "device": v.device, "backend": v.backend,
            "correctness_trials": f"({v.trials_passed} / {v.trials_total})"}
    if v.status is Status.COMPILE_ERROR:
        meta["compilation_error"] = v.compile_log[-4000:] or v.reason
    elif v.status is Status.RUNTIME_ERROR:
        meta["runtime_error"] = v.reason
    elif v.status in (Status.INCORRECT, Status.ILLEGAL):
        meta["correctness_issue"] = v.reason
    if v.max_abs_err is not None:
        meta["max_difference"], meta["avg_difference"] = [f"{v.max_abs_err:.6f}"], [f"{v.mean_abs_err or 0:.6f}"]
    if v.illegal_ops:
        meta["illegal_ops"] = v.illegal_ops
    ran = v.passed and v.candidate_ms is not None
    return KernelExecResult(
        compiled=compiled, correctness=v.passed, metadata=meta,
        runtime=v.candidate_ms if ran else -1.0,
        runtime_stats=_stats(v.candidate_ms, v.timing_rse, v.timing_reps, v.device) if ran else {},
        ref_runtime=v.eager_ms if ran and v.eager_ms is not None else -1.0,
        ref_runtime_stats=_stats(v.eager_ms, None, None, v.device) if ran else {})


def kernelbench_config(backend: str = "cuda", precision="fp32", measure_performance: bool = False,
                       num_correct_trials: int = 1, profile: str = "strict") -> VerifyConfig:
    if backend not in _BACKENDS:
        raise ValueError(f"backend {backend!r}: MooreEval verifies {', '.join(_BACKENDS)} kernels")
    cfg = VerifyConfig(backend=_BACKENDS[backend], profile=profile, precision=_precision(precision),
                       timing_enabled=measure_performance)
    cfg.correctness.seeds = max(cfg.correctness.seeds, int(num_correct_trials))  # never fewer than the verifier's
    return cfg


def eval_kernel_against_ref(original_model_src: str, custom_model_src: str, seed_num: int = 42,
                            num_correct_trials: int = 1, num_perf_trials: int = 10, verbose: bool = False,
                            measure_performance: bool = False, build_dir=None, device=None, backend: str = "cuda",
                            precision="fp32", profile: str = "strict", **kw) -> KernelExecResult:
    """KernelBench's `eval_kernel_against_ref` on MooreEval (see the module docstring for the differences).
    Extra KernelBench keywords (`timing_method`, `check_for_excessive_speedup`...) are accepted and ignored."""
    cfg = kernelbench_config(backend, precision, measure_performance, num_correct_trials, profile)
    if problem := device_problem(cfg.backend, 'backend="cpu"'):
        return to_exec_result(unusable(problem, cfg, status=Status.INFRA_ERROR))
    v = verify({"code": original_model_src, "name": kw.get("name") or ""}, custom_model_src, cfg)
    if verbose:
        print(v.feedback)
    return to_exec_result(v)
