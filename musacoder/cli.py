"""Command line: `musacoder verify`, `musacoder demo`, `musacoder tasks`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help="MusaCoder: LLMs that write native kernels.")
console = Console()
try:  # the benchmark harness needs the `bench` extra (httpx, matplotlib, transformers)
    from musacoder.bench.cli import bench_app

    app.add_typer(bench_app, name="bench", help="Evaluate a model on KernelBench-format tasks.")
except ImportError as _e:  # pragma: no cover - depends on what is installed
    _bench_missing = str(_e)

    @app.command("bench")
    def bench_unavailable():
        """Evaluate a model (needs: pip install 'musacoder[bench]')."""
        Console(stderr=True).print(f"musacoder bench needs the bench extra: {_bench_missing}")
        raise typer.Exit(2)
err = Console(stderr=True, soft_wrap=True)


def _config(backend: str, profile: str, no_timing: bool, seeds: int):
    from musacoder.config import VerifyConfig

    cfg = VerifyConfig(backend=backend, profile=profile, timing_enabled=not no_timing)
    cfg.correctness.seeds = seeds
    return cfg


def _fmt(x, spec=".2f", suffix=""):
    return "-" if x is None else f"{x:{spec}}{suffix}"


@app.command()
def verify(task: Path = typer.Option(..., help="Task .py file (KernelBench format)"),
           candidate: Path = typer.Option(..., help="Candidate .py file or raw model output"),
           backend: str = typer.Option("auto", help="auto | cpu | cuda | triton"),
           profile: str = typer.Option("strict", help="strict | kernelbench"),
           seeds: int = typer.Option(5, help="correctness trials on fresh seeds"),
           no_timing: bool = typer.Option(False, "--no-timing", help="skip timing (and speedups)"),
           as_json: bool = typer.Option(False, "--json", help="print the verdict as one JSON object")):
    """Verify one candidate against one task. Exit code 0 whenever verification ran, whatever the verdict."""
    from musacoder.tasks import TaskLoadError, load_tasks
    from musacoder.verifier.api import verify as run_verify

    try:
        tasks = load_tasks(task)
        raw = candidate.read_text()
    except (TaskLoadError, OSError) as e:
        err.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2)
    if len(tasks) != 1:
        err.print(f"[red]error:[/red] {task} holds {len(tasks)} tasks; give one")
        raise typer.Exit(2)
    v = run_verify(tasks[0], raw, _config(backend, profile, no_timing, seeds))
    if as_json:
        sys.stdout.write(v.to_json() + "\n")
        return
    colour = "green" if v.passed else "red"
    console.print(f"[bold {colour}]{v.status.value}[/]  {escape(v.reason)}")
    console.print(f"correctness {v.trials_passed}/{v.trials_total}  reward {v.reward:.3f}  "
                  f"speedup eager {_fmt(v.speedup_eager, '.2f', 'x')}  compile {_fmt(v.speedup_compile, '.2f', 'x')}  "
                  f"device {v.device}")
    console.print("[dim]" + escape(v.feedback) + "[/dim]")


@app.command()
def tasks(path: Optional[Path] = typer.Argument(None, help="Task file or directory (default: shipped tasks)")):
    """List tasks."""
    from musacoder.tasks import builtin_tasks, load_tasks

    ts = load_tasks(path) if path else builtin_tasks()
    for t in ts:
        console.print(f"{t.key}  [dim]{t.source}[/dim]")


@app.command()
def demo(backend: str = typer.Option("auto", help="auto picks cuda when a GPU is present, else cpu"),
         only: Optional[str] = typer.Option(None, help="only examples whose file name contains this"),
         out: Optional[Path] = typer.Option(None, help="also write the verdicts as JSONL here")):
    """Verify the shipped example kernels (honest and cheating) on the shipped tasks and print a table."""
    import torch
    from rich.progress import Progress

    from musacoder.examples_catalog import load_catalog
    from musacoder.tasks import builtin_task
    from musacoder.verifier.api import verify_many

    if backend == "auto":
        backend = "cuda" if torch.cuda.is_available() else "cpu"
    examples = [e for e in load_catalog(backend) if not only or only in e.file]
    if not examples:
        console.print(f"no examples for backend {backend}")
        raise typer.Exit(1)
    cfg = _config(backend, "strict", False, 5)
    console.print(f"Verifying {len(examples)} shipped candidates on the [bold]{backend}[/bold] backend "
                  f"(first run builds their extensions; later runs hit the build cache)")
    pairs = [(builtin_task(e.task), e.path.read_text()) for e in examples]
    verdicts = {}
    with Progress(console=console, transient=True) as prog:
        bar = prog.add_task("verifying", total=len(pairs))
        for i, v in verify_many(pairs, cfg):
            verdicts[i] = v
            prog.update(bar, advance=1, description=f"{examples[i].name}: {v.status.value}")
    table = Table(title=f"MooreEval verdicts ({backend}, {verdicts[0].device if verdicts else ''})")
    for col in ("candidate", "task", "threat", "verdict", "expected", "reason", "x eager", "x compile", "reward"):
        table.add_column(col, overflow="fold")
    matched = 0
    for i, e in enumerate(examples):
        v = verdicts[i]
        ok = v.status.value == e.expect or (e.expect == "ok_timed" and v.status.value in ("ok", "incorrect"))
        matched += ok
        table.add_row(e.name, e.task, "honest" if e.honest else str(e.threat),
                      f"[{'green' if v.passed else 'red'}]{v.status.value}[/]",
                      ("" if ok else "[bold red]!= [/]") + e.expect, escape(v.reason[:160]),
                      _fmt(v.speedup_eager), _fmt(v.speedup_compile), f"{v.reward:.2f}")
    console.print(table)
    console.print(f"{matched}/{len(examples)} verdicts as expected")
    if out:
        with open(out, "w") as f:
            for i, e in enumerate(examples):
                f.write(json.dumps({"example": e.file, **verdicts[i].to_dict()}) + "\n")


if __name__ == "__main__":
    app()
