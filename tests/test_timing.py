"""verifier/timing.py: sizing a block and bounding a candidate's, the protocol's floor taken off a block, the rule for
work moved out of the timed stretch, the speedup's interval and the stop rule."""

import random

import pytest

from musacoder.verifier.timing import (
    BLOCK_FLOOR_S,
    MAX_CALLS,
    block_limit_s,
    contended,
    faster_than_probed,
    held_in_plan,
    mean_ratio_interval,
    moved_out,
    net_block_ms,
    plan_calls,
    probe_eight,
)

MIB = 2**20


def test_a_block_lasts_its_target_and_its_sets_exceed_twice_the_cache():
    # 0.01 ms calls: 1,000 of them make 10 ms
    assert plan_calls(0.01, MIB, MIB, 8 * MIB, block_ms=10, mem_bytes=2**40) == 1000
    # long calls: the cache decides (2 x 50 MiB over 4 MiB sets: 25)
    assert plan_calls(5.0, 4 * MIB, MIB, 50 * MIB, block_ms=10, mem_bytes=2**40) == 25
    # huge sets, long calls: one call a block
    assert plan_calls(50.0, 512 * MIB, 512 * MIB, 50 * MIB, block_ms=10, mem_bytes=2**40) == 1


def test_a_block_stays_within_its_memory_and_half_the_free_memory():
    # an arm holds its sets, its outputs and its read-back rows: 1 + 2 x 1 MiB a call
    assert plan_calls(0.001, MIB, MIB, 0, block_ms=10, mem_bytes=30 * MIB) == 10
    assert plan_calls(0.001, MIB, MIB, 0, block_ms=10, mem_bytes=2**40, free_bytes=60 * MIB) == 5
    assert plan_calls(1e-6, 1, 1, 0, block_ms=10, mem_bytes=2**40) == MAX_CALLS
    assert plan_calls(0.001, 4 * 2**30, 2**30, 0, block_ms=10, mem_bytes=MIB) == 1  # never none


def test_intermediates_kept_in_a_graph_count_in_the_memory_plan():
    # 1 MiB set, 1 MiB output (held and read back), 2 MiB of intermediates: 5 MiB a call in 30 MiB
    assert plan_calls(0.001, MIB, MIB, 0, block_ms=10, mem_bytes=30 * MIB, held_bytes=2 * MIB) == 6
    # the larger side's counts; a candidate's own report up to 4x the reference's, or its output's size
    assert held_in_plan(3 * MIB, MIB, MIB) == 3 * MIB
    assert held_in_plan(MIB, 3 * MIB, MIB) == 3 * MIB
    assert held_in_plan(MIB, 2**40, MIB) == 4 * MIB
    assert held_in_plan(0, 2**40, 2 * MIB) == 8 * MIB  # a reference that keeps none: the output's size
    assert held_in_plan(0, -5, MIB) == 0


def test_a_side_is_probed_with_eight_calls_only_where_a_block_of_eight_could_run():
    gib = 2**30
    assert probe_eight(0.01, 64 * MIB, block_max_ms=2000, mem_bytes=16 * gib)
    assert not probe_eight(300.0, 64 * MIB, block_max_ms=2000, mem_bytes=16 * gib)  # 8 calls past block_max_ms
    # the MSE task: 4 GiB inputs and 8 GiB of intermediates a call: a block is one call, so no 8-call capture of
    # 64 GiB beside the next one (H200, 2026-11-29)
    assert not probe_eight(6.0, 4 * gib + 8 * gib, block_max_ms=2000, mem_bytes=16 * gib)


def test_a_cpu_block_past_its_limit_is_given_more_only_when_other_processes_slowed_it():
    # a build kept a core busy beside the block: 9 of 10 busy CPU seconds over 5 s were not the candidate's
    assert contended(busy_s=10.0, own_s=1.0, wall_s=5.0)
    assert not contended(busy_s=5.2, own_s=5.0, wall_s=5.0)  # it spun itself (cpu/exploit_72)
    assert not contended(busy_s=0.3, own_s=0.0, wall_s=5.0)  # it slept on an idle machine
    assert not contended(busy_s=1.0, own_s=0.0, wall_s=0.0)


def test_the_contention_grace_reads_the_machines_load_and_runs_out():
    """window._Contention with this process as the candidate: a child spinning beside it is other processes' load."""
    import os
    import subprocess
    import sys
    import time

    from musacoder.verifier.timing import CONTENDED_GRACES
    from musacoder.verifier.window import _Contention

    grace = _Contention(os.getpid(), 2.0)
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"])
    try:
        time.sleep(1.0)
        given = [grace() for _ in range(CONTENDED_GRACES + 1)]
    finally:
        spinner.wait()
    assert given == [2.0] * CONTENDED_GRACES + [0.0]


def test_a_candidate_whose_slow_probe_capped_the_blocks_must_be_timed_as_slow():
    # exploit 70: 300 ms a probed call (the same input again), 0.05 ms a timed one (a new input set a call)
    assert "6000x faster than its probed calls" in faster_than_probed(True, 300.0, 0.05)
    assert faster_than_probed(True, 300.0, 290.0) is None  # exploit 46: as slow timed as probed, timed (and caught)
    assert faster_than_probed(True, 1.0, 0.3) is None  # within 4x: a warm probe, a cold timed call
    assert faster_than_probed(False, 300.0, 0.05) is None  # uncapped blocks: the probe decided nothing


def test_a_candidates_block_may_last_a_bounded_multiple_of_its_plan():
    # exploit_46 on an H200: 230 calls probed at 8.7 ms each, then ~0.3 s of spin kernels queued behind each call
    assert block_limit_s(230, 8.66) == pytest.approx(39.8, rel=0.01)
    # a short honest block (1,024 calls of 5 us) keeps the floor: cold inputs and a busy host stay far inside it
    assert block_limit_s(1024, 0.005) == BLOCK_FLOOR_S
    assert block_limit_s(1, 1000.0) == 20.0


def test_the_slower_arms_block_stays_within_block_max_ms():
    # sized by a 0.01 ms reference (1,000 calls), a candidate that keeps the device busy 0.3 s a call (exploit 46 on
    # an H200) would hold one block for 300 s: capped at 2 s of its calls, never below one call
    assert plan_calls(0.01, MIB, MIB, 8 * MIB, block_ms=10, mem_bytes=2**40, slow_call_ms=300,
                      block_max_ms=2000) == 6
    assert plan_calls(0.01, MIB, MIB, 8 * MIB, block_ms=10, mem_bytes=2**40, slow_call_ms=5000,
                      block_max_ms=2000) == 1
    # an honest candidate 3x slower than the reference keeps the block the reference's target sets
    assert plan_calls(0.01, MIB, MIB, 8 * MIB, block_ms=10, mem_bytes=2**40, slow_call_ms=0.03,
                      block_max_ms=2000) == 1000


def test_time_outside_the_timed_stretch_counts_only_when_clearly_the_candidates():
    ref = [2.0, 2.1, 1.9, 2.0, 2.05, 1.95, 2.0, 2.0]
    assert not moved_out([x * 1.05 for x in ref], ref)  # 5%: noise
    assert not moved_out([x + 0.04 for x in ref], ref)  # under 50 us
    assert moved_out([x + 1.0 for x in ref], ref)  # work moved out of the block
    # once, in one round of eight: not the candidate's habit
    assert not moved_out([ref[0] + 5.0, *ref[1:]], ref)


def test_the_in_process_methods_interval_holds_its_ratio():
    rng = random.Random(1)
    ref = [2.0 + 0.01 * rng.random() for _ in range(50)]
    cand = [1.0 + 0.01 * rng.random() for _ in range(50)]
    lo, hi = mean_ratio_interval(ref, cand, rng)
    point = sum(ref) / sum(cand)
    assert lo <= point <= hi and hi - lo < 0.02 and 1.98 < point < 2.0


def test_paired_speedup_interval():
    import random

    from musacoder.verifier.timing import paired_speedup, reward_speedup

    ref = [2.0, 2.1, 1.9, 2.0, 2.05, 1.95] * 5
    cand = [1.0, 1.05, 0.95, 1.0, 1.02, 0.98] * 5
    sp, lo, hi = paired_speedup(ref, cand, random.Random(0))
    assert sp == pytest.approx(2.0) and 1.8 < lo <= sp <= hi < 2.2
    noisy = [0.5, 4.0] * 15  # a load spike on half the candidate's calls: the interval straddles 1
    sp, lo, hi = paired_speedup([1.0] * 30, noisy, random.Random(0))
    assert lo < 1.0 < hi and reward_speedup(sp, lo, hi) == 1.0
    assert reward_speedup(2.0, 1.5, 2.5) == 2.0 and reward_speedup(0.5, 0.4, 0.6) == 0.5


def test_the_stop_rule_reads_the_median():
    import random

    from musacoder.verifier.timing import rse

    rng = random.Random(0)
    calls = [10.0 * (1 + 0.003 * rng.gauss(0, 1)) for _ in range(20)]
    assert rse(calls) < 0.005  # twenty steady calls reach the 0.5% target...
    assert rse(calls[:19] + [60.0]) < 0.005  # ...and one 6x slow call among them does not undo it (a mean's would)
    assert rse([10.0 * (1 + 0.1 * rng.gauss(0, 1)) for _ in range(20)]) > 0.01  # 10% jitter on every call does
    assert rse([10.0]) == float("inf") and rse([0.0, 0.0]) == float("inf")



def test_the_protocols_floor_comes_off_each_block_and_never_more_than_half():
    # H200, 2026-11-29: a 2.89x elementwise kernel (1.78 ms blocks of 51 calls against 5.15 ms) read 2.71x with the
    # 0.065 ms round trip on both blocks; taken off, the ratio of the blocks is the kernels' again
    ref, cand, floor = 5.150 + 0.065, 1.783 + 0.065, 0.065
    assert (ref / cand) / (5.150 / 1.783) < 0.98
    assert net_block_ms(ref, floor) / net_block_ms(cand, floor) == pytest.approx(5.150 / 1.783)
    # a block near the floor keeps half of itself: nothing reads as free, whatever the floor says
    assert net_block_ms(0.1, 0.5) == 0.05 and net_block_ms(2.0, -1.0) == 2.0
