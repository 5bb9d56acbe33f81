"""Stage 3a (issue 14): repair and reviewer records from mutated verified kernels. The operators are checked on small
C++/CUDA/Triton sources (where they apply, and that the mutant differs exactly as intended); the pipeline runs end
to end on the cpu backend with mutants verified for real. Every mutant there reuses one C++ build (the shipped
honest ReLU's source), so the file stays cheap."""

import ast
import json

import pytest

from musacoder import cli
from musacoder.config import VerifyConfig
from musacoder.conversation import feedback_message, task_messages
from musacoder.data.records import load_records
from musacoder.examples_catalog import EXAMPLES_DIR
from musacoder.synth.mutate import OPERATORS, mutate
from musacoder.synth.repair import (
    MUTANTS,
    REPAIR,
    REVIEWER,
    STILL_PASSES,
    SolutionsError,
    load_solutions,
    plan_mutants,
    repair_records,
)
from musacoder.tasks import builtin_task
from musacoder.verifier.feedback import feedback_text
from musacoder.verifier.verdict import Verdict

CPP = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SRC = r"""
#include <torch/extension.h>
// for (j = 0; j < m; j++) in a comment is not code
torch::Tensor rowsum(torch::Tensor x) {
    TORCH_CHECK(x.dim() == 2, "if (i < n) in a message is not code either");
    auto xc = x.contiguous();
    const int64_t rows = xc.size(0), cols = xc.size(1);
    auto y = torch::empty({rows}, xc.options());
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    for (int64_t r = 0; r < rows; r++) {
        float acc = 0.f;
        for (int64_t c = 0; c < cols; c++) acc += in[r * cols + c];
        out[r] = acc;
    }
    return y;
}
"""

ext = load_inline(name="rowsum", cpp_sources=SRC, functions=["rowsum"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.rowsum(x)
'''

REF = '''import torch
import torch.nn as nn

dim = 1


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.sum(x, dim=dim)


def get_inputs():
    return [torch.randn(8, 32)]


def get_init_inputs():
    return []
'''

CUDA = '''import torch
from torch.utils.cpp_extension import load_inline

SRC = r"""
#include <torch/extension.h>

__global__ void rowmax(const float* x, float* y, int cols) {
    extern __shared__ float red[];
    float mx = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, x[blockIdx.x * cols + c]);
    red[threadIdx.x] = mx;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0 && cols < 0) y[blockIdx.x] = 0.f; else if (threadIdx.x == 0) y[blockIdx.x] = red[0];
}
"""
'''

TRITON = '''import torch
import triton
import triton.language as tl


@triton.jit
def rowmax_kernel(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, cols, BLOCK):
        c = start + tl.arange(0, BLOCK)
        mask = c < cols  # the bound
        v = tl.load(x_ptr + (row * stride + c), mask=mask, other=float("-inf"))
        acc = tl.maximum(acc, v)
    tl.store(y_ptr + row, tl.max(acc, 0))


def launch(x):
    return x.size(0)
'''


def mutants(op, code, reference="", seeds=range(8)):
    """Every distinct mutant an operator makes over a few seeds: code -> description."""
    got = {}
    for s in seeds:
        m = mutate(op, code, s, reference)
        if m is not None:
            assert m.operator == op and m.code != code and m.description
            ast.parse(m.code)  # still a Python program
            got[m.code] = m.description
    return got


def test_off_by_one_touches_loop_bounds_only_never_comments_or_strings():
    got = mutants("off_by_one", CPP)
    assert set(got) == {CPP.replace("r < rows", "r <= rows"), CPP.replace("c < cols", "c <= cols")}
    assert "`c <= cols` should be `c < cols`" in got[CPP.replace("c < cols", "c <= cols")]
    assert set(mutants("off_by_one", TRITON)) == {TRITON.replace("mask = c < cols", "mask = c <= cols")}
    assert mutants("off_by_one", "x = 1\n") == {}


def test_missing_guard_drops_bound_checks_and_triton_masks():
    guard = "if (threadIdx.x < s) "
    assert set(mutants("missing_guard", CUDA)) == {CUDA.replace(guard, "")}  # an if with an else is left alone
    assert mutants("missing_guard", CPP) == {}
    assert set(mutants("missing_guard", TRITON)) == {TRITON.replace(', mask=mask, other=float("-inf")', "")}


def test_wrong_index_swaps_index_terms_but_never_makes_a_no_op():
    got = mutants("wrong_index", CPP, seeds=range(20))
    assert set(got) == {CPP.replace("in[r * cols + c]", "in[c * cols + r]"),
                        CPP.replace("in[r * cols + c]", "in[r * c + cols]")}  # r*cols <-> cols*r is the same index
    assert "(r and c swapped)" in got[CPP.replace("in[r * cols + c]", "in[c * cols + r]")]
    tri = set(mutants("wrong_index", TRITON, seeds=range(20)))
    assert TRITON.replace("x_ptr + (row * stride + c)", "x_ptr + (c * stride + row)") in tri
    assert all("x_ptr" in m.split("tl.load(")[1][:8] for m in tri)  # the base pointer is never an index term


def test_reduction_init_and_accumulator_type():
    assert set(mutants("reduction_init", CPP)) == {CPP.replace("float acc = 0.f;", "float acc = -INFINITY;")}
    assert set(mutants("reduction_init", CUDA)) == {CUDA.replace("float mx = -INFINITY;", "float mx = 0;")}
    assert set(mutants("reduction_init", TRITON)) == {  # the accumulator, or the fill of masked lanes
        TRITON.replace('float("-inf"), tl.float32', "0.0, tl.float32"), TRITON.replace('other=float("-inf")', "other=0.0")}
    assert set(mutants("accumulator_type", CPP)) == {CPP.replace("float acc = 0.f;", "at::Half acc = 0.f;")}
    assert set(mutants("accumulator_type", TRITON)) == {TRITON.replace("), tl.float32)", "), tl.float16)")}
    omp = CPP.replace("        for (int64_t c", "        #pragma omp simd reduction(+:acc)\n        for (int64_t c")
    assert mutants("accumulator_type", omp) == {}  # an OpenMP reduction variable stays a float
    assert len(mutants("reduction_init", omp)) == 1


def test_missing_sync_is_cuda_only():
    got = mutants("missing_sync", CUDA)
    assert len(got) == 2 and all(m.count("__syncthreads();") == 1 for m in got)
    assert mutants("missing_sync", CPP) == mutants("missing_sync", TRITON) == {}


def test_swapped_dims_in_cpp_and_python():
    assert set(mutants("swapped_dims", CPP)) == {CPP.replace("xc.size(0), cols = xc.size(1)",
                                                             "xc.size(1), cols = xc.size(0)")}
    assert set(mutants("swapped_dims", TRITON)) == {TRITON.replace("x.size(0)", "x.size(1)")}
    assert mutants("swapped_dims", CUDA) == {}


def test_torch_fallback_puts_the_reference_forward_in_modelnew():
    (code, what), = mutants("torch_fallback", CPP, REF).items()
    tree = ast.parse(code)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew")
    fwd = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    assert ast.unparse(fwd.body) == "return torch.sum(x, dim=dim)"
    assert "\ndim = 1\n" in code and code.index("dim = 1") < code.index("class ModelNew")  # what forward reads
    assert code.split("class ModelNew")[0].startswith(CPP.split("class ModelNew")[0])  # the kernel stays
    assert "torch.sum" in what and "not allowed" in what
    assert mutants("torch_fallback", CPP, "") == {} and mutants("torch_fallback", CUDA, REF) == {}


def test_every_operator_is_seeded_and_plans_are_reproducible():
    relu = builtin_task("level1/19_ReLU")
    for op in OPERATORS:
        assert mutate(op, CPP, 3, REF) == mutate(op, CPP, 3, REF)
    first, missed = plan_mutants(relu, CPP, 3, seed=5)
    assert len(first) == 3 and len({m.operator for m in first}) == 3 and "missing_sync" not in [m.operator
                                                                                                 for m in first]
    assert plan_mutants(relu, CPP, 3, seed=5) == (first, missed)
    only, _ = plan_mutants(relu, CPP, 5, seed=0, operators=("off_by_one", "torch_fallback"))
    assert sorted(m.operator for m in only) == ["off_by_one", "torch_fallback"]


def test_load_solutions_keeps_passing_records_and_says_why_not_others(tmp_path):
    relu = builtin_task("level1/19_ReLU")
    ok = {"task": relu.key, "backend": "cpu", "status": "ok", "code": CPP}
    lines = [json.dumps(ok), "{cut by an interrupted run", json.dumps({**ok, "status": "incorrect"}),
             json.dumps({**ok, "backend": "triton"}), json.dumps({**ok, "task": "level9/nope"}),
             json.dumps({**ok, "code": None}), json.dumps(ok), json.dumps(["not", "a", "record"])]
    (tmp_path / "solutions.jsonl").write_text("\n".join(lines) + "\n")
    got = load_solutions(tmp_path, [relu], "cpu")
    assert got.solutions == [(relu, CPP)]  # the duplicate once
    assert got.skipped == {"status incorrect": 1, "backend triton, not cpu": 1}
    assert [p.split(":")[1] for p in got.problems] == ["2", "5", "6", "8"]
    assert "level9/nope is not among the given tasks" in got.problems[1]
    with pytest.raises(SolutionsError, match="does not exist"):
        load_solutions(tmp_path / "missing", [relu], "cpu")


# ---- end to end on the cpu backend ---------------------------------------------------------------------------

RELU = (EXAMPLES_DIR / "cpu" / "honest_relu.py").read_text()
# Two forwards around the same shipped kernel source (one build for every mutant): swapping the dimension of the
# first reshape is harmless (the mutant still passes), swapping the two of the view gives the wrong shape.
HARMLESS = RELU.replace("return relu_ext.relu(x)", "return relu_ext.relu(x.reshape(x.size(0), -1)).reshape(x.shape)")
HARMFUL = RELU.replace("return relu_ext.relu(x)", "return relu_ext.relu(x).view(x.size(0), x.size(1))")
OPS = ("swapped_dims", "torch_fallback")


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def repaired(tmp_path_factory, cache_dir):
    assert HARMLESS != RELU and HARMFUL != RELU
    relu = builtin_task("level1/19_ReLU")
    solutions = [(relu, RELU), (relu, HARMLESS), (relu, HARMFUL)]
    cfg = VerifyConfig(backend="cpu", cache_dir=cache_dir, timing_enabled=False)  # conftest's cpu_config: its pool
    out = tmp_path_factory.mktemp("repair")
    seen = []
    summary = repair_records(solutions, out, cfg, 2, 0, lambda *a: seen.append(a), OPS)
    return out, summary, solutions, cfg, seen


def test_mutants_are_verified_for_real_and_failing_ones_become_records(repaired):
    out, summary, _, _, seen = repaired
    # the fallback of both variants is the same program as the shipped kernel's: verified once
    assert summary["tried"] == 3 and summary["duplicates"] == 2 and summary["kept"] == 2, summary
    assert summary["dropped"] == {STILL_PASSES: 1} and summary["operators"]["torch_fallback"] == {"tried": 1, "kept": 1}
    assert summary["not_applicable"] == {"swapped_dims": 1} and seen[-1] == ("verify", 3, 3)
    muts = {(m["operator"], m["code"]): m for m in _lines(out / MUTANTS)}
    fallback = next(m for (op, _), m in muts.items() if op == "torch_fallback")
    assert fallback["status"] == "illegal" and "aten::relu" in fallback["reason"] and fallback["kept"]
    harmless = next(m for (op, c), m in muts.items() if op == "swapped_dims" and "reshape(x.size(1)" in c)
    assert harmless["status"] == "ok" and not harmless["kept"] and harmless["dropped"] == STILL_PASSES
    harmful = next(m for (op, c), m in muts.items() if op == "swapped_dims" and "view(x.size(1), x.size(0))" in c)
    assert harmful["status"] in ("incorrect", "runtime_error") and harmful["kept"], harmful["reason"]
    assert all(m["task"] == "level1/19_ReLU" and m["seed"] == 0 and len(m["solution"]) == 16 for m in muts.values())

    relu = builtin_task("level1/19_ReLU")
    repairs = _lines(out / REPAIR)
    assert sorted(r["metadata"]["mutant"] for r in repairs) == sorted([fallback["mutant"], harmful["mutant"]])
    for r in repairs:
        m = fallback if r["metadata"]["mutant"] == fallback["mutant"] else harmful
        msgs = r["messages"]
        assert r["kind"] == "repair" and [x["role"] for x in msgs] == ["system", "user", "assistant", "user",
                                                                        "assistant"]
        assert msgs[:2] == task_messages(relu, "cpu") and msgs[2]["content"] == f"```python\n{m['code'].strip()}\n```"
        # the feedback turn is the one a multi-turn run builds from this mutant's real verdict
        assert msgs[3]["content"] == feedback_message(1, feedback_text(Verdict.from_dict(m["verdict"])), False)[
            "content"]
        assert msgs[3]["content"].startswith("=== System Feedback for Round 1 ===\nStatus: " + m["status"])
        source = RELU if m is fallback else HARMFUL
        assert msgs[4]["content"] == f"```python\n{source.strip()}\n```"  # the verified original
    illegal = next(r for r in repairs if r["metadata"]["operator"] == "torch_fallback")
    assert "Forbidden PyTorch ops called in forward: aten::relu" in illegal["messages"][3]["content"]

    reviews = _lines(out / REVIEWER)
    assert len(reviews) == 2 and all(r["kind"] == "reviewer" for r in reviews)
    for r in reviews:
        m = fallback if r["metadata"]["mutant"] == fallback["mutant"] else harmful
        assert m["code"].strip() in r["messages"][1]["content"] and "has a bug" in r["messages"][1]["content"]
        assert r["messages"][2]["content"].startswith(f"Bug: {m['description']}.\n\n```python\n")
    records, problems = load_records([out / REPAIR, out / REVIEWER])  # the SFT loader takes them as they are
    assert not problems and sorted(r.kind for r in records) == ["repair", "repair", "reviewer", "reviewer"]


def test_a_second_run_redoes_nothing(repaired):
    out, first, solutions, cfg, _ = repaired
    before = {f: (out / f).read_text() for f in (MUTANTS, REPAIR, REVIEWER)}
    again = repair_records(solutions, out, cfg, 2, 0, None, OPS)
    assert again["tried"] == 0 and again["skipped_existing"] == first["tried"], again
    assert {f: (out / f).read_text() for f in before} == before


def test_cli_reports_and_refuses_bad_input(repaired, tmp_path, capsys):
    out, first, solutions, _, _ = repaired
    recs = [{"task": t.key, "teacher": "test", "backend": "cpu", "status": "ok", "code": c} for t, c in solutions]
    sol = tmp_path / "solutions.jsonl"
    sol.write_text("\n".join(map(json.dumps, recs)) + "\nnot json\n")
    run = ["synth", "repair", "--solutions", str(sol), "--out", str(out), "--per-solution", "2",
           "--operators", ",".join(OPS)]
    with pytest.raises(SystemExit) as e:
        cli.app(run, prog_name="musacoder")
    err = capsys.readouterr().err
    assert e.value.code == 0, err
    assert "unusable: solutions.jsonl:4: not JSON" in err and f"{first['tried']} already done" in err
    assert "0 mutants tried on 3 solutions" in err
    for bad, says in ((["--solutions", str(tmp_path / "none")], "does not exist"),
                      (["--backend", "metal"], "--backend must be cpu, cuda, triton, musa or musa-on-cuda"),
                      (["--operators", "off_by_one,typo"], "unknown operator(s) typo"),
                      (["--set", "no_such_setting=1"], "--set:")):
        args = dict(zip(run[2::2], run[3::2]))
        args.update(dict(zip(bad[::2], bad[1::2])))
        with pytest.raises(SystemExit) as e:
            cli.app(["synth", "repair", *[x for kv in args.items() for x in kv]], prog_name="musacoder")
        assert e.value.code == 2 and "error:" in (msg := capsys.readouterr().err) and says in msg, msg
    (tmp_path / "empty.jsonl").write_text("{}\n")
    with pytest.raises(SystemExit) as e:
        cli.app(["synth", "repair", "--solutions", str(tmp_path / "empty.jsonl"), "--out", str(tmp_path / "o")],
                prog_name="musacoder")
    assert e.value.code == 2 and "no usable solution" in capsys.readouterr().err
