"""verifier/window.py: one timing window end to end on the cpu, the protocol's floor measured with the candidate
stopped, the cpu subjects' allocator settings, and the rule that stops a window early."""

import os

import pytest

from musacoder.config import VerifyConfig


@pytest.fixture(scope="module")
def relu_verdict(cache_dir):
    from musacoder import verify
    from musacoder.examples_catalog import EXAMPLES_DIR
    from musacoder.tasks import builtin_task

    cfg = VerifyConfig(backend="cpu", cache_dir=cache_dir, profile="kernelbench")
    cfg.timing.baselines, cfg.timing.budget_s = ("eager",), 0.5
    return verify(builtin_task("level1/19_ReLU"), (EXAMPLES_DIR / "cpu" / "honest_relu.py").read_text(), cfg)


def test_an_honest_kernel_is_timed_in_blocks_of_calls_on_the_cpu(relu_verdict):
    v = relu_verdict
    assert v.status.value == "ok", v.reason
    d = v.details
    assert d["timing_method"] == "judge" and d["graphs"] is False
    assert d["calls_per_block"] >= 2  # 1 MiB inputs: a block's sets exceed twice the last-level cache
    assert v.timing_reps >= 10 and v.candidate_ms > 0 and v.eager_ms > 0
    # the round trip is paid once a block, not once a call: a call's share of it is far below the call
    assert d["timer_floor_ms"] / d["calls_per_block"] < 0.25 * v.eager_ms
    assert len(d["outside_ms"]) == 2 and not d["outside_included"], d
    # both sides' probes timed; no graph on the cpu, so no intermediates kept for the plan to count
    assert len(d["probe_s"]) == 2 and min(d["probe_s"]) > 0 and d["held_bytes"] == 0, d
    # the protocol's share of each side's block: the judge's clock over the side's own; for the clean reference,
    # whose own clock can be believed, never negative and short of the block
    trip = d["round_trip_ms"]
    assert len(trip) == 2 and 0 <= trip[1] < v.eager_ms * d["calls_per_block"], d
    assert len(d["spares_starting"]) == 2 and d["spares_starting"][0] == 0, d  # the cpu settles them first


def test_the_floor_is_measured_with_the_candidates_process_stopped():
    """The floor comes off every block of both arms: a candidate whose threads ran beside the reference's empty
    blocks would lengthen it and flatter the faster arm, so its process is stopped while they run, and continued."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from musacoder.verifier.window import Window

    def state(pid):
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    cand = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a candidate computing meanwhile
    try:
        seen = []
        run = SimpleNamespace(cand=SimpleNamespace(pid=cand.pid),  # the judge's run: only what _floor reads
                              floor=lambda: seen.append(state(cand.pid)) or 0.07)
        window = Window.__new__(Window)
        window.run = run
        assert window._floor() == 0.07 and seen == ["T"]  # stopped while the reference's blocks ran
        assert state(cand.pid) in "RS"  # and running again after
    finally:
        cand.kill()
        cand.wait()
    gone = SimpleNamespace(cand=SimpleNamespace(pid=cand.pid), floor=lambda: 1 / 0)
    window.run = gone
    assert window._floor() == 0.0  # a candidate already dead: no floor taken off, its next command says why


def test_cpu_subjects_keep_what_their_allocator_frees(monkeypatch):
    """A call's time on the cpu must not hang on where glibc's heap top happens to lie (page faults per call, 10 to
    3,200 for the same eager call): subjects start with the tunables that keep freed pages, the user's own kept."""
    import subprocess
    import sys

    from musacoder.verifier.judge import steady_malloc

    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    env = steady_malloc()
    assert "glibc.malloc.mmap_max=0" in env["GLIBC_TUNABLES"]
    probe = ("import resource, torch\nx = torch.rand(1 << 20)\nfor _ in range(50): (x * 2).sum()\n"
             "f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\nfor _ in range(200): (x * 2).sum()\n"
             "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f)")
    faults = int(subprocess.run([sys.executable, "-c", probe], env={**os.environ, **env},
                                capture_output=True, text=True, check=True).stdout)
    assert faults < 100  # 4 MiB freed and taken again 200 times (glibc's defaults: 0 to 7,000 faults, by the run)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert steady_malloc()["GLIBC_TUNABLES"].startswith("glibc.malloc.arena_max=2:")


def test_a_cpu_subjects_openmp_threads_spin_only_briefly_before_sleeping(tmp_path):
    """judge.subject_omp: both doors into a subject (its own environment, the zygote's) carry it, and an idle gap after
    a parallel region costs microseconds of CPU: an idle thread must not take the other subject's cores (OpenMP's
    default spins ~5 ms after each region)."""
    import subprocess
    import sys

    from musacoder.verifier.judge import private_env, subject_omp

    env = subject_omp()
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and int(env["GOMP_SPINCOUNT"]) <= 10_000
    assert {k: private_env(tmp_path)[k] for k in env} == env
    probe = ("import time, torch\ntorch.set_num_threads(2)\nx = torch.rand(1 << 20)\n"
             "for _ in range(20): x.relu()\nc = time.process_time()\n"
             "for _ in range(100): x.relu(); time.sleep(0.003)\nprint((time.process_time() - c) * 10)")
    per_gap_ms = float(subprocess.run([sys.executable, "-c", probe], env={**os.environ, **env, "OMP_NUM_THREADS": "2"},
                                      capture_output=True, text=True, check=True).stdout)
    assert per_gap_ms < 2.0  # the relu's own ~0.3 ms a call and the spin (OpenMP's default: ~5 ms here)


def test_a_window_stops_early_only_once_the_quiet_gate_already_refuses_the_candidate():
    from musacoder.verifier.window import _convicted

    busy = {"cand": [5.0, 6.0, 5.5, 7.0], "ref": [0.05, 0.04, 0.06, 0.05]}  # device busy after its blocks only
    assert _convicted(busy, elapsed_s=3.0, budget_s=2.0)
    assert not _convicted(busy, elapsed_s=1.0, budget_s=2.0)  # within the budget: the window goes on
    assert not _convicted({k: v[:3] for k, v in busy.items()}, 3.0, 2.0)  # too few pairs to decide on
    both = {"cand": [5.0, 6.0, 5.5, 7.0], "ref": [5.2, 5.9, 5.6, 6.8]}  # another process's load: after both
    assert not _convicted(both, 3.0, 2.0)
    honest = {"cand": [0.05, 0.06, 0.04, 0.05], "ref": [0.05, 0.04, 0.06, 0.05]}
    assert not _convicted(honest, 30.0, 2.0)
