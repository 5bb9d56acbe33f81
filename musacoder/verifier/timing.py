"""Timing statistics. The protocol itself lives in the judge (`judge._Run.time_ab`): candidate and reference
alternate on fresh inputs in one window, each call timed by the judge's clock from the command to the reply (the
subject synchronises the device before replying, so side streams count); the L2 cache is flushed before each call.
A speedup counts in the reward only when its bootstrap interval over the paired iterations excludes 1."""

from __future__ import annotations

import math
import random
import statistics


def rse(samples: list[float]) -> float:
    """Relative standard error of the median, the statistic reported, from the median absolute deviation: one slow
    call among twenty (a clock change, a page fault) barely moves a median, and here it barely moves its error,
    where a standard deviation would keep the timing loop running to its budget (3x the pairs on an H100's GEMMs)."""
    if len(samples) < 2:
        return float("inf")
    med = statistics.median(samples)
    mad = statistics.median(abs(x - med) for x in samples)
    # 1.4826 MAD estimates a normal sigma; the median's standard error is sqrt(pi/2) sigma / sqrt(n)
    return 1.2533 * 1.4826 * mad / (med * math.sqrt(len(samples))) if med > 0 else float("inf")


def speed_of_light_ms(bytes_moved: int, flops: float, rates: dict) -> float:
    """The floor no implementation beats: the larger of memory time and arithmetic time at measured ceilings."""
    return 1e3 * max(bytes_moved / rates["bytes_per_s"], flops / rates["flops_per_s"])


def paired_speedup(ref_ms: list[float], cand_ms: list[float], rng: random.Random, resamples: int = 400,
                   level: float = 0.95) -> tuple[float, float, float]:
    """Speedup median(ref)/median(cand) of A/B pairs timed in one window, and its bootstrap interval (pairs are
    resampled together, so load that hit both sides of a pair cancels)."""
    n = len(ref_ms)
    point = statistics.median(ref_ms) / statistics.median(cand_ms)
    boots = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        boots.append(statistics.median(ref_ms[i] for i in idx) / statistics.median(cand_ms[i] for i in idx))
    boots.sort()
    lo = boots[int((1 - level) / 2 * resamples)]
    hi = boots[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return point, lo, hi


def reward_speedup(speedup: float | None, low: float | None, high: float | None) -> float | None:
    """The speedup the reward may use: the measured one only when its interval excludes 1, else 1 (noise)."""
    if speedup is None or low is None or high is None:
        return speedup
    return speedup if (low > 1.0 or high < 1.0) else 1.0


LEFT_RUNNING_MS = 1.0  # a wait for the device after the candidate's replies this much above the reference's is work


def left_running(after_cand: list[float], after_ref: list[float], quiet_after_kill: bool | None = None) -> str:
    """Why a candidate is refused for device work it left running after its replies ("" if it is not), from the
    quiet gate's waits (verifier/quiet.py): the device needed clearly longer to become quiet after its turns than
    after the reference's, in most pairs; or it stayed busy after both and was quiet once the candidate's process was
    gone (its work, not another process's load, which stays)."""
    if not after_cand or not after_ref:
        return ""
    mc, mr = statistics.median(after_cand), statistics.median(after_ref)
    pairs = list(zip(after_cand, after_ref))
    if mc - mr > LEFT_RUNNING_MS and sum(c > r + LEFT_RUNNING_MS / 2 for c, r in pairs) >= 0.75 * len(pairs):
        return (f"GPU work left running after forward returned: the device stayed busy {mc:.1f} ms after the "
                f"candidate's replies (median), {mr:.2f} ms after the reference's")
    if quiet_after_kill and mc > LEFT_RUNNING_MS:
        return (f"GPU work left running after forward returned: the device stayed busy after the candidate's replies "
                f"({mc:.1f} ms median) and was quiet once its process was gone")
    return ""
