"""A precompiled `torch/extension.h` for the C++ side of builds: a cpu candidate's `load_inline` spends about half its
build parsing torch's umbrella header (45 s -> 23 s a build on a 2-core machine, docs/benchmarks.md), and a CUDA
candidate's bindings (`main.cpp`) compile beside its `.cu` for about as long as the light `.cu` itself.

The first build with a given set of flags runs as torch writes it; afterwards, a detached compiler makes the header's
PCH from that build's own flags (its ninja file, less the extension's name), in the background so no build waits on it
or is killed for its time. Later builds with the same flags put the PCH's folder first on the include path, where GCC
finds `torch/extension.h.gch` before the header, and uses it only where it is valid for the compilation (otherwise it
reads the header as before: a PCH can make a build faster, never different).

Only builds whose flags cannot bring their own headers in (no include paths, `-include`, plugins or response files)
use one. In a CUDA build the folder reaches nvcc too, where the same name resolves to the same header (a link to it):
nvcc preprocesses its host side (`-E`, where GCC reads headers, not PCHs). The PCHs (~0.75 GB each) live in
`$MUSACODER_PCH_DIR` (default `~/.cache/musacoder/pch`), shared by every cache, the newest four kept;
`MUSACODER_PCH=0` turns them off.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

KEEP = 4
STALE_S = 900  # a lock older than this was left by a compiler that died
_UNSAFE = ("-I", "-isystem", "-iquote", "-idirafter", "-include", "-imacros", "--include", "-fplugin", "-B", "@",
           "-nostdinc", "--sysroot", "-isysroot", "-iprefix", "-specs", "--specs", "-Wp,", "-Xpreprocessor")


def root() -> Path:
    return Path(os.environ.get("MUSACODER_PCH_DIR") or Path.home() / ".cache" / "musacoder" / "pch")


def _header() -> Path:
    import torch

    return Path(torch.__file__).parent / "include" / "torch" / "extension.h"


def key(arguments: dict, kind: str) -> str | None:
    """The PCH's name for this build's flags, or None where the build does not use one."""
    if os.environ.get("MUSACODER_PCH") == "0" or kind != "inline" or sys.platform != "linux":
        return None
    if any(arguments.get(k) for k in ("sycl_sources", "musa_sources", "extra_include_paths", "no_implicit_headers")):
        return None  # other compilers, own headers, or no torch header to precompile
    flags = [str(f) for f in arguments.get("extra_cflags") or []]
    cuda = bool(arguments.get("cuda_sources"))  # the C++ side then has CUDA's include paths and macros
    if any(f.startswith(_UNSAFE) for f in flags):
        return None
    import torch
    from torch.utils.cpp_extension import get_cxx_compiler

    header = _header()
    if not header.is_file():
        return None
    ident = [torch.__version__, str(header), header.stat().st_mtime_ns, get_cxx_compiler(), sys.version, flags]
    if cuda:
        from torch.utils.cpp_extension import CUDA_HOME

        ident += ["cuda", CUDA_HOME]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:24]


def ready(name: str) -> str | None:
    """The folder to put first on the include path, where this PCH has been made."""
    folder = root() / name
    try:
        if (folder / "torch" / "extension.h.gch").is_file():
            os.utime(folder)  # the newest are kept
            return str(folder)
    except OSError:  # evicted meanwhile, or a folder this user cannot touch: built without
        pass
    return None


def start(name: str, build_dir: Path) -> None:
    """Make the PCH from a finished build's flags, in a detached compiler (at most one a PCH). A PCH that cannot be
    made (an unwritable folder, a full disk) only means later builds parse the header as this one did."""
    try:
        _start(name, build_dir)
    except OSError as e:
        print(f"no precompiled header: {e}", file=sys.stderr, flush=True)


def _start(name: str, build_dir: Path) -> None:
    ninja = build_dir / "build.ninja"
    if not ninja.is_file():
        return
    text = ninja.read_text()
    cflags = re.search(r"^cflags = (.*)$", text, re.M)
    post = re.search(r"^post_cflags = (.*)$", text, re.M)
    if not cflags:
        return
    base = root()
    base.mkdir(parents=True, exist_ok=True)
    lock = base / f"{name}.lock"
    try:
        if time.time() - lock.stat().st_mtime > STALE_S:
            lock.unlink(missing_ok=True)
    except FileNotFoundError:
        pass
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return  # being made
    _evict(base, name)
    from torch.utils.cpp_extension import get_cxx_compiler

    folder = base / name / "torch"
    folder.mkdir(parents=True, exist_ok=True)
    for left in folder.glob("extension.h.gch.*"):  # a killed maker's partial PCH (~0.8 GB): the lock is ours now
        left.unlink(missing_ok=True)
    link = folder / "extension.h"  # GCC wants the header beside its PCH for a later `#include` of it (#pragma once)
    if not link.is_symlink():
        link.symlink_to(_header())
    flags = re.sub(r"-DTORCH_EXTENSION_NAME=\S+", "", cflags.group(1)) + " " + (post.group(1) if post else "")
    tmp = folder / f"extension.h.gch.{os.getpid()}"
    cmd = [get_cxx_compiler(), "-x", "c++-header", *shlex.split(flags), str(_header()), "-o", str(tmp)]
    script = (f"{shlex.join(cmd)} && mv -f {shlex.quote(str(tmp))} {shlex.quote(str(folder / 'extension.h.gch'))}; "
              f"rm -f {shlex.quote(str(tmp))} {shlex.quote(str(lock))}")
    with open(base / f"{name}.log", "w") as log:
        subprocess.Popen(["sh", "-c", script], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         start_new_session=True, close_fds=True)


def _evict(base: Path, keep: str) -> None:
    folders = sorted((p for p in base.iterdir() if p.is_dir() and p.name != keep), key=lambda p: p.stat().st_mtime)
    for old in folders[:max(0, len(folders) - (KEEP - 1))]:
        shutil.rmtree(old, ignore_errors=True)
