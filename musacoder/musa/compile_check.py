"""Compile-check MUSA code on a machine with nvcc and no MUSA compiler (`musacoder port check --compile`).

The MUSA text is translated m2c; then each translation unit `load_inline` would build is parsed, as load_inline
assembles it (`main.cpp`: torch/extension.h, cpp_sources and the bindings of `functions`; `cuda.cu`: torch/types.h,
cuda.h, cuda_runtime.h and the sources), against torch's headers: `cuda.cu` by nvcc's front end only
(`-fdevice-syntax-only -ptx`: host and device code parsed, no code generated), `main.cpp` by the host compiler
(`-fsyntax-only`). A C++ source (.mu) is one unit. Errors come back at the MUSA file's lines: the translation keeps
every line where it was, and each unit line is traced to the string literal it came from.

The sources are read statically (string literals, names bound to them at module level, lists and sums of those):
the candidate is never run. Not caught here: what nvcc accepts and mcc does not (128-lane warps, MUSA-only
intrinsics; see `port check`), and link errors. Cost: torch/extension.h takes nvcc about 20-30 s of CPU to parse.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from musacoder.musa.translate import M2C, looks_like_python, translate_cpp, translate_python
from musacoder.pyast import parse


class CompileCheckError(ValueError):
    """The check cannot run: no nvcc, or no sources it can read."""


# CUDA math-library headers that torch's CUDA headers include (ATen/cuda/CUDAContext.h) but a bare toolkit lacks,
# and the CMake-generated header a CPU torch wheel lacks. Written only where the real one is absent, with just the
# names torch's declarations use; a candidate calling cuBLAS itself needs the real headers.
STUB_HEADERS = {
    "c10/cuda/impl/cuda_cmake_macros.h": "#pragma once\n",
    "cublas_v2.h": "#pragma once\ntypedef struct cublasContext* cublasHandle_t;\n"
                   "typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;\n",
    "cublasLt.h": "#pragma once\ntypedef struct cublasLtContext* cublasLtHandle_t;\n",
    "cusparse.h": "#pragma once\ntypedef struct cusparseContext* cusparseHandle_t;\n"
                  "typedef enum { CUSPARSE_STATUS_SUCCESS = 0 } cusparseStatus_t;\n"
                  "const char* cusparseGetErrorString(cusparseStatus_t);\n",
    "cusolver_common.h": "#pragma once\ntypedef enum { CUSOLVER_STATUS_SUCCESS = 0, "
                         "CUSOLVER_STATUS_INVALID_VALUE = 3 } cusolverStatus_t;\n",
    "cusolverDn.h": "#pragma once\n#include <cusolver_common.h>\n"
                    "typedef struct cusolverDnContext* cusolverDnHandle_t;\n",
}
CUDA_PREFIX = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]  # load_inline's own
_PARSE_FLAG = re.compile(r"^(-D|-U|-I|-std=|--expt-)")  # user flags that change what parses; the rest is codegen


@dataclass
class Piece:
    text: str
    line: int  # the file line of the literal's first line
    exact: bool  # line k of text is file line `line + k - 1` (false for escaped newlines, implicit concatenation)


@dataclass
class Unit:
    name: str  # file name in the build directory: cuda.cu, main.cpp
    text: str
    origin: list[int]  # MUSA file line of each unit line
    compiler: str  # nvcc or c++
    flags: list[str] = field(default_factory=list)
    ext_name: str = "candidate"


@dataclass
class Diagnostic:
    line: int | None  # in the MUSA file
    unit: str
    message: str
    where: str = ""  # set when the error is inside a header: that header and line

    def render(self, path: str) -> str:
        at = f"{path}:{self.line}" if self.line else path
        return f"{at}: error: {self.message}" + (f"  [in {self.where}]" if self.where else "")


@dataclass
class CompileCheck:
    ok: bool
    diagnostics: list[Diagnostic]
    units: list[str]
    seconds: float
    log: str


# --- sources, read statically ------------------------------------------------------------------------------------

def _bindings(tree: ast.Module) -> dict[str, ast.expr]:
    env = {}
    for n in tree.body:
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            env[n.targets[0].id] = n.value
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value is not None:
            env[n.target.id] = n.value
    return env


def _pieces(node: ast.expr, env: dict, src: str, what: str, seen=()) -> list[Piece]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        segment = ast.get_source_segment(src, node) or ""
        return [Piece(node.value, node.lineno, segment.count("\n") == node.value.count("\n"))]
    if isinstance(node, ast.Name) and node.id in env and node.id not in seen:
        return _pieces(env[node.id], env, src, what, (*seen, node.id))
    if isinstance(node, (ast.List, ast.Tuple)):
        return [p for e in node.elts for p in _pieces(e, env, src, what, seen)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _pieces(node.left, env, src, what, seen), _pieces(node.right, env, src, what, seen)
        if len(left) == len(right) == 1:  # "a" + "b": one source, mapped from its first part
            return [Piece(left[0].text + right[0].text, left[0].line, left[0].exact and right[0].exact)]
        return left + right  # [a] + [b]
    raise CompileCheckError(f"line {node.lineno}: {what} of load_inline is not a string, a name bound to one at "
                            "module level, or a list of those: it cannot be read without running the candidate")


def _strings(node: ast.expr | None, env: dict, src: str, what: str) -> list[str]:
    if node is None:
        return []
    if isinstance(node, ast.Dict):  # functions={"name": "doc"}
        node = ast.List([k for k in node.keys if k is not None])
    return [p.text for p in _pieces(node, env, src, what)]


def _unit(name, prefix, pieces, suffix, call_line, compiler, flags, ext_name) -> Unit:
    texts, origin = [], []
    for line in prefix:
        texts.append(line)
        origin.append(call_line)
    for p in pieces:
        texts.append(p.text)
        n = p.text.count("\n") + 1
        origin += [p.line + k for k in range(n)] if p.exact else [p.line] * n
    for line in suffix:
        texts.append(line)
        origin.append(call_line)
    return Unit(name, "\n".join(texts), origin, compiler, flags, ext_name)


def units_of(cuda_python: str) -> list[Unit]:
    """The translation units of every `load_inline(...)` call in a (CUDA-dialect) Python candidate."""
    tree = parse(cuda_python)
    env = _bindings(tree)
    units: list[Unit] = []
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and (
        getattr(n.func, "id", None) == "load_inline" or getattr(n.func, "attr", None) == "load_inline")]
    for k, call in enumerate(sorted(calls, key=lambda c: c.lineno)):
        args = dict(zip(("name", "cpp_sources", "cuda_sources"), call.args))
        args.update({kw.arg: kw.value for kw in call.keywords if kw.arg})
        name_node = args.get("name")
        ext_name = name_node.value if isinstance(name_node, ast.Constant) and isinstance(name_node.value, str) \
            else f"candidate{k}"
        implicit = not (isinstance(args.get("no_implicit_headers"), ast.Constant) and args["no_implicit_headers"].value)
        flags = [f for key in ("extra_cflags", "extra_cuda_cflags")
                 for f in _strings(args.get(key), env, cuda_python, key) if _PARSE_FLAG.match(f)]
        flags += [f"-I{p}" for p in _strings(args.get("extra_include_paths"), env, cuda_python, "extra_include_paths")]
        suffix = []
        functions = _strings(args.get("functions"), env, cuda_python, "functions")
        if functions:  # load_inline's generated bindings
            suffix = ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {",
                      *[f'm.def("{f}", torch::wrap_pybind_function({f}), "{f}");' for f in functions], "}"]
        tag = f"{k}_" if len(calls) > 1 else ""
        cpp = _pieces(args["cpp_sources"], env, cuda_python, "cpp_sources") if "cpp_sources" in args else []
        units.append(_unit(f"{tag}main.cpp", ["#include <torch/extension.h>"] if implicit else [], cpp, suffix,
                           call.lineno, "c++", flags, ext_name))
        if args.get("cuda_sources") is not None:
            cuda = _pieces(args["cuda_sources"], env, cuda_python, "cuda_sources")
            units.append(_unit(f"{tag}cuda.cu", CUDA_PREFIX if implicit else [], cuda, [], call.lineno, "nvcc",
                               flags, ext_name))
    if not units:
        raise CompileCheckError("no load_inline(...) call: nothing to compile (the check reads the sources given to "
                                "load_inline, or a C++/MUSA source file)")
    return units


# --- compiling ---------------------------------------------------------------------------------------------------

@functools.cache
def _cuda_includes() -> tuple[str, ...]:
    """nvcc's own include directories (it adds them itself; the host compiler needs them given)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise CompileCheckError("nvcc not found on PATH: --compile needs the CUDA toolkit's nvcc")
    dry = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull], capture_output=True,
                         text=True).stderr
    m = re.search(r'INCLUDES="([^"]*)"', dry)
    return tuple(p[2:] for p in (m.group(1).split() if m else []) if p.startswith("-I"))


def _includes(stub_dir: Path) -> list[str]:
    from torch.utils.cpp_extension import include_paths

    dirs = [*include_paths("cpu"), sysconfig.get_paths()["include"], *_cuda_includes()]
    for rel, text in STUB_HEADERS.items():
        if not any(Path(d, rel).exists() for d in [*dirs, "/usr/include", "/usr/local/include"]):
            (stub_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (stub_dir / rel).write_text(text)
    return dirs + [str(stub_dir)]


def _command(unit: Unit, includes: list[str]) -> list[str]:
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    defines = [f"-DTORCH_EXTENSION_NAME={unit.ext_name}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    incs = [f"-I{d}" for d in includes]
    if unit.compiler == "nvcc":
        return ["nvcc", "-x", "cu", "-std=c++20", "-ptx", "-fdevice-syntax-only", "-w", *COMMON_NVCC_FLAGS,
                *defines, *incs, *unit.flags, unit.name, "-o", os.devnull]
    return [os.environ.get("CXX", "c++"), "-x", "c++", "-std=c++20", "-fsyntax-only", "-w", *defines, *incs,
            *[f for f in unit.flags if not f.startswith("--")], unit.name]


_EDG = re.compile(r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+)\): (?:catastrophic )?error[^:]*: (?P<msg>.*)$")
_GCC = re.compile(r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?:\d+:)? (?:fatal )?error: (?P<msg>.*)$")


def diagnostics(unit: Unit, log: str) -> list[Diagnostic]:
    """Compiler errors of one unit, at MUSA file lines; an error inside a header is placed at the unit line that
    led there (EDG's `at line N of cuda.cu`, gcc's `In file included from main.cpp:N`)."""
    lines = log.splitlines()
    out: list[Diagnostic] = []
    name = re.escape(unit.name)
    for i, text in enumerate(lines):
        edg, gcc = _EDG.match(text), _GCC.match(text)
        m = edg or gcc
        if not m:
            continue
        file, line, msg = m.group("file"), int(m.group("line")), m.group("msg").strip()
        where = ""
        if Path(file).name != unit.name:
            where, line = f"{file}:{line}", None
            if edg:  # EDG lists the instantiation chain after the error, down to the unit's line
                for ctx in lines[i + 1:]:
                    if _EDG.match(ctx) or _GCC.match(ctx):
                        break
                    c = re.search(rf"at line (\d+) of {name}\b", ctx)
                    line = int(c.group(1)) if c else line
            else:  # gcc lists the include chain before it, the unit's #include outermost
                j = i - 1
                while j >= 0 and re.match(r"^(In file included from|\s+from) ", lines[j]):
                    c = re.search(rf"from {name}:(\d+)", lines[j])
                    line = int(c.group(1)) if c else line
                    j -= 1
        musa_line = unit.origin[line - 1] if line and 0 < line <= len(unit.origin) else None
        d = Diagnostic(musa_line, unit.name, msg, where)
        if d not in out:
            out.append(d)
    return out


def _run(unit: Unit, includes: list[str], build: Path, timeout: float) -> tuple[int, str]:
    (build / unit.name).write_text(unit.text)
    try:
        p = subprocess.run(_command(unit, includes), cwd=build, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f"{unit.name}(1): error: the compiler ran over {timeout:g} s"
    return p.returncode, p.stdout + p.stderr


def compile_check(musa: str, timeout: float = 900) -> CompileCheck:
    """Translate MUSA code m2c and parse every translation unit it builds; errors at the MUSA text's lines."""
    started = time.perf_counter()
    _cuda_includes()  # no nvcc: say so before anything else
    if looks_like_python(musa):
        try:
            parse(musa)
        except SyntaxError as e:
            raise CompileCheckError(f"not valid Python (line {e.lineno}: {e.msg})") from None
        units = units_of(translate_python(musa, M2C))
    else:
        text = translate_cpp(musa, M2C)
        units = [Unit("source.cu", text, list(range(1, text.count("\n") + 2)), "nvcc")]
    with tempfile.TemporaryDirectory(prefix="musacoder-compile-") as tmp:
        build = Path(tmp)
        includes = _includes(build / "stubs")
        with ThreadPoolExecutor(max_workers=min(len(units), os.cpu_count() or 1)) as pool:
            results = list(pool.map(lambda u: _run(u, includes, build, timeout), units))
    diags = [d for u, (_, log) in zip(units, results) for d in diagnostics(u, log)]
    failed = [(u, log) for u, (rc, log) in zip(units, results) if rc != 0]
    for u, log in failed:  # a failure without a parsable error line still says why
        if not any(d.unit == u.name for d in diags):
            diags.append(Diagnostic(None, u.name, (log.strip().splitlines() or ["compiler failed"])[-1]))
    log = "\n".join(f"== {u.name} ({u.compiler})\n{log}" for u, (_, log) in zip(units, results))
    return CompileCheck(not failed, diags, [u.name for u in units], round(time.perf_counter() - started, 1), log)
