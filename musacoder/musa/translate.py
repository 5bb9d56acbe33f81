"""CUDA <-> MUSA source translation from the project's own identifier map (`cuda_musa.tsv`).

C++ is translated token by token: whole identifiers (`::`-qualified entries as token sequences) and whole `#include`
paths, never inside comments or string literals, so user identifiers that merely contain a key (`relu_cuda`) stay as
they are. Arch guards get their numbers mapped (`__CUDA_ARCH__ >= 800` <-> `__MUSA_ARCH__ >= 220`); a number with no
known counterpart is kept and reported, since a renamed macro with the old number silently flips the guard.
Python candidates are translated with `tokenize`: the C++ inside their string literals as above, plus the Python
names of the map (`cuda_sources`, `torch.cuda`, `.cuda()`, device strings).
"""

from __future__ import annotations

import functools
import io
import re
import tokenize
from dataclasses import dataclass, field
from importlib import resources

C2M, M2C = "c2m", "m2c"
ARCH_THRESHOLDS = {800: 220, 900: 310}  # __CUDA_ARCH__ -> __MUSA_ARCH__ (Ampere-class -> mp_22, Hopper -> mp_31)


@dataclass(frozen=True)
class Pair:
    kind: str
    cuda: str
    musa: str
    note: str = ""


@functools.cache
def pairs() -> tuple[Pair, ...]:
    text = resources.files("musacoder.musa").joinpath("cuda_musa.tsv").read_text()
    rows = [line.split("\t") for line in text.splitlines() if line and not line.startswith("#")]
    return tuple(Pair(*r) for r in rows)


@dataclass
class Table:
    names: dict[tuple[str, ...], str]  # C++ identifier sequence (split on ::) -> replacement
    headers: dict[str, str]
    python: dict[str, str]

    @property
    def longest(self) -> int:
        return max(len(k) for k in self.names)


@functools.cache
def table(direction: str) -> Table:
    if direction not in (C2M, M2C):
        raise ValueError(f"direction must be {C2M} or {M2C}, not {direction!r}")
    t = Table({}, {}, {})
    for p in pairs():
        src, dst = (p.cuda, p.musa) if direction == C2M else (p.musa, p.cuda)
        where = t.headers if p.kind == "header" else t.python if p.kind == "python" else None
        if where is not None:
            where.setdefault(src, dst)  # many-to-one: m2c keeps the first CUDA name listed
        else:
            t.names.setdefault(tuple(src.split("::")), dst)
    return t


@dataclass
class Result:
    text: str
    warnings: list[str] = field(default_factory=list)


_CPP = re.compile(r"""
    (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<include>\#[ \t]*include[ \t]*[<"][^>"\n]+[>"])
  | (?P<string>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<scope>::)
  | (?P<number>\d+[uUlL]*)
  | (?P<space>\s+)
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)
_ARCH_CMP = re.compile(r"(\s*)(>=|<=|==|!=|>|<)(\s*)(\d+)")


def translate_cpp(src: str, direction: str, warnings: list[str] | None = None) -> str:
    t = table(direction)
    warnings = [] if warnings is None else warnings
    toks = [(m.lastgroup, m.group()) for m in _CPP.finditer(src)]
    out, i = [], 0
    while i < len(toks):
        kind, text = toks[i]
        if kind == "include":
            path = re.search(r'[<"]([^>"]+)[>"]', text).group(1)
            out.append(text.replace(path, t.headers.get(path, path)))
            i += 1
            continue
        if kind != "ident":
            out.append(text)
            i += 1
            continue
        n, repl = _match(toks, i, t)
        if repl is None:
            out.append(text)
            i += 1
            continue
        out.append(repl)
        i += n
        if repl in ("__MUSA_ARCH__", "__CUDA_ARCH__"):
            out.append(_arch_number(toks, i, direction, warnings))
            i = _skip_arch_number(toks, i)
    return "".join(out)


def _match(toks, i, t: Table) -> tuple[int, str | None]:
    """The longest map entry starting at token i, as (tokens consumed, replacement)."""
    idents, j = [], i
    while j < len(toks) and len(idents) < t.longest:
        if toks[j][0] != "ident":
            break
        idents.append((toks[j][1], j))
        if j + 2 < len(toks) and toks[j + 1][0] == "scope" and toks[j + 2][0] == "ident":
            j += 2
        else:
            break
    for k in range(len(idents), 0, -1):
        key = tuple(name for name, _ in idents[:k])
        if key in t.names:
            return idents[k - 1][1] - i + 1, t.names[key]
    return 1, None


def _arch_tail(toks, i) -> tuple[str, int] | None:
    rest = "".join(text for _, text in toks[i:i + 6])
    m = _ARCH_CMP.match(rest)
    return (m, len(m.group())) if m else None


def _arch_number(toks, i, direction, warnings) -> str:
    found = _arch_tail(toks, i)
    if not found:
        return ""
    m, _ = found
    number = int(m.group(4))
    mapping = ARCH_THRESHOLDS if direction == C2M else {v: k for k, v in ARCH_THRESHOLDS.items()}
    if number not in mapping:
        warnings.append(f"arch guard `{m.group(2)} {number}` has no known counterpart: kept as is, check it by hand")
    return f"{m.group(1)}{m.group(2)}{m.group(3)}{mapping.get(number, number)}"


def _skip_arch_number(toks, i) -> int:
    found = _arch_tail(toks, i)
    if not found:
        return i
    consumed, j = found[1], i
    while consumed > 0:
        consumed -= len(toks[j][1])
        j += 1
    return j


CPP_HINT = re.compile(r"#\s*include|__global__|__device__|torch::|<<<|\bat::")
_DEVICE_STR = re.compile(r"(cuda|musa)(:\d+)?")


def translate_python(src: str, direction: str, warnings: list[str] | None = None) -> str:
    t = table(direction)
    warnings = [] if warnings is None else warnings
    lines = src.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    edits: list[tuple[int, int, str]] = []
    pos = lambda rc: starts[rc[0] - 1] + rc[1]  # noqa: E731
    dotted = {k: v for k, v in t.python.items() if "." in k.strip(".")}
    for i, tok in enumerate(toks):
        a, b = pos(tok.start), pos(tok.end)
        if tok.type == tokenize.NAME:
            prev = toks[i - 1].string if i else ""
            if prev == "." and "." + tok.string in t.python:
                edits.append((a, b, t.python["." + tok.string].lstrip(".")))
            elif tok.string in t.python:
                edits.append((a, b, t.python[tok.string]))
            else:
                for k, v in dotted.items():  # torch.utils.cpp_extension as a whole
                    if src.startswith(k, a) and not src[a + len(k):a + len(k) + 1].isidentifier():
                        edits.append((a, a + len(k), v))
        elif tok.type == tokenize.STRING:
            edits.extend(_string_edit(tok.string, a, b, direction, t, warnings))
    out, last = [], 0
    for a, b, new in sorted(edits):
        if a < last:  # inside an edit already made (a dotted name's tail)
            continue
        out += [src[last:a], new]
        last = b
    return "".join(out) + src[last:]


def _string_edit(lit: str, a: int, b: int, direction: str, t: Table, warnings):
    m = re.match(r"(?is)([rbuf]*)('''|\"\"\"|'|\")", lit)
    prefix, quote = m.group(1), m.group(2)
    body = lit[len(prefix) + len(quote):len(lit) - len(quote)]
    want = "cuda" if direction == C2M else "musa"
    dev = _DEVICE_STR.fullmatch(body)
    if dev and dev.group(1) == want:
        return [(a, b, f"{prefix}{quote}{t.python[repr(want)].strip(chr(39))}{dev.group(2) or ''}{quote}")]
    if CPP_HINT.search(body):
        new = translate_cpp(body, direction, warnings)
        if new != body:
            return [(a, b, prefix + quote + new + quote)]
    return []


def looks_like_python(src: str) -> bool:
    return bool(re.search(r"^\s*(import|from)\s+\w", src, re.MULTILINE))


def translate(src: str, direction: str) -> Result:
    """A Python candidate or a C/C++/CUDA/MUSA source, in the other dialect."""
    warnings: list[str] = []
    fn = translate_python if looks_like_python(src) else translate_cpp
    return Result(fn(src, direction, warnings), warnings)
