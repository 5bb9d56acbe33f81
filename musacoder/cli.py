"""Command line: `musacoder verify`, `demo`, `tasks`, `cache`, `bench`, `serve`, `sft`, `rft`, `rl`, `port`.

Heavy modules (torch, the verifier, the bench runner) are imported inside the commands so `--help` stays fast.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from musacoder.bench.cli import bench_app
from musacoder.cli_base import App, Backend, LogLevel, Precision, Profile, device_problem, err, fail, writable_dir
from musacoder.musa.cli import port_app
from musacoder.synth.cli import synth_app
from musacoder.tasks.select import IdsOpt, LevelsOpt, NamesOpt, TasksOpt
from musacoder.version import __version__

app = App(add_completion=False, no_args_is_help=True, help="MusaCoder: LLMs that write native kernels.")
console = Console()
# its generation clients need the bench extra (openai, transformers), imported when a run starts
app.add_typer(bench_app, name="bench", help="Evaluate a model on KernelBench-format tasks.")
cache_app = App(add_completion=False, no_args_is_help=True, help="Inspect or clear the build/baseline/verdict cache.")
app.add_typer(cache_app, name="cache")
app.add_typer(port_app, name="port")
app.add_typer(synth_app, name="synth")


def _version(value: bool):
    if value:
        print(f"musacoder {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="print the version and exit")):
    """MusaCoder: LLMs that write native kernels."""


BackendOpt = typer.Option("auto", help="auto picks cuda when a GPU is present, else cpu")
ProfileOpt = typer.Option("strict", help="strict adds input and shape variants; kernelbench checks the task's own "
                                         "inputs only")


def _config(backend: str, profile: str, no_timing: bool, seeds: int, precision: str = "fp32",
            run_timeout: float | None = None, worker_mem_gb: float | None = None, sets: list[str] | None = None):
    from musacoder.config import VerifyConfig

    options = {"backend": backend, "profile": profile, "precision": precision, "timing_enabled": not no_timing,
               "correctness": {"seeds": seeds}}
    optional = (("run_timeout_s", run_timeout), ("worker_mem_gb", worker_mem_gb))
    options.update((k, v) for k, v in optional if v is not None)
    try:
        return VerifyConfig.from_options(options, sets)
    except ValueError as e:
        fail(f"--set: {e}")


def _resolve_backend(backend: str) -> tuple[str, str]:
    """(backend, why) with `auto` resolved once, here, so every later step and the output agree on it; `error:` for
    a backend this machine has no device for, before anything is verified."""
    from musacoder.backends import resolve

    if backend != "auto":
        if problem := device_problem(backend):
            fail(problem)
        return backend, ""
    chosen = resolve(backend)
    return chosen, "auto: a GPU is present" if chosen != "cpu" else "auto: no GPU found"


def _fmt(x, spec=".2f", suffix=""):
    return "-" if x is None else f"{x:{spec}}{suffix}"


_COMPILER_ERROR_RE = re.compile(r"^\S+?:\d+(?::\d+)?:\s*(?:fatal )?error\b.*$", re.MULTILINE)


def first_compiler_error(log: str) -> str | None:
    """The compiler's first `file:line[:col]: error ...` line, or its first line mentioning an error."""
    m = _COMPILER_ERROR_RE.search(log or "")
    if m:
        return m.group(0).strip()
    return next((ln.strip() for ln in (log or "").splitlines() if "error" in ln.lower()), None)


def read_candidate(path: Path) -> str:
    """The candidate's text, or `error:` exit 2 for a missing, binary or non-UTF-8 file. A `.py` file without a code
    block goes to the verifier as a code block, so a missing ModelNew is reported as such by its static check
    (plain text without `ModelNew` would be reported as "no python code block found")."""
    try:
        data = path.read_bytes()
    except OSError as e:
        fail(f"candidate {path}: cannot read: {e.strerror or e}")
    if b"\0" in data:
        fail(f"candidate {path} is a binary file, not Python source or model output")
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(f"candidate {path} is not UTF-8 text (byte {e.start}): give Python source or model output")
    if path.suffix == ".py" and "```" not in raw and "ModelNew" not in raw:
        raw = f"```python\n{raw}\n```"
    return raw


def pick_task(path, levels, ids, names, size_scale: float = 1.0):
    """Exactly one task from the shared selection options (optionally size-scaled), or `error:` exit 2."""
    from musacoder.tasks import TaskLoadError
    from musacoder.tasks.select import scale_task, select_tasks

    if path is None:
        fail("give the task: --tasks FILE (a .py task, or a .jsonl with --ids/--names, or FILE#N)")
    try:
        ts = select_tasks(path, levels, ids, names)
        if len(ts) != 1:
            shown = ", ".join(t.key for t in ts[:5]) + (", ..." if len(ts) > 5 else "")
            fail(f"{path} selects {len(ts)} tasks ({shown}); pick one with --ids, --names or --levels "
                 "(`musacoder tasks PATH` lists them)")
        return scale_task(ts[0], size_scale)
    except TaskLoadError as e:
        fail(e)


def _run_with_spinner(label: str, fn):
    """Run fn() while stderr shows a spinner with the elapsed time: a slow build or a hung candidate is visible."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                  transient=True) as prog:
        prog.add_task(label, total=None)
        return fn()


@app.command()
def verify(candidate: Path = typer.Option(..., help="Candidate .py file or raw model output"),
           tasks: TasksOpt = None,
           task: Path | None = typer.Option(None, "--task", help="alias of --tasks"),
           levels: LevelsOpt = None, ids: IdsOpt = None, names: NamesOpt = None,
           backend: Backend = BackendOpt,
           profile: Profile = ProfileOpt,
           precision: Precision = "fp32",
           seeds: int = typer.Option(5, min=1, help="correctness trials on fresh seeds"),
           no_timing: bool = typer.Option(False, "--no-timing", help="skip timing (and speedups)"),
           size_scale: float = typer.Option(1.0,
                                            help="scale the task's size constants (small machines); the task key "
                                                 "records it, e.g. level1/19_ReLU@size0.25"),
           run_timeout: float | None = typer.Option(None, min=1, help="seconds a candidate may run (default 300)"),
           worker_mem_gb: float | None = typer.Option(None, min=0, help="cpu worker memory cap, GiB (0: none; "
                                                                           "default 16)"),
           as_json: bool = typer.Option(False, "--json", help="print the verdict as one JSON object")):
    """Verify one candidate against one task. Exit code 0 whenever verification ran, whatever the verdict."""
    from musacoder.backends import available_bytes
    from musacoder.tasks.select import memory_problem

    t = pick_task(tasks or task, levels, ids, names, size_scale)
    raw = read_candidate(candidate)
    resolved, why = _resolve_backend(backend)
    try:
        cfg = _config(resolved, profile, no_timing, seeds, precision, run_timeout, worker_mem_gb)
    except ValueError as e:
        fail(e)
    problem = memory_problem(t, available_bytes(resolved, cfg.worker_mem_gb if resolved == "cpu" else 0.0), resolved)
    if problem:
        fail(problem)
    writable_dir(cfg.cache_dir, "cache (MUSACODER_CACHE)")
    from musacoder.api import verify as run_verify

    v = _run_with_spinner(f"verifying {t.key} on {resolved}", lambda: run_verify(t, raw, cfg))
    if as_json:
        sys.stdout.write(v.to_json() + "\n")
        return
    colour = "green" if v.passed else "red"
    console.print(f"[bold {colour}]{v.status.value}[/]  {escape(v.reason)}")
    if v.status.value == "compile_error":
        line = first_compiler_error(v.compile_log)
        if line:
            # the build directory is a cache path: keep file:line, which is what the reader needs
            console.print(f"compiler: {escape(re.sub(r'^[^:]*/', '', line))}", soft_wrap=True)
    console.print(f"task {escape(t.key)}  backend {resolved}" + (f" ({why})" if why else "") + f"  device {v.device}")
    cached = [k.removesuffix("_cached") for k in ("build_cached", "baseline_cached") if v.details.get(k)]
    if cached:
        console.print(f"from the cache: {', '.join(cached)}  [dim](musacoder cache info)[/dim]")
    console.print(f"correctness {v.trials_passed}/{v.trials_total}  reward {v.reward:.3f}  "
                  f"speedup eager {_fmt(v.speedup_eager, '.2f', 'x')}  compile {_fmt(v.speedup_compile, '.2f', 'x')}")
    console.print("[dim]" + escape(v.feedback) + "[/dim]")


@app.command("tasks")
def list_tasks(path: Path | None = typer.Argument(None, help="Task file or directory (default: shipped tasks)"),
               levels: LevelsOpt = None, ids: IdsOpt = None, names: NamesOpt = None):
    """List tasks: key, problem id and the source that `verify --tasks` accepts."""
    from musacoder.tasks import TaskLoadError
    from musacoder.tasks.select import select_tasks

    try:
        ts = select_tasks(path, levels, ids, names)
    except TaskLoadError as e:
        fail(e)
    for t in ts:
        pid = "-" if t.problem_id is None else str(t.problem_id)
        console.print(f"{escape(t.key)}  id {pid}  [dim]{escape(t.source)}[/dim]", soft_wrap=True)
    err.print(f"[dim]{len(ts)} tasks; verify one with: musacoder verify --tasks SOURCE --candidate FILE[/dim]")


@app.command()
def demo(backend: Backend = BackendOpt,
         only: str | None = typer.Option(None, help="only examples whose file name contains this (of all of them)"),
         all_: bool = typer.Option(False, "--all", help="every shipped example, not only one honest kernel a task "
                                   "and one exploit a threat class"),
         out: Path | None = typer.Option(None, help="also write the verdicts as JSONL here")):
    """Verify shipped example kernels (honest and cheating) on the shipped tasks and print a table: by default one
    honest kernel a task and the first exploit of each threat class; --all for the whole catalog."""
    from musacoder.api import verify_many
    from musacoder.examples_catalog import load_catalog, tour
    from musacoder.progress import LoggedProgress
    from musacoder.tasks import builtin_task

    backend, why = _resolve_backend(backend)
    catalog = load_catalog(backend)
    examples = [e for e in catalog if only in e.file] if only else catalog if all_ else tour(catalog)
    if not examples:
        fail(f"no examples for backend {backend}" + (f" matching {only!r}" if only else ""))
    cfg = _config(backend, "strict", False, 5)
    writable_dir(cfg.cache_dir, "cache (MUSACODER_CACHE)")
    if out:
        writable_dir(out.parent, "--out")
    share = "" if only or all_ else f" of {len(catalog)} (--all for every one)"
    console.print(f"Verifying {len(examples)}{share} shipped candidates on the [bold]{backend}[/bold] backend"
                  + (f" ({why})" if why else "") + " (first run builds their extensions; later runs hit the build "
                  "cache)")
    pairs = [(builtin_task(e.task), e.code) for e in examples]
    verdicts = {}
    with LoggedProgress(console=console, transient=True) as prog:
        bar = prog.add_task("verifying", total=len(pairs))
        for i, v in verify_many(pairs, cfg):
            verdicts[i] = v
            prog.update(bar, advance=1, description=f"{examples[i].name}: {v.status.value}")
    console.print(demo_table(examples, verdicts, backend))
    matched = sum(_as_expected(e, verdicts[i]) for i, e in enumerate(examples))
    console.print(f"{matched}/{len(examples)} verdicts as expected")
    if out:
        with open(out, "w") as f:
            for i, e in enumerate(examples):
                f.write(json.dumps({"example": e.file, **verdicts[i].to_dict()}) + "\n")


@app.command()
def calibrate(backend: Backend = BackendOpt,
              quick: bool = typer.Option(False, "--quick", help="the cpu part CI runs: the smallest rows only"),
              kernelbench: bool = typer.Option(False, "--kernelbench",
                                               help="add KernelBench's in-process method as a column"),
              cache: Path | None = typer.Option(None, help="build cache (default: a new temporary one)"),
              out: Path | None = typer.Option(None, help="also write the rows as JSON here, each as it is measured"),
              resume: bool = typer.Option(False, "--resume", help="keep what --out holds from a run cut short on "
                                          "this machine and measure only the rest (pass its --cache too)")):
    """Check the verifier's speedups against the same kernels timed in one process (do_bench on a GPU,
    torch.utils.benchmark on the cpu); exit 1 when a row disagrees beyond its tolerance."""
    from tabulate import tabulate

    from musacoder.bench.calibrate import run, table

    resolved, why = _resolve_backend(backend)
    if resolved not in ("cpu", "cuda"):
        fail(f"calibration ships kernels for cpu and cuda, not {resolved}: use --backend cpu or cuda")
    if cache:
        writable_dir(cache, "--cache")
    if out:
        writable_dir(out.parent, "--out")
    elif resume:
        fail("--resume continues the run whose rows --out holds: give --out")
    console.print(f"Calibrating the [bold]{resolved}[/bold] backend" + (f" ({why})" if why else ""))
    rows = run(resolved, quick, str(cache) if cache else None, str(out) if out else None, kernelbench,
               log=lambda msg: err.print(f"[dim]{escape(msg)}[/dim]"), resume=resume)
    head, *body = table(rows)
    print(tabulate(body, headers=head, tablefmt="github"))
    failed = sum(r["verdict"] == "FAIL" for r in rows)
    if failed:
        fail(f"{failed} of {len(rows)} rows disagree with the in-process measurement beyond their tolerance", code=1)
    console.print(f"{len(rows)} rows: the verifier agrees with the in-process measurement")


def _as_expected(e, v) -> bool:
    return v.status.value in e.accepted


def demo_table(examples, verdicts, backend: str) -> Table:
    """Readable at ~100 columns: short headers, numeric columns never wrap, the reason column takes what is left."""
    device = verdicts[0].device if verdicts else ""
    table = Table(title=f"MooreEval verdicts ({backend}, {device})", title_justify="left", pad_edge=False)
    table.add_column("candidate", overflow="fold", max_width=24)
    table.add_column("task", overflow="fold", max_width=16)
    table.add_column("threat", no_wrap=True)
    table.add_column("verdict", overflow="fold")
    table.add_column("reason", overflow="ellipsis", ratio=1, min_width=16)
    for col in ("xEag", "xCmp", "reward"):
        table.add_column(col, no_wrap=True, justify="right")
    for i, e in enumerate(examples):
        v = verdicts[i]
        verdict = f"[{'green' if v.passed else 'red'}]{v.status.value}[/]"
        if not _as_expected(e, v):
            verdict += f" [bold red](want {e.expect})[/]"
        table.add_row(escape(e.name), escape(e.task.split("/")[-1]), "honest" if e.honest else f"#{e.threat}",
                      verdict, escape(v.reason[:160]), _fmt(v.speedup_eager), _fmt(v.speedup_compile),
                      f"{v.reward:.2f}")
    return table


@cache_app.command("info")
def cache_info(cache_dir: Path | None = typer.Option(None, help="default: $MUSACODER_CACHE")):
    """Entries, size and age of each kind of cached thing (builds, baselines, verdicts...)."""
    from musacoder.cache_admin import cache_info as info
    from musacoder.cache_admin import human_age, human_size
    from musacoder.config import default_cache_dir

    root = cache_dir or default_cache_dir()
    kinds = info(root)
    if not kinds:
        console.print(f"{root}: empty")
        return
    table = Table(title=str(root), title_justify="left")
    for col in ("kind", "entries", "size", "oldest", "newest"):
        table.add_column(col, justify="left" if col == "kind" else "right", overflow="fold")
    for k in kinds:
        table.add_row(escape(k.name), str(k.entries), human_size(k.size), human_age(k.oldest), human_age(k.newest))
    console.print(table)


@cache_app.command("clear")
def cache_clear(kind: str | None = typer.Option(None, help="one kind as `cache info` names it; default: all"),
                cache_dir: Path | None = typer.Option(None, help="default: $MUSACODER_CACHE")):
    """Remove cached builds, baselines and verdicts (all, or one kind). Do not run while a verifier uses the cache."""
    from musacoder.cache_admin import clear_cache, kind_names
    from musacoder.config import default_cache_dir

    root = cache_dir or default_cache_dir()
    try:
        cleared = clear_cache(root, kind)
    except KeyError:
        fail(f"no cache kind {kind!r} in {root}; kinds: {', '.join(kind_names(root)) or 'none'}")
    console.print(f"cleared {', '.join(cleared) or 'nothing'} in {root}")


def _given(**options) -> dict:
    """Command-line options that were given, to lay over a config file's settings."""
    return {k: v for k, v in options.items() if v is not None}


SET_OPTION = typer.Option([], "--set", metavar="KEY=VALUE",
                          help="override one setting of the config, YAML value; repeatable (lora.r=16, max_steps=50)")


@app.command()
def sft(config: Path = typer.Option(..., help="SFT settings (YAML), e.g. configs/sft-tiny.yaml"),
        output_dir: str | None = typer.Option(None, help="overrides the config's output_dir"),
        set_: list[str] = SET_OPTION):
    """Multi-task SFT on TRL's SFTTrainer (needs the train extra). Resumes from the newest checkpoint."""
    import torch

    from musacoder.data.records import DataError
    from musacoder.train.sft import SFTConfig, train_sft

    try:
        cfg = SFTConfig.from_yaml(config, set_, **({"output_dir": output_dir} if output_dir else {}))
        final = train_sft(cfg)
    except torch.OutOfMemoryError as e:
        _out_of_memory(e, "lower per_device_train_batch_size (raise gradient_accumulation_steps to keep the global "
                          "batch) or max_length", cfg.output_dir)
    except (DataError, ValueError) as e:
        fail(e)
    console.print(f"model: {final}  (loss curve, data report and skipped records in {cfg.output_dir})")


def _out_of_memory(e: Exception, advice: str, output_dir: str) -> None:
    """A training run that ran out of device memory: what to change, and that the same command resumes."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else "out of memory"
    fail(f"{first[:200]}\n{advice}; the same command resumes from the newest checkpoint in {output_dir}", code=1)


@app.command()
def rft(config: Path = typer.Option(..., help="RFT settings (YAML), e.g. configs/rft-tiny.yaml"),
        output_dir: str | None = typer.Option(None, help="overrides the config's output_dir"),
        set_: list[str] = SET_OPTION, tasks: TasksOpt = None, levels: LevelsOpt = None, ids: IdsOpt = None,
        names: NamesOpt = None):
    """Diversity-preserving RFT data: sample, verify, cluster each task's passing answers into a pool. Resumable."""
    from musacoder.bench.store import RunMismatch
    from musacoder.tasks import TaskLoadError
    from musacoder.train.rft import RFTConfig, run_rft

    try:
        cfg = RFTConfig.from_yaml(config, set_, **_given(output_dir=output_dir, tasks=tasks and str(tasks),
                                                        levels=levels, ids=ids, names=names))
        run_rft(cfg, console=console)  # its client checks a local model exists before loading anything
    except (RunMismatch, TaskLoadError, ValueError) as e:
        fail(e)
    console.print(escape((Path(cfg.output_dir) / "rft_report.md").read_text()), soft_wrap=True)


@app.command()
def rl(config: Path = typer.Option(..., help="RL settings (YAML), e.g. configs/rl-tiny-cpu.yaml"),
       output_dir: str | None = typer.Option(None, help="overrides the config's output_dir"),
       set_: list[str] = SET_OPTION, tasks: TasksOpt = None, levels: LevelsOpt = None, ids: IdsOpt = None,
       names: NamesOpt = None):
    """Execution-feedback RL (PrimeEcho, BDR, MirrorPop) on TRL's GRPOTrainer. Resumes from the newest checkpoint."""
    from musacoder.train.rl.config import RLConfig

    try:  # the settings first: a mistake in them shows before torch and TRL are even imported
        cfg = RLConfig.from_yaml(config, set_, **_given(output_dir=output_dir, tasks=tasks and str(tasks),
                                                        levels=levels, ids=ids, names=names))
    except ValueError as e:
        fail(e)
    import torch

    from musacoder.data.records import DataError
    from musacoder.tasks import TaskLoadError
    from musacoder.train.rl.trainer import METRICS, train_rl

    try:
        final = train_rl(cfg)
    except torch.OutOfMemoryError as e:
        _out_of_memory(e, "lower micro_batch, group_size or max_new_tokens", cfg.output_dir)
    except (DataError, TaskLoadError, ValueError) as e:
        fail(e)
    console.print(f"model: {final}  (per-step metrics in {Path(cfg.output_dir) / METRICS}, curve in reward.png)")


@app.command()
def serve(host: str = typer.Option("127.0.0.1", help="address to bind (0.0.0.0: every interface; set a token)"),
          port: int = typer.Option(8000),
          backend: Backend = BackendOpt,
          profile: Profile = ProfileOpt,
          seeds: int = typer.Option(5, min=1, help="correctness trials on fresh seeds"),
          no_timing: bool = typer.Option(False, "--no-timing", help="skip timing (and speedups)"),
          cache_dir: Path | None = typer.Option(None, help="builds and verdicts (default: $MUSACODER_CACHE)"),
          token: str | None = typer.Option(None, envvar="MUSACODER_TOKEN", show_default=False,
                                              help="bearer token clients must send (prefer the env variable)"),
          max_queue: int = typer.Option(4096, help="accepted-but-unfinished jobs before 429"),
          max_body_mb: float = typer.Option(16.0, help="request bodies over this get 413"),
          ray_address: str | None = typer.Option(None, help="front a Ray cluster ('auto', 'ray://host:10001')"),
          compile_workers: int | None = typer.Option(None, help="compile workers (default: cores - devices)"),
          log_level: LogLevel = typer.Option("info", help="uvicorn log level"),
          set_: list[str] = typer.Option([], "--set", metavar="KEY=VALUE",
                                         help="a verifier setting the options above do not cover, YAML value; "
                                              "repeatable (devices=[0,0,1,1]: two judges on each of two GPUs)")):
    """Serve verifications over HTTP (needs the serve extra). The verifier settings are fixed at start."""
    if problem := device_problem(backend):
        fail(problem)
    cfg = _config(backend, profile, no_timing, seeds, sets=set_)
    from musacoder.service.app import serve as run_service
    from musacoder.service.settings import ServiceSettings

    if cache_dir:
        cfg.cache_dir = cache_dir
    writable_dir(cfg.cache_dir, "cache")
    settings = ServiceSettings(token=token or None, max_queue=max_queue, max_body_mb=max_body_mb)
    run_service(cfg, settings, host=host, port=port, ray_address=ray_address, compile_workers=compile_workers,
                log_level=log_level)


if __name__ == "__main__":
    app()
