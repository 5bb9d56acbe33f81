"""verifier/quiet.py and timing.left_running: the quiet gate."""

import os
import signal
import time

import torch


def test_left_running_reads_the_quiet_gates_waits():
    """Work the candidate left on the device shows as waits after its replies only; another process's load shows
    after both (not refused) unless the device went quiet once the candidate's process was gone."""
    from musacoder.verifier.timing import left_running

    quiet, busy = [0.02] * 20, [9.0] * 20
    assert left_running(quiet, quiet) == ""
    assert "GPU work left running" in left_running(busy, quiet)
    assert left_running(busy[:4] + quiet[4:], quiet) == ""  # a few slow drains: noise, not a pattern
    assert left_running(busy, busy) == "" and left_running(busy, busy, quiet_after_kill=False) == ""
    assert "quiet once its process was gone" in left_running(busy, busy, quiet_after_kill=True)
    assert left_running([], []) == ""


def test_quiet_gate_keeps_the_lowest_idle_latency_and_waits_out_a_busy_device(monkeypatch):
    """The gate's logic on the cpu, its device faked by a synchronise that takes long while 'busy' (the real probe is
    a one-element kernel on the GPU, run there by the exploit suite): a busy device at one job's start cannot raise
    the threshold, and a wait lasts until a probe answers at the idle latency."""

    from musacoder.verifier import quiet

    monkeypatch.setattr(quiet, "_IDLE_MS", {})
    cpu = torch.device("cpu")
    idle = quiet.calibrate(cpu, lambda: None)
    assert quiet.calibrate(cpu, lambda: time.sleep(0.005)) == idle < 1.0
    busy = iter([True] * 4)
    gate = quiet.QuietGate(0, cpu, lambda: time.sleep(0.004) if next(busy, False) else None)
    assert gate.quiet_ms < 3.0
    assert gate.wait("cand") >= 12.0 and gate.wait("ref") < 3.0
    assert gate.waits["cand"][0] >= 12.0 and len(gate.waits["ref"]) == 1


def test_cpu_gate_sees_a_process_left_spinning_and_stops_it_until_the_next_block():
    """A process that spins after 'forward' returned is busy in every sample and, once stopped, uses no CPU until
    resumed; a sleeping process is not busy. Real processes: a shell loop stands in for exploit_32's native thread
    (the exploit suite runs that; the gate reads the process's clock, all its threads)."""
    import subprocess

    from musacoder.proc.process import cpu_seconds
    from musacoder.verifier.quiet import CpuGate

    procs = [subprocess.Popen(["bash", "-c", "while :; do :; done"]), subprocess.Popen(["sleep", "60"])]
    try:
        time.sleep(0.2)  # both started
        gates = [CpuGate(p.pid) for p in procs]
        for g in gates:
            for _ in range(4):
                g.resume()
                time.sleep(0.01)  # its block
                g.stop()
        busy, quiet = gates
        assert "sampled after" in busy.busy() and not quiet.busy(), (busy.used_s, quiet.used_s, busy.sampled_s)
        assert quiet.used_s < 0.002 and busy.used_s > 0.5 * busy.sampled_s
        used = cpu_seconds(procs[0].pid)  # stopped by its last stop()
        time.sleep(0.05)
        assert cpu_seconds(procs[0].pid) - used < 0.002
        busy.resume()
        time.sleep(0.05)
        assert cpu_seconds(procs[0].pid) - used > 0.02
        # continued behind the judge's back (a process of its own sends SIGCONT; here the test does): its clock ran
        # while it was to be stopped
        assert "while stopped" not in busy.busy()
        busy.stop()
        os.kill(procs[0].pid, signal.SIGCONT)
        time.sleep(0.05)
        busy.resume()
        assert "while stopped between its timed blocks" in busy.busy(), busy.stopped_ran_s
    finally:
        for p in procs:
            p.kill()
            p.wait()
