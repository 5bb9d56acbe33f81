"""The quiet gate between timed calls: on a device (cuda, triton, musa, QuietGate), and on the cpu (CpuGate).

A candidate's native thread can keep launching kernels after its forward has returned and the harness has
synchronised the device, so the reference timed next shares the GPU with them and looks slow (exploit
`cuda/exploit_45`: +18% of unearned speedup before this gate). Two measures, both outside the candidate's reach:

- its process is stopped (SIGSTOP) from its reply to its next command: no thread of it can launch anything while the
  reference runs;
- after each reply the judge waits until the device is quiet: a tiny kernel of its own, launched and synchronised,
  returns at its idle latency (`calibrate`) only when no other context holds the GPU (contexts time-slice it). What
  was launched before the stop landed has then drained before the next arm starts.

The waits are the evidence: work the candidate left running shows as a wait after its replies and not after the
reference's (`timing.left_running` decides); another process's load on the GPU shows after both.

On the cpu the threat is the same with cores for the GPU: a detached thread left spinning after forward returned
(exploit `cpu/exploit_32`) shares the cores with the reference timed next. Its process is stopped after a short sample
of its CPU clock, so nothing of it runs until its next block; the sample is the evidence."""

from __future__ import annotations

import math
import os
import signal
import statistics
import time

import torch

from musacoder.proc.process import cpu_seconds, stop_and_wait

_IDLE_MS: dict[str, float] = {}  # per device: the lowest idle probe latency this judge process has measured


def _probe(buf: torch.Tensor, synchronize) -> float:
    t0 = time.perf_counter()
    buf.add_(1)
    synchronize()
    return (time.perf_counter() - t0) * 1e3


def calibrate(device: torch.device, synchronize) -> float:
    """The device's idle probe latency, measured at the start of each job before its candidate's process is taken
    (the previous candidate's process and context are gone; spares have run nothing) and kept as the lowest this
    process has seen: no candidate can raise the threshold its own leftovers are judged by (a kernel left running from
    its last call before the window would have, had the window calibrated itself), and another judge's work at one
    job's start raises it for that job at most."""
    buf = torch.zeros(1, device=device)
    _probe(buf, synchronize)  # the first launch pays for module loading
    base = statistics.median(_probe(buf, synchronize) for _ in range(9))
    _IDLE_MS[str(device)] = min(_IDLE_MS.get(str(device), math.inf), base)
    return _IDLE_MS[str(device)]


class QuietGate:
    def __init__(self, pid: int, device: torch.device, synchronize, cap_s: float = 0.05):
        self.pid, self.sync, self.cap_s = pid, synchronize, cap_s
        self.buf = torch.zeros(1, device=device)
        base = _IDLE_MS.get(str(device)) or calibrate(device, synchronize)
        self.quiet_ms = max(3 * base, base + 0.05)  # an idle device answers at ~its base latency
        self.waits: dict[str, list[float]] = {"cand": [], "ref": []}
        self.stopped = False

    def probe(self) -> float:
        return _probe(self.buf, self.sync)

    def stop(self):
        self._signal(signal.SIGSTOP)
        self.stopped = True

    def resume(self):
        if self.stopped:
            self._signal(signal.SIGCONT)
            self.stopped = False

    def _signal(self, sig):
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:  # it died: the next call to it says so
            pass

    def wait(self, arm: str) -> float:
        """Wait after `arm`'s reply until the device is quiet or `cap_s` has passed; the ms waited, recorded."""
        t0 = time.perf_counter()
        while self.probe() > self.quiet_ms and time.perf_counter() - t0 < self.cap_s:
            pass
        ms = (time.perf_counter() - t0) * 1e3
        self.waits[arm].append(ms)
        return ms

    def quiet_now(self, probes: int = 10) -> bool:
        """Whether the device answers at its idle latency (after the candidate's process was killed)."""
        return statistics.median(self.probe() for _ in range(probes)) <= self.quiet_ms


AFTER_REPLY_S = 0.003  # the cpu sample after each of the candidate's replies
BUSY_SHARE = 0.1  # of the sampled time (2-vCPU VM: an honest ReLU used 0.07 ms of 38, exploit_32 17-56 ms)
STOPPED_RAN_S = 0.001  # CPU a stopped process used in all its stops: its clock stands still when every thread is


class CpuGate:
    """cpu: the candidate's process from each reply to its next block. Its CPU clock (all threads, exited ones too) is
    read over AFTER_REPLY_S, then every thread of it is stopped until its next block, and its clock read again when it
    is continued. Before this the process ran between its blocks and was metered there: a thread spinning 300 ms a
    call that mostly ran within the candidate's own blocks, or ended inside a ~300 ms gap, once read as idle (CI,
    2026-11-29). Now nothing it left running shares the cores with the reference, and whatever runs at a reply runs in
    the sample: an honest process's threads sleep once forward has returned (OpenMP's after ~1,000 spins,
    judge.subject_omp), a left-running one is busy in every sample. A process of its own that continues it (SIGCONT
    is its to send: same sandbox) shows as CPU used while stopped (exploit `cpu/exploit_74`)."""

    def __init__(self, pid: int):
        self.pid, self.stopped = pid, False
        self.used_s = self.sampled_s = self.stopped_ran_s = self._at_stop = 0.0

    def stop(self):
        t0, c0 = time.perf_counter(), cpu_seconds(self.pid)
        time.sleep(AFTER_REPLY_S)
        self.used_s += max(0.0, cpu_seconds(self.pid) - c0)
        self.sampled_s += time.perf_counter() - t0
        self.stopped = True
        stop_and_wait(self.pid)  # not stopped in time: a thread in a system call, stopped when it returns
        self._at_stop = cpu_seconds(self.pid)

    def resume(self):
        if self.stopped:
            self.stopped_ran_s += max(0.0, cpu_seconds(self.pid) - self._at_stop)
            try:
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:  # it died: the next call to it says so
                pass
            self.stopped = False

    def busy(self) -> str:
        """Why its process is refused for work left running after its blocks ("" when it is not)."""
        if self.stopped_ran_s > STOPPED_RAN_S:
            return (f"the candidate process used {self.stopped_ran_s * 1e3:.1f} ms of CPU after forward returned, "
                    "while stopped between its timed blocks (continued by a process of its own)")
        if self.used_s > BUSY_SHARE * self.sampled_s:
            return (f"the candidate process used {self.used_s * 1e3:.1f} ms of CPU after forward returned, in "
                    f"{self.sampled_s * 1e3:.1f} ms sampled after its timed blocks (work left running in the "
                    "background)")
        return ""
