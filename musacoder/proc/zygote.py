"""A fork server and its client: a process that imported once what its children need, forking one child per
request (~20 ms instead of a fresh interpreter and its imports).

The server's module runs as `python -m MODULE --fd N` and hands its socket to `serve`. A request carries the child's
arguments, environment and log file, and the child's end of a socket pair (SCM_RIGHTS), so the client talks to the
child directly. The child leads its own process group, as a spawned process does. The client cannot wait() for a
child it did not start: the server reaps each one and writes its exit code to `<log>.exit` (`Forked` reads it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

from musacoder.proc.process import WorkerProcess


def serve(sock: socket.socket, run_child: Callable[[list[str]], None], hello: dict) -> None:
    """The server's loop: say `hello`, then fork a child per request, which runs `run_child(argv + ["--fd", N])`.
    Returns when the client closes its end."""
    exits: dict[int, str] = {}  # child pid -> where to record how it ended (the client cannot wait() for it)

    def reap(*_):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in exits:
                try:
                    Path(exits.pop(pid)).write_text(str(os.waitstatus_to_exitcode(status)))
                except OSError:  # the client gave up waiting and removed the child's directory: nobody reads it
                    pass

    signal.signal(signal.SIGCHLD, reap)
    sock.send(json.dumps({"type": "hello", "pid": os.getpid(), **hello}).encode())
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
        except OSError:
            return
        if not msg:
            return
        req = json.loads(msg)
        # a child that dies at once must not be reaped before it is registered: its exit would go unrecorded
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(req, fds[0], sock, run_child)
        exits[pid] = req["log"] + ".exit"
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        os.close(fds[0])
        sock.send(json.dumps({"pid": pid}).encode())


def _child(req: dict, fd: int, sock, run_child):
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        sock.close()
        os.setsid()  # its own process group, as a spawned process has: the client kills the group
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.environ.update(req["env"])
        import tempfile

        tempfile.tempdir = None  # the server's cached temporary directory is not this child's
        run_child([*req["argv"], "--fd", str(fd)])
        code = 0
    except BaseException:  # os._exit below skips Python's own report: the client shows this log when a start fails
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(code)


class Forked:
    """What a process handle needs of a child the client did not start itself (Popen's pid/poll/wait): liveness from
    /proc, the exit code from the file the server writes when it reaps the child."""

    def __init__(self, pid: int, exit_file: Path):
        self.pid, self.exit_file = pid, exit_file
        self.returncode: int | None = None
        self.recorded = True  # False: it is gone and the server wrote no exit code in time (returncode is a guess)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                with open(f"/proc/{self.pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                        return None
            except OSError:
                pass
            for _ in range(50):  # the server records the exit right after reaping it
                if self.exit_file.exists() and self.exit_file.read_text():
                    self.returncode = int(self.exit_file.read_text())
                    break
                time.sleep(0.01)
            else:
                self.returncode, self.recorded = -signal.SIGKILL, False
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.01)
        return self.returncode


class Zygote:
    """The client's handle on a fork server running `python -m module`, started when first needed."""

    def __init__(self, module: str, env: dict, log_path: Path):
        self.module, self.env, self.log_path = module, env, log_path
        self.proc: subprocess.Popen | None = None
        self.hello: dict = {}

    def _start(self):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message, one packet
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", self.module, "--fd", str(child.fileno())],
                                         pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         env={**os.environ, **self.env}, start_new_session=True)
        child.close()
        self.sock = parent
        self.sock.settimeout(300)
        hello = self.sock.recv(1 << 16)
        if not hello:
            raise RuntimeError(f"the zygote did not start: {self.log_path.read_bytes()[-800:]!r}")
        self.hello = json.loads(hello)

    def running(self) -> dict:
        """Its hello, started if it is not running."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        return self.hello

    def fork(self, argv: list[str], env: dict, log: Path, fd: int) -> int:
        """Fork a child running `argv` with `env`, talking over `fd` (which the child receives); its pid."""
        for _ in range(2):
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            try:
                req = json.dumps({"argv": argv, "env": env, "log": str(log)}).encode()
                socket.send_fds(self.sock, [req], [fd])
                answer = self.sock.recv(1 << 16)
                if answer:
                    return json.loads(answer)["pid"]
            except OSError:
                pass
            self.close()  # it died between requests: start a new one once
        raise RuntimeError("the zygote stopped answering")

    def close(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.sock.close()
            self.proc = None


class ForkedWorker(WorkerProcess):
    """A worker process forked by a zygote instead of started from scratch; otherwise a WorkerProcess (the same
    calls, timeouts and process-tree kill: the child leads its own process group)."""

    def __init__(self, zygote: Zygote, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.zygote = zygote

    def launch(self) -> None:
        parent, child = socket.socketpair()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = self.argv[1:]  # the process's own arguments (argv[0] names its module, which the zygote runs)
        pid = self.zygote.fork(argv, self.env, self.log_path, child.fileno())
        child.close()
        self.proc = Forked(pid, Path(str(self.log_path) + ".exit"))
        self.conn = Connection(parent.detach())
        self.jobs = 0
