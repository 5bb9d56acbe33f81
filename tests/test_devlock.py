"""The lock of judges sharing one device: device work side by side, timing alone, timers not starved, a stuck
holder costs a bounded wait. flock conflicts between separate opens even within one process, so threads stand in
for judges."""

import threading
import time

from musacoder.config import VerifyConfig
from musacoder.pool.local import LocalPool
from musacoder.verifier.devlock import DeviceLock


def _hold(lock: DeviceLock, how: str, seconds: float, log: list, name: str, started: threading.Event | None = None):
    with getattr(lock, how)():
        log.append((name, "in", time.monotonic()))
        if started:
            started.set()
        time.sleep(seconds)
        log.append((name, "out", time.monotonic()))


def _run(*threads):
    for t in threads:
        t.start()
        time.sleep(0.05)  # a fixed arrival order
    for t in threads:
        t.join()


def test_device_work_overlaps_and_timing_runs_alone(tmp_path):
    path, log = str(tmp_path / "dev0"), []
    a, b, c = (DeviceLock(path, {}) for _ in range(3))
    _run(threading.Thread(target=_hold, args=(a, "shared", 0.4, log, "a")),
         threading.Thread(target=_hold, args=(b, "shared", 0.4, log, "b")),
         threading.Thread(target=_hold, args=(c, "exclusive", 0.2, log, "timer")))
    t = {(n, e): at for n, e, at in log}
    assert t[("b", "in")] < t[("a", "out")]  # two judges' checks at once
    assert t[("timer", "in")] >= max(t[("a", "out")], t[("b", "out")])  # the timer waited for both
    assert c.stages["timing_wait"] > 0.2


def test_a_waiting_timer_is_not_starved_by_later_device_work(tmp_path):
    path, log = str(tmp_path / "dev0"), []
    a, timer, late = (DeviceLock(path, {}) for _ in range(3))
    _run(threading.Thread(target=_hold, args=(a, "shared", 0.4, log, "a")),
         threading.Thread(target=_hold, args=(timer, "exclusive", 0.3, log, "timer")),
         threading.Thread(target=_hold, args=(late, "shared", 0.1, log, "late")))
    t = {(n, e): at for n, e, at in log}
    assert t[("late", "in")] >= t[("timer", "out")]  # it arrived while a held the lock, and queued behind the timer


def test_a_stuck_holder_costs_a_bounded_wait_and_is_recorded(tmp_path):
    path, log, started = str(tmp_path / "dev0"), [], threading.Event()
    holder = threading.Thread(target=_hold, args=(DeviceLock(path, {}), "exclusive", 1.5, log, "stuck", started))
    holder.start()
    started.wait()
    other = DeviceLock(path, {}, wait_s=0.3)
    t0 = time.monotonic()
    with other.exclusive():
        waited = time.monotonic() - t0
    holder.join()
    assert 0.3 <= waited < 1.2 and other.stages["lock_timeout"] == 0.3


def test_no_path_no_lock():
    lock = DeviceLock("", {})
    with lock.shared(), lock.exclusive():  # would deadlock with a real lock
        pass
    assert lock.stages == {}


def test_the_pool_gives_a_lock_only_to_judges_that_share_a_device(tmp_path):
    with LocalPool(VerifyConfig(backend="cpu", cache_dir=tmp_path, devices=(0, 0))) as pool:
        assert pool._locks[0] and pool._locks[0] == pool._locks[1]
        lock_dir = pool._lock_dir
        assert lock_dir.is_dir() and "musacoder-locks-" in lock_dir.name
    assert not lock_dir.exists()  # removed with the pool
    with LocalPool(VerifyConfig(backend="cpu", cache_dir=tmp_path)) as pool:
        assert pool._locks == [""] and pool._lock_dir is None
    # timing side by side: still a lock, for the checks and for timing again alone a candidate the device stayed
    # busy after
    cfg = VerifyConfig(backend="cpu", cache_dir=tmp_path, devices=(0, 0))
    cfg.timing.exclusive = False
    with LocalPool(cfg) as pool:
        assert pool._locks[0] and pool._locks[0] == pool._locks[1]


def test_a_candidate_waits_for_the_lock_stopped(tmp_path):
    """A judge's idle candidate whose thread keeps computing is stopped while its judge waits for the device (its
    work would land in the lock holder's window) and runs again once the lock is had."""
    import subprocess
    import sys

    import psutil

    from musacoder.verifier.devlock import stopped_while_waiting

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        proc, path = psutil.Process(spin.pid), str(tmp_path / "dev0")
        holder, held = DeviceLock(path, {}), threading.Event()
        t = threading.Thread(target=_hold, args=(holder, "exclusive", 0.8, [], "timer", held))
        t.start()
        held.wait()
        time.sleep(0.2)  # the spinner is up to speed
        before = sum(proc.cpu_times()[:2])
        with stopped_while_waiting(spin.pid, DeviceLock(path, {}).exclusive()):
            waited = sum(proc.cpu_times()[:2]) - before  # ~0.6 s of the holder's window went by
            time.sleep(0.3)
            ran = sum(proc.cpu_times()[:2]) - before - waited
        t.join()
        assert waited < 0.15 and ran > 0.1, (waited, ran)
        # a process that is gone costs nothing
        spin.kill()
        spin.wait()
        with stopped_while_waiting(spin.pid, DeviceLock(path, {}).shared()):
            pass
    finally:
        spin.kill()
