"""What every musacoder command line shares: one `error: ...` line with exit 2 for unusable input, whatever raised it
(typer's usage errors, an unusable backend or device, a missing extra, malformed YAML, a path that cannot be read or
written), exit 130 on Ctrl-C, and the choice types validated by click before anything starts.

The errors are turned into lines by typer's public hooks: the click command classes every musacoder app builds
(`Group`, `Command`: their `invoke`), and `App.__call__`, the console script's entry, for the usage errors raised
before any command runs. So the console script, `python -m musacoder.cli` and typer's CliRunner behave alike."""

from __future__ import annotations

import errno
import os
import re
import sys
import tempfile
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Literal

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from musacoder.backends import BackendError

err = Console(stderr=True, soft_wrap=True)

# Choice types: typer validates a Literal before the command runs (the issue: `--backend foo` hung the pool).
Backend = Literal["auto", "cpu", "cuda", "triton", "musa", "musa-on-cuda"]
Profile = Literal["strict", "kernelbench"]
Precision = Literal["fp32", "fp16", "bf16"]
LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]

# the extra whose packages a command needs (pyproject.toml's optional-dependencies); a missing module another extra
# installs is named by its own extra
COMMAND_EXTRAS = {"serve": "serve", "sft": "train", "rft": "train", "rl": "train", "bench": "bench"}
_IMPORT_NAMES = {"hydra-core": "hydra", "prometheus-client": "prometheus_client"}  # distribution -> module
# errors of a path that cannot be written: the line says to choose another
_UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.ENOSPC}


def fail(msg: str, code: int = 2):
    """Print `error: msg` on stderr and exit (2: unusable input)."""
    err.print(f"[red]error:[/red] {escape(str(msg))}")
    raise typer.Exit(code)


def extra_for(module: str, command: str | None = None) -> str | None:
    """The extra that installs `module` (a top-level import name): the command's own when it lists the module, else
    the first that does; None when no extra does (then it is not a missing extra but a broken install)."""
    try:
        requires = metadata.requires("musacoder") or []
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return COMMAND_EXTRAS.get(command or "")
    extras: dict[str, set[str]] = {}
    for req in requires:  # "transformers>=4.56; extra == 'bench'"
        dist, extra = re.match(r"\s*([\w.-]+)", req), re.search(r"extra\s*==\s*['\"]([^'\"]+)", req)
        if dist and extra:
            name = dist.group(1).lower()
            extras.setdefault(extra.group(1), set()).add(_IMPORT_NAMES.get(name, name.replace("-", "_")))
    own = COMMAND_EXTRAS.get(command or "")
    if own and module in extras.get(own, ()):
        return own
    return next((e for e, mods in extras.items() if module in mods and e != "test"), None)


def yaml_problem(e: yaml.YAMLError) -> str:
    """`FILE:LINE:COL: what` for a YAML syntax error (the file is named when it was loaded from a stream)."""
    mark = getattr(e, "problem_mark", None)
    what = " ".join(str(x) for x in (getattr(e, "problem", None), getattr(e, "context", None)) if x) or str(e)
    if mark is None:
        return f"invalid YAML: {what}"
    return f"{mark.name}:{mark.line + 1}:{mark.column + 1}: invalid YAML: {what}"


def path_problem(e: OSError) -> str:
    where = " -> ".join(str(p) for p in (e.filename, e.filename2) if p is not None)
    what = e.strerror or str(e)
    if not where:
        return what
    hint = "; choose a path you can write to" if e.errno in _UNWRITABLE else ""
    return f"{where}: {what}{hint}"


def writable_dir(path: str | Path, what: str = "") -> Path:
    """Check a file can be made in directory `path` (or, while it does not exist, in its nearest existing parent,
    so nothing is left behind) before any work whose results would go there; `error:` naming the path otherwise
    (read-only, a file in the way, no permission)."""
    path = Path(path).expanduser()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        if not probe.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(probe))
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        where = "" if probe == path else f" ({probe}: {e.strerror or e})"
        fail(f"{what + ' ' if what else ''}{path}: cannot write there{where or f' ({e.strerror or e})'}; choose a "
             "path you can write to")
    return path


def device_problem(backend: str, use_cpu: str = "--backend cpu") -> str | None:
    """Why `backend` cannot run on this machine (a CUDA backend without a usable CUDA device), to say before anything
    is verified: without a GPU every CUDA candidate would get a compile error ("CUDA_HOME is not set"), a bad
    kernel's verdict for a wrong setting. `use_cpu`: how the caller spells the fix."""
    if backend not in ("cuda", "triton", "musa-on-cuda"):
        return None
    import torch

    if torch.cuda.is_available():
        return None
    return f"no CUDA device: use {use_cpu}"


def report(e: BaseException, ctx=None) -> int | None:
    """Print the one `error:` line (and return the exit code) for an exception a user can act on; None for others,
    which are bugs and keep their traceback. `ctx`: the click context of the command that raised it."""
    if isinstance(e, typer.TyperException):  # click's usage errors, in typer's own hierarchy
        # typer's Literal check words it through pydantic: "Value error, 'foo' is not one of ..."
        err.print(f"[red]error:[/red] {escape(e.format_message().replace('Value error, ', ''))}")
        ctx = getattr(e, "ctx", None)
        if ctx is not None:
            err.print(f"[dim](see: {escape(ctx.command_path)} --help)[/dim]")
        return getattr(e, "exit_code", 2) or 2
    if isinstance(e, KeyboardInterrupt):
        err.print("interrupted")
        return 130
    if isinstance(e, BrokenPipeError):  # the reader went away (`| head`): nothing left to say to it
        sys.stderr.close()
        return 0
    if isinstance(e, ModuleNotFoundError) and e.name and not e.name.startswith("musacoder"):
        module = e.name.split(".")[0]
        extra = extra_for(module, ctx.find_root().invoked_subcommand if ctx else None)
        if extra is None:
            return None
        what = ctx.command_path if ctx else "this command"
        msg = f"{what} needs the {extra} extra (no module {module!r}): pip install 'musacoder[{extra}]'"
    elif isinstance(e, BackendError):  # e.g. --backend musa without torch_musa: raised where it is resolved
        msg = str(e)
    elif isinstance(e, yaml.YAMLError):
        msg = yaml_problem(e)
    elif isinstance(e, OSError):
        msg = path_problem(e)
    else:
        return None
    err.print(f"[red]error:[/red] {escape(msg)}")
    return 2


@contextmanager
def _as_error_lines(ctx):
    try:
        yield
    except (typer.Exit, typer.Abort):
        raise
    except (Exception, KeyboardInterrupt) as e:
        code = report(e, ctx)
        if code is None:
            raise
        raise typer.Exit(code) from None


def _quiet_flags(params):
    """An on/off flag takes no value, but typer shows `<bool>` after it; an empty metavar (click's public
    parameter attribute) shows nothing."""
    for p in params:
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
    return params


class Command(TyperCommand):
    def invoke(self, ctx):
        with _as_error_lines(ctx):
            return super().invoke(ctx)

    def get_params(self, ctx):
        return _quiet_flags(super().get_params(ctx))


class Group(TyperGroup):
    def invoke(self, ctx):
        with _as_error_lines(ctx):
            return super().invoke(ctx)

    def get_params(self, ctx):
        return _quiet_flags(super().get_params(ctx))

    def parse_args(self, ctx, args):
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            typer.echo(ctx.get_help())  # a bare `musacoder bench` is asking for help: exit 0
            ctx.exit(0)
        return super().parse_args(ctx, args)


class App(typer.Typer):
    """A Typer app built from `Group` and `Command`, whose console entry turns the usage errors raised before any
    command runs (a wrong top-level option) into the same `error:` line."""

    def __init__(self, **kwargs):
        kwargs.setdefault("cls", Group)
        super().__init__(**kwargs)

    def command(self, *args, **kwargs):
        kwargs.setdefault("cls", Command)
        return super().command(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        kwargs.setdefault("standalone_mode", False)
        try:
            rv = super().__call__(*args, **kwargs)
        except (Exception, KeyboardInterrupt) as e:
            code = report(e)
            if code is None:
                raise
            sys.exit(code)
        sys.exit(rv if isinstance(rv, int) else 0)
