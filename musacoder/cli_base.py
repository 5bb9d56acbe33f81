"""What every musacoder command line shares: one `error: ...` format with exit 2 for unusable input (typer's own
usage errors and unusable backends included), exit 130 on Ctrl-C, and the choice types validated by click before
anything starts."""

from __future__ import annotations

import sys
from typing import Literal

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperOption

from musacoder.backends import BackendError

try:  # typer >= 0.2x vendors its own click: its exceptions are not click's
    from typer._click import exceptions as _cx
except ImportError:  # pragma: no cover - older typer on the real click
    import click.exceptions as _cx

err = Console(stderr=True, soft_wrap=True)

# Choice types: typer validates a Literal before the command runs (the issue: `--backend foo` hung the pool).
Backend = Literal["auto", "cpu", "cuda", "triton", "musa", "musa-on-cuda"]
Profile = Literal["strict", "kernelbench"]
Precision = Literal["fp32", "fp16", "bf16"]
LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]


def _flag_type(self, ctx):
    """typer shows `<bool>` after an on/off flag, which reads as if it took a value; show nothing."""
    return None if self.is_flag else _display_type_rich(self, ctx)


# typer versions without this hook (e.g. the one a GPU image ships) keep their own display
_display_type_rich = getattr(TyperOption, "display_type_rich", None)
if _display_type_rich is not None:
    TyperOption.display_type_rich = _flag_type


def fail(msg: str, code: int = 2):
    """Print `error: msg` on stderr and exit (2: unusable input)."""
    err.print(f"[red]error:[/red] {escape(str(msg))}")
    raise typer.Exit(code)


class App(typer.Typer):
    """A Typer app whose usage errors print `error: ...` and exit 2 (click's panel is easy to miss and says
    `Error`), and whose Ctrl-C exits 130 without a traceback."""

    def __call__(self, *args, **kwargs):
        kwargs.setdefault("standalone_mode", False)
        try:
            rv = super().__call__(*args, **kwargs)
        except _cx.NoArgsIsHelpError as e:
            print(e.ctx.get_help())
            sys.exit(0)
        except _cx.ClickException as e:
            # typer's Literal check words it through pydantic: "Value error, 'foo' is not one of ..."
            err.print(f"[red]error:[/red] {escape(e.format_message().replace('Value error, ', ''))}")
            ctx = getattr(e, "ctx", None)
            if ctx is not None:
                err.print(f"[dim](see: {escape(ctx.command_path)} --help)[/dim]")
            sys.exit(2)
        except BackendError as e:  # e.g. --backend musa without torch_musa: raised where the backend is resolved
            err.print(f"[red]error:[/red] {escape(str(e))}")
            sys.exit(2)
        except (typer.Abort, KeyboardInterrupt):
            err.print("interrupted")
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)
