"""`musacoder calibrate`'s cpu part (bench/calibrate.py): the verifier's speedups of shipped honest kernels against the
same kernels timed in one process (the verifier's blocks, the judge's threads and OpenMP settings, cold inputs). The
command judges each row at 10%; on a shared 2-core machine both sides move by up to 40% from run to run
(docs/benchmarks.md, 2026-11-28), so CI asserts what the per-call protocol got wrong: it read a 3x-faster fused kernel
at 1.2x (a ratio of 0.4), and nothing now strays by half. The GPU table is in docs/benchmarks.md."""

import json

import pytest

from musacoder.bench.calibrate import CASES, rows_for, run, table, tolerance


@pytest.fixture(scope="module")
def quick(cache_dir, tmp_path_factory):
    """The quick cpu calibration, its rows and the JSON it wrote as it went."""
    out = tmp_path_factory.mktemp("calibrate") / "cal.json"
    return run("cpu", quick=True, cache=cache_dir, out=str(out), log=lambda *a: None), out


def test_the_shipped_set_spans_the_four_families_and_sizes():
    assert {c.family for c in CASES} == {"elementwise", "reduction", "gemm", "fused level-2"}
    gpu = rows_for("cuda", quick=False)
    assert len(gpu) >= 12 and all("ModelNew" in r["kernel_code"] for r in gpu)
    assert tolerance("cuda", 0.030) == 0.05 and tolerance("cuda", 0.010) == 0.10 and tolerance("cuda", 0.002) is None
    assert tolerance("cpu", 0.002) == 0.10


def test_the_verifiers_cpu_speedups_agree_with_an_in_process_measurement(quick, cache_dir):
    rows, _ = quick
    assert rows and all(r["judge"]["status"] == "ok" for r in rows), [r["judge"] for r in rows]
    lines = table(rows)
    assert len(lines) == len(rows) + 1
    arms = lines[0].index("time a call, verifier / in process: reference, candidate")
    # per side, against the verifier's workload in one process, minutes apart on a shared VM: loose (CI, 2026-11-29: a
    # side outside 0.5-2.0 once); the ratio below is what the two arms, timed round by round, must agree on
    assert all(all(0.2 < float(x) < 5 for x in line[arms].split(", ")) for line in lines[1:]), lines
    lo_hi = [r["truth"]["range"] for r in rows]  # the truth's own spread over its repeats, around its median
    assert all(lo <= r["truth"]["block_speedup"] * 1.0001 and r["truth"]["block_speedup"] <= hi * 1.0001
               for (lo, hi), r in zip(lo_hi, rows)), lo_hi
    far = [r for r in rows if not 0.5 < r["ratio"] < 2.0]
    if far:  # measured again once: this VM's noise came and went between runs (CI, 2026-11-29: a gemm row at 0.42
        # and 0.48 in two runs of one commit, 0.5-2.0 in the run before); a protocol error repeats and fails here
        again = run("cpu", quick=True, cache=cache_dir, log=lambda *a: None)
        far = [r for r in again if not 0.5 < r.get("ratio", 0) < 2.0]
        lines += table(again)[1:]
    assert not far, "\n".join(" | ".join(line) for line in lines)


def test_a_run_cut_short_resumes_measuring_only_what_it_lacks(quick, cache_dir, tmp_path):
    """A device call's time limit cut the 32-core host's cpu calibration after 5 of its 10 verdicts (H200 host,
    2026-11-29): `--resume` keeps what --out holds. Here: one row verified but not yet timed in process, one not
    verified at all."""
    rows, out = quick
    saved = json.loads(out.read_text())
    assert [r["verdict"] for r in saved["rows"]] == [r["verdict"] for r in rows]  # written as measured
    first, second = saved["rows"][:2]
    for k in ("truth", "tolerance", "ratio", "ratio_isolated", "verdict"):
        first.pop(k)
    saved["rows"][1] = {k: second[k] for k in ("family", "task", "sizes")}
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps(saved))
    said = []
    again = run("cpu", quick=True, cache=cache_dir, out=str(cut), log=said.append, resume=True)
    assert any("resumed: 1 of 2 rows verified" in m for m in said), said
    assert sum("verified 1/1 (judge)" in m for m in said) == 1 and not any("verified 2/" in m for m in said), said
    assert again[0]["judge"] == first["judge"]  # kept, not measured again
    assert all("truth" in r and r["verdict"] in ("ok", "FAIL") for r in again)
    assert json.loads(cut.read_text())["rows"][1]["judge"]["status"] == "ok"
