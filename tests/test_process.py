"""proc/process.py: a worker that died says how it ended, and that its end went unrecorded when its fork server wrote
no exit record (rather than guessing a signal)."""

import time

import pytest


def test_a_forked_subject_whose_end_went_unrecorded_says_so(tmp_path):
    """A forked subject's exit code comes from a record its fork server writes; when none came, the error said
    "signal SIGKILL" (a guess), which sent two sessions looking for a killer."""
    import socket
    import subprocess
    from multiprocessing.connection import Connection

    from musacoder.proc.process import WorkerDied, WorkerProcess
    from musacoder.proc.zygote import Forked

    gone = subprocess.Popen(["true"], start_new_session=True)  # left a zombie: its pid stays ours, never reused
    while open(f"/proc/{gone.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    try:
        proc = Forked(gone.pid, tmp_path / "exit")
        assert proc.poll() is not None and not proc.recorded
        worker = WorkerProcess("subject-cand", "cpu", tmp_path, ["musacoder.verifier.subject"])
        ours, _theirs = socket.socketpair()
        worker.proc, worker.conn = Forked(gone.pid, tmp_path / "exit"), Connection(ours.detach())
        with pytest.raises(WorkerDied, match="exit status not recorded"):
            worker._recv(5)
    finally:
        gone.wait()

