"""`musacoder port`: CUDA <-> MUSA translation of a file and the MUSA portability check, on any machine."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from musacoder.cli_base import App, err, fail

port_app = App(add_completion=False, no_args_is_help=True, help="Translate CUDA <-> MUSA sources; check portability.")
FileArg = typer.Argument(..., help="a Python candidate or a C++/CUDA/MUSA source")
OutOpt = typer.Option(None, "-o", "--out", help="write here instead of stdout")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        fail(f"{path}: no such file")
    except (UnicodeDecodeError, IsADirectoryError) as e:
        fail(f"{path}: not a text source ({type(e).__name__})")


def _translate(direction: Literal["c2m", "m2c"], path: Path, out: Path | None):
    from musacoder.musa.translate import translate

    res = translate(_read(path), direction)
    for w in res.warnings:
        err.print(f"[yellow]warning:[/yellow] {w}")
    if out is None:
        print(res.text, end="")
    else:
        out.write_text(res.text)


@port_app.command("c2m")
def c2m(path: Path = FileArg, out: Path | None = OutOpt):
    """CUDA -> MUSA (identifiers, headers, arch guards, load_inline's cuda_sources, device strings)."""
    _translate("c2m", path, out)


@port_app.command("m2c")
def m2c(path: Path = FileArg, out: Path | None = OutOpt):
    """MUSA -> CUDA (e.g. to compile-check MUSA code with nvcc)."""
    _translate("m2c", path, out)


@port_app.command("check")
def check(path: Path = FileArg,
          compile_: bool = typer.Option(False, "--compile", help="also compile-check it with nvcc: translate m2c, "
                                        "parse each unit load_inline would build against torch's headers (no MUSA "
                                        "compiler needed; about 30 s of CPU per unit)")):
    """MUSA portability hazards (warp size, shared memory, PTX, fp64, arch guards...); exit 1 if any (or, with
    --compile, any compiler error, shown at the MUSA file's line)."""
    from musacoder.musa.portability import check as run_check

    src = _read(path)
    findings = run_check(src)
    for f in findings:
        print(f"{path}:{f.line}: [{f.rule}] {f.reason}")
    if not findings:
        print(f"{path}: no MUSA portability hazards found")
    failed = bool(findings)
    if compile_:
        from musacoder.musa.compile_check import CompileCheckError, compile_check

        try:
            res = compile_check(src)
        except CompileCheckError as e:
            fail(f"{path}: {e}")
        for d in res.diagnostics:
            print(d.render(str(path)))
        units = ", ".join(res.units)
        print(f"{path}: compile check (m2c, nvcc syntax only) {'passed' if res.ok else 'FAILED'}: {units} "
              f"in {res.seconds:.0f} s")
        failed |= not res.ok
    if failed:
        raise typer.Exit(1)


@port_app.command("kernelbench")
def kernelbench(src: Path = typer.Argument(..., help="a KernelBench tree (level1/19_ReLU.py ...) or a .jsonl"),
                out: Path = typer.Argument(..., help="new directory: the MUSA tasks in SRC's form, report.json, "
                                                     "report.md"),
                device: Literal["auto", "cpu", "cuda"] = typer.Option(
                    "auto", help="where references run (auto: cuda if present, else cpu)"),
                run: bool = typer.Option(True, "--run/--no-run", help="run each reference (original and round "
                                                                      "trip) and compare; --no-run: text checks only"),
                timeout: float = typer.Option(300, min=1, help="seconds per task for its reference runs"),
                budget_mb: float = typer.Option(1024, min=1, help="estimated peak memory a reference may use; a "
                                                                 "bigger task runs at a smaller size scale "
                                                                 "(recorded per task)"),
                worker_mem_gb: float = typer.Option(8.0, min=0, help="memory cap of the cpu reference worker, GiB "
                                                                     "(0: none)")):
    """KernelBench -> MUSA: every task with its device code moved to MUSA (.cuda() -> .musa(), "cuda" -> "musa",
    torch.cuda.* -> torch.musa.*, import torch_musa), re-verified (loads, m2c gives the original back, reference
    outputs equal), kept or dropped with the reason."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from musacoder.musa.kernelbench import port
    from musacoder.progress import LoggedProgress
    from musacoder.tasks import TaskLoadError

    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    with LoggedProgress(TextColumn("porting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=err, transient=True) as bar:
        job = bar.add_task("", total=None)
        try:
            report = port(src, out, device=device, run=run, timeout=timeout, budget=int(budget_mb * 2**20),
                          mem_gb=worker_mem_gb, progress=lambda done, total, key: bar.update(
                              job, completed=done, total=total, description=key))
        except TaskLoadError as e:
            fail(e)
    c = report["counts"]
    print(f"{c['total']} tasks: {c['converted']} converted, {c['unchanged']} unchanged, {c['dropped']} dropped "
          f"({report['seconds']:.0f} s) -> {report['out']}; report: {out / 'report.md'}")
