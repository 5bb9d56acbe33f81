"""Task selection shared by the CLI commands (`--tasks PATH --levels --ids --names`), size scaling and a memory
estimate made before anything runs. Kept free of torch at import time so `musacoder --help` stays fast."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Annotated

import typer

from musacoder.pyast import parse
from musacoder.tasks.model import Task, TaskLoadError

# One option set for every command that takes tasks (verify, bench run; rl/synth can reuse these annotations).
TasksOpt = Annotated[Path | None, typer.Option(
    "--tasks", help="KernelBench .jsonl/.parquet, a task directory, a .py task, or FILE#N as `musacoder tasks` "
                    "prints it")]
LevelsOpt = Annotated[str | None, typer.Option(help="comma-separated levels, or 'all'")]
IdsOpt = Annotated[str | None, typer.Option(help="comma-separated KernelBench problem ids, e.g. 19,23")]
NamesOpt = Annotated[str | None, typer.Option(help="comma-separated names or keys (substring or level1/19_ReLU)")]

_REF_RE = re.compile(r"^(.*)#(\d+)$")


def _csv(s: str | list | None) -> list[str]:
    """Comma-separated (the command line) or a list (a config file)."""
    items = s if isinstance(s, list) else (s or "").split(",")
    return [str(x).strip() for x in items if str(x).strip()]


def parse_ints(s: str | list | None, what: str) -> list[int] | None:
    if s is None or _csv(s) in ([], ["all"]):
        return None
    try:
        return [int(x) for x in _csv(s)]
    except ValueError:
        raise TaskLoadError(f"{what} must be comma-separated integers, not {s!r}") from None


def select_tasks(path: str | Path | None, levels: str | list | None = None, ids: str | list | None = None,
                 names: str | list | None = None) -> list[Task]:
    """Tasks under `path` filtered by level, problem id and name. `FILE#N` (the source `musacoder tasks` prints for
    record N of a JSONL/Parquet file) picks that record."""
    from musacoder.tasks.loaders import builtin_tasks, load_tasks

    record = None
    if path is not None:
        m = _REF_RE.match(str(path))
        if m and not Path(path).exists():
            path, record = Path(m.group(1)), int(m.group(2))
    tasks = load_tasks(path, levels=parse_ints(levels, "--levels")) if path is not None else builtin_tasks()
    if path is None and levels:
        tasks = [t for t in tasks if t.level in (parse_ints(levels, "--levels") or [t.level])]
    if record is not None:
        tasks = [t for t in tasks if t.source.endswith(f"#{record}")]
        if not tasks:
            raise TaskLoadError(f"{path} has no record #{record}")
    want_ids = parse_ints(ids, "--ids")
    if want_ids:
        tasks = [t for t in tasks if t.problem_id in want_ids]
    want_names = _csv(names)
    if want_names:
        tasks = [t for t in tasks if any(n == t.key or n in t.name for n in want_names)]
    if not tasks:
        raise TaskLoadError(f"no task in {path or 'the shipped tasks'} matches"
                            + "".join(f" {k} {v}" for k, v in (("--levels", levels), ("--ids", ids),
                                                                ("--names", names)) if v))
    return tasks


def _scaled(node: ast.expr, f: float, min_size: int) -> ast.expr | None:
    """A new int (or tuple of ints) constant scaled by f; None when nothing in it is a size."""
    def one(v):
        return max(1, round(v * f)) if v >= min_size else v

    if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= min_size:
        return ast.Constant(one(node.value))
    if isinstance(node, ast.Tuple) and node.elts and all(
            isinstance(e, ast.Constant) and type(e.value) is int for e in node.elts) \
            and any(e.value >= min_size for e in node.elts):
        return ast.Tuple([ast.Constant(one(e.value)) for e in node.elts], ast.Load())
    return None


def scale_task(task: Task, factor: float, min_size: int = 8) -> Task:
    """The task with its module-level size constants (ints >= min_size, e.g. `batch_size = 16`) times `factor`.
    The key records it (`level1/19_ReLU@size0.25`) so a scaled result is never mistaken for the real size."""
    if factor == 1.0:
        return task
    if factor <= 0:
        raise TaskLoadError(f"--size-scale must be > 0, not {factor}")
    tree = parse(task.code)
    changed = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            new = _scaled(node.value, factor, min_size)
            if new is not None:
                node.value = new
                changed[node.targets[0].id] = ast.literal_eval(new)
    if not changed:
        raise TaskLoadError(f"task {task.key}: no module-level size constants to scale")
    return dataclasses.replace(task, name=f"{task.name}@size{factor:g}", code=ast.unparse(tree),
                               metadata={**task.metadata, "size_scale": factor, "scaled_constants": changed})


def estimate_bytes(task: Task, factor: float = 4.0) -> tuple[int, int]:
    """(input bytes, estimated peak bytes): get_inputs() and the model's parameters built on the meta device (no
    memory used), inputs x `factor` for the reference's and the candidate's copies and outputs."""
    import torch

    ns: dict = {"__name__": f"musacoder_estimate_{task.code_hash}"}
    with torch.device("meta"):
        exec(compile(task.code, task.source or task.key, "exec"), ns)  # noqa: S102 - trusted reference code
        inputs = ns["get_inputs"]()
        model = ns["Model"](*ns["get_init_inputs"]())
    seen: list = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            seen.append(x.numel() * x.element_size())
        elif isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)

    walk(inputs)
    params = sum(p.numel() * p.element_size() for p in model.parameters()) if isinstance(model, torch.nn.Module) \
        else 0
    total = sum(seen)
    return total, int(total * factor + 2 * params)


def memory_problem(task: Task, have: int, backend: str) -> str | None:
    """A message when the task will not fit in `have` bytes of `backend` (`backends.available_bytes`), else None.
    Estimation failures are not fatal: the verifier decides."""
    try:
        inputs, need = estimate_bytes(task)
    except Exception:  # noqa: BLE001 - a task that cannot run on meta is judged by the verifier as usual
        return None
    if need <= have:
        return None
    gb = 2**30
    hint = max(0.01, round(have / need / 2, 2))
    return (f"task {task.key} needs about {need / gb:.1f} GiB (inputs {inputs / gb:.1f} GiB x 4 for reference and "
            f"candidate copies and outputs), more than the {have / gb:.1f} GiB available on {backend}; "
            f"shrink it with --size-scale {hint:g} (recorded in the task key) or raise --worker-mem-gb")
