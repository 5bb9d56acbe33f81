"""Private directories named after the process that made them, so that what a killed process left behind can be
found by its pid and removed."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path


def shm_root() -> Path:
    """Where the judges' buffer directories live (as files on the cpu)."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def new_dir(prefix: str, shared_memory: bool = True) -> Path:
    """A private directory: in shared memory where buffers live as files (cpu), else in the temporary directory."""
    root = shm_root() if shared_memory else Path(tempfile.gettempdir())
    d = root / f"musacoder-{prefix}-{os.getpid()}-{secrets.token_hex(6)}"
    d.mkdir(mode=0o700)
    return d


def remove_dir(d: Path | None) -> None:
    if d is not None:
        shutil.rmtree(d, ignore_errors=True)


def sweep(pid: int) -> None:
    """Remove the directories a killed process created (named with its pid): a judge killed by its pool never runs
    its own clean-up, and what it left in shared memory would hold RAM until the host restarts."""
    for root in {shm_root(), Path(tempfile.gettempdir())}:
        for d in root.glob(f"musacoder-*-{pid}-*"):
            remove_dir(d)


def write_beside(path: str, data: bytes | str) -> str:
    """Write `data` to `path` through a temporary file in the same directory, so readers never see a partial file.
    Renaming within one directory is something a sandbox without Landlock's "refer" right may still do (ABI 1 cannot
    grant it: a rename into another directory fails with EXDEV there)."""
    tmp = f"{path}.tmp.pid_{os.getpid()}_{secrets.token_hex(8)}"
    with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)
    return path
