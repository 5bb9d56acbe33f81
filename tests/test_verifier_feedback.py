"""Profiler facts in the repair turns (issue 44, F): the bottleneck class and what to change, computed from what a
verdict records (timing, the candidate kernels' share of device time, their launches, the speed-of-light estimate)
and from Nsight Compute's metrics where measured. Verdicts as samples.sqlite stores them (`Verdict.to_dict`); no
GPU needed."""

import json

import pytest

from musacoder.verifier.feedback import BOUND_ADVICE, bottleneck, feedback_text, kernel_bound
from musacoder.verifier.verdict import Verdict

# a correct, timed CUDA verdict as stored: the fields the rule reads, the rest at their defaults
STORED = json.loads("""{"status": "ok", "reason": "correct and legal; 1.31x vs eager", "task": "level1/19_ReLU",
 "backend": "cuda", "correctness": 1.0, "trials_passed": 16, "trials_total": 16, "kernel_launches": 17,
 "kernel_time_share": 0.97, "candidate_ms": 0.367, "eager_ms": 0.54, "compile_ms": 0.47, "timing_rse": 0.004,
 "timing_reps": 40, "speedup_eager": 1.31, "speedup_compile": 1.14, "sol_ms": 0.31, "reward": 0.7,
 "details": {"profile": {"own_kernels": 1, "share": 0.97, "names": ["relu_kernel(float const*, float*, long)"]},
             "speedup_interval": [1.28, 1.34], "timer_floor_ms": 0.045, "threads": 1}}""")


def verdict(**changes) -> Verdict:
    d = json.loads(json.dumps(STORED))
    details = changes.pop("details", {})
    d.update(changes)
    d["details"].update(details)
    return Verdict.from_dict(d)


def test_a_kernel_near_the_speed_of_light():
    b = bottleneck(verdict())  # 0.31 ms of 0.367 ms (the round trip is taken off candidate_ms): 84%
    assert b.kind == "near-roofline" and "84%" in b.facts and b.advice == BOUND_ADVICE["near-roofline"]
    # where the verdict records which term sets the estimate, it says which limit
    mem = verdict(details={"roofline": {"bytes": 268435456, "flops": 67108864, "bytes_per_s": 3.0e12,
                                        "flops_per_s": 5.0e13}})
    assert bottleneck(mem).kind == "memory-bound"
    gemm = verdict(details={"roofline": {"bytes": 50331648, "flops": 1.37e11, "bytes_per_s": 3.0e12,
                                         "flops_per_s": 5.0e13}})
    assert bottleneck(gemm).kind == "compute-bound"


def test_a_kernel_far_below_it_is_latency_bound():
    b = bottleneck(verdict(candidate_ms=2.0, sol_ms=0.32))  # 0.32 of 2.0 ms (the round trip already off): 16%
    assert b.kind == "latency-bound" and "16%" in b.facts and "0.32 ms" in b.facts


def test_time_at_the_harness_floor_is_host_overhead():
    b = bottleneck(verdict(candidate_ms=0.003, sol_ms=0.002))  # 3 us of work behind a 45 us round trip
    assert b.kind == "host-overhead" and "0.045 ms" in b.facts


def test_device_time_outside_the_candidates_kernels():
    b = bottleneck(verdict(kernel_time_share=0.31, details={"profile": {"own_kernels": 1, "share": 0.31}}))
    assert b.kind == "foreign-kernels" and "31%" in b.facts and "torch.empty" in b.advice


def test_many_launches_are_launch_bound():
    b = bottleneck(verdict(details={"profile": {"own_kernels": 5, "share": 0.95}}))
    assert b.kind == "launch-bound" and "5 kernels" in b.facts and "Fuse" in b.advice
    # the earlier classes come first: a forward at the floor is host-bound however many launches it makes
    assert bottleneck(verdict(candidate_ms=0.02, details={"profile": {"own_kernels": 5}})).kind == "host-overhead"


def test_nsight_compute_metrics_decide_where_measured():
    ncu = [{"kernel": "void relu_kernel(float const*, float*, long)", "duration_ns": 3100.0, "sm_pct": 12.0,
            "memory_pct": 78.0, "dram_pct": 70.1, "occupancy_pct": 81.0, "registers": 16.0, "grid": "(4096, 1, 1)",
            "block": "(256, 1, 1)"},
           {"kernel": "void fill_kernel(float*)", "duration_ns": 900.0, "sm_pct": 80.0, "memory_pct": 10.0}]
    b = bottleneck(verdict(), ncu)
    assert b.kind == "memory-bound" and "78%" in b.facts  # the longest kernel's
    assert kernel_bound({"sm_pct": 30.0, "memory_pct": 59.0}) == "latency-bound"
    assert kernel_bound({"sm_pct": 70.0, "memory_pct": 65.0}) == "compute-bound"


@pytest.mark.parametrize("changes", [dict(status="incorrect", candidate_ms=None), dict(candidate_ms=None),
                                     dict(sol_ms=None)])
def test_no_class_without_the_facts(changes):
    assert bottleneck(verdict(**changes)) is None


def test_the_feedback_turn_carries_it():
    text = feedback_text(verdict(details={"profile": {"own_kernels": 4, "share": 0.9}}))
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("Bottleneck: launch-bound."))
    assert lines[at - 1].startswith("Timing: your kernel 0.367 ms") and "What to change: Fuse" in lines[at]
    assert lines[-1] == "The kernel is correct. Optimise it further while keeping it correct."
    failed = feedback_text(verdict(status="incorrect", reason="2/16 trials failed", candidate_ms=None))
    assert "Bottleneck" not in failed and failed.endswith("Fix correctness first.")
    # refused while timed after every trial passed: the advice is not about correctness
    timed = feedback_text(verdict(status="runtime_error", reason="failed while timed: ...", candidate_ms=None,
                                  trials_passed=16, trials_total=16))
    assert "Fix correctness" not in timed and timed.endswith("what failed is in the reason above: fix that.")
    crashed = feedback_text(verdict(status="runtime_error", reason="CUDA error", candidate_ms=None,
                                    trials_passed=3, trials_total=16))
    assert crashed.endswith("Fix correctness first.")
