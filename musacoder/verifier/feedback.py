"""Feedback text for multi-turn repair: what failed, where, and what to do next; for a correct kernel, what bounds
its speed and what to change (`bottleneck`).

The bottleneck class is computed from facts the verifier measured, by stated rules, first match:

- host-overhead: the candidate's time a call on the judge's clock (`candidate_ms`, from which the round trip is
  taken off, plus its share of it) is under HOST_FLOOR x its share of the harness's own round trip (`timer_floor_ms`
  over `calls_per_block`: the round trip is paid once a block of calls): fixed cost is most of what was timed, so a
  faster kernel body would not show;
- foreign-kernels: the candidate's own kernels have under OWN_SHARE of the device time of a profiled forward
  (`kernel_time_share`): the rest is kernels it did not write (copies from `.contiguous()`/`.to()`, fills from
  `torch.zeros`, library calls);
- launch-bound: MANY_LAUNCHES or more launches of its own kernels per forward (`details.profile.own_kernels`);
- with Nsight Compute metrics of its kernels (`ncu`: per launch `sm_pct`, `memory_pct`, as synth/profiling.py
  measures them), Nsight Compute's own rule on the longest kernel: memory-bound when its memory throughput is at
  least BOUND_PCT of peak and above its SM throughput, compute-bound when its SM throughput is, else latency-bound;
- else by the speed-of-light estimate (`sol_ms`: the task's bytes over measured bandwidth or its flops over the
  measured matmul rate, whichever is larger): at NEAR_ROOF or more of it, the kernel is at the hardware's limit for
  this work, memory-bound or compute-bound by whichever term sets the estimate (`details.roofline`, where recorded;
  near-roofline without it); below it, latency-bound: neither limit is near, the kernel waits.

No class without timing (a failed or untimed candidate): its feedback is about correctness.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from musacoder.verifier.verdict import Status, Verdict

_ERR_LINE = re.compile(r"(error|Error|ERROR)[^\n]*")

HOST_FLOOR = 2.0  # timed at under twice the harness's round trip: the per-call cost is most of it
OWN_SHARE = 0.5  # own kernels under half the device time: the rest is glue
MANY_LAUNCHES = 3  # own kernel launches per forward from which fusing them is the first change
NEAR_ROOF = 0.6  # at this share of the speed-of-light estimate or more, the kernel is at the hardware's limit
BOUND_PCT = 60.0  # Nsight Compute's line: under it for both SM and memory throughput, latency bounds the kernel

BOUND_ADVICE = {
    "memory-bound": "It moves data about as fast as the memory system allows, so a faster program moves fewer bytes: "
                    "fuse the neighbouring ops so intermediates stay on chip, read each input once, load wider.",
    "compute-bound": "Its arithmetic units are near their peak, so a faster program issues fewer instructions per "
                     "output: cheaper math, index arithmetic hoisted out of loops, tensor cores for matrix products.",
    "latency-bound": "Neither its arithmetic nor its memory is near its peak, so it mostly waits: on too few warps "
                     "(more blocks, fewer registers a thread), on dependent loads, or on a launch too small to fill "
                     "the GPU.",
    "near-roofline": "It is near the speed-of-light estimate for this task's bytes and flops, so a faster program "
                     "does less work: fewer passes over memory, fused neighbouring ops, no recomputation.",
    "host-overhead": "Cut what forward does on the host: allocations, `.contiguous()`/`.to()` copies, Python loops "
                     "and separate launches. At this size a faster kernel body would hardly show.",
    "foreign-kernels": "Remove the work outside your kernels: write into `torch.empty` outputs instead of zero-filled "
                       "ones, drop `.contiguous()`/`.clone()`/`.to()` copies by reading strides in the kernel, and "
                       "fold casts into it.",
    "launch-bound": "Fuse your kernels into fewer launches: intermediates then stay in registers instead of going "
                    "through global memory, and each launch's fixed cost is paid once.",
}


def kernel_bound(k: dict) -> str:
    """Nsight Compute's rule on one kernel's `sm_pct` and `memory_pct` (percent of peak)."""
    sm, mem = k.get("sm_pct") or 0.0, k.get("memory_pct") or 0.0
    if mem >= BOUND_PCT and mem >= sm:
        return "memory-bound"
    return "compute-bound" if sm >= BOUND_PCT else "latency-bound"


@dataclass(frozen=True)
class Bottleneck:
    kind: str  # a key of BOUND_ADVICE
    facts: str  # the measurements it follows from
    advice: str

    def text(self) -> str:
        return f"Bottleneck: {self.kind}. {self.facts} What to change: {self.advice}"


def bottleneck(v: Verdict, ncu: list[dict] | None = None) -> Bottleneck | None:
    """The rule of the module docstring over a timed verdict (and Nsight Compute's kernels, when measured)."""
    if v.status is not Status.OK or not v.candidate_ms:
        return None
    ms = v.candidate_ms
    floor = v.details.get("timer_floor_ms")
    if floor:
        floor /= v.details.get("calls_per_block") or 1  # a block's round trip, shared by its calls
    prof = v.details.get("profile") or {}
    timed = ms + (floor or 0.0)  # the judge's clock a call: candidate_ms has the round trip taken off (net_block_ms)
    if floor and timed < HOST_FLOOR * floor:
        return _b("host-overhead", f"Your forward timed {timed:.4g} ms a call on the harness's clock, under "
                                   f"{HOST_FLOOR:g}x its share of the harness's own round trip, {floor:.4g} ms.")
    if v.kernel_time_share is not None and v.kernel_time_share < OWN_SHARE:
        return _b("foreign-kernels", f"Your own kernels took {v.kernel_time_share:.0%} of the device time of a "
                                     "forward; the rest ran in kernels you did not write.")
    launches = prof.get("own_kernels")
    if launches is not None and launches >= MANY_LAUNCHES:
        return _b("launch-bound", f"A forward launches {launches} kernels of yours.")
    if ncu:
        k = max(ncu, key=lambda k: k.get("duration_ns") or 0)
        kind = kernel_bound(k)
        return _b(kind, f"Nsight Compute: your longest kernel runs at {k.get('sm_pct') or 0:.0f}% of peak SM "
                        f"throughput and {k.get('memory_pct') or 0:.0f}% of peak memory throughput.")
    if not v.sol_ms:
        return None
    own = ms
    share = v.sol_ms / own if own > 0 else 1.0
    if share < NEAR_ROOF:
        return _b("latency-bound", f"It reaches {share:.0%} of the speed-of-light estimate ({v.sol_ms:.4g} ms for "
                                   f"this task's bytes and flops, against your {own:.4g} ms beyond the harness's "
                                   "round trip).")
    roof = v.details.get("roofline") or {}
    kind = "near-roofline"
    if roof.get("bytes_per_s") and roof.get("flops_per_s"):
        kind = "memory-bound" if roof.get("bytes", 0) / roof["bytes_per_s"] >= roof.get("flops", 0) / \
            roof["flops_per_s"] else "compute-bound"
    return _b(kind, f"It reaches {min(share, 1.0):.0%} of the speed-of-light estimate ({v.sol_ms:.4g} ms).")


def _b(kind: str, facts: str) -> Bottleneck:
    return Bottleneck(kind, facts, BOUND_ADVICE[kind])


def first_compiler_errors(log: str, n: int = 5) -> str:
    lines = [m.group(0).strip() for m in _ERR_LINE.finditer(log)]
    seen, out = set(), []
    for ln in lines:
        if ln not in seen and "ninja" not in ln.lower() and "Error building extension" not in ln:
            seen.add(ln)
            out.append(ln[:300])
        if len(out) >= n:
            break
    return "\n".join(out) if out else log.strip()[-1500:]


def feedback_text(v: Verdict, ncu: list[dict] | None = None) -> str:
    parts = [f"Status: {v.status.value}", f"Reason: {v.reason}"]
    if v.status is Status.COMPILE_ERROR and v.compile_log:
        parts.append("First compiler errors:\n" + first_compiler_errors(v.compile_log))
    if v.trials_total:
        parts.append(f"Correctness: {v.trials_passed}/{v.trials_total} trials passed")
    if v.max_abs_err is not None and v.status is not Status.OK:
        parts.append(f"Max abs error {v.max_abs_err:.4g}, mean abs error {v.mean_abs_err or 0:.4g}"
                     + (f", worst at {v.error_where}" if v.error_where else ""))
    if v.illegal_ops:
        parts.append("Forbidden PyTorch ops called in forward: " + ", ".join(v.illegal_ops)
                     + ". Compute with your own kernels; only allocation and view ops are allowed.")
    if v.candidate_ms is not None:
        t = f"Timing: your kernel {v.candidate_ms:.4g} ms"
        if v.eager_ms is not None:
            t += f", PyTorch eager {v.eager_ms:.4g} ms (speedup {v.speedup_eager:.3g}x)"
        if v.compile_ms is not None:
            t += f", torch.compile {v.compile_ms:.4g} ms (speedup {v.speedup_compile:.3g}x)"
        parts.append(t)
    if b := bottleneck(v, ncu):
        parts.append(b.text())
    if v.portability:
        parts.append("MUSA portability (checked before compiling; these build, but break or slow down on Moore "
                     "Threads GPUs unless the line says they cannot build):\n"
                     + "\n".join(f"- {n}" for n in v.portability))
    if v.emulated:
        parts.append("Emulated: your MUSA code was translated to CUDA and verified on an NVIDIA GPU; 128-lane warps, "
                     "MUSA shared-memory limits and MUSA timing were not exercised.")
    if v.status is Status.OK:
        parts.append("The kernel is correct. Optimise it further while keeping it correct.")
    elif v.status is Status.RUNTIME_ERROR and v.trials_total and v.trials_passed == v.trials_total:
        # it failed later, while timed: "fix correctness" would send a correct kernel the wrong way
        parts.append("Every output was correct; what failed is in the reason above: fix that.")
    elif v.status in (Status.INCORRECT, Status.RUNTIME_ERROR, Status.COMPILE_ERROR):
        parts.append("Fix correctness first.")
    return "\n".join(parts)
