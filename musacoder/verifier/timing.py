"""Timing protocol, shared by candidates and baselines so their numbers are comparable.

Inputs live in two buffer slots used alternately, refilled (untimed, generated on the device) each iteration with
input set (i // 2) % K: every iteration sees a different address than the one before, and each address recurs with
different contents, so an output memoised on `data_ptr`/`id()`/shape is returned for the wrong inputs and caught.
Only the K reference outputs are kept, never K input copies, so multi-GB tasks fit. The cache is flushed, the device is synchronised device-wide before the stop timestamp (side streams count),
and the output is checked against the reference for that input set (phase detection and memoisation fail).
Repetitions run until the relative standard error of the mean is under the target, or the budget is spent.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field

import torch



class SpotCheckFailed(RuntimeError):
    """The output changed between correctness checking and timing."""


@dataclass
class TimingResult:
    median_ms: float
    mean_ms: float
    std_ms: float
    rse: float
    reps: int
    samples: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"median_ms": self.median_ms, "mean_ms": self.mean_ms, "std_ms": self.std_ms, "rse": self.rse,
                "reps": self.reps}


def time_callable(fn, make_set, n_sets: int, backend, cfg, check=None, traced_call=None) -> TimingResult:
    """Time fn over input sets make_set(0..n_sets-1). check(out, k) returns a reason on mismatch; traced_call(args)
    runs one iteration under the op tracer at a random position (excluded from the statistics)."""
    timer = backend.timer()
    slots = [make_set(0), make_set(0)]
    samples: list[float] = []
    trace_at = random.randint(cfg.warmup, cfg.warmup + cfg.min_reps - 1) if traced_call else -1
    t_begin = None
    i = 0
    while True:
        k = (i // 2) % n_sets
        args = slots[i % 2]
        _refill(args, make_set(k))
        if cfg.l2_flush:
            backend.flush_cache()
        if i == trace_at:
            out = traced_call(args)
        else:
            timer.start()
            with torch.no_grad():
                out = fn(*args)
            ms = timer.stop()
            if i >= cfg.warmup:
                samples.append(ms)
                if t_begin is None:
                    t_begin = time.perf_counter()
        if check is not None:
            reason = check(out, k)
            if reason:
                raise SpotCheckFailed(f"timed iteration {i}: {reason}")
        i += 1
        n = len(samples)
        if n >= cfg.max_reps:
            break
        if n >= cfg.min_reps:
            rse = _rse(samples)
            if rse < cfg.rse_target or time.perf_counter() - t_begin > cfg.budget_s:
                break
    return TimingResult(statistics.median(samples), statistics.fmean(samples), statistics.pstdev(samples),
                        _rse(samples), len(samples), samples)


def _refill(dst, src):
    for d, s in zip(dst, src):
        if isinstance(d, torch.Tensor):
            d.copy_(s)
        elif isinstance(d, (list, tuple)):
            _refill(d, s)


def _rse(samples: list[float]) -> float:
    if len(samples) < 2:
        return float("inf")
    mean = statistics.fmean(samples)
    return statistics.stdev(samples) / (mean * math.sqrt(len(samples))) if mean > 0 else float("inf")


def speed_of_light_ms(bytes_moved: int, flops: float, rates: dict) -> float:
    """The floor no implementation beats: the larger of memory time and arithmetic time at measured ceilings."""
    return 1e3 * max(bytes_moved / rates["bytes_per_s"], flops / rates["flops_per_s"])
