"""The paper's reward (eq. 2) of one verified candidate."""

from __future__ import annotations

from musacoder.verifier.verdict import Status


def reward(status: Status, q: float, speedup: float | None, lam: float = 0.5, nu_max: float = 4.0) -> float:
    """-1 on failure, fallback or q = 0; -0.5 + 0.5 q for partial correctness; 1 + lam * min(max(nu-1, 0), nu_max)
    when fully correct and legal."""
    if status in (Status.ILLEGAL, Status.FORMAT_ERROR, Status.COMPILE_ERROR, Status.TIMEOUT, Status.INFRA_ERROR):
        return -1.0
    if q <= 0.0:
        return -1.0
    if q < 1.0 or status is not Status.OK:
        return -0.5 + 0.5 * q
    nu = speedup if speedup is not None else 1.0
    return 1.0 + lam * min(max(nu - 1.0, 0.0), nu_max)
