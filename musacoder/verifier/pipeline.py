"""Deciding the verdict from what the stages measured. Pure: no candidate code, no device, no I/O."""

from __future__ import annotations

from musacoder.config import VerifyConfig
from musacoder.verifier.feedback import feedback_text
from musacoder.verifier.reward import reward
from musacoder.verifier.static import StaticResult
from musacoder.verifier.timing import speed_of_light_ms
from musacoder.verifier.verdict import Status, Verdict


def _first_line(text: str, n: int = 400) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else text)[:n]


def decide(v: Verdict, cfg: VerifyConfig, static: StaticResult, prebuild: dict | None, facts: dict | None,
           baseline: dict | None) -> Verdict:
    """Fill `v` (which carries task, backend, hashes and any worker-level failure) from the stages' facts."""
    if v.status is None:
        _decide_status(v, cfg, static, prebuild, facts or {}, baseline)
    speed = v.speedup_eager
    v.reward = reward(v.status, v.correctness, speed, cfg.reward.lam, cfg.reward.nu_max)
    v.feedback = feedback_text(v)
    return v


def _decide_status(v: Verdict, cfg, static, prebuild, facts, baseline) -> None:
    def done(status: Status, reason: str):
        v.status, v.reason = status, reason

    if not static.ok:
        return done(static.status, static.reason)
    if prebuild and prebuild.get("build_error"):
        v.compile_log = prebuild["build_error"][-20000:]
        return done(Status.COMPILE_ERROR, "the native code failed to build")
    v.stage_seconds.update(facts.get("stage_seconds", {}))
    if facts.get("infra_error"):
        return done(Status.INFRA_ERROR, "verifier error: " + _first_line(facts["infra_error"]))
    if facts.get("task_error"):
        return done(Status.INFRA_ERROR, facts["task_error"][:1000])
    if facts.get("compile_error"):
        v.compile_log = facts["compile_error"][-20000:]
        return done(Status.COMPILE_ERROR, "the native code failed to build")
    if facts.get("integrity"):
        return done(Status.ILLEGAL, "the candidate replaced harness functions or settings: "
                    + ", ".join(facts["integrity"]))
    if facts.get("import_error"):
        return done(Status.RUNTIME_ERROR, _first_line(facts["import_error"]))

    trials = facts.get("trials", [])
    v.trials_total = len(trials) + (1 if facts.get("spot_check") else 0)
    v.trials_passed = sum(t["passed"] for t in trials)
    v.correctness = v.trials_passed / v.trials_total if v.trials_total else 0.0
    errs = [t for t in trials if t.get("max_abs") is not None]
    if errs:
        worst = max(errs, key=lambda t: t["max_abs"])
        v.max_abs_err, v.mean_abs_err, v.error_where = worst["max_abs"], worst["mean_abs"], worst.get("where")
    v.ops_seen = facts.get("ops", {})
    v.illegal_ops = facts.get("illegal_ops", [])
    v.kernel_launches = facts.get("launches")
    prof = facts.get("profile")
    v.kernel_time_share = prof["share"] if prof else facts.get("host_share")
    v.details = {k: facts[k] for k in ("launch_names", "builds", "profile", "profile_error", "worker_pid") if facts.get(k)}
    failed = [t for t in trials if not t["passed"]]

    if facts.get("processes_spawned"):
        return done(Status.ILLEGAL, f"the candidate started {facts['processes_spawned']} process(es); they were killed")
    if facts.get("threads_started", 0) > 0:
        return done(Status.ILLEGAL, f"the candidate started {facts['threads_started']} thread(s)")
    if v.illegal_ops:
        counts = ", ".join(f"{op} x{v.ops_seen.get(op, 0)}" for op in v.illegal_ops)
        return done(Status.ILLEGAL, f"forward calls PyTorch compute ops outside the allowlist: {counts}")
    if facts.get("fatal") and not failed:
        return done(Status.RUNTIME_ERROR, "the device became unusable after the candidate ran")
    if failed and len(failed) == len(trials) and all("error" in t for t in failed):
        return done(Status.RUNTIME_ERROR, f"forward raised: {failed[0]['reason']}")
    if not v.kernel_launches:
        return done(Status.ILLEGAL, "no kernel of the candidate's own ran during forward (decoy kernel)")
    if prof is not None and prof.get("own_kernels", 1) == 0:
        return done(Status.ILLEGAL, "the candidate's extension ran but launched no device kernel of its own")
    if failed:
        t = failed[0]
        return done(Status.INCORRECT, f"{len(failed)}/{len(trials)} trials failed; first: [{t['kind']}] {t['reason']}")
    if facts.get("spot_check"):
        return done(Status.INCORRECT, "output changed between correctness checks and timing: " + facts["spot_check"])
    if facts.get("timing_error"):
        return done(Status.RUNTIME_ERROR, "failed while timed: " + _first_line(facts["timing_error"]))

    timing = facts.get("timing")
    if timing:
        v.candidate_ms, v.timing_rse, v.timing_reps = timing["median_ms"], timing["rse"], timing["reps"]
        _apply_baseline(v, cfg, baseline or {})
    done(Status.OK, "correct and legal" + (f"; {v.speedup_eager:.2f}x vs eager" if v.speedup_eager else ""))
    if v.sol_flag:
        v.reason += f"; FLAG: faster than the speed-of-light estimate ({v.sol_ms:.4g} ms)"


def _apply_baseline(v: Verdict, cfg, baseline: dict) -> None:
    if "eager" in baseline:
        v.eager_ms = baseline["eager"]["median_ms"]
        v.speedup_eager = v.eager_ms / v.candidate_ms if v.candidate_ms else None
    if "compile" in baseline:
        v.compile_ms = baseline["compile"]["median_ms"]
        v.speedup_compile = v.compile_ms / v.candidate_ms if v.candidate_ms else None
    if baseline.get("rates"):
        v.sol_ms = speed_of_light_ms(baseline.get("bytes", 0), baseline.get("flops", 0.0), baseline["rates"])
        v.sol_flag = bool(v.candidate_ms is not None and v.candidate_ms < cfg.timing.sol_margin * v.sol_ms)
    if baseline.get("timer_floor"):
        v.details["timer_floor_ms"] = baseline["timer_floor"]["median_ms"]
    for k in ("eager_error", "compile_error", "error"):
        if baseline.get(k):
            v.details[f"baseline_{k}"] = baseline[k][-500:]
