"""Stage 1 of synthesis: generated operator graphs are valid KernelBench tasks (seeded, shape-variant safe), the
cleaning filters drop what they should and say why, and `musacoder synth tasks` resumes. Cheap: cpu, small sizes."""

import json
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import torch

from musacoder import cli
from musacoder.synth.clean import check_task
from musacoder.synth.graphs import FAMILIES, GraphSpec, generate, render
from musacoder.tasks import load_tasks
from musacoder.verifier.inputs import Shape, init_inputs, load_module, make_inputs, scaled_constants

SMALL = GraphSpec(size=0.25)


def test_seeded_and_every_family_appears():
    assert render(generate(5, SMALL)) == render(generate(5, SMALL))
    assert render(generate(5, SMALL)) != render(generate(6, SMALL))
    seen = Counter(f for s in range(300) for f in generate(s, SMALL).families)
    assert set(seen) == set(FAMILIES), set(FAMILIES) - set(seen)
    only = GraphSpec(families=("activation", "softmax"), min_ops=3, max_ops=3)
    assert all(set(generate(s, only).families) <= {"activation", "softmax"} for s in range(20))
    with pytest.raises(ValueError, match="unknown operator families"):
        GraphSpec(families=("gemm",))


def test_tasks_run_at_their_sizes_and_at_the_verifiers_shape_variant():
    """The verifier rescales the module-level size constants (x0.75) for its shape variant: every generated graph
    must stay valid there, because its shapes are expressions over those constants."""
    with tempfile.TemporaryDirectory() as tmp:
        for s in range(60):
            m = load_module(render(generate(s, SMALL)), f"g{s}", Path(tmp))
            for shape in (Shape(), Shape(scaled_constants(m, 0.75, 2))):
                torch.manual_seed(0)
                model = m.Model(*init_inputs(m, shape))
                out = model(*make_inputs(m, shape, 0, torch.device("cpu"), "fp32"))
                assert isinstance(out, torch.Tensor), s


def _task(forward: str, init: str = "pass") -> str:
    return f"""import torch
import torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        {init}
    def forward(self, x):
        {forward}
batch = 16
dim = 64
def get_inputs():
    return [torch.rand(batch, dim)]
def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("forward, init, reason", [
    ("return torch.relu(x)", "pass", None),
    ("return torch.log(x - 2)", "pass", "non-finite outputs"),
    ("return x * 1e-4", "pass", "degenerate"),
    ("return torch.softmax(x.sum(dim=1, keepdim=True), dim=-1)", "pass", "insensitive to inputs"),
    ("return x + torch.rand_like(x)", "pass", "non-deterministic"),
    ("self.n.add_(1)\n        return x * self.n", "self.register_buffer('n', torch.zeros(1))", "external state"),
    ("return x + 0 * self.lin(x)", "self.lin = nn.Linear(dim, dim)", "insensitive to weights"),
    ("return x @ torch.ones(3, 3)", "pass", "fails in eager"),
])
def test_cleaning_filters(forward, init, reason):
    rep = check_task(_task(forward, init))
    if reason is None:
        assert rep.ok and rep.aten_ops == ["aten::relu"] and rep.families == ["activation"], rep
    else:
        assert any(p.startswith(reason) for p in rep.problems), rep.problems
    assert not check_task("import torch\nclass Model(:\n").ok


def test_synth_tasks_cli_writes_loadable_tasks_and_resumes(tmp_path, capsys):
    out = tmp_path / "tasks.jsonl"
    run = ["synth", "tasks", "--out", str(out), "--size", "0.25", "--n"]
    with pytest.raises(SystemExit) as e:
        cli.app(run + ["12"], prog_name="musacoder")
    assert e.value.code == 0
    kept = [json.loads(x) for x in out.read_text().splitlines()]
    dropped = [json.loads(x) for x in (tmp_path / "dropped.jsonl").read_text().splitlines()]
    assert len(kept) + len(dropped) == 12 and all(d["problems"] for d in dropped)
    assert all(r["metadata"]["families"] and r["metadata"]["aten_ops"] for r in kept)
    assert [t.problem_id for t in load_tasks(out)] == [r["problem_id"] for r in kept]  # the loader takes them
    with pytest.raises(SystemExit):
        cli.app(run + ["15"], prog_name="musacoder")
    assert "12 already done" in capsys.readouterr().err
    seeds = [json.loads(x)["metadata"]["seed"] for f in (out, tmp_path / "dropped.jsonl")
             for x in f.read_text().splitlines()]
    assert sorted(seeds) == list(range(15))  # nothing generated twice
