"""Deciding the verdict from what the stages measured. Pure: no candidate code, no device, no I/O."""

from __future__ import annotations

from musacoder.config import VerifyConfig
from musacoder.verifier.feedback import feedback_text
from musacoder.verifier.protocol import Facts
from musacoder.verifier.reward import reward
from musacoder.verifier.static import StaticResult
from musacoder.verifier.timing import reward_speedup, speed_of_light_ms
from musacoder.verifier.verdict import Status, Verdict


def _first_line(text: str, n: int = 400) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else text)[:n]


def decide(cfg: VerifyConfig, static: StaticResult, prebuild: dict | None, facts: Facts | None,
           failure: tuple[Status, str] | None = None, **known) -> Verdict:
    """The verdict from the stages' findings: a worker-level `failure` (a dead or timed-out worker) when there is
    one, else the static check's, the build's and the judge's `facts`, in that order. `known`: the Verdict's fields
    the caller already has (task, backend, hashes, device, stage seconds, details)."""
    v = Verdict(status=Status.INFRA_ERROR, reason="", **known)  # both set below, before it is returned
    if failure:
        v.status, v.reason = failure
    else:
        _decide_status(v, cfg, static, prebuild, facts or Facts())
    if prebuild and prebuild.get("build_error") and not v.compile_log:
        v.compile_log = prebuild["build_error"][-20000:]
    speed = reward_speedup(v.speedup_eager, *v.details.get("speedup_interval", (None, None)))
    v.reward = reward(v.status, v.correctness, speed, cfg.reward.lam, cfg.reward.nu_max)
    v.feedback = feedback_text(v)
    return v


def _decide_status(v: Verdict, cfg, static, prebuild, f: Facts) -> None:  # noqa: C901
    def done(status: Status, reason: str):
        v.status, v.reason = status, reason

    if not static.ok:
        return done(static.status, static.reason)
    if prebuild and prebuild.get("build_error"):
        v.compile_log = prebuild["build_error"][-20000:]
        return done(Status.COMPILE_ERROR, "the native code failed to build")
    if prebuild and prebuild.get("symbol_problems"):
        return done(Status.ILLEGAL, "native code " + "; ".join(prebuild["symbol_problems"][:5]))
    v.stage_seconds.update(f.stage_seconds)
    v.details.update({k: v_ for k, v_ in (("sandbox", f.sandbox), ("tracer", f.tracer), ("builds", f.builds),
                                          ("launch_names", f.launch_names), ("worker_pid", f.worker_pid),
                                          ("candidate_pid", f.candidate_pid)) if v_})
    if f.infra_error:
        return done(Status.INFRA_ERROR, "verifier error: " + _first_line(f.infra_error))
    if f.task_error:
        return done(Status.INFRA_ERROR, f.task_error[:1000])
    if f.timed_out:
        return done(Status.TIMEOUT, f.timed_out)
    if f.compile_error:
        v.compile_log = f.compile_error[-20000:]
        return done(Status.COMPILE_ERROR, "the native code failed to build")
    if f.symbol_problems:
        return done(Status.ILLEGAL, "native code " + "; ".join(f.symbol_problems[:5]))
    if f.integrity:
        return done(Status.ILLEGAL, "the candidate replaced harness functions or settings: " + ", ".join(f.integrity))
    if f.import_error:
        return done(Status.RUNTIME_ERROR, _first_line(f.import_error))
    if f.crashed and not f.trials:
        return done(Status.RUNTIME_ERROR, f.crashed)

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
    failed = [t for t in trials if not t.passed]

    if f.processes_spawned:
        n = f.processes_spawned
        return done(Status.ILLEGAL, f"the candidate started {'a process' if n == 1 else f'{n} processes'} that "
                    f"{'was' if n == 1 else 'were'} still running after forward returned (a double fork, setsid or a "
                    "cleared subreaper flag does not take one out of the candidate's process tree); killed with it")
    if f.busy_after_return:
        return done(Status.ILLEGAL, f.busy_after_return)
    if v.illegal_ops:
        counts = ", ".join(f"{op} x{v.ops_seen.get(op, 0)}" for op in v.illegal_ops)
        return done(Status.ILLEGAL, f"forward calls PyTorch compute ops outside the allowlist: {counts}")
    if f.crashed:
        return done(Status.RUNTIME_ERROR, f.crashed)
    if f.fatal and not failed:
        return done(Status.RUNTIME_ERROR, "the device became unusable after the candidate ran")
    if failed and len(failed) == len(trials) and all(t.error for t in failed):
        return done(Status.RUNTIME_ERROR, f"forward raised: {failed[0].reason}")
    if not v.kernel_launches:
        return done(Status.ILLEGAL, "no kernel of the candidate's own ran during forward (decoy kernel)")
    if prof is not None and prof.get("own_kernels", 1) == 0:
        return done(Status.ILLEGAL, "the candidate's extension ran but launched no device kernel of its own")
    if failed:
        t = failed[0]
        return done(Status.INCORRECT, f"{len(failed)}/{len(trials)} trials failed; first: [{t.kind}] {t.reason}")
    if f.spot_check:
        return done(Status.INCORRECT, "output changed between correctness checks and timing: " + f.spot_check)
    if f.timing_error:
        return done(Status.RUNTIME_ERROR, "failed while timed: " + _first_line(f.timing_error))

    if f.timing:
        _apply_timing(v, cfg, f)
    done(Status.OK, "correct and legal" + (f"; {v.speedup_eager:.2f}x vs eager" if v.speedup_eager else ""))
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
                     reference_self_ms=t.reference_self_ms, outside_ms=t.outside_ms,
                     outside_included=t.outside_included, quiet_wait_ms=t.quiet_wait_ms)
    if f.rates:
        v.sol_ms = speed_of_light_ms(f.bytes, f.flops, f.rates)
        v.details["roofline"] = {"bytes": f.bytes, "flops": f.flops, **f.rates}  # which term sets it (feedback.py)
        v.sol_flag = bool(v.candidate_ms < cfg.timing.sol_margin * v.sol_ms)
