"""Mutation operators for stage 3a (repair trajectories): realistic bugs injected into a verified candidate.

`mutate(operator, code, seed, reference="") -> Mutant | None` is a pure function of the candidate's Python text: the
operator (`OPERATORS`) finds the places where its bug applies inside the kernel sources the candidate carries
(C++/CUDA source strings for `load_inline`, the bodies of `@triton.jit` functions; `swapped_dims` and
`torch_fallback` also edit the Python), `seed` picks one, and the mutant comes with a one-line description of the
bug as a reviewer would state it (what is wrong in the mutant and what it should be); None when the operator does
not apply. `reference` is the task's source; only `torch_fallback` reads it.

Comments, string literals and preprocessor lines of the C++ are masked before matching, so a bug is never injected
into a comment or a `TORCH_CHECK` message; positions stay those of the candidate text.
"""

from __future__ import annotations

import ast
import builtins
import io
import random
import re
import tokenize
from collections.abc import Callable
from dataclasses import dataclass

from musacoder.pyast import parse


@dataclass(frozen=True)
class Mutant:
    code: str
    operator: str
    description: str


@dataclass(frozen=True)
class _Site:
    start: int
    end: int
    new: str
    what: str


@dataclass(frozen=True)
class _Region:
    lang: str  # cpp | cuda | triton
    start: int
    text: str  # the masked source: same length as the original span


_IDENT = r"[A-Za-z_]\w*"
_DOTTED = re.compile(rf"{_IDENT}(?:\.{_IDENT})*")
_BALANCE = {"(": ")", "[": "]", "{": "}"}
_ZERO = r"0(?:\.0*)?[fF]?|0[lL]|0\.0*[fF]?"
_NEG_INF_CPP = re.compile(r"-\s*INFINITY\b|-\s*std::numeric_limits<\s*\w+\s*>::infinity\(\)"
                          r"|std::numeric_limits<\s*\w+\s*>::lowest\(\)|-\s*FLT_MAX\b")
_NEG_INF_TRITON = re.compile(r"""float\(\s*["']-inf["']\s*\)|-\s*float\(\s*["']inf["']\s*\)|-\s*math\.inf\b""")
_ACC_DECL = re.compile(rf"\b(float|double)(\s+)({_IDENT})\s*=\s*([^;,]+);")


# ---- where the kernel sources are -----------------------------------------------------------------------------

def _mask_cpp(s: str) -> str:
    """Comments, string/char literals and preprocessor lines blanked (newlines kept), so offsets still match."""
    out, i, n = list(s), 0, len(s)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = s[i]
        if s.startswith("//", i) or (c == "#" and s[s.rfind("\n", 0, i) + 1:i].strip() == ""):
            j = s.find("\n", i)
            j = n if j < 0 else j
        elif s.startswith("/*", i):
            j = s.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and s[j] != c and s[j] != "\n":
                j += 2 if s[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            i += 1
            continue
        blank(i, j)
        i = j
    return "".join(out)


def _mask_python_comments(s: str) -> str:
    return re.sub(r"#[^\n]*", lambda m: " " * len(m.group(0)), s)


def _line_offsets(code: str) -> list[int]:
    """Where each line starts (and the end), numbered as tokenize and ast number them: split at newlines only."""
    offs = [0] + [m.end() for m in re.finditer("\n", code)]
    return offs if offs[-1] == len(code) else offs + [len(code)]


def _regions(code: str) -> list[_Region]:
    """C++/CUDA source strings (an `#include`, or braces and semicolons) and `@triton.jit` function bodies."""
    lines = _line_offsets(code)
    regions = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return []
    for tok in tokens:
        if tok.type != tokenize.STRING:
            continue
        body = tok.string.lstrip("rRbBuUfF")
        quote = 3 if body[:3] in ('"""', "'''") else 1
        start = lines[tok.start[0] - 1] + tok.start[1] + len(tok.string) - len(body) + quote
        end = lines[tok.end[0] - 1] + tok.end[1] - quote
        text = code[start:end]
        if "#include" in text or ("{" in text and ";" in text):
            regions.append(_Region("cuda" if "__global__" in text else "cpp", start, _mask_cpp(text)))
    try:
        tree = parse(code)
    except SyntaxError:
        return regions
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
                "triton.jit" in ast.unparse(d) or ast.unparse(d) == "jit" for d in node.decorator_list):
            start, end = lines[node.lineno - 1], lines[node.end_lineno]
            regions.append(_Region("triton", start, _mask_python_comments(code[start:end])))
    return regions


def _close(text: str, i: int) -> int:
    """Index just past the bracket that closes the one at text[i]; -1 when it is not closed."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] in _BALANCE:
            depth += 1
        elif text[j] in ")]}":
            depth -= 1
            if depth == 0:
                return j + 1
    return -1


def _split_args(text: str) -> list[tuple[int, int]]:
    """(start, end) of each top-level comma-separated argument of an argument list's inside."""
    spans, depth, a = [], 0, 0
    for j, c in enumerate(text):
        if c in _BALANCE:
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            spans.append((a, j))
            a = j + 1
    if text[a:].strip():
        spans.append((a, len(text)))
    return spans


def _snippet(s: str) -> str:
    return " ".join(s.split())


def _site(code: str, start: int, end: int, new: str, ctx: tuple[int, int],
          describe: Callable[[str, str], str]) -> _Site:
    """Replace code[start:end] by `new`; `describe(before, after)` gets the context span before and after."""
    a, b = ctx
    return _Site(start, end, new, describe(_snippet(code[a:b]), _snippet(code[a:start] + new + code[end:b])))


def _line_span(code: str, i: int) -> tuple[int, int]:
    end = code.find("\n", i)
    return code.rfind("\n", 0, i) + 1, len(code) if end < 0 else end


def _is_accumulator(text: str, name: str) -> bool:
    """Updated from its own value after the declaration (`s += ...`, `acc = acc + ...`, `m = max(m, ...)`)."""
    n = re.escape(name)
    return re.search(rf"\b{n}\s*(\+=|-=|\*=)|\b{n}\s*=(?!=)[^;\n]*\b{n}\b", text) is not None


_TYPES = {"int64_t", "int32_t", "int", "long", "unsigned", "size_t", "float", "double", "const", "auto", "half"}


def _int_value(expr: str, env_seed: int) -> int | None:
    """The value of a C or Triton index expression with every name a random integer (fixed by the name and
    `env_seed`, so an expression and its swapped copy see the same values); None when it is not plain integer
    arithmetic. Evaluated on the AST, never with eval."""
    e = re.sub(r"static_cast<[^<>]*>", "", expr)
    e = re.sub(r"\(\s*(?:const\s+)?(?:int64_t|int32_t|int|long|unsigned|size_t)\s*\)", "", e)
    e = re.sub(r"\b(\d+)[uUlL]+\b", r"\1", e).replace("/", "//")
    names: dict[str, str] = {}
    e = _DOTTED.sub(lambda m: names.setdefault(m.group(0), f"v{len(names)}"), e)
    try:
        tree = parse(e.strip(), mode="eval")
    except SyntaxError:
        return None
    env = {v: random.Random(f"{env_seed}:{name}").randint(2, 1000) for name, v in names.items()}
    ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__, ast.FloorDiv: int.__floordiv__,
           ast.Mod: int.__mod__}

    def ev(node) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            return env[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -ev(node.operand) if isinstance(node.op, ast.USub) else ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(ast.dump(node))

    try:
        return ev(tree.body)
    except (ValueError, KeyError, ZeroDivisionError):
        return None


def _swaps(code: str, a: int, b: int, mask: str, ctx: tuple[int, int]) -> list[_Site]:
    """Sites swapping two index names in code[a:b] (its masked text `mask`) where that changes the value."""
    idents = []
    for m in _DOTTED.finditer(mask):
        follow = mask[m.end():].lstrip()[:1]
        if m.group(0) not in _TYPES and "ptr" not in m.group(0) and follow not in ("(", "<") \
                and m.group(0) not in idents:
            idents.append(m.group(0))
    expr, sites = code[a:b], []
    for i, x in enumerate(idents):
        for y in idents[i + 1:]:
            new = re.sub(rf"(?<![\w.])({re.escape(x)}|{re.escape(y)})(?![\w.])",
                         lambda m, x=x, y=y: y if m.group(1) == x else x, expr)
            values = [(_int_value(expr, k), _int_value(new, k)) for k in range(3)]
            if all(None not in uv for uv in values) and any(u != v for u, v in values):  # no no-op swaps
                sites.append(_site(code, a, b, new, ctx, lambda before, after, x=x, y=y:
                                   f"wrong index: `{after}` should be `{before}` ({x} and {y} swapped)"))
    return sites


# ---- the operators' sites -------------------------------------------------------------------------------------

def _off_by_one(code: str, regions: list[_Region], reference: str) -> list[_Site]:
    sites = []
    for r in regions:
        if r.lang == "triton":  # a mask or bound: `mask = offs < n`
            for m in re.finditer(rf"=\s*({_IDENT})\s*<(?![<=])\s*[\w.]+(?:\s*[-+*/]\s*[\w.]+)*", r.text):
                lt = r.start + m.start() + m.group(0).index("<")
                sites.append(_site(code, lt, lt + 1, "<=", (r.start + m.start(1), r.start + m.end()),
                                   lambda b, a: f"off-by-one bound: `{a}` should be `{b}`; the mask admits one "
                                                "element past the end"))
            continue
        for m in re.finditer(r"\b(for|if|while)\s*\(", r.text):
            close = _close(r.text, m.end() - 1)
            if close < 0:
                continue
            cond_at, inner = m.end(), r.text[m.end():close - 1]
            if m.group(1) == "for":
                parts = inner.split(";")
                if len(parts) != 3:
                    continue
                cond_at, inner = cond_at + len(parts[0]) + 1, parts[1]
            c = re.match(rf"\s*{_DOTTED.pattern}\s*<(?![<=])", inner)
            if c:
                lt = r.start + cond_at + c.end() - 1
                what = "the loop runs one iteration" if m.group(1) == "for" else "the guard admits one index"
                sites.append(_site(code, lt, lt + 1, "<=", (r.start + cond_at, r.start + cond_at + len(inner)),
                                   lambda b, a, what=what: f"off-by-one bound: `{a}` should be `{b}`; {what} past "
                                                           "the end"))
    return sites


def _missing_guard(code: str, regions: list[_Region], reference: str) -> list[_Site]:
    sites = []
    for r in regions:
        if r.lang == "triton":
            sites += _dropped_masks(code, r)
            continue
        for m in re.finditer(r"\bif\s*\(", r.text):
            close = _close(r.text, m.end() - 1)
            cond = r.text[m.end():close - 1] if close > 0 else ""
            if not re.search(r"(?<![<>])<=?(?![<>])", cond) or r.text[:m.start()].rstrip().endswith("else"):
                continue
            body = close + len(r.text[close:]) - len(r.text[close:].lstrip())
            end = _close(r.text, body) if r.text[body:body + 1] == "{" else r.text.find(";", body) + 1
            if end <= 0 or re.match(r"\s*else\b", r.text[end:]):
                continue  # an if/else: dropping the condition would not leave the else branch's meaning
            sites.append(_site(code, r.start + m.start(), r.start + body, "", (r.start + m.start(), r.start + close),
                               lambda b, a: f"missing boundary check: the guard `{b}` is missing, so out-of-range "
                                            "indices are read and written"))
    return sites


def _dropped_masks(code: str, r: _Region) -> list[_Site]:
    """tl.load/tl.store calls without their mask (and `other`, which needs one), given positionally or by name."""
    sites = []
    for m in re.finditer(r"\btl\.(load|store)\s*\(", r.text):
        close = _close(r.text, m.end() - 1)
        if close < 0:
            continue
        inner_at = r.start + m.end()
        args = _split_args(r.text[m.end():close - 1])
        mask_pos, other_pos = (1, 2) if m.group(1) == "load" else (2, None)
        drop, has_mask = [], False
        for k, (a, b) in enumerate(args):
            kw = re.match(r"\s*(\w+)\s*=(?!=)", r.text[m.end() + a:m.end() + b])
            name = kw.group(1) if kw else {mask_pos: "mask", other_pos: "other"}.get(k)
            if name in ("mask", "other"):
                drop.append(k)
                has_mask |= name == "mask"
        if not has_mask:
            continue
        new = ",".join(code[inner_at + a:inner_at + b] for k, (a, b) in enumerate(args) if k not in drop)
        sites.append(_site(code, inner_at, r.start + close - 1, new, (r.start + m.start(), r.start + close),
                           lambda b, a: f"missing boundary check: `{a}` needs its mask, as in `{b}`; the last block "
                                        "accesses memory past the end"))
    return sites


def _wrong_index(code: str, regions: list[_Region], reference: str) -> list[_Site]:
    sites = []
    for r in regions:
        if r.lang == "triton":
            spans = []
            for m in re.finditer(r"\btl\.(load|store)\s*\(", r.text):
                args = _split_args(r.text[m.end():max(_close(r.text, m.end() - 1) - 1, m.end())])
                if args:
                    a, b = m.end() + args[0][0], m.end() + args[0][1]
                    spans.append((a, b, a, b))
        else:
            spans = []
            for m in re.finditer(rf"(?<![\w.]){_IDENT}\s*\[", r.text):  # subscripts: a[i * k + p]
                close = _close(r.text, m.end() - 1)
                if close > 0:
                    spans.append((m.end(), close - 1, m.start(), close))
            for m in re.finditer(r"\+\s*static_cast<\w+>\(", r.text):  # Inductor's `in_ptr0 + static_cast<...>(...)`
                close = _close(r.text, m.end() - 1)
                if close > 0:
                    spans.append((m.end(), close - 1, m.end(), close - 1))
        for a, b, ctx_a, ctx_b in spans:  # the index expression, and what the description quotes
            sites += _swaps(code, r.start + a, r.start + b, r.text[a:b], (r.start + ctx_a, r.start + ctx_b))
    return sites


def _reduction_init(code: str, regions: list[_Region], reference: str) -> list[_Site]:
    sites = []
    for r in regions:
        neg_inf = _NEG_INF_TRITON if r.lang == "triton" else _NEG_INF_CPP
        for m in neg_inf.finditer(r.text):
            start = r.start + m.start()
            sites.append(_site(code, start, r.start + m.end(), "0.0" if r.lang == "triton" else "0",
                               _line_span(code, start), lambda b, a: f"wrong reduction init: `{a}` should be `{b}`: "
                                                                     "the max starts at 0 instead of -inf"))
        if r.lang == "triton":
            for m in re.finditer(rf"({_IDENT})\s*=\s*tl\.(zeros|full)\s*\(", r.text):
                if not _is_accumulator(r.text[m.end():], m.group(1)):
                    continue
                args = _split_args(r.text[m.end():max(_close(r.text, m.end() - 1) - 1, m.end())])
                at = r.start + m.end()
                if m.group(2) == "zeros" and args:  # tl.zeros(shape, dtype) -> tl.full(shape, -inf, dtype)
                    new = f"tl.full({code[at + args[0][0]:at + args[0][1]].strip()}, float(\"-inf\")"
                    a, b = r.start + m.start(2) - 3, at + args[0][1]
                elif m.group(2) == "full" and len(args) > 1 and re.fullmatch(rf"\s*(?:{_ZERO})\s*",
                                                                             code[at + args[1][0]:at + args[1][1]]):
                    new, (a, b) = ' float("-inf")', (at + args[1][0], at + args[1][1])
                else:
                    continue
                sites.append(_site(code, a, b, new, _line_span(code, a), lambda bef, aft, n=m.group(1):
                                   f"wrong reduction init: `{aft}` should be `{bef}`: the sum `{n}` starts at -inf "
                                   "instead of 0"))
            continue
        for m in _ACC_DECL.finditer(r.text):
            if re.fullmatch(rf"\s*(?:{_ZERO})\s*", m.group(4)) and _is_accumulator(r.text[m.end():], m.group(3)):
                start = r.start + m.start(4)
                sites.append(_site(code, start, r.start + m.end(4), "-INFINITY", _line_span(code, start),
                                   lambda b, a, n=m.group(3): f"wrong reduction init: `{a}` should be `{b}`: the sum "
                                                              f"`{n}` starts at -inf instead of 0"))
    return sites


def _accumulator_type(code: str, regions: list[_Region], reference: str) -> list[_Site]:
    sites = []
    for r in regions:
        if r.lang == "triton":
            for m in re.finditer(rf"({_IDENT})\s*=\s*tl\.(?:zeros|full)\s*\(([^\n]*?)\btl\.float32\b", r.text):
                if _is_accumulator(r.text[m.end():], m.group(1)):
                    start = r.start + m.end() - len("tl.float32")
                    sites.append(_site(code, start, r.start + m.end(), "tl.float16", _line_span(code, start),
                                       lambda b, a, n=m.group(1): f"accumulator type: `{a}` should be `{b}`: `{n}` "
                                                                  "accumulates in float16 instead of float32"))
            continue
        source = code[r.start:r.start + len(r.text)]
        in_omp = {n for clause in re.findall(r"reduction\s*\(([^)]*)\)", source)
                  for n in re.findall(_IDENT, clause.split(":")[-1])}
        for m in _ACC_DECL.finditer(r.text):
            name = m.group(3)
            if name not in in_omp and _is_accumulator(r.text[m.end():], name):  # an OpenMP reduction needs a scalar
                start = r.start + m.start(1)
                sites.append(_site(code, start, r.start + m.end(1), "at::Half", _line_span(code, start),
                                   lambda b, a, n=name, t=m.group(1): f"accumulator type: `{a}` should be `{b}`: `{n}` "
                                                                      f"accumulates in half precision instead of {t}"))
    return sites


def _missing_sync(code: str, regions: list[_Region], reference: str) -> list[_Site]:
    sites = []
    for r in regions:
        if r.lang != "cuda":
            continue
        for m in re.finditer(r"__syncthreads\s*\(\s*\)\s*;", r.text):
            line = r.text.count("\n", 0, m.start()) + 1
            sites.append(_Site(r.start + m.start(), r.start + m.end(), "",
                               f"missing __syncthreads(): the barrier on line {line} of the CUDA source is missing, "
                               "so threads read shared memory before the others have written it"))
    return sites


_DIM = re.compile(rf"({_DOTTED.pattern})(\.size\((\d)\)|\.size\(\)\[(\d)\]|\.shape\[(\d)\])")


def _swapped_dims(code: str, regions: list[_Region], reference: str) -> list[_Site]:
    masked = _masked(code, regions)
    found = [(m, int(m.group(3) or m.group(4) or m.group(5))) for m in _DIM.finditer(masked)]
    pairs, singles = [], []
    for i, (m, d) in enumerate(found):
        for n, e in found[i + 1:]:
            if m.group(1) == n.group(1) and d != e and "\n" not in masked[m.end():n.start()]:
                one, two = code[m.start():m.end()], code[n.start():n.end()]
                new = _redim(one, e) + code[m.end():n.start()] + _redim(two, d)
                pairs.append(_Site(m.start(), n.end(), new, f"swapped dimensions: `{_redim(one, e)}` and "
                                                            f"`{_redim(two, d)}` are exchanged; they should be `{one}` "
                                                            f"and `{two}`"))
        other = 1 if d == 0 else d - 1
        new = _redim(code[m.start():m.end()], other)
        singles.append(_site(code, m.start(), m.end(), new, (m.start(), m.end()),
                             lambda b, a: f"swapped dimensions: `{a}` should be `{b}`"))
    return pairs or singles


def _redim(access: str, dim: int) -> str:
    """`x.size(0)` -> `x.size(dim)`: the dimension is the access's last digit."""
    k = max(access.rfind(c) for c in "0123456789")
    return access[:k] + str(dim) + access[k + 1:]


def _masked(code: str, regions: list[_Region]) -> str:
    """The candidate with C++ comments and strings and Python comments blanked."""
    out = code
    for r in regions:
        out = out[:r.start] + r.text + out[r.start + len(r.text):]
    lines = _line_offsets(code)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.COMMENT:
                a = lines[tok.start[0] - 1] + tok.start[1]
                out = out[:a] + " " * len(tok.string) + out[a + len(tok.string):]
    except (tokenize.TokenError, SyntaxError):
        pass
    return out


def _torch_fallback(code: str, regions: list[_Region], reference: str) -> list[_Site]:
    """ModelNew.forward replaced by the reference's Model.forward: correct, and refused as a PyTorch fallback."""
    try:
        cand, ref = parse(code), parse(reference)
    except SyntaxError:
        return []
    new_cls = next((n for n in cand.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None)
    ref_cls = next((n for n in ref.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    fwd = _method(new_cls, "forward")
    ref_fwd = _method(ref_cls, "forward")
    if fwd is None or ref_fwd is None:
        return []
    lines, ref_lines = _line_offsets(code), reference.splitlines(keepends=True)
    first = min([fwd.lineno] + [d.lineno for d in fwd.decorator_list])
    indent = " " * fwd.col_offset
    body = "".join(ref_lines[ref_fwd.lineno - 1:ref_fwd.end_lineno])
    body = "".join(indent + ln[ref_fwd.col_offset:] if ln.strip() else ln for ln in body.splitlines(keepends=True))
    missing = _missing_globals(cand, ref, ref_fwd)
    header = "".join(ast.get_source_segment(reference, s) + "\n" for s in missing)
    start = lines[min([new_cls.lineno] + [d.lineno for d in new_cls.decorator_list]) - 1]
    end = lines[fwd.end_lineno]
    new = (header + ("\n" if header else "") + code[start:lines[first - 1]] + body.rstrip("\n") + "\n")
    calls = sorted({ast.unparse(c.func) for c in ast.walk(ref_fwd) if isinstance(c, ast.Call)})
    what = (", ".join(calls[:4]) + (", ..." if len(calls) > 4 else "")) if calls else \
        f"`{_snippet(ast.unparse(ref_fwd.body[-1]))}`"
    return [_Site(start, end, new, f"PyTorch fallback: forward computes the result with PyTorch ({what}) instead of "
                                   "calling the kernel; PyTorch compute ops are not allowed in forward")]


def _method(cls: ast.ClassDef | None, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None) if cls else None


def _missing_globals(cand: ast.Module, ref: ast.Module, fwd: ast.FunctionDef) -> list[ast.stmt]:
    """The reference's module-level imports and assignments of names its forward reads and the candidate lacks."""
    def defined(mod: ast.Module) -> dict[str, ast.stmt]:
        out = {}
        for s in mod.body:
            if isinstance(s, (ast.Import, ast.ImportFrom)):
                out.update({(a.asname or a.name).split(".")[0]: s for a in s.names})
            elif isinstance(s, (ast.Assign, ast.AnnAssign)):
                targets = s.targets if isinstance(s, ast.Assign) else [s.target]
                out.update({n.id: s for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)})
            elif isinstance(s, (ast.FunctionDef, ast.ClassDef)):
                out[s.name] = s
        return out

    have, theirs = defined(cand), defined(ref)
    local = {a.arg for a in ast.walk(fwd.args) if isinstance(a, ast.arg)} | {
        n.id for n in ast.walk(fwd) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    need = []
    for n in ast.walk(fwd):
        if (isinstance(n, ast.Name) and n.id not in local and n.id not in have and n.id in theirs
                and not hasattr(builtins, n.id) and theirs[n.id] not in need):
            need.append(theirs[n.id])
    return sorted(need, key=lambda s: s.lineno)


OPERATORS: dict[str, Callable[[str, list[_Region], str], list[_Site]]] = {
    "off_by_one": _off_by_one,
    "missing_guard": _missing_guard,
    "wrong_index": _wrong_index,
    "reduction_init": _reduction_init,
    "accumulator_type": _accumulator_type,
    "missing_sync": _missing_sync,
    "swapped_dims": _swapped_dims,
    "torch_fallback": _torch_fallback,
}


def mutate(operator: str, code: str, seed: int = 0, reference: str = "") -> Mutant | None:
    """The mutant of `code` by `operator` at the site `seed` picks, or None when the operator does not apply."""
    sites = OPERATORS[operator](code, _regions(code), reference)
    if not sites:
        return None
    s = random.Random(f"{operator}:{seed}").choice(sites)
    new = code[:s.start] + s.new + code[s.end:]
    return Mutant(new, operator, s.what) if new != code else None
