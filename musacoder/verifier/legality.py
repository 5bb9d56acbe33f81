"""Legality at run time: the aten ops ModelNew.forward dispatches, its own launches, and harness integrity.

The op trace runs at the dispatcher where it can (optrace.cpp: a RecordFunction callback, which every dispatcher call
runs whatever dispatch keys a guard excluded), else as a Python dispatch mode, which sees only the ops that reach the
Python key. The judge builds the native tracer once per torch version (`ensure_tracer`) and names it to subjects in
MUSACODER_OPTRACE_LIB; `tracer_kind()` says which one a process uses.
"""

from __future__ import annotations

import builtins
import ctypes
import fcntl
import hashlib
import os
import secrets
import shlex
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import torch
import torch.utils.cpp_extension  # noqa: F401  (snapshot() holds its load_inline)
from torch.utils._python_dispatch import TorchDispatchMode

from musacoder.verifier.capture import KeepAlive

# The paper's appendix allowlist (41 ops) ...
PAPER_ALLOWED = {
    "_assert_async", "_assert_scalar", "_assert_tensor_metadata", "_cast_Byte", "_cast_Char", "_cast_Double",
    "_cast_Float", "_cast_Half", "_cast_Int", "_cast_Long", "_cast_Short", "_local_scalar_dense", "alias",
    "allclose", "equal", "item", "arange", "clone", "contiguous", "copy_", "empty", "empty_like", "full", "ones",
    "zeros", "rand", "randint", "randn", "as_strided", "broadcast_to", "expand", "flatten", "permute", "reshape",
    "select", "slice", "squeeze", "stride", "transpose", "unsqueeze", "view",
}
# ... plus the names newer PyTorch dispatches the same operations through (a documented choice, see method.md).
ALIASES_ALLOWED = {
    "to", "_to_copy", "detach", "fill_", "zero_", "new_empty", "empty_strided", "new_empty_strided", "lift_fresh",
    "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full", "_unsafe_view", "t", "resize_",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size", "_reshape_alias", "unbind", "split",
    "chunk", "narrow", "expand_as", "view_as", "squeeze_", "unsqueeze_", "as_strided_", "set_", "is_nonzero",
    "scalar_tensor", "lift_fresh_copy", "_has_compatible_shallow_copy_type", "record_stream",
    "detach_",  # torch.tensor(...) detaches the tensor it made (seen at the dispatcher; autograd metadata only)
}
# ... plus zero-copy views: each returns a tensor sharing the input's storage with new sizes/strides/offset (or a
# complex<->real reinterpretation), so none of them can compute a result. Copying variants (split_copy...) are not here.
VIEWS_ALLOWED = {
    "split_with_sizes", "tensor_split", "unfold", "diagonal",
    "view_as_real", "view_as_complex", "movedim", "moveaxis", "swapaxes", "swapdims", "unflatten",
}
ALLOWED_OPS = PAPER_ALLOWED | ALIASES_ALLOWED | VIEWS_ALLOWED


# Ops that allowlisted ops call inside themselves (rand fills with uniform_, a device copy goes through _copy_from):
# not counted there by the dispatcher tracer, refused where forward calls them.
HELPERS = {"uniform_", "normal_", "random_", "_copy_from", "_copy_from_and_resize"}

TRACER_ENV = "MUSACODER_OPTRACE_LIB"
_SOURCE = Path(__file__).with_name("optrace.cpp")


class TracerUnavailable(RuntimeError):
    pass


def ensure_tracer(cache_dir) -> str:
    """The dispatcher tracer's library for this torch, built into `cache_dir` once per torch version and source
    (under a file lock: judges share the cache) and never loaded here. Raises TracerUnavailable with the compiler's
    words when it cannot be built."""
    from torch.utils import cpp_extension

    cxx = cpp_extension.get_cxx_compiler()
    abi = int(torch.compiled_with_cxx11_abi())
    key = hashlib.sha256(b"\0".join(str(p).encode() for p in (
        _SOURCE.read_bytes(), torch.__version__, torch.version.git_version, cxx, abi))).hexdigest()[:16]
    out = Path(cache_dir) / "optrace" / key
    lib = out / "optrace.so"
    if lib.exists():
        return str(lib)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another judge may be building it
        if lib.exists():
            return str(lib)
        tmp = out / f"optrace.{os.getpid()}.so"
        libdirs = cpp_extension.library_paths()
        cmd = [*shlex.split(cxx), "-O2", "-std=c++20", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
               *(f"-I{p}" for p in cpp_extension.include_paths()), str(_SOURCE), "-o", str(tmp),
               *(f"-L{p}" for p in libdirs), *(f"-Wl,-rpath,{p}" for p in libdirs), "-lc10", "-ltorch_cpu"]
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900)
        except FileNotFoundError:
            raise TracerUnavailable(f"no C++ compiler ({cxx}) to build the dispatcher op tracer") from None
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            tmp.unlink(missing_ok=True)
            why = e.stderr.strip()[-2000:] if isinstance(e.stderr, str) else f"no result in {e.timeout:.0f} s"
            raise TracerUnavailable(f"the dispatcher op tracer did not build: {why}") from None
        if not tmp.is_file():  # a compiler wrapper that exits 0 and writes nothing
            raise TracerUnavailable(f"the C++ compiler ({cxx}) wrote no dispatcher op tracer")
        os.replace(tmp, lib)
    return str(lib)


def use_tracer(cache_dir) -> str:
    """Name the dispatcher tracer to every process this one starts from now on (subjects, judges, their zygotes inherit
    the environment), building it first; where it cannot be built, name none (they trace with the Python dispatch mode
    and symbols.py stays strict). What is in force, for the log."""
    try:
        os.environ[TRACER_ENV] = ensure_tracer(cache_dir)
    except TracerUnavailable as e:
        os.environ.pop(TRACER_ENV, None)
        return f"{e}: subjects trace ops with the Python dispatch mode"
    return tracer_kind()


def dispatcher_traced() -> bool:
    """Whether this process's subjects trace at the dispatcher (the judge named the library to them)."""
    path = os.environ.get(TRACER_ENV)
    return bool(path) and os.path.isfile(path)


def _loader():
    """`_library` over state that no name outside this closure reaches: candidate code that imports this module can
    call it (harmless: it gets the library, whose windows need their token) but not swap what the harness uses."""
    state: dict = {}  # "lib", "pid", "namespaces"

    def library(torch_namespaces: frozenset):
        """The dispatcher tracer, loaded and configured once per process (a forked child configures its own); None
        where the judge named none. A library that was named but does not load is an error, never a silent fallback:
        the judge accepts dispatcher calls in native code only because this trace sees them."""
        path = os.environ.get(TRACER_ENV)
        if not path:
            return None
        if state.get("pid") != os.getpid():
            lib = state.get("lib")
            if lib is None:
                lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL)  # its symbols stay out of the candidate's reach
                lib.musacoder_optrace_configure.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
                lib.musacoder_optrace_start.argtypes = lib.musacoder_optrace_stop.argtypes = [ctypes.c_uint64]
                lib.musacoder_optrace_read.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_long]
                lib.musacoder_optrace_read.restype = ctypes.c_long
            allowed = "\n".join(f"aten::{op}" for op in sorted(ALLOWED_OPS | HELPERS))
            if lib.musacoder_optrace_configure("\n".join(sorted(torch_namespaces)).encode(), allowed.encode()):
                raise RuntimeError("the op tracer was configured in this process by someone else")
            state.update(lib=lib, pid=os.getpid(), namespaces=torch_namespaces)
        if state["namespaces"] != torch_namespaces:
            raise RuntimeError("the op tracer is configured for other namespaces in this process")
        return state["lib"]

    return library


_library = _loader()


def tracer_kind() -> str:
    return "dispatcher (RecordFunction)" if os.environ.get(TRACER_ENV) else "python dispatch mode"


class _ModeTrace(TorchDispatchMode):
    """The fallback: the ops that reach the Python dispatch key (not those native code runs under a guard that
    excludes it)."""

    def __init__(self, ops: Counter):
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func._schema.name] += 1
        return func(*args, **(kwargs or {}))


class OpTrace:
    """The ops called while active, `ns::op` names (overloads folded) -> calls: what the candidate called itself, in
    Python or native code on any thread, and what its own ops (TORCH_LIBRARY) called, not what PyTorch's own kernels
    call inside an allowlisted op (optrace.cpp says which calls count)."""

    def __init__(self, torch_namespaces):
        self.ops: Counter = Counter()
        self.torch_namespaces = frozenset(torch_namespaces)
        self._lib = _library(self.torch_namespaces)
        self._mode = None if self._lib is not None else _ModeTrace(self.ops)
        self._token = 0

    def __enter__(self):
        if self._mode is not None:
            self._mode.__enter__()
            return self
        self._token = secrets.randbits(63) | 1
        if self._lib.musacoder_optrace_start(self._token):
            raise RuntimeError("the op trace could not start: another window is open in this process")
        return self

    def __exit__(self, *exc):
        if self._mode is not None:
            return self._mode.__exit__(*exc)
        if self._lib.musacoder_optrace_stop(self._token):
            raise RuntimeError("the op trace's window was not open at its end")
        n = self._lib.musacoder_optrace_read(self._token, None, 0)
        buf = ctypes.create_string_buffer(n)
        self._lib.musacoder_optrace_read(self._token, buf, n)
        for line in buf.value.decode().splitlines():
            count, kind, name, _overload = line.split("\t")
            # a RecordFunction made with a schema the dispatcher does not hold: native code posing as an op
            self.ops[f"aten::<forged {name}>" if kind == "forged" else name] += int(count)
        return False

    def illegal(self) -> list[str]:
        return self.illegal_names(self.ops, self.torch_namespaces)

    @staticmethod
    def illegal_names(ops, torch_namespaces) -> list[str]:
        bad = []
        for name in ops:
            ns, _, op = name.partition("::")
            if ns in torch_namespaces and (ns != "aten" or op not in ALLOWED_OPS):
                bad.append(name)
        return sorted(bad)

    def own_ops(self) -> int:
        """Calls of ops registered by the candidate itself (TORCH_LIBRARY), which count as its own launches."""
        return sum(n for name, n in self.ops.items() if name.partition("::")[0] not in self.torch_namespaces)


def _harness_objects() -> dict:
    objs = {
        "time.perf_counter": time.perf_counter, "time.time": time.time, "time.monotonic": time.monotonic,
        "torch.allclose": torch.allclose, "torch.isclose": torch.isclose, "torch.equal": torch.equal,
        "torch.isfinite": torch.isfinite,
        "torch.Tensor.__eq__": torch.Tensor.__eq__, "torch.Tensor.clone": torch.Tensor.clone,
        "torch.Tensor.abs": torch.Tensor.abs, "torch.Tensor.max": torch.Tensor.max,
        "torch.Tensor.double": torch.Tensor.double, "torch.Tensor.copy_": torch.Tensor.copy_,
        "torch.nn.Module.__call__": torch.nn.Module.__call__, "torch.nn.Module._call_impl": torch.nn.Module._call_impl,
        "torch.utils.cpp_extension.load_inline": torch.utils.cpp_extension.load_inline,
        "builtins.isinstance": builtins.isinstance, "builtins.type": builtins.type, "builtins.len": builtins.len,
        "builtins.float": builtins.float, "builtins.open": builtins.open,
        "torch.cuda.synchronize": torch.cuda.synchronize, "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.Event.record": torch.cuda.Event.record,
        "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
        "torch.cuda.Event.synchronize": torch.cuda.Event.synchronize,
        "torch.cuda.current_stream": torch.cuda.current_stream,
        # the keep-alive of a capture (its figure sizes blocks; one that holds nothing evades it)
        "musacoder.verifier.capture.KeepAlive.__torch_dispatch__": KeepAlive.__torch_dispatch__,
        "musacoder.verifier.capture.KeepAlive.held_bytes": KeepAlive.held_bytes,
    }
    return objs


def snapshot() -> dict:
    """The functions the harness relies on (the objects themselves: an id alone can be reused by a replacement made
    where a deleted original was freed), and settings that change numerics or timing."""
    snap = _harness_objects()
    snap["setting:num_threads"] = torch.get_num_threads()
    snap["setting:allow_tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    snap["setting:allow_tf32_cudnn"] = torch.backends.cudnn.allow_tf32
    snap["setting:float32_matmul_precision"] = torch.get_float32_matmul_precision()
    return snap


def integrity_changes(before: dict, after: dict) -> list[str]:
    """Names whose function is not the same object any more, or whose setting changed value."""
    return sorted(k for k in before if (before[k] != after.get(k) if k.startswith("setting:")
                                        else before[k] is not after.get(k)))


def thread_count() -> int:
    return threading.active_count()
