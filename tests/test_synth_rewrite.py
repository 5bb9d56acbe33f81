"""Stage 3b/3c (issue 14): rewrite pairs of verified solutions with measured speedups, and profiling records. The
pair rule runs on stated verdicts; the pipeline runs end to end on the cpu backend: two forwards around the shipped
honest ReLU (one C++ build for the file, shared with the other synth tests) verified with timing, paired, then
profiled in the sandboxed profiling process, beside programs that host-bound, raise, crash or hang there."""

import json

import pytest

from musacoder import cli
from musacoder.config import TimingConfig, VerifyConfig
from musacoder.data.records import load_records
from musacoder.examples_catalog import EXAMPLES_DIR
from musacoder.pool.local import LocalPool
from musacoder.synth.profiling import (
    NCU_METRICS,
    OTHER_HOST,
    PROFILES,
    PROFILING,
    diagnose,
    kernel_bound,
    load_rewrites,
    nsight_text,
    parse_ncu_csv,
    profiling_records,
    short_name,
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


def _ncu_csv(launches):
    """`ncu --import R --csv --page raw` as ncu 2025.3 writes it: header, units, a row per launch (device attributes
    among the columns, thousands separators in numbers), after ncu's own lines."""
    head = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC", "device__attribute_architecture", *NCU_METRICS]
    units = [""] * 12 + ["usecond", "%", "%", "%", "%", "register/thread"]  # ncu scales times unless told not to

    def line(cells):
        return ",".join(f'"{c}"' for c in cells)

    rows = [line([i, 632, "python3.12", "127.0.0.1", name, 1, 7, "(128, 1, 1)", "(16384, 1, 1)", 0, "9.0", 384,
                  *values]) for i, (name, values) in enumerate(launches)]
    return "\n".join(["==PROF== Disconnected from process 632", line(head), line(units), *rows])


def test_nsight_compute_read_out_and_its_rule():
    """The report's rows become records' kernels; the named kernel gets Nsight Compute's 60% rule."""
    relu = "void relu_kernel<float>(const float *, float *, long)"
    text = _ncu_csv([(relu, ["1,234.567", "12.5", "91.0", "88.4", "80.1", "16"]),
                     ("triton_poi_fused_add_0", ["2.048", "70.6", "30", "n/a", "50", "24"])])
    relu_k, add_k = parse_ncu_csv(text)
    assert relu_k == {"kernel": relu, "grid": "(16384, 1, 1)", "block": "(128, 1, 1)", "duration_ns": 1234567,
                      "sm_pct": 12.5, "memory_pct": 91.0, "dram_pct": 88.4, "occupancy_pct": 80.1, "registers": 16.0}
    assert add_k["dram_pct"] is None and add_k["duration_ns"] == 2048
    assert parse_ncu_csv("==ERROR== InterprocessLockFailed\n") == []
    assert short_name(relu) == "relu_kernel" and short_name("triton_poi_fused_add_0") == "triton_poi_fused_add_0"
    assert short_name("void at::native::reduce_kernel<512, 1>(T3)") == "reduce_kernel"
    assert [kernel_bound(k) for k in (relu_k, add_k)] == ["memory-bound", "compute-bound"]
    assert kernel_bound({"sm_pct": 30.0, "memory_pct": 59.0}) == "latency-bound"
    # the named kernel is found by its function name, though ncu's longest launch is another one
    d = diagnose([{"name": "triton_poi_fused_add_0", "kind": "kernel", "calls": 1, "self_ms": 1.0}], 1.0, 1)
    said = nsight_text(d, [relu_k, add_k])
    assert said.startswith("Nsight Compute, one forward: `triton_poi_fused_add_0` took 2.048 us") and \
        "71% of peak SM throughput" in said and "it is compute-bound" in said and "DRAM" not in said


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


TRITON_RELU = """import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_tl(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        relu_tl[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
"""


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_nsight_compute_measures_the_named_kernel_on_a_gpu(backend, tmp_path, cache_dir):
    """A CUDA and a Triton ReLU through `profiling_records` with ncu (the device machine has it): the record carries
    what ncu measured of the kernel torch.profiler named, in its prompt and its answer."""
    import shutil

    if shutil.which("ncu") is None:
        pytest.skip("ncu is not on PATH")
    code = (EXAMPLES_DIR / "cuda" / "honest_relu.py").read_text() if backend == "cuda" else TRITON_RELU
    cfg = VerifyConfig(backend=backend, cache_dir=cache_dir)
    summary = profiling_records([Solution(RELU_TASK, code, "test", {}, backend)], tmp_path, cfg, iterations=5)
    assert summary["statuses"] == {"ok": 1} and summary["nsight_statuses"] == {"ok": 1}, _lines(tmp_path / PROFILES)
    (rec,) = load_records([tmp_path / PROFILING])[0]
    meta, (prof,) = rec.metadata, _lines(tmp_path / PROFILES)
    assert meta["nsight_compute"] == "measured", meta["nsight_compute"]
    # the kernel torch.profiler saw is the one ncu measured (names as each writes them: `relu_kernel(float const*,
    # float*, long)` and `relu_kernel(const float *, float *, long)`)
    seen = {short_name(r["name"]) for r in prof["rows"] if r["kind"] == "kernel"}
    (k,) = [k for k in meta["ncu_kernels"] if short_name(k["kernel"]) in seen]
    assert short_name(k["kernel"]) == ("relu_kernel" if backend == "cuda" else "relu_tl"), k["kernel"]
    # 256k floats read and written: 2.3 us for a kernel of that size on an H200 (2026-11-27); in ns, not us or ms
    assert 500 < k["duration_ns"] < 1e6 and 0 < k["sm_pct"] <= 100 and 0 < k["memory_pct"] <= 100, k
    assert k["registers"] > 0
    assert "Nsight Compute, one forward after the warm-up" in rec.messages[1]["content"]
    assert f"Nsight Compute, one forward: `{short_name(k['kernel'])}` took" in rec.messages[-1]["content"]


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
