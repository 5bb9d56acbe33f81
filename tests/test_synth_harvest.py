"""Stage 1b: real modules harvested from torch.nn, torch.nn.functional and transformers are valid KernelBench tasks
whose size constants drive their shapes; what cannot be a task is dropped or excluded with the reason; seeded and
resumable. Cheap: a selection of origins at small sizes, on the cpu."""

import ast
import importlib.util
import json
import tempfile
from pathlib import Path

import pytest
import torch

from musacoder import cli
from musacoder.synth.harvest import HarvestSpec, harvest, harvest_tasks
from musacoder.tasks.model import Task
from musacoder.verifier.inputs import Shape, init_inputs, load_module, make_inputs, scaled_constants

# layers and ops across the families (torch.nn names are CamelCase, functional ones snake_case)
SELECTION = ("ReLU", "GELU", "Hardtanh", "LogSoftmax", "Softmax2d", "LayerNorm", "GroupNorm", "BatchNorm2d",
             "InstanceNorm1d", "RMSNorm", "Conv1d", "Conv2d", "ConvTranspose2d", "Linear", "Bilinear", "MaxPool2d",
             "AvgPool1d", "AdaptiveAvgPool2d", "MaxUnpool2d", "Embedding", "EmbeddingBag", "MSELoss",
             "CrossEntropyLoss", "KLDivLoss", "TripletMarginLoss", "ReflectionPad2d", "Upsample", "PixelShuffle",
             "MultiheadAttention", "GRUCell", "CosineSimilarity", "Unfold", "Dropout", "RReLU", "Identity",
             "LazyLinear", "gelu", "silu", "layer_norm", "softmax", "log_softmax", "scaled_dot_product_attention",
             "interpolate", "unfold", "conv2d", "linear", "embedding", "cross_entropy", "mse_loss", "max_pool2d",
             "pad", "normalize", "group_norm", "rms_norm", "dropout", "relu_")
SPEC = HarvestSpec(size=0.25, libs=("nn", "functional"), match=SELECTION)
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def _read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def harvested(tmp_path_factory):
    out = tmp_path_factory.mktemp("harvest") / "tasks.jsonl"
    summary = harvest_tasks(out, SPEC)
    return out, summary, _read(out), {r["metadata"]["origin"]: r for r in _read(out.with_name("dropped.jsonl"))}


def test_many_kept_tasks_over_families_with_provenance(harvested):
    out, summary, kept, dropped = harvested
    assert summary["generated"] == len(kept) + len(dropped) and summary["skipped_existing"] == 0
    assert len(kept) >= 40, summary
    families = {f for r in kept for f in r["metadata"]["families"]}
    assert len(families) >= 8, families
    assert {"convolution", "matmul", "normalization", "pooling", "loss", "activation"} <= families
    assert summary["sources"]["torch.nn"]["kept"] >= 20 and summary["sources"]["torch.nn.functional"]["kept"] >= 15
    for r in kept:
        meta = r["metadata"]
        assert meta["generator"] == "harvest" and meta["families"] and meta["aten_ops"], r["name"]
        assert meta["origin"].startswith(("torch.nn.", "torch.nn.functional.")) and isinstance(r["problem_id"], int)
    assert len({r["problem_id"] for r in kept}) == len(kept)
    assert {r["metadata"]["origin"] for r in kept} >= {"torch.nn.LayerNorm", "torch.nn.functional.gelu",
                                                      "torch.nn.Conv2d", "torch.nn.functional.interpolate"}


def test_rng_and_non_layers_are_dropped_with_the_reason(harvested):
    _, summary, kept, dropped = harvested
    for origin in ("torch.nn.Dropout", "torch.nn.RReLU", "torch.nn.functional.dropout"):
        assert dropped[origin]["problems"][0].startswith("non-deterministic"), dropped[origin]["problems"]
        assert dropped[origin]["code"]  # it was built and failed the cleaning check, not skipped
    for origin, why in (("torch.nn.Identity", "no computation"), ("torch.nn.LazyLinear", "lazy"),
                        ("torch.nn.functional.relu_", "in-place variant")):
        assert dropped[origin]["problems"][0].startswith("excluded: ") and why in dropped[origin]["problems"][0]
    assert summary["dropped"]["non-deterministic"] >= 3 and summary["dropped"]["excluded"] >= 3
    assert not {r["metadata"]["origin"] for r in kept} & set(dropped)


def _run(module, shape: Shape):
    torch.manual_seed(0)
    model = module.Model(*init_inputs(module, shape))
    inputs = make_inputs(module, shape, 0, torch.device("cpu"), "fp32")
    with torch.no_grad():
        out = model(*inputs)
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    return [tuple(x.shape) for x in inputs], [tuple(o.shape) for o in outs]


def _forward_reads_constants(code: str) -> set[str]:
    tree = ast.parse(code)
    consts = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    forward = next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    return {n.id for n in ast.walk(forward) if isinstance(n, ast.Name)} & consts


def test_kept_tasks_load_run_and_their_size_constants_drive_the_shapes(harvested):
    """The verifier's shape variant rescales the module-level ints >= 8 while it builds inputs and the model:
    halving them must change the inputs (and every non-scalar output), the task must still run there, and forward
    must not read them (it would see the old values)."""
    _, _, kept, _ = harvested
    with tempfile.TemporaryDirectory() as tmp:
        for r in kept:
            Task(name=r["name"], code=r["code"], problem_id=r["problem_id"]).validate()
            assert not _forward_reads_constants(r["code"]), r["name"]
            m = load_module(r["code"], r["name"], Path(tmp))
            ins, outs = _run(m, Shape())
            half = scaled_constants(m, 0.5, 8)
            assert half, r["name"]
            ins2, outs2 = _run(m, Shape(half))
            assert ins2 != ins, r["name"]
            if any(outs):  # a summed loss is a scalar at every size
                assert outs2 != outs, r["name"]
        linear = next(r for r in kept if r["metadata"]["origin"] == "torch.nn.Linear")
        m = load_module(linear["code"], "linear", Path(tmp))
        full = _run(m, Shape())[1][0]
        half = _run(m, Shape({"out_features": m.out_features // 2}))[1][0]
        assert full[-1] == m.out_features and half == full[:-1] + (m.out_features // 2,)


def test_reproducible_seeded_and_resume_redoes_nothing(harvested):
    out, _, kept, dropped = harvested
    first = [(h.origin, h.code, h.skip) for h in harvest(SPEC)]
    assert first == [(h.origin, h.code, h.skip) for h in harvest(SPEC)]
    other = [h.code for h in harvest(HarvestSpec(seed=1, size=0.25, libs=("nn", "functional"), match=SELECTION))]
    assert sum(a != b for (_, a, _), b in zip(first, other)) >= 5  # the seed draws other sizes
    before = out.read_text(), out.with_name("dropped.jsonl").read_text()
    again = harvest_tasks(out, SPEC)
    assert again["generated"] == 0 and again["skipped_existing"] == len(kept) + len(dropped)
    assert (out.read_text(), out.with_name("dropped.jsonl").read_text()) == before


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers not installed")
def test_transformers_blocks_become_tasks(tmp_path):
    out = tmp_path / "hf.jsonl"
    spec = HarvestSpec(size=0.25, libs=("transformers",), match=("transformers.models.llama.*",))
    summary = harvest_tasks(out, spec)
    kept = {r["metadata"]["origin"].rsplit(".", 1)[-1]: r for r in _read(out)}
    assert {"LlamaRMSNorm", "LlamaMLP", "apply_rotary_pos_emb", "LlamaAttention"} <= set(kept), summary
    assert "reduction" in kept["LlamaRMSNorm"]["metadata"]["families"]  # written out: pow, mean, rsqrt, mul
    assert "matmul" in kept["LlamaMLP"]["metadata"]["families"]
    for r in kept.values():
        assert "import transformers" in r["code"] or "from transformers." in r["code"]
        assert r["metadata"]["source"] == "transformers"
        m = load_module(r["code"], r["name"], tmp_path)
        ins, outs = _run(m, Shape())
        assert _run(m, Shape(scaled_constants(m, 0.5, 8)))[0] != ins, r["name"]


def test_libraries_that_are_missing_are_reported_not_recorded():
    unavailable = {}
    found = harvest(HarvestSpec(libs=("torchvision", "timm")), unavailable)
    for lib in ("torchvision", "timm"):
        if importlib.util.find_spec(lib) is None:
            assert lib in unavailable and "not importable" in unavailable[lib]
            assert not any(h.source == lib for h in found)
    with pytest.raises(ValueError, match="unknown harvest sources"):
        HarvestSpec(libs=("keras",))


def test_cli_harvest_resumes_and_bad_input_is_an_error_line(tmp_path, capsys):
    out = tmp_path / "tasks.jsonl"
    run = ["synth", "tasks", "--source", "harvest", "--out", str(out), "--size", "0.25", "--libs", "nn"]
    with pytest.raises(SystemExit) as e:
        cli.app(run + ["--match", "ReLU6,Dropout,Conv1d"], prog_name="musacoder")
    assert e.value.code == 0
    assert "2 kept, 1 dropped" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.app(run + ["--match", "ReLU6,Dropout,Conv1d,Tanh"], prog_name="musacoder")
    assert e.value.code == 0 and "3 already done" in capsys.readouterr().err
    assert [r["metadata"]["origin"] for r in _read(out)] == ["torch.nn.Conv1d", "torch.nn.ReLU6", "torch.nn.Tanh"]
    for bad, msg in ((["--match", "NoSuchLayer*"], "nothing to harvest"), (["--libs", "keras"], "unknown harvest")):
        with pytest.raises(SystemExit) as e:
            cli.app(run + bad, prog_name="musacoder")
        err = capsys.readouterr().err
        assert e.value.code == 2 and "error:" in err and msg in err and "Traceback" not in err
