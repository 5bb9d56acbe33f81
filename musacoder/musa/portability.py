"""Static MUSA portability checks on a kernel's C++ (or a Python candidate's embedded C++).

Each rule names a construct that compiles (often also under nvcc after reverse translation) but breaks or misbehaves
on Moore Threads GPUs: 32-lane warp arithmetic on 128-lane warps (mp_21/mp_22), static shared memory over 28 KB,
inline PTX and NVIDIA-only instructions, fp64 in device code, CUDA arch-guard numbers, CUDA graphs, NVRTC, the
opt-in shared-memory attribute. Findings carry a line and a reason the feedback turn can show the model.
"""

from __future__ import annotations

import ast
import functools
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources

from musacoder.musa.translate import ARCH_THRESHOLDS
from musacoder.pyast import parse

_TYPE_BYTES = {"char": 1, "int8_t": 1, "uint8_t": 1, "bool": 1, "short": 2, "half": 2, "__half": 2, "int16_t": 2,
               "__nv_bfloat16": 2, "__mt_bfloat16": 2, "int": 4, "float": 4, "unsigned": 4, "int32_t": 4,
               "uint32_t": 4, "half2": 4, "__half2": 4, "double": 8, "long": 8, "int64_t": 8, "float2": 8,
               "float4": 16, "double2": 16}


# Rules whose construct cannot compile for a MUSA target at all (MUSA has no PTX, and mcc no PTX assembler): the
# verifier refuses such a candidate before building it, on `musa` and `musa-on-cuda` alike. Every other rule is a
# warning: the code builds (also under nvcc after m2c) but may compute wrong results or run slowly on MTT GPUs.
FATAL_RULES = frozenset({"ptx"})


@dataclass(frozen=True)
class Finding:
    rule: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: [{self.rule}] {self.reason}"


@functools.cache
def capabilities() -> dict[tuple[int, int], dict]:
    raw = json.loads(resources.files("musacoder.musa").joinpath("arch.json").read_text())
    return {tuple(map(int, k.split("."))): v for k, v in raw.items() if not k.startswith("_")}


def _strip(src: str) -> str:
    """Comments and string literals blanked (same length, newlines kept), so rules see only code."""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group())
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', blank, src, flags=re.DOTALL)


def _line(code: str, pos: int) -> int:
    return code.count("\n", 0, pos) + 1


_WARP32 = re.compile(r"(&\s*31\b|>>\s*5\b|%\s*32\b|/\s*32\b)")
_LANE_WORDS = re.compile(r"threadIdx|lane|tid|warp", re.IGNORECASE)
_SHFL = re.compile(r"\b__shfl(?:_xor|_down|_up)?_sync\s*\(")
_PTX = re.compile(r"\basm\b\s*(?:volatile\b\s*)?\(|\bmma\.sync\b|\bldmatrix\b|\bcp\.async\b|\bwgmma\b")
_PDL = re.compile(r"\b(?:cuda|musa)(?:GridDependencySynchronize|TriggerProgrammaticLaunchCompletion)\b")
_ARCH = re.compile(r"\b__(?:CUDA|MUSA)_ARCH__\s*(>=|<=|==|!=|>|<)\s*(\d+)")
_GRAPH = re.compile(r"\b(?:cuda|musa)Graph\w*|\b(?:cuda|musa)StreamBeginCapture\b|\bCUDAGraph\b|\btorch\.cuda\.graph\b")
_NVRTC = re.compile(r"\bnvrtc\w*")
_OPTIN = re.compile(r"\b(?:cuda|musa)FuncSetAttribute\s*\([^;]*MaxDynamicSharedMemorySize")
_SHARED = re.compile(r"\b__shared__\s+(?:(?:volatile|const|static|alignas\(\d+\))\s+)*([A-Za-z_][\w:]*)\s+"
                     r"[A-Za-z_]\w*\s*((?:\[[^\]]+\]\s*)+)")
_DEVICE_FN = re.compile(r"\b__(?:global|device)__\b[^;{]*\{")


def _warp32(code: str) -> Iterator[Finding]:
    for m in _WARP32.finditer(code):
        line = code.splitlines()[_line(code, m.start()) - 1]
        if _LANE_WORDS.search(line):
            yield Finding("warp32", _line(code, m.start()),
                          f"`{m.group().strip()}` next to thread/lane indices assumes 32-lane warps; MTT S4000 "
                          "warps have 128 lanes: use warpSize")


def _shuffle_widths(code: str, consts: dict[str, int]) -> Iterator[Finding]:
    for m in _SHFL.finditer(code):
        args = _call_args(code, m.end())
        width = args[3].strip() if len(args) >= 4 else None
        if width is None:
            yield Finding("shuffle-width", _line(code, m.start()), "shuffle without an explicit width: on "
                          "128-lane warps it spans 128 lanes; pass width <= 32 or reduce across groups in "
                          "shared memory")
        elif _eval(width, consts) is not None and _eval(width, consts) > 32:
            yield Finding("shuffle-width", _line(code, m.start()), f"shuffle width {width} over 32")


def _static_shared(code: str, consts: dict[str, int], limit: int) -> Iterator[Finding]:
    """Static __shared__ arrays whose size is known (its type's and every dimension's) and over `limit` bytes."""
    for m in _SHARED.finditer(code):
        size = _TYPE_BYTES.get(m.group(1).split("::")[-1])
        dims = [_eval(d, consts) for d in re.findall(r"\[([^\]]+)\]", m.group(2))]
        if not size or any(d is None for d in dims):
            continue
        total = size * math.prod(dims)
        if total > limit:
            yield Finding("static-shared", _line(code, m.start()),
                          f"static __shared__ array of {total} bytes: mp_21/mp_22 allow {limit} bytes; use dynamic "
                          "shared memory")


def _ptx(code: str) -> Iterator[Finding]:
    for m in _PTX.finditer(code):
        yield Finding("ptx", _line(code, m.start()), f"`{m.group().strip()}`: NVIDIA-only (PTX or its "
                      "instructions); MUSA has no PTX")


def _arch_guards(code: str) -> Iterator[Finding]:
    for m in _ARCH.finditer(code):
        number = int(m.group(2))
        if number not in ARCH_THRESHOLDS and number not in ARCH_THRESHOLDS.values():
            yield Finding("arch-guard", _line(code, m.start()), f"arch guard `{m.group().strip()}`: {number} has no "
                          "MUSA counterpart (known: 800 -> 220, 900 -> 310)")


# constructs MUSA lacks, found by their names alone: (rule, pattern, why)
_NAMED = (("pdl", _PDL, "programmatic dependent launch does not exist on MUSA (a no-op at best)"),
          ("cuda-graph", _GRAPH, "graph capture/replay: not part of the MUSA timing path"),
          ("nvrtc", _NVRTC, "NVRTC has no MUSA twin: compile with mcc"),
          ("smem-optin", _OPTIN, "the opt-in dynamic shared memory attribute is a no-op on MUSA"))


def _named(code: str) -> Iterator[Finding]:
    for rule, rx, why in _NAMED:
        for m in rx.finditer(code):
            yield Finding(rule, _line(code, m.start()), f"`{m.group()[:40]}`: {why}")


def _fp64(code: str) -> Iterator[Finding]:
    for start, end in _device_bodies(code):
        for m in re.finditer(r"\bdouble\b", code[start:end]):
            yield Finding("fp64", _line(code, start + m.start()), "double in device code: MUSA GPUs have no fp64 "
                          "(torch_musa builds with -mathx-disable-fp64)")


def check_cpp(src: str, static_shared_limit: int = 28 * 1024) -> list[Finding]:
    code = _strip(src)
    consts = _constants(code)
    out = [*_warp32(code), *_shuffle_widths(code, consts), *_static_shared(code, consts, static_shared_limit),
           *_ptx(code), *_arch_guards(code), *_named(code), *_fp64(code)]
    return sorted(set(out), key=lambda f: (f.line, f.rule))  # one finding per rule and line


def check(src: str) -> list[Finding]:
    """A C++ source, or a Python candidate: the C++ in its string literals, and CUDA graphs in its Python."""
    from musacoder.musa.translate import CPP_HINT, looks_like_python

    if not looks_like_python(src):
        return check_cpp(src)
    try:
        tree = parse(src)
    except SyntaxError:
        return []
    out = [Finding(f.rule, f.line + node.lineno - 1, f.reason)
           for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
           and CPP_HINT.search(node.value) for f in check_cpp(node.value)]
    graph = _GRAPH.search(src)
    if graph and not any(f.rule == "cuda-graph" for f in out):
        out.append(Finding("cuda-graph", _line(src, graph.start()), "CUDA graph capture/replay in the candidate"))
    return sorted(out, key=lambda f: (f.line, f.rule))


def _call_args(code: str, i: int) -> list[str]:
    depth, args, cur = 1, [], []
    while i < len(code) and depth:
        c = code[i]
        depth += c in "([{"
        depth -= c in ")]}"
        if depth == 1 and c == ",":
            args.append("".join(cur))
            cur = []
        elif depth:
            cur.append(c)
        i += 1
    return [*args, "".join(cur)]


def _device_bodies(code: str):
    for m in _DEVICE_FN.finditer(code):
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += code[i] == "{"
            depth -= code[i] == "}"
            i += 1
        yield m.end(), i


def _constants(code: str) -> dict[str, int]:
    found = {}
    for name, value in re.findall(r"#\s*define\s+(\w+)\s+\(?([\w\s*+\-/()]+?)\)?\s*$", code, re.MULTILINE):
        found[name] = value
    for name, value in re.findall(r"\bconstexpr\s+(?:int|unsigned|size_t|int64_t|long)\s+(\w+)\s*=\s*([^;]+);", code):
        found[name] = value
    out: dict[str, int] = {}
    for _ in range(3):  # constants defined from other constants
        for k, v in found.items():
            n = _eval(v, out)
            if n is not None:
                out[k] = n
    return out


def _eval(expr: str, consts: dict[str, int]) -> int | None:
    """An integer constant expression over known names (+ - * / and parentheses), else None."""
    expr = re.sub(r"\b(\d+)[uUlL]+\b", r"\1", expr.strip())
    try:
        tree = parse(expr, mode="eval")
    except SyntaxError:
        return None

    def ev(n):
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name) and n.id in consts:
            return consts[n.id]
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add | ast.Sub | ast.Mult | ast.FloorDiv | ast.Div):
            a, b = ev(n.left), ev(n.right)
            if a is None or b is None:
                return None
            if isinstance(n.op, ast.Div | ast.FloorDiv):
                return a // b if b else None
            return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}[type(n.op)]
        return None
    return ev(tree.body)
