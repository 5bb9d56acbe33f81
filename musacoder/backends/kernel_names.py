"""Demangled C++ names reduced to what identifies a function (`ns::kernel<float>`), and whether a kernel the profiler
saw is one a library defines: shared by the backends' kernel profiles and the verifier's symbol checks."""

from __future__ import annotations

import re

_SPECIAL_PREFIXES = ("vtable for ", "typeinfo for ", "typeinfo name for ", "VTT for ", "guard variable for ",
                     "construction vtable for ", "non-virtual thunk to ", "virtual thunk to ",
                     "covariant return thunk to ", "TLS init function for ", "TLS wrapper function for ")
_OPERATOR_RE = re.compile(r"operator\s*(?:<<=|>>=|<<|>>|<=>|<=|>=|->\*|->|\(\)|\[\]|<|>|"
                          r"\s(?:new\[\]|delete\[\]|new|delete|[\w:]+))\s*")
_TRAILING_RE = re.compile(r"(?:\s*(?:const|volatile|&&|&|noexcept)\s*)+$")


def _strip_params(s: str) -> str:
    """Drop a trailing balanced `(...)` parameter list."""
    if not s.endswith(")"):
        return s
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(s[i], 0)
        if depth == 0:
            return s[:i]
    return s


def _depth0_split(s: str, sep: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in s:
        depth += {"<": 1, "(": 1, ">": -1, ")": -1}.get(ch, 0)
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def qualified_name(sym: str, templates: bool = True) -> str:
    """`void ns::k<float>(at::Acc<float, 2>) const` -> `ns::k<float>` (or `ns::k` without template arguments)."""
    s = sym.split(" [clone")[0].strip()
    for p in _SPECIAL_PREFIXES:
        s = s.removeprefix(p)
    s = s.replace("(anonymous namespace)", "{anon}")
    s = _OPERATOR_RE.sub(lambda m: "operator" + re.sub(r"\W", "_", m.group(0)[8:].strip()), s)
    s = _strip_params(_TRAILING_RE.sub("", s))
    s = _depth0_split(s.strip(), " ")[-1]  # drop the return type
    if not templates:
        out, depth = [], 0
        for ch in s:
            if ch == "<":
                depth += 1
            elif ch == ">":
                depth -= 1
            elif depth == 0:
                out.append(ch)
        s = "".join(out)
    return s.replace(" ", "")


def own_kernel(profiled_name: str, kernels: list[str]) -> bool:
    """Whether a kernel name from the profiler is one of the library's own (template args and params optional)."""
    full, base = qualified_name(profiled_name), qualified_name(profiled_name, templates=False)
    for k in kernels:
        if qualified_name(k) == full or qualified_name(k, templates=False) == base:
            return True
    return False
