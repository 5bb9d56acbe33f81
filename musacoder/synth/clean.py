"""Stage 1d/1e: a task's own unit test, the cleaning filters, and its operator families from the aten ops it runs.

`check_task(code)` runs the task in eager on the cpu (at its own sizes, or rescaled with `size_scale` to keep the
check cheap; the verifier's shape-variant code does the rescaling) and returns the reasons to drop it, empty when
it is kept. The numeric filters follow robust-kbench's (threshold 0.01): outputs all near zero, outputs that do not
change with the inputs (per-element spread over input seeds under 0.01 everywhere), outputs that do not change
with the weights (inputs held fixed, the model built under another seed); plus NaN/Inf, non-determinism (two runs
of the same seed differ), and a task that mutates its own state in forward (parameters or buffers change).

Not checked here (named): file or network access (generated tasks have none; harvested modules will need the static
scan), data-dependent control flow, and runtimes too short to time (a GPU question, answered by the verifier's
timing when solutions are verified).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
from pydantic import BaseModel
from torch.utils._python_dispatch import TorchDispatchMode

from musacoder.data.opgraph import IGNORED_OPS, families_of
from musacoder.verifier.inputs import Shape, init_inputs, load_module, make_inputs, scaled_constants

THRESHOLD = 0.01  # robust-kbench's
SEEDS = 3
M = TypeVar("M", bound=BaseModel)

# aten op -> operator family, for mixing and reporting (first match wins)
@dataclass
class TaskReport:
    problems: list[str] = field(default_factory=list)  # why to drop it; empty: keep
    aten_ops: list[str] = field(default_factory=list)
    families: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _build(module, shape: Shape, seed: int):
    torch.manual_seed(seed)
    return module.Model(*init_inputs(module, shape))


def _outputs(module, shape: Shape, model, input_seed: int, transform: str = "", rng_seed: int = 0
             ) -> list[torch.Tensor]:
    inputs = make_inputs(module, shape, input_seed, torch.device("cpu"), "fp32", transform)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(rng_seed)  # a forward that draws from the global RNG gives away itself when this changes
    with torch.no_grad():
        out = model(*inputs)
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    after = model.state_dict()
    if any(not torch.equal(before[k], after[k]) for k in before):
        raise _Stateful()
    return [o.detach().float() for o in outs]


class _Stateful(Exception):
    pass


class _AtenOps(TorchDispatchMode):
    """The aten ops forward dispatches (the same names torch.profiler shows, without starting a profiler)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = "aten::" + func.__name__.split(".")[0]
        if name not in IGNORED_OPS and name not in self.seen:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def _aten_ops(module, shape: Shape) -> list[str]:
    model = _build(module, shape, 0)
    inputs = make_inputs(module, shape, 0, torch.device("cpu"), "fp32")
    with torch.no_grad(), _AtenOps() as mode:
        model(*inputs)
    return mode.seen


def measure_families(code: str, size_scale: float = 1.0, min_size: int = 2) -> list[str]:
    """The operator families of a task that did not come with them (KernelBench, the shipped tasks): the aten ops of
    one eager forward on the cpu, as `check_task` finds them, at the task's sizes x `size_scale`. Raises whatever
    loading or running the task raises."""
    with tempfile.TemporaryDirectory() as tmp:
        module = load_module(code, "synth_task", Path(tmp))
        shape = Shape(scaled_constants(module, size_scale, min_size) if size_scale != 1.0 else {})
        return families_of(_aten_ops(module, shape))


def known_families(task) -> list[str]:
    """The families a task record came with (`synth tasks`, `synth variants` write them; the loaders keep them in
    `Task.metadata`), else []."""
    fams = task.metadata.get("families")
    return [str(f) for f in fams] if isinstance(fams, list) else []


def with_families(meta: M, task) -> M:
    """A training record's metadata (a data/schema.py model) plus its task's known families, which SFT mixing weighs
    by (train/data.py); without any, as it is (no `families` key written)."""
    fams = known_families(task)
    return meta.model_copy(update={"families": fams}) if fams else meta


def check_task(code: str, size_scale: float = 1.0, min_size: int = 2) -> TaskReport:
    rep = TaskReport()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            module = load_module(code, "synth_task", Path(tmp))
        except Exception as e:
            rep.problems.append(f"does not load: {type(e).__name__}: {e}"[:300])
            return rep
        shape = Shape(scaled_constants(module, size_scale, min_size) if size_scale != 1.0 else {})
        try:
            model = _build(module, shape, 0)
            runs = [_outputs(module, shape, model, s) for s in range(SEEDS)]
            again = _outputs(module, shape, _build(module, shape, 0), 0, rng_seed=1)
            signed = _outputs(module, shape, model, 0, "sign")  # a second, sign-symmetric input distribution
            other = _build(module, shape, 1)
            random_init = any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                                    other.state_dict().values()))
            reweighted = _outputs(module, shape, other, 0)
            rep.aten_ops = _aten_ops(module, shape)
        except _Stateful:
            rep.problems.append("external state: forward changes the model's parameters or buffers")
            return rep
        except Exception as e:
            rep.problems.append(f"fails in eager: {type(e).__name__}: {e}"[:300])
            return rep
    rep.families = families_of(rep.aten_ops)
    first = runs[0]
    if any(not torch.isfinite(o).all() for o in first + signed):
        rep.problems.append("non-finite outputs (NaN or Inf)")
        return rep
    if any(not torch.equal(a, b) for a, b in zip(first, again)):
        rep.problems.append("non-deterministic: two runs on the same inputs differ (random numbers in forward?)")
    if all(o.abs().max().item() < THRESHOLD for o in first):
        rep.problems.append(f"degenerate: every output within +-{THRESHOLD}")
    spread = [torch.stack([r[i] for r in runs]).std(dim=0) for i in range(len(first))]
    if all(s.max().item() < THRESHOLD for s in spread):
        rep.problems.append(f"insensitive to inputs: outputs vary by under {THRESHOLD} across {SEEDS} input seeds")
    if random_init and all((a - b).abs().max().item() < THRESHOLD for a, b in zip(first, reweighted)):
        rep.problems.append(f"insensitive to weights: another initialisation changes no output by {THRESHOLD}")
    return rep
