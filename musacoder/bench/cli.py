"""`musacoder bench run` and `musacoder bench compare`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape

from musacoder.cli_base import App, Backend, Precision, Profile, device_problem, err, fail, writable_dir
from musacoder.tasks.select import IdsOpt, NamesOpt

bench_app = App(add_completion=False, no_args_is_help=True,
                help="Evaluate a model on KernelBench-format tasks the way the MusaCoder paper does.")
console = Console()


@bench_app.command()
def run(tasks: Path = typer.Option(..., "--tasks", help="KernelBench .jsonl/.parquet, a task directory, or a .py "
                                                        "task"),
        model: str = typer.Option(..., help="generation client: openai:MODEL@URL, hf:PATH or replay:PATH (above)"),
        out: Path = typer.Option(..., help="run directory; an existing run there is resumed"),
        levels: str = typer.Option("1,2,3", help="comma-separated levels, or 'all'"),
        ids: IdsOpt = None, names: NamesOpt = None,
        samples: int = typer.Option(8, min=1, help="samples per task"),
        temperature: float = typer.Option(0.7, min=0.0),
        top_p: float = typer.Option(1.0, min=0.0, max=1.0),
        max_tokens: int = typer.Option(32768, min=1, help="response token limit"),
        turns: int = typer.Option(1, min=1, help="responses per sample; > 1 adds verifier-feedback turns"),
        stop_on_success: bool = typer.Option(True, "--stop-on-success/--optimise-after-success",
                                             help="end a sample's turns once one passes, or ask to optimise it"),
        backend: Backend = typer.Option("auto", help="prompt style and verifier"),
        profile: Profile = typer.Option("strict", help="verifier profile"),
        precision: Precision = typer.Option("fp32"),
        no_timing: bool = typer.Option(False, "--no-timing", help="skip timing (no speedups, no Faster Rate)"),
        one_shot: bool = typer.Option(True, "--one-shot/--zero-shot", help="include the built-in example"),
        faster_threshold: float = typer.Option(1.1, help="Faster Rate counts speedups above this"),
        overlap: bool = typer.Option(True, "--overlap/--no-overlap",
                                     help="verify while generating; turn off when the model server shares the "
                                          "device that times the kernels"),
        concurrency: int = typer.Option(16, min=1, help="requests in flight (openai)"),
        batch_size: int = typer.Option(8, min=1, help="generation batch (hf)"),
        request_timeout: float = typer.Option(1800.0, min=1.0, help="seconds one request may take, the whole "
                                              "answer (openai); a timed-out request is recorded, not re-sent"),
        max_model_len: int = typer.Option(0, min=0, help="the model's context in tokens (openai; 0: ask the "
                                          "server); prompts and max_tokens are fitted into it"),
        force: bool = typer.Option(False, "--force", help="report fewer samples/turns than OUT holds"),
        set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE",
                                       help="a verifier setting the options above do not cover, YAML value; "
                                            "repeatable (devices=[0,0,0,0]: four judges on GPU 0)")):
    """Generate, verify and score; writes samples.sqlite, metrics.json, report.md and plots under OUT.

    MODEL, one of:
    openai:NAME@http://host:port/v1  (an OpenAI-compatible server; no @URL: http://localhost:8000/v1)
    hf:/path/to/checkpoint  (local transformers)
    replay:/path/to/file.jsonl  (or a directory)

    Exit code 0 when every sample is finished; 1 when some are not (rerun the same command to retry them);
    2 on bad arguments; 130 when interrupted (rerun the same command to resume). Ctrl-C once: nothing new is
    generated or verified, the verifications in flight finish and are stored; twice: exit at once.
    Where a KernelBench task file comes from, and the replay format: docs/ecosystem-kernelbench.md.
    """
    from musacoder.bench.clients import ReplayError, make_client
    from musacoder.bench.report import failure_table, paper_table, task_table
    from musacoder.bench.runner import BenchConfig, run_bench
    from musacoder.bench.store import RunMismatch
    from musacoder.config import VerifyConfig
    from musacoder.tasks import TaskLoadError
    from musacoder.tasks.select import select_tasks

    try:  # before anything slow (loading a model): a mistyped setting fails at once
        vcfg = VerifyConfig.from_options({"profile": profile, "precision": precision, "timing_enabled": not no_timing},
                                         set_)
    except ValueError as e:
        fail(f"--set: {e}")
    if problem := device_problem(backend):
        fail(problem)
    writable_dir(out, "--out")
    writable_dir(vcfg.cache_dir, "cache (MUSACODER_CACHE)")
    try:
        task_list = select_tasks(tasks, levels, ids, names)
        client = make_client(model, concurrency=concurrency, batch_size=batch_size, request_timeout=request_timeout,
                             max_model_len=max_model_len)
        cfg = BenchConfig(samples=samples, temperature=temperature, top_p=top_p, max_tokens=max_tokens, turns=turns,
                          stop_on_success=stop_on_success, backend=backend, one_shot=one_shot,
                          faster_threshold=faster_threshold, overlap=overlap)
        console.print(f"{len(task_list)} tasks x {samples} samples, model [bold]{escape(model)}[/bold] -> {out}")
        m = run_bench(task_list, client, out, cfg, vcfg, console=console, force=force)
    except (TaskLoadError, ReplayError, RunMismatch, ValueError) as e:
        fail(e)
    except KeyboardInterrupt:
        err.print("interrupted; rerun the same command to resume")
        raise typer.Exit(130) from None
    console.print(Markdown(paper_table(m)))
    if m.get("failures"):
        console.print(Markdown("**Failure reasons**\n\n" + failure_table(m)))
    if m.get("per_task"):
        shown = 20
        console.print(Markdown("**Per task**\n\n" + task_table(m, limit=shown)))
        if len(m["per_task"]) > shown:
            console.print(f"({len(m['per_task']) - shown} more tasks in the report)")
    console.print(f"report: {out / 'report.md'}")
    if m["unfinished"] and client.fatal:  # the server is gone: say so once, rather than "run again"
        err.print(f"[red]error:[/red] {escape(client.fatal)}; {m['unfinished']} samples unfinished, the rest are kept "
                  f"in {out}: rerun the same command once the server is up")
        raise typer.Exit(1)
    if m["unfinished"]:
        err.print(f"[yellow]{m['unfinished']} samples unfinished[/yellow] (generation_error or infra_error, or "
                  "not yet generated or verified: above and in the report); run the same command again to retry them")
        raise typer.Exit(1)


@bench_app.command()
def compare(run_a: Path = typer.Argument(..., help="first run directory"),
            run_b: Path = typer.Argument(..., help="second run directory"),
            out: Path | None = typer.Option(None, help="also write the markdown here")):
    """Two runs side by side (markdown on stdout); differences within sampling noise are marked."""
    from musacoder.bench.report import compare as compare_runs

    try:
        text = compare_runs(run_a, run_b)
    except FileNotFoundError as e:
        fail(e)
    if out:
        out.write_text(text)
    print(text)
