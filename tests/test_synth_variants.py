"""Stage 1c variants: every kind makes loadable tasks that pass the cleaning check, reproducibly per seed; shape
variants change the output shape, dtype variants compute in fp16/bf16, fused ones compute what they say; a variant
that breaks its task is dropped with the reason. Cheap: cpu, the shipped tasks and small hand-written ones."""

import json
import random
import tempfile
from pathlib import Path

import pytest
import torch

from musacoder import cli
from musacoder.data.decontam import trace_task
from musacoder.synth.clean import check_task
from musacoder.synth.variants import (
    VariantError,
    chain_variant,
    check_variant,
    draw,
    dtype_variant,
    epilogue_variant,
    shape_variant,
    synth_variants,
)
from musacoder.tasks import Task, builtin_task, load_tasks
from musacoder.verifier.inputs import load_module

RELU = builtin_task("level1/19_ReLU")
GEMM = builtin_task("level2/76_Gemm_Add_ReLU")
# takes ReLU's output shape: the partner a chain needs
TANH = Task(name="1_Tanh", level=9, code=RELU.code.replace("torch.relu", "torch.tanh").replace("ReLU", "Tanh"))
# two constants the code ties together without computing one from the other: other factors break it
TIED = Task(name="2_Tied", code='''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(width, width) * 0.1)

    def forward(self, x):
        return torch.tanh(x @ self.w)


rows = 16
width = 64
cols = 64


def get_inputs():
    return [torch.rand(rows, cols)]


def get_init_inputs():
    return []
''')
# a plain tensor attribute: Module.to() leaves it in fp32, so a dtype variant breaks
PLAIN = Task(name="3_Plain", code=TIED.code.replace("nn.Parameter(torch.randn(width, width) * 0.1)",
                                                    "torch.randn(width, width) * 0.1").replace("cols = 64", "cols = width"))


def _run(code: str, seed: int = 0):
    with tempfile.TemporaryDirectory() as tmp:
        m = load_module(code, "variant", Path(tmp))
        torch.manual_seed(seed)
        model = m.Model(*m.get_init_inputs())
        torch.manual_seed(seed + 1)
        inputs = m.get_inputs()
        with torch.no_grad():
            return model(*inputs), inputs


def _read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_every_kind_is_kept_checked_loadable_and_resumes(tmp_path):
    out = tmp_path / "variants.jsonl"
    summary = synth_variants([RELU, GEMM, TANH], out, per_task=1, seed=0)
    kept = _read(out)
    assert summary["kept"] == len(kept) and summary["kept_per_kind"] == {"shape": 3, "dtype": 3, "fuse": 3}
    assert {r["metadata"]["fusion"] for r in kept if r["metadata"]["variant"] == "fuse"} == {"chain", "epilogue"}
    assert sorted(t.name for t in load_tasks(out)) == sorted(r["name"] for r in kept)  # the loader takes them
    for r in kept:
        assert r["metadata"]["parent"] in {RELU.key, GEMM.key, TANH.key} and r["metadata"]["aten_ops"]
        assert r["name"].startswith(r["metadata"]["parent"].split("/")[-1] + "@")
    assert check_task(next(r["code"] for r in kept if r["metadata"]["variant"] == "shape")).ok
    again = synth_variants([RELU, GEMM, TANH], out, per_task=1, seed=0)
    assert again["kept"] == 0 and again["skipped_existing"] == len(kept) and len(_read(out)) == len(kept)


def test_reproducible_by_seed():
    def codes(seed):
        return [v.code for _, _, v, _ in draw([RELU, GEMM, TANH], ("shape", "fuse"), 2, seed)]

    assert codes(3) == codes(3)
    assert codes(3) != codes(4)


def test_shape_variants_change_the_output_shape():
    parent_out, _ = _run(GEMM.code)
    shapes = set()
    for _, _, v, _ in draw([GEMM], ("shape",), 3, 0):
        out, _ = _run(v.code)
        assert out.shape != parent_out.shape
        assert set(v.meta["factors"]) == {"batch_size", "in_features", "out_features"}  # not bias_shape: a name
        assert out.shape == (v.meta["constants"]["batch_size"], v.meta["constants"]["out_features"])
        shapes.add(out.shape)
    assert len(shapes) == 3  # distinct variants
    tiny = RELU.code.replace("batch_size = 16", "batch_size = 4").replace("dim = 16384", "dim = 6")
    with pytest.raises(VariantError, match="no module-level size constants"):
        shape_variant(Task(name="tiny", code=tiny), random.Random(0))


@pytest.mark.parametrize("dtype, torch_dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_dtype_variants_compute_in_their_dtype(dtype, torch_dtype):
    v = dtype_variant(GEMM, dtype)
    out, inputs = _run(v.code)
    assert out.dtype == torch_dtype and all(x.dtype == torch_dtype for x in inputs)
    ref, _ = _run(GEMM.code)
    assert torch.allclose(out.float(), ref, atol=0.5, rtol=0.05)  # the same model, rounded
    assert check_task(v.code).ok  # the check feeds fp32: forward casts
    assert v.meta["verify_precision"] == dtype and v.meta["atol"] == 1e-2


def test_fused_variants_compute_what_they_say():
    out, (x,) = _run(epilogue_variant(GEMM, "tanh").code)
    ref, _ = _run(GEMM.code)
    assert torch.equal(out, torch.tanh(ref))
    chain = chain_variant(RELU, TANH, trace_task(RELU.code), trace_task(TANH.code))
    out, inputs = _run(chain.code)
    assert len(inputs) == 1 and torch.equal(out, torch.tanh(torch.relu(inputs[0])))
    assert chain.meta == {"fusion": "chain", "second": TANH.key}
    # the epilogue is never the op the task already ends with
    epilogues = {v.meta.get("epilogue") for _, _, v, _ in draw([RELU], ("fuse",), 12, 0)}
    assert "relu" not in epilogues and len(epilogues) == 12


def test_a_variant_that_breaks_its_task_is_dropped_with_the_reason(tmp_path):
    out = tmp_path / "v.jsonl"
    summary = synth_variants([TIED, PLAIN], out, kinds=("shape", "dtype"), per_task=2, seed=0)
    dropped = _read(tmp_path / "v.dropped.jsonl")
    reasons = {(r["metadata"]["parent"], r["metadata"]["variant"]): r["problems"] for r in dropped}
    assert any(p.startswith("fails in eager") for p in reasons[(TIED.key, "shape")])  # width and cols drift apart
    assert any("same dtype" in p for p in reasons[(PLAIN.key, "dtype")])
    assert summary["dropped"] == len(dropped) and summary["reasons"]
    # kept ones are those whose draws kept the tie, or whose dtype survived
    for r in _read(out):
        if r["metadata"]["variant"] == "shape" and r["metadata"]["parent"] == TIED.key:
            assert r["metadata"]["constants"]["width"] == r["metadata"]["constants"]["cols"]


def test_shape_variants_stay_under_the_input_cap():
    """Inputs may grow to 1 GiB (KernelBench's own sizes are often past it: those only shrink); judged on the meta
    device, before any check runs."""
    one_dim = RELU.code.replace("batch_size = 16", "batch_size = 4")  # under 8: not a size, only dim scales
    big = Task(name="big", code=one_dim.replace("dim = 16384", "dim = 50331648"))  # 0.75 GiB: x1.5 is over 1 GiB
    grown = [v for _, _, v, _ in draw([big], ("shape",), 4, 0) if v.meta["factors"]["dim"] > 1]
    assert grown and all(check_variant(v)[0][0].startswith("too large: inputs grow to") for v in grown)
    huge = Task(name="huge", code=RELU.code.replace("dim = 16384", "dim = 33554432"))  # 2 GiB
    assert all(max(v.meta["factors"].values()) < 1 for _, _, v, _ in draw([huge], ("shape",), 3, 0))


def test_cli(tmp_path, capsys):
    out = tmp_path / "v.jsonl"
    args = ["synth", "variants", "--out", str(out), "--names", "19_ReLU", "--kinds", "shape,dtype", "--per-task", "2",
            "--seed", "1"]
    with pytest.raises(SystemExit) as e:
        cli.app(args, prog_name="musacoder")
    assert e.value.code == 0
    assert len(_read(out)) == 4 and "4 kept (shape 2, dtype 2)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.app(args, prog_name="musacoder")
    assert "4 already done" in capsys.readouterr().err and len(_read(out)) == 4
    for bad, message in ((["--kinds", "size"], "unknown variant kinds"), (["--names", "nope"], "no task")):
        with pytest.raises(SystemExit) as e:
            cli.app(["synth", "variants", "--out", str(tmp_path / "w.jsonl")] + bad, prog_name="musacoder")
        err = capsys.readouterr().err
        assert e.value.code == 2 and "error:" in err and message in err
