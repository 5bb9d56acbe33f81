"""Feedback text for multi-turn repair: what failed, where, and what to do next."""

from __future__ import annotations

import re

from musacoder.verifier.verdict import Status, Verdict

_ERR_LINE = re.compile(r"(error|Error|ERROR)[^\n]*")


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


def feedback_text(v: Verdict) -> str:
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
    if v.portability:
        parts.append("MUSA portability (checked before compiling; these build, but break or slow down on Moore "
                     "Threads GPUs unless the line says they cannot build):\n"
                     + "\n".join(f"- {n}" for n in v.portability))
    if v.emulated:
        parts.append("Emulated: your MUSA code was translated to CUDA and verified on an NVIDIA GPU; 128-lane warps, "
                     "MUSA shared-memory limits and MUSA timing were not exercised.")
    if v.status is Status.OK:
        parts.append("The kernel is correct. Optimise it further while keeping it correct.")
    elif v.status in (Status.INCORRECT, Status.RUNTIME_ERROR, Status.COMPILE_ERROR):
        parts.append("Fix correctness first.")
    return "\n".join(parts)
