"""Stage 3b/3c (issue 14): rewrite pairs of verified solutions with measured speedups, and profiling records. The
pair rule runs on stated verdicts; the pipeline runs end to end on the cpu backend: two forwards around the shipped
honest ReLU (one C++ build for the file, shared with the other synth tests) verified with timing, paired, then
profiled in the sandboxed profiling process, beside programs that host-bound, raise, crash or hang there."""

import json

import pytest

from musacoder import cli
from musacoder.config import TimingConfig, VerifyConfig
from musacoder.examples_catalog import EXAMPLES_DIR
from musacoder.pool.local import LocalPool
from musacoder.synth.profiling import (
    OTHER_HOST,
    PROFILES,
    PROFILING,
    diagnose,
    load_rewrites,
    profiling_records,
)
from musacoder.synth.rewrite import (
    EAGER_DISAGREES,
    NO_TIMING,
    PAIRS,
    REWRITE,
    SLOW_TEACHER,
    UNPAIRED,
    UNTIMED,
    WITHIN_NOISE,
    NoiseRule,
    Solution,
    load_passing,
    rewrite_records,
    slow_candidate,
    write_pairs,
)
from musacoder.tasks import builtin_task
from musacoder.train.data import load_records

RELU_TASK = builtin_task("level1/19_ReLU")
FAST = (EXAMPLES_DIR / "cpu" / "honest_relu.py").read_text()
# the same kernel launched 64 times for one output: ~4x the time of one launch plus MooreEval's call round trip
SLOW = FAST.replace("return relu_ext.relu(x)", "for _ in range(63):\n            relu_ext.relu(x)\n"
                                               "        return relu_ext.relu(x)")
HOST = FAST.replace("return relu_ext.relu(x)", "for _ in range(300):\n            x = x.view(-1).view(x.shape)\n"
                                               "        return relu_ext.relu(x)")
PLAIN = "import os\nimport torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
RAISES = PLAIN + "        raise ValueError('no kernel today')\n"
CRASHES = PLAIN + "        os.abort()\n"
HANGS = PLAIN + "        while True:\n            pass\n"
# answers for its process on the process's own channel: a reply of the wrong shape
FORGES = PLAIN + ("        import sys\n        from multiprocessing.connection import Connection\n"
                  "        Connection(int(sys.argv[sys.argv.index('--fd') + 1])).send_bytes(b'{\"ok\": true, \"rows\": 1}')\n"
                  "        os._exit(0)\n")


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _verdict(ms, rse=0.01, speedup_eager=None):
    return {"status": "ok", "candidate_ms": ms, "timing_rse": rse, "speedup_eager": speedup_eager}


def test_noise_rule_keeps_only_speedups_beyond_the_timing_noise():
    rule = NoiseRule()
    assert rule.judge(_verdict(2.0), _verdict(1.0)) == (2.0, None)
    assert rule.judge(_verdict(1.08), _verdict(1.0))[1] == WITHIN_NOISE  # under the 1.1x floor
    # 1.3x, but each time has a 10% standard error: the threshold is 1 + 3 * sqrt(2) * 0.1 = 1.42
    assert rule.threshold(_verdict(1.3, 0.1), _verdict(1.0, 0.1)) == pytest.approx(1.4243, abs=1e-4)
    assert rule.judge(_verdict(1.3, 0.1), _verdict(1.0, 0.1))[1] == WITHIN_NOISE
    assert rule.judge(_verdict(1.5, 0.1), _verdict(1.0, 0.1))[1] is None
    # 2x slower, yet faster than its own run's eager than the "fast" one was: the machine's load changed between runs
    assert rule.judge(_verdict(2.0, speedup_eager=1.2), _verdict(1.0, speedup_eager=1.0))[1] == EAGER_DISAGREES
    assert rule.judge({"status": "ok", "candidate_ms": None}, _verdict(1.0)) == (None, NO_TIMING)
    assert NoiseRule(min_speedup=3.0).judge(_verdict(2.0), _verdict(1.0))[1] == WITHIN_NOISE


def test_pairs_are_slower_to_fastest_and_noise_is_dropped_with_reasons(tmp_path):
    softmax = builtin_task("level1/23_Softmax")
    sols = [Solution(RELU_TASK, f"# {name}\n", "t", v, f"f:{i}") for i, (name, v) in enumerate([
        ("near", _verdict(1.05, speedup_eager=0.95)), ("fast", _verdict(1.0, speedup_eager=1.0)),
        ("slow", _verdict(2.5, speedup_eager=0.4)), ("drift", _verdict(2.0, speedup_eager=1.3)),
        ("untimed", {"status": "ok"})])] + [Solution(softmax, "# alone\n", "t", _verdict(1.0), "f:9")]
    got = write_pairs(sols, tmp_path, "cpu", NoiseRule())
    assert got == {"kept": 1, "dropped": {WITHIN_NOISE: 1, EAGER_DISAGREES: 1}, "skipped_existing": 0,
                   "unpaired": {UNTIMED: 1, UNPAIRED: 1}}
    pairs = _lines(tmp_path / PAIRS)
    assert {p["fast_code"] for p in pairs} == {"# fast\n"}  # every slower one against the fastest
    assert {p["slow_code"]: p["dropped"] for p in pairs} == {"# near\n": WITHIN_NOISE, "# slow\n": None,
                                                             "# drift\n": EAGER_DISAGREES}
    (rec,), problems = load_records([tmp_path / REWRITE])
    assert not problems and rec.kind == "rewrite" and rec.metadata["speedup"] == 2.5
    assert rec.messages[-1]["content"] == "```python\n# fast\n```"
    assert "```python\n# slow\n```" in rec.messages[1]["content"] and "runs in 2.5 ms" in rec.messages[1]["content"]
    assert rec.metadata["slow"]["origin"] == "f:2" and rec.metadata["fast"]["ms"] == 1.0


def test_diagnosis_rule():
    def row(name, kind, calls, ms):
        return {"name": name, "kind": kind, "calls": calls, "self_ms": ms}

    one = diagnose([row("k1", "kernel", 10, 8.0), row("k2", "kernel", 10, 1.0), row("aten::empty", "host", 10, 0.5)],
                   1.0, 10)
    assert (one.category, one.bottleneck["name"], one.kernel_share) == ("one kernel", "k1", pytest.approx(0.9))
    many = diagnose([row(f"k{i}", "kernel", 10, 2.0) for i in range(4)] + [row(OTHER_HOST, "host", None, 1.0)],
                    1.0, 10)
    assert (many.category, many.launches, many.top_kernel_share) == ("many launches", 4, pytest.approx(0.25))
    host = diagnose([row("k1", "kernel", 10, 3.0), row("aten::view", "host", 6000, 5.0),
                     row(OTHER_HOST, "host", None, 2.0)], 1.0, 10)
    assert (host.category, host.bottleneck["name"]) == ("host overhead", "aten::view")


def test_slow_teacher_makes_scalar_single_threaded_code():
    """No build here: the slow configuration's candidate text (its build and verification: the slow test below)."""
    r = slow_candidate(RELU_TASK.code, "cpu")
    assert r.ok, r.reason
    assert "Vectorized" not in r.candidate and "#pragma omp parallel" not in r.candidate
    assert "'-D'," not in r.candidate  # no bare macro flag from the scalar ISA


# ---- end to end on the cpu backend ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def timed(cache_dir):
    return VerifyConfig(backend="cpu", cache_dir=cache_dir,
                        timing=TimingConfig(baselines=("eager",), budget_s=0.5))


@pytest.fixture(scope="module")
def paired(tmp_path_factory, timed):
    """FAST and SLOW verified with timing into a solutions.jsonl, then paired."""
    src = tmp_path_factory.mktemp("solve")
    with LocalPool(timed) as pool:
        verdicts = dict(pool.verify_many([(RELU_TASK, FAST), (RELU_TASK, SLOW)]))
    assert all(v.passed for v in verdicts.values()), {i: v.reason for i, v in verdicts.items()}
    (src / "solutions.jsonl").write_text("".join(
        json.dumps({"task": RELU_TASK.key, "teacher": "test", "backend": "cpu", "status": "ok", "code": code,
                    "verdict": verdicts[i].to_dict()}) + "\n" for i, code in enumerate([FAST, SLOW])))
    loaded = load_passing([src], [RELU_TASK], "cpu")
    out = tmp_path_factory.mktemp("rewrite")
    summary = rewrite_records(loaded.solutions, out, timed, slow=False)
    return src, out, summary, verdicts


def test_a_pair_of_verified_kernels_becomes_a_rewrite_record(paired):
    _, out, summary, verdicts = paired
    assert summary["kept"] == 1 and not summary["dropped"] and summary["slow_teacher"] is None, summary
    (rec,), problems = load_records([out / REWRITE])
    meta = rec.metadata
    # the answer is the program MooreEval measured faster, by more than the threshold
    assert verdicts[1].candidate_ms > verdicts[0].candidate_ms * meta["threshold"]
    assert rec.messages[-1]["content"] == f"```python\n{FAST.strip()}\n```" and SLOW.strip() in rec.messages[1][
        "content"]
    assert meta["speedup"] == pytest.approx(verdicts[1].candidate_ms / verdicts[0].candidate_ms)
    assert meta["slow"]["ms"] == verdicts[1].candidate_ms and meta["fast"]["rse"] == verdicts[0].timing_rse
    assert meta["fast"]["speedup_eager"] > meta["slow"]["speedup_eager"]


def test_a_second_rewrite_run_redoes_nothing(paired, timed, tmp_path):
    src, out, first, _ = paired
    before = {f: (out / f).read_text() for f in (PAIRS, REWRITE)}
    # the slow teacher too: its task is recorded as done in the output's solutions.jsonl
    (out / "solutions.jsonl").write_text(json.dumps({"task": RELU_TASK.key, "teacher": SLOW_TEACHER,
                                                     "status": "no_solution", "reason": "recorded"}) + "\n")
    sols = [Solution(s.task, s.code, "inductor", s.verdict, s.origin)
            for s in load_passing([src], [RELU_TASK], "cpu").solutions]
    again = rewrite_records(sols, out, timed)
    assert again["slow_teacher"] == {"tried": 0, "skipped_existing": 1, "teacher": {}, "verdicts": {}}
    assert again["kept"] == 0 and again["skipped_existing"] == first["kept"], again
    assert {f: (out / f).read_text() for f in before} == before


@pytest.fixture(scope="module")
def profiled(paired, timed):
    src, out, _, _ = paired
    extra = [Solution(RELU_TASK, code, "test", {}, name) for name, code in
             (("host", HOST), ("raises", RAISES), ("crashes", CRASHES), ("hangs", HANGS), ("forges", FORGES))]
    sols = load_passing([src], [RELU_TASK], "cpu").solutions + extra
    # 10 s: the hanging program costs that; 2 s cut an honest one profiled on 2 loaded cores (CI, 2026-11-26)
    summary = profiling_records(sols, out, timed, load_rewrites(out), iterations=5, timeout_s=10.0)
    return out, summary, sols


def test_profiling_records_name_the_dominating_kernel_and_carry_the_rewrite(profiled):
    out, summary, sols = profiled
    assert summary["records"] == 3 and summary["with_rewrite"] == 1, summary
    assert summary["categories"] == {"one kernel": 2, "host overhead": 1}
    recs = {r.metadata["solution"]: r for r in load_records([out / PROFILING])[0]}
    fast, slow, host = (recs[s.hash] for s in sols[:3])
    assert all(r.kind == "profiling" for r in recs.values())
    assert slow.metadata["bottleneck"] == "relu" and slow.metadata["category"] == "one kernel"
    assert "| relu | kernel | 64 |" in slow.messages[1]["content"]  # the table: 64 launches per forward
    answer = slow.messages[-1]["content"]
    assert answer.startswith("Bottleneck: `relu` (one kernel") and "It runs 64 times per forward" in answer
    assert answer.endswith(f"```python\n{FAST.strip()}\n```") and "faster (" in answer
    assert slow.metadata["rewrite"]["fast"] == sols[0].hash and fast.metadata["rewrite"] is None
    assert "vectorised and multi-threaded already" in fast.messages[-1]["content"]  # its source has omp simd
    assert host.metadata["category"] == "host overhead" and "| aten::view | host | 600 |" in host.messages[1][
        "content"]
    assert slow.metadata["nsight_compute"].startswith(("not available", "not applicable"))


def test_a_program_that_raises_crashes_hangs_or_forges_a_reply_is_recorded_with_its_reason(profiled):
    out, summary, _ = profiled
    assert summary["statuses"] == {"ok": 3, "failed": 2, "crashed": 1, "timeout": 1}
    rows = {r["origin"]: r for r in _lines(out / PROFILES)}
    assert rows["raises"]["status"] == "failed" and "ValueError: no kernel today" in rows["raises"]["reason"]
    assert rows["raises"]["sandbox"]  # the process said how it was sandboxed (Landlock, or "none (why)")
    assert rows["crashes"]["status"] == "crashed" and "SIGABRT" in rows["crashes"]["reason"]
    assert rows["hangs"]["status"] == "timeout" and rows["hangs"]["reason"].startswith("profiling: no answer within 10s")
    assert rows["forges"]["status"] == "failed" and rows["forges"]["reason"].startswith("profiling: malformed reply")


def test_cli_reruns_do_nothing_and_bad_input_exits_2(profiled, paired, tmp_path, capsys):
    out, _, _ = profiled
    src = paired[0]

    def call(*args):
        with pytest.raises(SystemExit) as e:
            cli.app(["synth", *args], prog_name="musacoder")
        return e.value.code, capsys.readouterr().err

    code, err = call("rewrite", "--solutions", str(src), "--out", str(out), "--no-slow-teacher")
    assert code == 0 and "0 pairs kept, 0 dropped, 1 already judged" in err, err
    code, err = call("profile", "--solutions", str(src), "--out", str(out))
    assert code == 0 and "0 profiling records (0 with a faster rewrite) of 0 programs, 2 already done" in err, err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    for args, says in ((["rewrite", "--solutions", str(tmp_path / "none"), "--out", str(tmp_path)], "does not exist"),
                       (["rewrite", "--solutions", str(bad), "--out", str(tmp_path / "o")], "no usable solution"),
                       (["profile", "--solutions", str(src), "--out", str(out), "--backend", "musa"],
                        "--backend must be cpu, cuda or triton"),
                       (["profile", "--solutions", str(src), "--out", str(tmp_path), "--rewrites", str(bad.parent)],
                        "no rewrite_pairs.jsonl there")):
        code, err = call(*args)
        assert code == 2 and "error:" in err and says in err and "Traceback" not in err, err


@pytest.mark.slow
def test_slow_teacher_pairs_with_the_compiler_teacher_on_softmax(tmp_path, timed):
    """Inductor's softmax and its scalar one-thread version, both built and verified (~2 min on 2 cpu cores)."""
    from musacoder.synth.solve import solve_tasks

    softmax = builtin_task("level1/23_Softmax")
    solve_tasks([softmax], tmp_path / "solve", timed)
    sols = load_passing([tmp_path / "solve"], [softmax], "cpu").solutions
    summary = rewrite_records(sols, tmp_path / "rw", timed)
    assert summary["slow_teacher"]["verdicts"] == {"ok": 1}, summary
    (pair,) = _lines(tmp_path / "rw" / PAIRS)
    assert pair["slow"]["teacher"] == SLOW_TEACHER and pair["fast"]["teacher"] == "inductor"
    assert pair["kept"], pair
