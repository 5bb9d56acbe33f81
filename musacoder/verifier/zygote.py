"""A fork server for subject processes: `python -m musacoder.verifier.zygote --fd N`.

Starting a candidate process from scratch costs the import of Python, torch and the harness (~1.5 s of CPU; ~10 s
with the CUDA runtime on an H200 host); a judge needs one per candidate. The zygote imports all of that once, creates
no device context and runs no candidate code, and forks one child per request (~20 ms; the way torch's own DataLoader
workers start). The child applies its environment and its sandbox before anything else runs, then becomes a subject
(`subject.main`), which creates its own device context. The request carries
the child's end of a socket pair (SCM_RIGHTS), so the judge talks to the child directly. A candidate's child forks
once more (`sandbox.own_namespace`): the subject runs as PID 1 of a PID namespace of its own, and the zygote's child
stays behind as its waiter, ending as it ended, so the exit the zygote records is the subject's; the judge's handle
moves to the subject once it says its pid (`proc.process.UnderWaiter`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

from musacoder.proc.process import WorkerProcess


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int, required=True)
    args = ap.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    from musacoder.proc.process import adopt_orphans_and_follow_parent

    adopt_orphans_and_follow_parent()
    # torch.cuda.is_available() (cpp_extension calls it on import) initialises the CUDA driver unless told to ask NVML,
    # and a child forked after that cannot use the device ("Cannot re-initialize CUDA in forked subprocess")
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    # what every subject imports, loaded once here (no device context: a CUDA context does not survive a fork)
    import torch

    import musacoder.backends  # noqa: F401
    import musacoder.verifier.buffers  # noqa: F401
    import musacoder.verifier.build  # noqa: F401
    import musacoder.verifier.inputs  # noqa: F401
    import musacoder.verifier.legality  # noqa: F401
    import musacoder.verifier.protocol  # noqa: F401
    from musacoder.backends import get_backend
    from musacoder.verifier import legality, subject

    # warm torch's Python dispatch machinery once (the first traced call costs ~0.7 s of CPU), on the CPU only
    with torch.no_grad(), legality.OpTrace(get_backend("cpu").torch_namespaces):
        torch.ones(2).clone().view(2, 1)

    device_fork = _children_can_use_the_device(torch)
    exits: dict[int, str] = {}  # child pid -> where to record how it ended (the judge cannot wait() for it)

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
                except OSError:  # the judge gave up waiting and removed the subject's directory: nobody reads it
                    pass

    signal.signal(signal.SIGCHLD, reap)
    sock.send(json.dumps({"type": "hello", "pid": os.getpid(), "device_fork": device_fork}).encode())
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
            _child(req, fds[0], sock, subject)
        exits[pid] = req["log"] + ".exit"
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        os.close(fds[0])
        sock.send(json.dumps({"pid": pid}).encode())


def _children_can_use_the_device(torch) -> bool:
    """Whether a child forked now could still initialise the device: torch marks it "in bad fork" when anything
    imported here initialised CUDA."""
    pid = os.fork()
    if pid == 0:
        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def _child(req: dict, fd: int, sock, subject):
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        sock.close()
        os.setsid()  # its own process group, as a spawned subject has: the judge kills the group
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.environ.update(req["env"])
        import tempfile

        tempfile.tempdir = None  # the zygote's cached temporary directory is not this child's
        subject.main([*req["argv"], "--fd", str(fd)])
        code = 0
    except BaseException:  # os._exit below skips Python's own report: the judge shows this log when a start fails
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(code)


class Forked:
    """What the judge's process handle needs of a child it did not start itself (Popen's pid/poll/wait): liveness from
    /proc, the exit code from the file the zygote writes when it reaps the child."""

    def __init__(self, pid: int, exit_file: Path):
        self.pid, self.exit_file = pid, exit_file
        self.returncode: int | None = None
        self.recorded = True  # False: it is gone and the zygote wrote no exit code in time (returncode is a guess)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                with open(f"/proc/{self.pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                        return None
            except OSError:
                pass
            for _ in range(50):  # the zygote records the exit right after reaping it
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
    """The judge's handle on its fork server."""

    def __init__(self, env: dict, log_path: Path):
        self.env, self.log_path = env, log_path
        self.proc: subprocess.Popen | None = None

    def _start(self):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message, one packet
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "musacoder.verifier.zygote", "--fd",
                                          str(child.fileno())], pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, env={**os.environ, **self.env}, start_new_session=True)
        child.close()
        self.sock = parent
        self.sock.settimeout(300)
        hello = self.sock.recv(1 << 16)
        if not hello:
            raise RuntimeError(f"the zygote did not start: {self.log_path.read_bytes()[-800:]!r}")
        self._device_fork = bool(json.loads(hello).get("device_fork"))

    def device_fork(self) -> bool:
        """Whether its children can use the device (started if it is not running)."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        return self._device_fork

    def fork(self, argv: list[str], env: dict, log: Path, fd: int) -> int:
        """Fork a subject running `argv` with `env`, talking over `fd` (which the child receives); its pid."""
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
    """A subject process forked by the zygote instead of started from scratch; otherwise a WorkerProcess (the same
    calls, timeouts and process-tree kill: the child leads its own process group)."""

    def __init__(self, zygote: Zygote, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.zygote = zygote

    def launch(self) -> None:
        parent, child = socket.socketpair()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = self.argv[1:]  # the subject's own arguments (argv[0] names its module)
        pid = self.zygote.fork(argv, self.env, self.log_path, child.fileno())
        child.close()
        self.proc = Forked(pid, Path(str(self.log_path) + ".exit"))
        self.conn = Connection(parent.detach())
        self.jobs = 0


if __name__ == "__main__":
    main()
