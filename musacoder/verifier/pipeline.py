"""Deciding the verdict from what the stages measured. Pure: no candidate code, no device, no I/O."""

from __future__ import annotations

from musacoder.config import VerifyConfig
from musacoder.verifier.feedback import feedback_text
from musacoder.verifier.protocol import Facts, PrebuildResult
from musacoder.verifier.reward import reward
from musacoder.verifier.static import StaticResult
from musacoder.verifier.timing import reward_speedup, speed_of_light_ms
from musacoder.verifier.verdict import Status, Verdict


def _first_line(text: str, n: int = 400) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else text)[:n]


def decide(cfg: VerifyConfig, static: StaticResult, prebuild: PrebuildResult | None, facts: Facts | None,
           failure: tuple[Status, str] | None = None, **known) -> Verdict:
    """The verdict from the stages' findings: a worker-level `failure` (a dead or timed-out worker) when there is
    one, else the static check's, the build's and the judge's `facts`, in that order. `known`: the Verdict's fields
    the caller already has (task, backend, hashes, device, stage seconds, details)."""
    v = Verdict(status=Status.INFRA_ERROR, reason="", **known)  # both set below, before it is returned
    if failure:
        v.status, v.reason = failure
    else:
        _decide_status(v, cfg, static, prebuild, facts or Facts())
    if prebuild and prebuild.build_error and not v.compile_log:
        v.compile_log = prebuild.build_error[-20000:]
    speed = reward_speedup(v.speedup_eager, *v.details.get("speedup_interval", (None, None)))
    v.reward = reward(v.status, v.correctness, speed, cfg.reward.lam, cfg.reward.nu_max)
    v.feedback = feedback_text(v)
    return v


def unusable(reason: str, config: VerifyConfig | None = None, task: str = "", status: Status = Status.FORMAT_ERROR,
             backend: str = "") -> Verdict:
    """The verdict of an item that never reached the verifier (or whose verification failed outside it), with
    reward and feedback filled as for any other."""
    return decide(config or VerifyConfig(), StaticResult(), None, None, (status, reason[:500]), task=task,
                  backend=backend)


def _decide_status(v: Verdict, cfg, static, prebuild, f: Facts) -> None:
    """Runs `_RULES` (below) in order: the first rule that returns (status, reason) decides; when none does, OK."""
    for rule in _RULES:
        decided = rule(v, static, prebuild, f)
        if decided is not None:
            v.status, v.reason = decided
            return
    _decide_ok(v, cfg, f)


# Each rule takes (v, static, prebuild, f) and returns (status, reason) when it decides, else None; the two
# `_record_*` steps decide nothing, they copy what the later rules and the verdict read into `v`.
def _static_refused(v, static, prebuild, f):
    return None if static.ok else (static.status, static.reason)


def _prebuild_failed(v, static, prebuild, f):
    if prebuild and prebuild.build_error:
        v.compile_log = prebuild.build_error[-20000:]
        return Status.COMPILE_ERROR, "the native code failed to build"
    return None


def _prebuild_symbols(v, static, prebuild, f):
    if prebuild and prebuild.symbol_problems:
        return Status.ILLEGAL, "native code " + "; ".join(prebuild.symbol_problems[:5])
    return None


def _record_run(v, static, prebuild, f):
    v.stage_seconds.update(f.stage_seconds)
    builds = [b.model_dump() for b in f.builds]
    v.details.update({k: v_ for k, v_ in (("sandbox", f.sandbox), ("tracer", f.tracer), ("builds", builds),
                                          ("launch_names", f.launch_names), ("worker_pid", f.worker_pid),
                                          ("candidate_pid", f.candidate_pid)) if v_})


def _infra_error(v, static, prebuild, f):
    return (Status.INFRA_ERROR, "verifier error: " + _first_line(f.infra_error)) if f.infra_error else None


def _task_error(v, static, prebuild, f):
    return (Status.INFRA_ERROR, f.task_error[:1000]) if f.task_error else None


def _timed_out(v, static, prebuild, f):
    return (Status.TIMEOUT, f.timed_out) if f.timed_out else None


def _compile_error(v, static, prebuild, f):
    if f.compile_error:
        v.compile_log = f.compile_error[-20000:]
        return Status.COMPILE_ERROR, "the native code failed to build"
    return None


def _symbol_problems(v, static, prebuild, f):
    return (Status.ILLEGAL, "native code " + "; ".join(f.symbol_problems[:5])) if f.symbol_problems else None


def _integrity(v, static, prebuild, f):
    if f.integrity:
        return Status.ILLEGAL, "the candidate replaced harness functions or settings: " + ", ".join(f.integrity)
    return None


def _import_error(v, static, prebuild, f):
    return (Status.RUNTIME_ERROR, _first_line(f.import_error)) if f.import_error else None


def _crashed_before_trials(v, static, prebuild, f):
    return (Status.RUNTIME_ERROR, f.crashed) if f.crashed and not f.trials else None


def _record_trials(v, static, prebuild, f):
    trials = f.trials
    v.trials_total = len(trials) + (1 if f.spot_check else 0)
    v.trials_passed = sum(t.passed for t in trials)
    v.correctness = v.trials_passed / v.trials_total if v.trials_total else 0.0
    errs = [t for t in trials if t.max_abs is not None]
    if errs:
        worst = max(errs, key=lambda t: t.max_abs)
        v.max_abs_err, v.mean_abs_err, v.error_where = worst.max_abs, worst.mean_abs, worst.where
    v.ops_seen = f.ops
    v.illegal_ops = f.illegal_ops
    v.kernel_launches = f.launches
    prof = f.profile
    v.kernel_time_share = prof["share"] if prof else None
    if prof:
        v.details["profile"] = prof


def _failed(f: Facts) -> list:
    return [t for t in f.trials if not t.passed]


def _processes_spawned(v, static, prebuild, f):
    n = f.processes_spawned
    if not n:
        return None
    return Status.ILLEGAL, (f"the candidate started {'a process' if n == 1 else f'{n} processes'} that "
                            f"{'was' if n == 1 else 'were'} still running after forward returned (a double fork, "
                            "setsid or a cleared subreaper flag does not take one out of the candidate's process "
                            "tree); killed with it")


def _busy_after_return(v, static, prebuild, f):
    return (Status.ILLEGAL, f.busy_after_return) if f.busy_after_return else None


def _illegal_ops(v, static, prebuild, f):
    if v.illegal_ops:
        counts = ", ".join(f"{op} x{v.ops_seen.get(op, 0)}" for op in v.illegal_ops)
        return Status.ILLEGAL, f"forward calls PyTorch compute ops outside the allowlist: {counts}"
    return None


def _crashed(v, static, prebuild, f):
    return (Status.RUNTIME_ERROR, f.crashed) if f.crashed else None


def _device_lost(v, static, prebuild, f):
    if f.fatal and not _failed(f):
        return Status.RUNTIME_ERROR, "the device became unusable after the candidate ran"
    return None


def _every_trial_raised(v, static, prebuild, f):
    failed = _failed(f)
    if failed and len(failed) == len(f.trials) and all(t.error for t in failed):
        return Status.RUNTIME_ERROR, f"forward raised: {failed[0].reason}"
    return None


def _no_own_launch(v, static, prebuild, f):
    if not v.kernel_launches:
        return Status.ILLEGAL, "no kernel of the candidate's own ran during forward (decoy kernel)"
    return None


def _no_own_device_kernel(v, static, prebuild, f):
    if f.profile is not None and f.profile.get("own_kernels", 1) == 0:
        return Status.ILLEGAL, "the candidate's extension ran but launched no device kernel of its own"
    return None


def _trials_failed(v, static, prebuild, f):
    failed = _failed(f)
    if failed:
        t = failed[0]
        return Status.INCORRECT, f"{len(failed)}/{len(f.trials)} trials failed; first: [{t.kind}] {t.reason}"
    return None


def _spot_check(v, static, prebuild, f):
    if f.spot_check:
        return Status.INCORRECT, "output changed between correctness checks and timing: " + f.spot_check
    return None


def _timing_error(v, static, prebuild, f):
    return (Status.RUNTIME_ERROR, "failed while timed: " + _first_line(f.timing_error)) if f.timing_error else None


# The evaluator's sequence: the first rule that decides sets the verdict (order matters).
_RULES = (
    _static_refused,         # the static check refused the source
    _prebuild_failed,        # the native code failed to build before the run (keeps the build log)
    _prebuild_symbols,       # the prebuilt native code imports forbidden symbols
    _record_run,             # (records the run's stage seconds and details)
    _infra_error,            # the verifier itself failed
    _task_error,             # the task could not be set up
    _timed_out,              # the run went past its time limit
    _compile_error,          # the native code failed to build in the run (keeps the build log)
    _symbol_problems,        # the native code built in the run imports forbidden symbols
    _integrity,              # the candidate replaced harness functions or settings
    _import_error,           # importing the candidate failed
    _crashed_before_trials,  # the candidate crashed before any trial ran
    _record_trials,          # (records trial counts, errors, ops, launches and the profile)
    _processes_spawned,      # processes of the candidate outlived forward
    _busy_after_return,      # the candidate kept working after forward returned
    _illegal_ops,            # forward ran PyTorch compute ops outside the allowlist
    _crashed,                # the candidate crashed during the trials
    _device_lost,            # the device became unusable though no trial failed
    _every_trial_raised,     # every trial raised
    _no_own_launch,          # no kernel of the candidate's own ran (decoy)
    _no_own_device_kernel,   # its extension ran but launched no device kernel of its own
    _trials_failed,          # some trial's output was wrong
    _spot_check,             # the output changed between the correctness checks and timing
    _timing_error,           # it failed while timed
)


def _decide_ok(v: Verdict, cfg, f: Facts) -> None:
    """No rule decided: OK, with the timing's figures and what the reason notes about them."""
    if f.timing:
        _apply_timing(v, cfg, f)
    speed = f"; {v.speedup_eager:.2f}x vs eager" if v.speedup_eager else ""
    v.status, v.reason = Status.OK, "correct and legal" + speed
    if f.timing:
        lo, hi = v.details["speedup_interval"]
        if lo <= 1.0 <= hi:
            v.reason += f" (within noise: 95% interval {lo:.2f}-{hi:.2f})"
        if f.timing.outside_included:
            v.reason += ("; it spent clearly longer than the reference preparing its calls or reading its outputs "
                         "back: timed with that time included")
        if f.timing.method == "kernelbench":
            v.reason += "; timed by KernelBench's method in each process (comparable, not tamper-proof)"
    if v.sol_flag:
        v.reason += f"; FLAG: faster than the speed-of-light estimate ({v.sol_ms:.4g} ms)"


def _apply_timing(v: Verdict, cfg, f: Facts) -> None:
    t = f.timing
    v.candidate_ms, v.timing_rse, v.timing_reps = t.candidate_ms, t.rse, t.reps
    v.eager_ms, v.speedup_eager = t.reference_ms, t.speedup
    v.compile_ms, v.speedup_compile = t.compile_ms, t.compile_speedup
    v.details.update(speedup_interval=[round(t.speedup_low, 4), round(t.speedup_high, 4)], timing_method=t.method,
                     graphs=t.graphs, calls_per_block=t.calls, timer_floor_ms=t.floor_ms, threads=t.threads,
                     reference_self_ms=t.reference_self_ms, round_trip_ms=t.round_trip_ms,
                     spares_starting=t.spares_starting,
                     outside_ms=t.outside_ms,
                     outside_included=t.outside_included, quiet_wait_ms=t.quiet_wait_ms, probe_s=t.probe_s,
                     held_bytes=t.held_bytes)
    if f.rates:
        v.sol_ms = speed_of_light_ms(f.bytes, f.flops, f.rates)
        v.details["roofline"] = {"bytes": f.bytes, "flops": f.flops, **f.rates}  # which term sets it (feedback.py)
        v.sol_flag = bool(v.candidate_ms < cfg.timing.sol_margin * v.sol_ms)
