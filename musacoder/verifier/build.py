"""Compile stage. Builds run in the judge's trusted processes, never where candidate code runs.

A candidate's `load_inline`/`load` call (in its sandboxed subject process) becomes a `BuildRequest` holding the
build arguments, sources as text, and which extension API it called (torch's `cpp_extension`, or torch_musa's
`musa_extension` on the musa backend). The trusted `Builder` has the backend turn them into arguments of the
backend's own loader (musa: CUDA sources translated to MUSA), compiles them with that loader into a content-addressed
cache (key: every build argument but the name, plus torch version and arch list), never imports the result, inspects
the library's imported symbols (`symbols.py`), and answers with the library's path. The subject then imports it
read-only. So the cache holds only what the builder made from those exact arguments: a candidate can neither write it
nor change what a later candidate with the same sources loads.
"""

from __future__ import annotations

import copy
import fcntl
import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from musacoder.verifier import pch
from musacoder.verifier.protocol import BuildRecord, BuildReply

# Extension APIs by name (Backend.extension_apis): modules whose load_inline/load a candidate may call.
EXTENSION_APIS = {"torch": "torch.utils.cpp_extension", "musa": "torch_musa.utils.musa_extension"}
_KEY_EXCLUDE = {"name", "build_directory", "verbose", "keep_intermediates"}


@dataclass(frozen=True)
class ExtensionApi:
    """One loader module and its real load_inline/load, captured on first use: in a subject that is before the
    RemoteLoader replaces them; the judge never replaces them."""

    name: str
    module: types.ModuleType
    load_inline: Callable
    load: Callable

    def signature(self, kind: str) -> inspect.Signature:
        return inspect.signature(self.load if kind == "files" else self.load_inline)


@functools.cache
def extension_api(name: str) -> ExtensionApi:
    module = importlib.import_module(EXTENSION_APIS[name])
    return ExtensionApi(name, module, module.load_inline, module.load)


extension_api("torch")  # captured at import, before any subject can replace it


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


def build_key(arguments: dict, arch_env_var: str = "TORCH_CUDA_ARCH_LIST") -> str:
    payload = {k: v for k, v in sorted(arguments.items()) if k not in _KEY_EXCLUDE}
    payload["torch"] = torch.__version__
    payload["arch"] = os.environ.get(arch_env_var, "")
    if getattr(torch.version, "musa", None):  # a MUSA build depends on the MUSA toolkit as well
        payload["musa"] = torch.version.musa
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:24]


# ---- trusted side ----------------------------------------------------------------------------------------------
class Builder:
    """Builds BuildRequests into the shared cache. Runs compilers only: no candidate Python, no candidate library
    is ever loaded into this process."""

    def __init__(self, cache_root: Path, backend):
        self.root = Path(cache_root) / "ext"
        self.root.mkdir(parents=True, exist_ok=True)
        self.backend = backend

    def build(self, arguments: dict) -> BuildReply:
        t0 = time.perf_counter()
        kind = arguments.pop("_kind", "inline")
        arguments = self.backend.build_arguments(arguments.pop("_api", "torch"), arguments)
        problem = self.backend.check_build(arguments)
        if problem:
            return BuildReply(error=problem)
        key = build_key({**arguments, "_kind": kind}, self.backend.arch_env_var or "TORCH_CUDA_ARCH_LIST")
        build_dir = self.root / key
        so = build_dir / f"mc_{key}.so"
        build_dir.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be building the same key
            failed = build_dir / "failed"
            cached = so.exists() and (build_dir / "ok").exists()
            if not cached and failed.exists():  # a known failure is not rebuilt either
                return BuildReply(error=failed.read_text(), key=key, cached=True)
            if not cached:
                # torch's baton survives a build killed on timeout and would make later builds wait forever;
                # our flock already makes us the only builder of this key.
                (build_dir / "lock").unlink(missing_ok=True)
                try:
                    self._compile(kind, arguments, f"mc_{key}", build_dir)
                except Exception as e:  # the compiler's own text is the useful part
                    msg = str(e)
                    if "Error building extension" in msg:  # the compiler's verdict, not an interrupted build
                        failed.write_text(msg)
                    return BuildReply(error=msg, key=key, seconds=time.perf_counter() - t0)
                (build_dir / "ok").touch()
            sym = _symbols(so, build_dir / "symbols.json", self.backend.name)
        return BuildReply(path=str(so), key=key, cached=cached, seconds=time.perf_counter() - t0,
                          problems=sym.get("problems", []), kernels=sym.get("kernels", []))

    def _compile(self, kind: str, arguments: dict, name: str, build_dir: Path) -> None:
        """The candidate's build, first with the backend's lighter headers where it has them (CUDA: the `.cu` without
        torch's umbrella header, docs/verifier.md "Cold builds"). A light build that does not compile is set aside
        unreported and the candidate's own sources are built, so errors are always those of what it wrote; in the
        same folder, where ninja keeps what did compile (the bindings' object). `light` in the folder says which
        build the library is. The C++ side uses a precompiled torch header once one is made for its flags (pch.py).
        MUSACODER_PLAIN_BUILDS=1: torch's loader as it is (scripts/cold_build.py's "before")."""
        api = extension_api(self.backend.extension_apis[-1])
        if os.environ.get("MUSACODER_PLAIN_BUILDS") == "1":
            return _compile(api, kind, arguments, name, build_dir)
        env = self.backend.compiler_env()
        pch_name = pch.key(arguments, kind)
        folder = pch.ready(pch_name) if pch_name else None
        extra = {"extra_include_paths": [folder]} if folder else {}
        light = self.backend.light_build(arguments) if kind == "inline" else None
        built = False
        if light is not None:
            try:
                _compile(api, kind, {**light, **extra}, name, build_dir, env)
                built = self.backend.light_library_problem(build_dir / f"{name}.so", light) is None
                if built:
                    (build_dir / "light").touch()
            except Exception as e:
                if "Error building extension" not in str(e):  # not the compiler's verdict (interrupted): as before
                    raise
        if not built:
            _compile(api, kind, {**arguments, **extra}, name, build_dir, env)
        if pch_name and not folder:
            pch.start(pch_name, build_dir)


def _compile(api: ExtensionApi, kind: str, arguments: dict, name: str, build_dir: Path,
             env: dict[str, str] | None = None) -> None:
    """Build without loading: the loader's JIT path with its final import step replaced for this call (musa_extension
    binds its own name for torch's import step, so it is replaced in the loader's module), `env` set meanwhile (read
    when the loader writes its ninja file)."""
    real_import = api.module._import_module_from_library
    api.module._import_module_from_library = lambda *a, **k: None
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    # the loader renames a second build of one name with other sources (name_v1); ours are named by their key
    getattr(api.module, "JIT_EXTENSION_VERSIONER", types.SimpleNamespace(entries={})).entries.pop(name, None)
    try:
        # a copy: the loader extends the lists it is given (sources, flags), and a light build's lists are the own's
        args = copy.deepcopy(dict(arguments, name=name, build_directory=str(build_dir), verbose=False))
        if kind == "files":  # `load`: the subject sent file contents; write them where the build can see them
            files = args.pop("files")
            src_dir = build_dir / "src"
            src_dir.mkdir(exist_ok=True)
            args["sources"] = []
            for fname, text in files:
                p = src_dir / Path(fname).name
                p.write_text(text)
                args["sources"].append(str(p))
            api.load(**args)
        else:
            api.load_inline(**args)
    finally:
        api.module._import_module_from_library = real_import
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _symbols(so: Path, record: Path, backend: str) -> dict:
    """Imported-symbol problems and defined kernels of a built library, recorded by the trusted builder (again when
    the record was made under another version of the symbol policy)."""
    from musacoder.verifier.symbols import POLICY, check_imports, library_symbols

    if record.exists():
        sym = json.loads(record.read_text())
        if sym.get("policy") == POLICY and sym.get("backend") == backend:
            return sym
    syms = library_symbols(so)
    sym = {"policy": POLICY, "backend": backend, "problems": check_imports(syms.imported, backend),
           "kernels": syms.kernels}
    record.write_text(json.dumps(sym))
    return sym


# ---- candidate side (runs in the sandboxed subject) ------------------------------------------------------------
def _import_extension(name: str, path: Path):
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


class _CountedModule(types.ModuleType):
    """Proxy of a built extension whose functions count their calls (all of them: an extension that binds with its
    own PYBIND11_MODULE lists no `functions=`)."""

    def __init__(self, real, counter: LaunchCounter):
        super().__init__(real.__name__)
        object.__setattr__(self, "_real", real)
        for fname in dir(real):
            fn = getattr(real, fname)
            if not fname.startswith("__") and isinstance(fn, types.BuiltinFunctionType):
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


class RemoteLoader:
    """load_inline / load for the subject: ask the judge to build, then import the library it names."""

    def __init__(self, request_build, counter: LaunchCounter, apis: tuple[str, ...] = ("torch",)):
        self.request_build = request_build  # BuildRequest arguments -> BuildReply
        self.counter = counter
        self.apis = [extension_api(a) for a in apis]  # the real loaders' signatures, taken before install()
        self.records: list[BuildRecord] = []
        self.kernels: list[str] = []
        self.problems: list[str] = []

    def load_inline(self, *args, _api: str = "torch", **kwargs):
        arguments = dict(extension_api(_api).signature("inline").bind(*args, **kwargs).arguments)
        return self._load(arguments, "inline", _api)

    def load(self, *args, _api: str = "torch", **kwargs):
        arguments = dict(extension_api(_api).signature("files").bind(*args, **kwargs).arguments)
        sources = arguments.pop("sources")
        sources = [sources] if isinstance(sources, str) else list(sources)
        arguments["files"] = [(os.path.basename(s), Path(s).read_text()) for s in sources]
        return self._load(arguments, "files", _api)

    def _load(self, arguments: dict, kind: str, api: str):
        arguments = {k: _jsonable(v) for k, v in arguments.items() if k not in ("build_directory", "verbose")}
        reply = self.request_build({**arguments, "_kind": kind, "_api": api})
        self.records.append(BuildRecord.of(reply))
        self.kernels += reply.kernels
        self.problems += reply.problems
        if reply.error:
            raise BuildError(reply.error)
        so = Path(reply.path)
        if not arguments.get("is_python_module", True):
            torch.ops.load_library(str(so))
            return str(so)
        return _CountedModule(_import_extension(so.stem, so), self.counter)

    def install(self):
        """Replace load_inline / load of every API for every later `from <loader module> import ...`."""
        for api in self.apis:
            api.module.load_inline = functools.partial(self.load_inline, _api=api.name)
            api.module.load = functools.partial(self.load, _api=api.name)


def _jsonable(v):
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, Path):
        return str(v)
    return v


# ---- artifacts across nodes (Ray) --------------------------------------------------------------------------------
_ARTIFACT_FILES = ("symbols.json",)


def export_artifacts(cache_root: Path, keys) -> dict[str, dict[str, bytes]]:
    """The built libraries of these keys (and their symbol records), for a node with no shared cache."""
    out = {}
    for key in keys:
        d = Path(cache_root) / "ext" / key
        if (d / "ok").exists():
            out[key] = {name: (d / name).read_bytes() for name in (f"mc_{key}.so", *_ARTIFACT_FILES)
                        if (d / name).exists()}
    return out


def import_artifacts(cache_root: Path, blobs: dict[str, dict[str, bytes]]) -> None:
    """Place shipped libraries in this node's cache, so the builder finds them built. Written by the trusted actor,
    from what a trusted builder on another node made."""
    root = Path(cache_root) / "ext"
    root.mkdir(parents=True, exist_ok=True)
    for key, files in blobs.items():
        build_dir = root / key
        build_dir.mkdir(exist_ok=True)
        with open(root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (build_dir / "ok").exists():
                continue
            for name, data in files.items():
                tmp = build_dir / f".{name}.tmp"
                tmp.write_bytes(data)
                tmp.rename(build_dir / name)
            (build_dir / "ok").touch()
