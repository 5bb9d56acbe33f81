"""Compile stage: a content-addressed build cache behind `torch.utils.cpp_extension.load_inline`.

The harness replaces load_inline (in its own worker processes, before any candidate is imported) with
`CachedLoadInline`. The cache key is the hash of every build argument except the extension's name, plus the torch
version and arch list, so the same sources and flags never build twice, whatever the candidate calls its module.
The returned module is wrapped so that every call of a listed function is counted: that is how the verifier knows
the candidate's own code actually ran (decoys fail).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.utils.cpp_extension as cpp_extension

_REAL_LOAD_INLINE = cpp_extension.load_inline
_KEY_EXCLUDE = {"name", "build_directory", "verbose", "keep_intermediates"}


class BuildError(RuntimeError):
    """The candidate's native code did not build; the message carries the compiler's output."""


@dataclass
class LaunchCounter:
    """Calls of the candidate's own compiled functions / kernels, and host time spent in them."""

    launches: int = 0
    seconds: float = 0.0
    names: set = field(default_factory=set)

    def reset(self):
        self.launches, self.seconds, self.names = 0, 0.0, set()


@dataclass
class BuildRecord:
    key: str
    seconds: float
    cached: bool
    error: str | None = None


def build_key(arguments: dict) -> str:
    payload = {k: v for k, v in sorted(arguments.items()) if k not in _KEY_EXCLUDE}
    payload["torch"] = torch.__version__
    payload["arch"] = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _import_extension(name: str, path: Path):
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


class _CountedModule(types.ModuleType):
    """Proxy of a built extension whose exported functions count their calls."""

    def __init__(self, real, functions, counter: LaunchCounter):
        super().__init__(real.__name__)
        object.__setattr__(self, "_real", real)
        for fname in functions:
            fn = getattr(real, fname, None)
            if fn is not None:
                setattr(self, fname, _counted(fn, fname, counter))

    def __getattr__(self, item):
        return getattr(object.__getattribute__(self, "_real"), item)


def _counted(fn, name, counter: LaunchCounter):
    def call(*args, **kwargs):
        counter.launches += 1
        counter.names.add(name)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            counter.seconds += time.perf_counter() - t0

    call.__name__ = name
    call.__doc__ = getattr(fn, "__doc__", None)
    return call


class CachedLoadInline:
    """Drop-in for load_inline: content-hash cache, backend checks, build records, launch counting."""

    def __init__(self, cache_root: Path, backend, counter: LaunchCounter):
        self.root = Path(cache_root) / "ext"
        self.root.mkdir(parents=True, exist_ok=True)
        self.backend = backend
        self.counter = counter
        self.records: list[BuildRecord] = []
        self._sig = inspect.signature(_REAL_LOAD_INLINE)

    def __call__(self, *args, **kwargs):
        bound = self._sig.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        problem = self.backend.check_build(arguments)
        if problem:
            self.records.append(BuildRecord("", 0.0, False, problem))
            raise BuildError(problem)
        key = build_key(arguments)
        name = f"mc_{key}"
        build_dir = self.root / key
        so = build_dir / f"{name}.so"
        t0 = time.perf_counter()
        build_dir.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be building the same key
            cached = so.exists() and (build_dir / "ok").exists()
            failed = build_dir / "failed"
            if not cached and failed.exists():  # a known failure is not rebuilt either
                self.records.append(BuildRecord(key, time.perf_counter() - t0, True, failed.read_text()))
                raise BuildError(failed.read_text())
            if not cached:
                # torch's own baton file survives a build killed on timeout and would make every later build
                # of this key wait forever; our flock already makes us the only builder of this key.
                (build_dir / "lock").unlink(missing_ok=True)
                arguments.update(name=name, build_directory=str(build_dir), verbose=False)
                try:
                    _REAL_LOAD_INLINE(**arguments)
                except Exception as e:  # the compiler's own text is the useful part
                    msg = str(e)
                    if "Error building extension" in msg:  # the compiler's verdict, not an interrupted build
                        failed.write_text(msg)
                    self.records.append(BuildRecord(key, time.perf_counter() - t0, False, msg))
                    raise BuildError(msg) from None
                (build_dir / "ok").touch()
        self.records.append(BuildRecord(key, time.perf_counter() - t0, cached))
        if not arguments.get("is_python_module", True):
            torch.ops.load_library(str(so))
            return str(so)
        real = _import_extension(name, so)
        functions = arguments.get("functions") or []
        if isinstance(functions, str):
            functions = [functions]
        return _CountedModule(real, list(functions), self.counter)


def export_artifacts(cache_root: Path, keys) -> dict[str, bytes]:
    """The built libraries of these keys, to ship to a node that has no shared cache (Ray object store)."""
    out = {}
    for key in keys:
        so = Path(cache_root) / "ext" / key / f"mc_{key}.so"
        if (so.parent / "ok").exists():
            out[key] = so.read_bytes()
    return out


def import_artifacts(cache_root: Path, blobs: dict[str, bytes]) -> None:
    """Place shipped libraries in this node's cache, so CachedLoadInline finds them built."""
    root = Path(cache_root) / "ext"
    root.mkdir(parents=True, exist_ok=True)
    for key, data in blobs.items():
        build_dir = root / key
        build_dir.mkdir(exist_ok=True)
        with open(root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (build_dir / "ok").exists():
                continue
            tmp = build_dir / f".mc_{key}.so.tmp"
            tmp.write_bytes(data)
            tmp.rename(build_dir / f"mc_{key}.so")
            (build_dir / "ok").touch()


def install(cache_root: Path, backend, counter: LaunchCounter) -> CachedLoadInline:
    """Replace load_inline for every later `from torch.utils.cpp_extension import load_inline`."""
    loader = CachedLoadInline(cache_root, backend, counter)
    cpp_extension.load_inline = loader
    return loader
