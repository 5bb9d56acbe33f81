"""Processes, the ground floor under the pool and the verifier: a persistent worker process (started in its own
process group, killed as a group on timeout), the descendants of a process, and reaping what a killed child left."""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path


def usable_cores() -> int:
    """The cores this process may run on (its affinity: `verify.cpus`, taskset), not the host's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)


def cpu_seconds(pid: int) -> float:
    """CPU seconds a process has used, all its threads, those that exited too; 0 once it is gone. The kernel's clock
    for it (clock_getcpuclockid: nanoseconds) where there is one, else psutil's (clock ticks: 10 ms, too coarse for a
    few ms of work left running after a reply)."""
    clock = _cpu_clock(pid)
    if clock is not None:
        try:
            return time.clock_gettime(clock)
        except OSError:  # gone
            return 0.0
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


def _cpu_clock(pid: int) -> int | None:
    import ctypes

    get = _clock_getcpuclockid()
    clock = ctypes.c_int()
    return clock.value if get is not None and get(pid, ctypes.byref(clock)) == 0 else None


@functools.cache
def _clock_getcpuclockid():
    import ctypes

    try:
        return ctypes.CDLL(None).clock_getcpuclockid
    except (OSError, AttributeError):  # no such libc symbol
        return None


def descendants(pid: int) -> list[int]:
    """All live descendants of a process (Linux /proc; empty elsewhere)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def stop_and_wait(pid: int, timeout_s: float = 0.5) -> bool:
    """SIGSTOP `pid` and wait until every thread of it is stopped (a stop is delivered asynchronously: a thread
    running on another core keeps running for a moment). False: it is gone, or a thread did not stop in time (one
    in a driver call); the caller sends SIGCONT either way."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            states = []
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:  # a thread or the process went meanwhile
            states = [""]
        if states and all(s in "Tt" and s for s in states):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


class UnderWaiter:
    """A process handle (Popen's pid/poll/wait/returncode) on a subject that runs as PID 1 of its own namespace, a
    child of the process that was started (`sandbox.own_namespace`): that process only waits for it and ends as it
    ended. The pid is the subject's, so signals, /proc reads and the process-tree count reach it and what it
    started; liveness and the exit status are the waiter's."""

    def __init__(self, waiter, pid: int):
        self.waiter, self.pid = waiter, pid

    @property
    def returncode(self) -> int | None:
        return self.waiter.returncode

    @property
    def recorded(self) -> bool:
        return getattr(self.waiter, "recorded", True)

    def poll(self) -> int | None:
        return self.waiter.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.waiter.wait(timeout)


class WorkerTimeout(RuntimeError):
    pass


class WorkerDied(RuntimeError):
    pass


class WorkerProcess:
    def __init__(self, role: str, backend: str, cache_dir: Path, argv: list[str], env: dict | None = None,
                 max_jobs: int = 64, start_timeout: float = 300.0, log_path: Path | None = None,
                 launcher: list[str] | None = None):
        """`argv`: the module to run (`python -m`) and its arguments, to which `--fd N` is added (a pool's worker, a
        judge's subject); `launcher`: a command that runs the Python process as its child (a profiler)."""
        self.role, self.backend, self.cache_dir = role, backend, Path(cache_dir)
        self.argv = argv
        self.env = env or {}
        self.launcher = launcher or []
        self.max_jobs = max_jobs
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.jobs = 0
        self.needs_restart = False
        self.hello: dict = {}
        self.log_path = log_path or self.cache_dir / "logs" / f"{role}-{os.getpid()}-{id(self)}.log"

    def start(self) -> dict:
        self.launch()
        return self.await_hello()

    def launch(self) -> None:
        """Start the process without waiting for it (call from the thread that will outlive it: children die
        with the thread that started them, PR_SET_PDEATHSIG)."""
        parent, child = socket.socketpair()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*self.launcher, sys.executable, "-m", *self.argv, "--fd", str(child.fileno())],
            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
            start_new_session=True)  # own process group: a timeout kills compilers and grandchildren too
        child.close()
        log.close()
        self.conn = Connection(parent.detach())
        self.jobs = 0

    def await_hello(self) -> dict:
        try:
            self.hello = self._recv(self.start_timeout)
        except (WorkerTimeout, WorkerDied) as e:
            self.kill()
            raise WorkerDied(f"{self.role} worker failed to start: {e}") from None
        # a subject in a namespace of its own says its pid before it runs anything of a candidate's
        pid = self.hello.get("pid")
        if pid and pid != self.proc.pid and _parent(pid) == self.proc.pid:
            self.proc = UnderWaiter(self.proc, pid)
        return self.hello

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def call(self, job: dict, timeout: float, on_request=None) -> dict:
        """Send a job, return its answer. Messages with a "type" the process sends meanwhile (a subject's build
        requests) are answered by `on_request(message) -> dict`; the time they take counts against `timeout`."""
        if not self.alive or self.needs_restart or self.jobs >= self.max_jobs:
            self.restart()
        self.jobs += 1
        try:
            self.conn.send_bytes(json.dumps(job).encode())
        except OSError:  # the process went away between jobs: not this job's doing, so retry once on a fresh one
            self.restart()
            self.conn.send_bytes(json.dumps(job).encode())
        deadline = time.monotonic() + timeout
        while True:
            result = self._recv(max(deadline - time.monotonic(), 0.001))
            if on_request is None or "type" not in result:
                break
            self.conn.send_bytes(json.dumps(on_request(result)).encode())
        self.needs_restart = bool(result.get("fatal") or result.get("recycle"))
        return result

    def _recv(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise WorkerTimeout(f"no answer within {timeout:.0f}s")
            try:
                if self.conn.poll(min(left, 1.0)):
                    return json.loads(self.conn.recv_bytes())
            except (EOFError, OSError):
                pass
            if self.proc.poll() is not None:
                code, recorded = self.proc.returncode, getattr(self.proc, "recorded", True)  # a forked subject's
                self.kill()
                what = ("exit status not recorded: its fork server did not reap it in time or is gone" if not recorded
                        else f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}")
                raise WorkerDied(f"the {self.role} worker died ({what}); log tail: {self.log_tail()}")

    def log_tail(self, n: int = 800) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def finish(self, timeout: float) -> int | None:
        """End the process the way it ends itself (its loop stops when the channel closes), so that a launcher
        writes what it collected; its exit status, or None when it had to be killed after `timeout`."""
        self.conn.close()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            self.kill()

    def restart(self):
        self.kill()
        self.needs_restart = False
        self.start()

    def kill(self):
        if self.proc is not None:
            # ninja puts each compiler in its own process group, so killing ours is not enough: take the whole
            # tree (the worker is its descendants' subreaper, so orphans are still in it), then the group. A process
            # already seen dead has been reaped and its pid may be another process's now: only its group is left
            # to kill (a group id is not handed out as a new pid while the group exists).
            seen_dead = self.proc.returncode is not None
            for pid in [] if seen_dead else [self.proc.pid, *descendants(self.proc.pid)]:
                try:
                    os.kill(pid, signal.SIGSTOP)  # freeze first, so nothing forks while we walk the tree
                except ProcessLookupError:
                    pass
            for pid in [] if seen_dead else [*descendants(self.proc.pid), self.proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:  # the group is the started process's (a waiter's, where the subject is below it)
                os.killpg(getattr(self.proc, "waiter", self.proc).pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            from musacoder.proc.scratch import sweep

            sweep(self.proc.pid)
        if self.conn is not None:
            self.conn.close()
        self.proc, self.conn = None, None


def adopt_orphans_and_follow_parent():
    """Linux: become the reaper of our descendants (a double-forked or setsid'd child of a candidate is still in
    our tree when it is killed) and die with our parent (a pool or judge killed hard leaves nothing running)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
