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
def check(path: Path = FileArg):
    """MUSA portability hazards (warp size, shared memory, PTX, fp64, arch guards...); exit 1 if any."""
    from musacoder.musa.portability import check as run_check

    findings = run_check(_read(path))
    for f in findings:
        print(f"{path}:{f.line}: [{f.rule}] {f.reason}")
    if findings:
        raise typer.Exit(1)
    print(f"{path}: no MUSA portability hazards found")
