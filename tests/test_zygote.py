"""verifier/zygote.py and proc/zygote.py: the fork server and its children."""

import os
import signal
import time


def test_the_fork_server_says_when_its_children_could_not_use_the_device():
    """Anything that initialised CUDA in the fork server leaves its children "in bad fork" (torch's flag): a forked
    child reports the flag and the judge then starts device subjects from scratch. The flag is faked (no GPU here);
    the fork and the report are real."""
    from types import SimpleNamespace

    from musacoder.verifier.zygote import _children_can_use_the_device

    def torch_with(bad: bool):
        return SimpleNamespace(cuda=SimpleNamespace(_is_in_bad_fork=lambda: bad))

    assert _children_can_use_the_device(torch_with(False))
    assert not _children_can_use_the_device(torch_with(True))


def test_a_fork_server_slow_to_reap_survives_a_judge_that_stopped_waiting(tmp_path):
    """On a loaded host (16 judges on 64 cores, 2026-11-26) the fork server reaped a killed candidate after the judge
    had given up waiting and removed the candidate's directory; writing the exit record there raised inside its SIGCHLD
    handler and killed it, and with it every spare it had forked: "no candidate process could be started (SIGKILL)"
    verdicts. The slow reap is made certain by stopping the server while the judge closes the candidate."""
    from musacoder.backends import get_backend
    from musacoder.verifier.judge import Subject
    from musacoder.verifier.zygote import SubjectZygote

    zygote = SubjectZygote({}, tmp_path / "logs" / "zygote.log")
    backend = get_backend("cpu")
    try:
        zygote.device_fork()  # started
        spare = Subject(backend, tmp_path, "cand", False, 1, zygote).ready()
        cand = Subject(backend, tmp_path, "cand", False, 1, zygote).ready()
        os.kill(zygote.proc.pid, signal.SIGSTOP)
        cand.close()  # kills it, waits 0.5 s for the exit record, removes its directory
        os.kill(zygote.proc.pid, signal.SIGCONT)
        time.sleep(1.0)
        assert zygote.proc.poll() is None and spare.proc.alive
        spare.close()
    finally:
        zygote.close()


def test_the_fork_server_plumbing_knows_no_verifier(tmp_path):
    """proc/zygote.py on its own: a server that imports nothing of the verifier forks a worker that answers over the
    socket it was handed, in its own environment, and records how it ended when it is killed."""
    import textwrap

    from musacoder.proc.zygote import ForkedWorker, Zygote

    (tmp_path / "echo_server.py").write_text(textwrap.dedent('''
        import json
        import os
        import socket
        import sys
        from multiprocessing.connection import Connection

        from musacoder.proc.zygote import serve


        def echo(argv):
            conn = Connection(int(argv[argv.index("--fd") + 1]))
            conn.send_bytes(json.dumps({"pid": os.getpid(), "argv": argv}).encode())
            while True:
                job = json.loads(conn.recv_bytes())
                conn.send_bytes(json.dumps({"echo": job, "env": os.environ.get("ECHO")}).encode())


        if __name__ == "__main__":
            serve(socket.socket(fileno=int(sys.argv[2])), echo, {"warm": True})
    '''))
    zygote = Zygote("echo_server", {"PYTHONPATH": str(tmp_path)}, tmp_path / "logs" / "zygote.log")
    worker = ForkedWorker(zygote, "echo", "cpu", tmp_path, ["echo_server", "--x", "1"], env={"ECHO": "yes"})
    try:
        assert zygote.running()["warm"]
        hello = worker.start()
        assert hello["argv"][:3] == ["--x", "1", "--fd"] and hello["pid"] == worker.proc.pid != zygote.proc.pid
        assert worker.call({"n": 1}, timeout=30) == {"echo": {"n": 1}, "env": "yes"}
        forked = worker.proc
        worker.kill()
        assert forked.returncode == -signal.SIGKILL and forked.recorded
        assert zygote.proc.poll() is None  # the server outlives its children
    finally:
        worker.kill()
        zygote.close()
