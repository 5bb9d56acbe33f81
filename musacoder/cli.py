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


@app.command()
def sft(config: Path = typer.Option(..., help="SFT settings (YAML), e.g. configs/sft-tiny.yaml"),
        output_dir: Optional[str] = typer.Option(None, help="overrides the config's output_dir")):
    """Multi-task SFT on TRL's SFTTrainer (needs the train extra). Resumes from the newest checkpoint."""
    from musacoder.train.data import DataError
    from musacoder.train.sft import SFTConfig, train_sft

    try:
        cfg = SFTConfig.from_yaml(config, **({"output_dir": output_dir} if output_dir else {}))
        final = train_sft(cfg)
    except (DataError, ValueError, OSError) as e:
        err.print(f"[red]error:[/red] {escape(str(e))}")
        raise typer.Exit(2)
    console.print(f"model: {final}  (loss curve, data report and skipped records in {cfg.output_dir})")


@app.command()
def rft(config: Path = typer.Option(..., help="RFT settings (YAML), e.g. configs/rft-tiny.yaml"),
        output_dir: Optional[str] = typer.Option(None, help="overrides the config's output_dir")):
    """Diversity-preserving RFT data: sample, verify, cluster each task's passing answers into a pool. Resumable."""
    from musacoder.bench.store import RunMismatch
    from musacoder.tasks import TaskLoadError
    from musacoder.train.rft import RFTConfig, run_rft

    try:
        cfg = RFTConfig.from_yaml(config, **({"output_dir": output_dir} if output_dir else {}))
        run_rft(cfg, console=console)
    except (RunMismatch, TaskLoadError, ValueError, OSError) as e:
        err.print(f"[red]error:[/red] {escape(str(e))}")
        raise typer.Exit(2)
    console.print(escape((Path(cfg.output_dir) / "rft_report.md").read_text()), soft_wrap=True)


@app.command()
def rl(config: Path = typer.Option(..., help="RL settings (YAML), e.g. configs/rl-tiny-cpu.yaml"),
       output_dir: Optional[str] = typer.Option(None, help="overrides the config's output_dir")):
    """Execution-feedback RL (PrimeEcho, BDR, MirrorPop) on TRL's GRPOTrainer. Resumes from the newest checkpoint."""
    from musacoder.tasks import TaskLoadError
    from musacoder.train.data import DataError
    from musacoder.train.rl.config import RLConfig
    from musacoder.train.rl.trainer import METRICS, train_rl

    try:
        cfg = RLConfig.from_yaml(config, **({"output_dir": output_dir} if output_dir else {}))
        final = train_rl(cfg)
    except (DataError, TaskLoadError, ValueError, OSError) as e:
        err.print(f"[red]error:[/red] {escape(str(e))}")
        raise typer.Exit(2)
    console.print(f"model: {final}  (per-step metrics in {Path(cfg.output_dir) / METRICS}, curve in reward.png)")


@app.command()
def serve(host: str = typer.Option("127.0.0.1", help="address to bind (0.0.0.0: every interface; set a token)"),
          port: int = typer.Option(8000),
          backend: str = typer.Option("auto", help="auto | cpu | cuda | triton"),
          profile: str = typer.Option("strict", help="strict | kernelbench"),
          seeds: int = typer.Option(5, help="correctness trials on fresh seeds"),
          no_timing: bool = typer.Option(False, "--no-timing", help="skip timing (and speedups)"),
          cache_dir: Optional[Path] = typer.Option(None, help="builds and verdicts (default: $MUSACODER_CACHE)"),
          token: Optional[str] = typer.Option(None, envvar="MUSACODER_TOKEN", show_default=False,
                                              help="bearer token clients must send (prefer the env variable)"),
          max_queue: int = typer.Option(4096, help="accepted-but-unfinished jobs before 429"),
          max_body_mb: float = typer.Option(16.0, help="request bodies over this get 413"),
          ray_address: Optional[str] = typer.Option(None, help="front a Ray cluster ('auto', 'ray://host:10001')"),
          compile_workers: Optional[int] = typer.Option(None, help="compile workers (default: cores - devices)"),
          log_level: str = typer.Option("info", help="uvicorn log level")):
    """Serve verifications over HTTP (needs the serve extra). The verifier settings are fixed at start."""
    from musacoder.service.app import serve as run_service
    from musacoder.service.settings import ServiceSettings

    cfg = _config(backend, profile, no_timing, seeds)
    if cache_dir:
        cfg.cache_dir = cache_dir
    settings = ServiceSettings(token=token or None, max_queue=max_queue, max_body_mb=max_body_mb)
    run_service(cfg, settings, host=host, port=port, ray_address=ray_address, compile_workers=compile_workers,
                log_level=log_level)


if __name__ == "__main__":
    app()
