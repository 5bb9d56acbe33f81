"""`musacoder synth`: build training data (the method's step 1)."""

from __future__ import annotations

from pathlib import Path

import typer

from musacoder.cli_base import App, err, fail
from musacoder.tasks.select import IdsOpt, LevelsOpt, NamesOpt, TasksOpt

synth_app = App(add_completion=False, no_args_is_help=True, help="Synthesize tasks and verified solutions.")


@synth_app.command("tasks")
def tasks(out: Path = typer.Option(..., help="JSONL of kept tasks (KernelBench records); dropped.jsonl beside it"),
          n: int = typer.Option(100, min=1, help="graphs to generate"),
          seed: int = typer.Option(0, help="first seed; seeds seed..seed+n-1, each reproducible"),
          min_ops: int = typer.Option(2, min=1), max_ops: int = typer.Option(5, min=1),
          families: str | None = typer.Option(None, help="comma-separated operator families (default: all)"),
          fusion_depth: int = typer.Option(1, min=0, help="binary merges of earlier branches per graph, at most"),
          size: float = typer.Option(1.0, min=0.01, help="multiplies the drawn tensor sizes"),
          check_scale: float = typer.Option(1.0, min=0.01, max=1.0,
                                            help="run the cleaning checks at these sizes (cheaper)")):
    """Random operator graphs over KernelBench's families as tasks, checked and cleaned. Resumable (appends)."""
    from rich.progress import Progress

    from musacoder.synth.graphs import FAMILIES, GraphSpec
    from musacoder.synth.tasks import synth_tasks

    try:
        fams = tuple(f.strip() for f in families.split(",") if f.strip()) if families else FAMILIES
        spec = GraphSpec(min_ops=min_ops, max_ops=max_ops, families=fams, fusion_depth=fusion_depth, size=size)
    except ValueError as e:
        fail(e)
    if out.exists() and out.is_dir():
        fail(f"{out} is a directory; give a .jsonl file")
    with Progress(console=err, transient=True) as bar:
        job = bar.add_task("generating and checking", total=n)
        summary = synth_tasks(out, n, seed, spec, check_scale, lambda i, total: bar.update(job, completed=i,
                                                                                           total=total))
    err.print(f"{summary['kept']} kept, {summary['generated'] - summary['kept']} dropped"
              + (f", {summary['skipped_existing']} already done" if summary["skipped_existing"] else "")
              + f"  ->  {out}")
    for reason, count in summary["dropped"].items():
        err.print(f"  dropped {count}: {reason}")
    if summary["families"]:
        err.print("  families of kept tasks: " + ", ".join(f"{k} {v}" for k, v in summary["families"].items()))


@synth_app.command("solve")
def solve(out: Path = typer.Option(..., help="directory: solutions.jsonl (every try, with its verdict), sft.jsonl"),
          tasks: TasksOpt = None, levels: LevelsOpt = None, ids: IdsOpt = None, names: NamesOpt = None,
          backend: str = typer.Option("cpu", help="cpu (Inductor's C++) or triton (Inductor's Triton, a GPU)"),
          limit: int | None = typer.Option(None, min=1, help="the first N tasks only")):
    """Compiler-teacher solutions for the selected tasks (`synth tasks` output, KernelBench, ...), each verified by
    MooreEval (strict); the passing ones as SFT records. Resumable."""
    from rich.progress import Progress

    from musacoder.config import VerifyConfig
    from musacoder.synth.solve import SFT, SOLUTIONS, solve_tasks
    from musacoder.tasks import TaskLoadError
    from musacoder.tasks.select import select_tasks

    if backend not in ("cpu", "triton"):
        fail(f"--backend must be cpu or triton (the compiler teacher's), not {backend!r}")
    try:
        found = select_tasks(tasks, levels, ids, names)[:limit]
    except (TaskLoadError, OSError) as e:
        fail(e)
    with Progress(console=err, transient=True) as bar:
        job = bar.add_task("teacher", total=len(found))
        summary = solve_tasks(found, out, VerifyConfig(backend=backend),
                              lambda stage, i, n: bar.update(job, description=stage, completed=i, total=n))
    err.print(f"{summary['tried']} tried"
              + (f", {summary['skipped_existing']} already done" if summary["skipped_existing"] else "")
              + f"; teacher: {summary['teacher']}; verdicts: {summary['verdicts']}")
    err.print(f"  -> {out / SOLUTIONS}, passing ones in {out / SFT}")
