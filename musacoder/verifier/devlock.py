"""The lock judges take when several of them share one device. Their correctness trials and profiles run side by
side (a judge keeps a GPU ~11% busy), but a timing window runs alone: another judge's kernels in it would slow
the candidate's and the reference's arms by chance, and the speedup with them.

Two flock files per device: `lock`, shared for device work and exclusive for timing, and `gate`, which every
judge passes before taking `lock` and a timer holds while it waits, so a stream of judges doing device work cannot
starve a timer. A judge that dies releases its locks with its file descriptors. The files live in a directory with
a secret name in the shared-memory root, which candidates cannot list. A judge that cannot get the lock within
`wait_s` (another judge's candidate hangs in its checks) goes on without it and says so in its stage times
(`lock_timeout`): a hang elsewhere costs the device's other judges at most that, never a verdict."""

from __future__ import annotations

import fcntl
import os
import signal
import time
from contextlib import contextmanager
from pathlib import Path

from musacoder.proc import scratch


def lock_dir() -> Path:
    return scratch.new_dir("locks")


def shared_devices(on: list[int]) -> set[int]:
    """The devices that more than one judge runs on: only those need a lock."""
    return {d for d in on if on.count(d) > 1}


class DeviceLock:
    def __init__(self, path: str, stages: dict, wait_s: float = 60.0):
        self.path, self.stages, self.wait_s = path, stages, wait_s

    @contextmanager
    def shared(self):
        with self._hold(exclusive=False):
            yield

    @contextmanager
    def exclusive(self, stage: str = "timing_wait"):
        t0 = time.perf_counter()
        with self._hold(exclusive=True):
            if self.path:
                self.stages[stage] = round(time.perf_counter() - t0, 4)
            yield

    @contextmanager
    def _hold(self, exclusive: bool):
        if not self.path:  # this judge has its device to itself
            yield
            return
        deadline = time.monotonic() + self.wait_s
        fds = []
        try:
            gate = os.open(self.path + ".gate", os.O_RDWR | os.O_CREAT, 0o600)
            fds.append(gate)
            ok = _take(gate, fcntl.LOCK_EX, deadline)
            lock = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
            fds.append(lock)
            ok = ok and _take(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, deadline)
            if ok and not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)  # device work holds the gate only to pass it
            if not ok:
                self.stages["lock_timeout"] = self.wait_s
            yield
        finally:
            for fd in fds:
                os.close(fd)  # closing releases the flock


@contextmanager
def stopped_while_waiting(pid: int | None, hold):
    """Enter `hold` (a DeviceLock's shared or exclusive) with process `pid` (the judge's candidate, idle between its
    calls) stopped until the lock is had: a candidate whose threads keep launching kernels would otherwise put them
    into the window of the judge holding the lock, slowing its arms or answering its question of leftover work."""
    def signal_it(sig):
        try:
            if pid:
                os.kill(pid, sig)
        except ProcessLookupError:  # it died: its next call says so
            pass

    signal_it(signal.SIGSTOP)
    try:
        with hold:
            signal_it(signal.SIGCONT)
            yield
    finally:
        signal_it(signal.SIGCONT)


def _take(fd: int, how: int, deadline: float) -> bool:
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
