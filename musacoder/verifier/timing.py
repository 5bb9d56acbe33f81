"""Timing statistics and the sizing of a timing window. The protocol itself lives in `window.py`: rounds of one
block per arm, each block a run of back-to-back calls on distinct fresh input sets, timed by the judge's clock from a
bare `go` to a bare `done` (the subject synchronises the device before `done`, so side streams count). A speedup
counts in the reward only when its bootstrap interval over the paired rounds excludes 1."""

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


MAX_CALLS = 1024  # calls a block at most: each is its own input set, allocated and opened once a window


def plan_calls(call_ms: float, set_bytes: int, out_bytes: int, cache_bytes: int, block_ms: float, mem_bytes: float,
               free_bytes: float | None = None, slow_call_ms: float = 0.0, block_max_ms: float = math.inf,
               held_bytes: int = 0) -> int:
    """Calls a block: enough for the block to last `block_ms` at the faster arm's `call_ms` (the round trip is paid
    once a block) and for its input sets to exceed twice the last-level cache (each call reads inputs no earlier call
    of the block left there), within `mem_bytes` of an arm's input sets, read-back rows, held outputs and
    intermediates kept in a graph (`held_bytes` a call), half of `free_bytes` for both arms', and `block_max_ms` of
    the slower arm's block at its `slow_call_ms`."""
    per_call = call_bytes(set_bytes, out_bytes, held_bytes)
    want = max(math.ceil(block_ms / max(call_ms, 1e-4)), math.ceil(2 * cache_bytes / max(set_bytes, 1)))
    cap = min(MAX_CALLS, int(mem_bytes // max(per_call, 1)))
    if slow_call_ms > 0:
        cap = min(cap, int(block_max_ms // slow_call_ms))
    if free_bytes is not None:
        cap = min(cap, int(0.5 * free_bytes // max(2 * per_call, 1)))
    return max(1, min(want, cap))


def call_bytes(set_bytes: int, out_bytes: int, held_bytes: int) -> int:
    """What one call of a block holds on one arm: its input set, its output, its read-back row, its intermediates."""
    return set_bytes + 2 * out_bytes + held_bytes


def probe_eight(one_call_ms: float, per_call_bytes: int, block_max_ms: float, mem_bytes: float) -> bool:
    """Whether a side is probed with blocks of 8 calls after its blocks of 1: not when its one call already lasts an
    eighth of `block_max_ms`, nor when 8 calls would hold more than a block may (`mem_bytes`), where a block is capped
    below 8 calls anyway. A captured probe keeps each call's intermediates (capture.py): 8 calls of a task with 4 GiB
    inputs held 64 GiB, and the next capture beside them failed (H200, 2026-11-29)."""
    return one_call_ms <= block_max_ms / 8 and 8 * per_call_bytes <= mem_bytes


HELD_RATIO = 4  # the most a candidate's intermediates in a graph weigh in the plan, against the reference's


def held_in_plan(ref_held: int, cand_held: int, out_bytes: int) -> int:
    """The intermediates a call keeps in a captured graph (verifier/capture.py) that the plan counts for each arm: the
    larger side's, where the candidate's own report counts up to HELD_RATIO times the reference's (or the output's
    size, where the reference keeps none). More would let a candidate shorten both arms' blocks, whose round trips then
    pull a slower kernel's ratio toward 1; an honest candidate past it keeps its own (the plan leaves half the device
    free)."""
    return max(ref_held, min(max(cand_held, 0), HELD_RATIO * max(ref_held, out_bytes)))


# A candidate's timed block may last BLOCK_OVERRUN times what its probed calls planned (at least BLOCK_FLOOR_S)
BLOCK_OVERRUN, BLOCK_FLOOR_S = 20.0, 5.0


def block_limit_s(calls: int, probed_ms: float) -> float:
    """The most a candidate's timed block may take from `go` to its read-back's end, in seconds. Work queued after its
    calls returned (exploit_46: ~0.3 s of spin kernels behind each call that returns in microseconds, so its probes
    can read fast and size 1,024-call blocks) would otherwise hold the judge for the whole run; past the limit the
    block is stopped and no speed is measured. An honest block lasts about its plan (cold inputs: a few times it)."""
    return max(BLOCK_OVERRUN * calls * probed_ms / 1e3, BLOCK_FLOOR_S)


# cpu: a block past its limit while other processes kept this many cores busy is given the limit again, this often
CONTENDED_CORES, CONTENDED_GRACES = 0.5, 3


def contended(busy_s: float, own_s: float, wall_s: float) -> bool:
    """Whether a cpu block that ran past its limit was slowed by other processes rather than by its own work: the
    machine's busy CPU seconds over the block, less the candidate's own, make at least CONTENDED_CORES cores on average.
    On 2 cores a build beside a block of 1,024 small OpenMP calls kept descheduling one of its threads, each parallel
    region waited for it, and an honest ReLU planned at 6.4 ms ran past 5 s (CI, 2026-11-29). A candidate that spins
    (cpu/exploit_72) is busy itself, one that sleeps leaves the machine idle: neither is given more."""
    return wall_s > 0 and (busy_s - own_s) / wall_s >= CONTENDED_CORES


PROBE_RATIO = 4.0  # timed calls this much faster than the probed ones, when the probe capped the blocks: refused


def net_block_ms(block_ms: float, floor_ms: float) -> float:
    """A block's time on the judge's clock less the protocol's own cost (`floor_ms`, a block of no calls to the clean
    reference), taken the same from both arms: the kernels' time, as do_bench's events see it (the round trip pulled the
    large elementwise rows' speedups 4-6% under the truth, H200 2026-11-29). At most half the block is taken off, so
    no block reads faster than twice what its kernels could."""
    return block_ms - min(max(floor_ms, 0.0), block_ms / 2)


def faster_than_probed(capped: bool, probed_ms: float, timed_ms: float) -> str | None:
    """Why no speed is measured, when the candidate's slow probe capped the blocks (`timing.block_max_ms`) but its
    timed calls ran far faster: the cap shortened the reference's blocks too, so their round trips would weigh on
    its time a call and flatter the candidate. None otherwise (an honest kernel is timed about as fast as probed)."""
    if capped and timed_ms * PROBE_RATIO < probed_ms:
        return (f"its timed calls ran {probed_ms / timed_ms:.0f}x faster than its probed calls ({timed_ms:.4g} "
                f"against {probed_ms:.4g} ms), whose slowness sized the blocks: no speed is measured")
    return None


def moved_out(cand_ms: list[float], ref_ms: list[float]) -> bool:
    """Whether the candidate's time outside its timed stretch (preparing a block before `ready`, reading its outputs
    back after `done`) is clearly longer than the reference's, paired by round: the same protocol moving the same
    bytes, so a clear excess is work moved out of the timed stretch (computed ahead, a lazily filled output, a thread
    finishing it), and its speed must count that time. Clear: a median excess over 10% of the reference's and 50 us,
    in three rounds of four."""
    if not cand_ms or not ref_ms:
        return False
    limit = max(0.1 * statistics.median(ref_ms), 0.05)
    pairs = list(zip(cand_ms, ref_ms))
    return (statistics.median(c - r for c, r in pairs) > limit
            and sum(c - r > limit / 2 for c, r in pairs) >= 0.75 * len(pairs))


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


def mean_ratio_interval(ref_ms: list[float], cand_ms: list[float], rng: random.Random, resamples: int = 400,
                        level: float = 0.95) -> tuple[float, float]:
    """Bootstrap interval of mean(ref)/mean(cand) for two sides timed apart (KernelBench's method: each side's trials
    in its own process, so nothing pairs them)."""
    boots = sorted(statistics.fmean(rng.choices(ref_ms, k=len(ref_ms))) /
                   statistics.fmean(rng.choices(cand_ms, k=len(cand_ms))) for _ in range(resamples))
    return boots[int((1 - level) / 2 * resamples)], boots[min(resamples - 1, int((1 + level) / 2 * resamples))]


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
