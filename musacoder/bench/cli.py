"""`musacoder bench run` and `musacoder bench compare`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markdown import Markdown

bench_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="Evaluate a model on KernelBench-format tasks the way the MusaCoder paper does.")
console = Console()
err = Console(stderr=True, soft_wrap=True)


@bench_app.command()
def run(tasks: Path = typer.Option(..., help="KernelBench .jsonl, a task directory, or a .py task"),
        model: str = typer.Option(..., help="openai:MODEL[@http://host:port/v1] | hf:/path/to/checkpoint | "
                                            "replay:/path/to/file.jsonl (or a directory)"),
        out: Path = typer.Option(..., help="run directory; an existing run there is resumed"),
        levels: str = typer.Option("1,2,3", help="comma-separated levels, or 'all'"),
        samples: int = typer.Option(8, help="samples per task"),
        temperature: float = typer.Option(0.7),
        top_p: float = typer.Option(1.0),
        max_tokens: int = typer.Option(32768, help="response token limit"),
        turns: int = typer.Option(1, help="responses per sample; > 1 adds verifier-feedback turns"),
        stop_on_success: bool = typer.Option(True, "--stop-on-success/--optimise-after-success",
                                             help="end a sample's turns once one passes, or ask to optimise it"),
        backend: str = typer.Option("auto", help="auto | cpu | cuda | triton (prompt style and verifier)"),
        profile: str = typer.Option("strict", help="verifier profile: strict | kernelbench"),
        no_timing: bool = typer.Option(False, "--no-timing", help="skip timing (no speedups, no Faster Rate)"),
        one_shot: bool = typer.Option(True, "--one-shot/--zero-shot", help="include the built-in example"),
        faster_threshold: float = typer.Option(1.1, help="Faster Rate counts speedups above this"),
        overlap: bool = typer.Option(True, "--overlap/--no-overlap",
                                     help="verify while generating; turn off when the model server shares the "
                                          "device that times the kernels"),
        concurrency: int = typer.Option(16, help="requests in flight (openai)"),
        batch_size: int = typer.Option(8, help="generation batch (hf)")):
    """Generate, verify and score; writes samples.sqlite, metrics.json, report.md and plots under OUT.

    Exit code 0 when every sample is finished, 1 when some are not (e.g. the model server failed; run the same
    command again to retry just those), 2 on bad arguments.
    """
    from musacoder.bench.clients import ReplayError, make_client
    from musacoder.bench.report import paper_table
    from musacoder.bench.runner import BenchConfig, run_bench
    from musacoder.bench.store import RunMismatch
    from musacoder.config import VerifyConfig
    from musacoder.tasks import TaskLoadError, load_tasks

    try:
        level_list = None if levels.strip() == "all" else [int(x) for x in levels.split(",") if x.strip()]
        task_list = load_tasks(tasks, levels=level_list)
        if not task_list:
            raise ValueError(f"no tasks in {tasks} at levels {levels}")
        client = make_client(model, concurrency=concurrency, batch_size=batch_size)
        cfg = BenchConfig(samples=samples, temperature=temperature, top_p=top_p, max_tokens=max_tokens, turns=turns,
                          stop_on_success=stop_on_success, backend=backend, one_shot=one_shot,
                          faster_threshold=faster_threshold, overlap=overlap)
        vcfg = VerifyConfig(profile=profile, timing_enabled=not no_timing)
        console.print(f"{len(task_list)} tasks x {samples} samples, model [bold]{model}[/bold] -> {out}")
        m = run_bench(task_list, client, out, cfg, vcfg, console=console)
    except (TaskLoadError, ReplayError, RunMismatch, ValueError) as e:
        err.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2)
    console.print(Markdown(paper_table(m)))
    console.print(f"report: {out / 'report.md'}")
    if m["unfinished"]:
        err.print(f"[yellow]{m['unfinished']} samples unfinished[/yellow] (see status generation_error in the "
                  "report); run the same command again to retry them")
        raise typer.Exit(1)


@bench_app.command()
def compare(run_a: Path = typer.Argument(..., help="first run directory"),
            run_b: Path = typer.Argument(..., help="second run directory"),
            out: Optional[Path] = typer.Option(None, help="also write the markdown here")):
    """Two runs side by side (markdown on stdout)."""
    from musacoder.bench.report import compare as compare_runs

    try:
        text = compare_runs(run_a, run_b)
    except FileNotFoundError as e:
        err.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2)
    if out:
        out.write_text(text)
    print(text)
