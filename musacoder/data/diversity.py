"""Structural similarity of kernel implementations: normalised tokens, MinHash/LSH clustering, diversity measures.

Normalisation keeps what makes two implementations different strategies (keywords, kernel builtins and
intrinsics, operators, the shape of loops and indexing) and drops what does not (comments, docstrings, names the
author chose, literal values), so a renamed or re-commented copy lands in its original's cluster.
"""

from __future__ import annotations

import io
import keyword
import re
import tokenize
from collections.abc import Collection
from dataclasses import dataclass
from itertools import combinations

from musacoder.settings import Settings

_CPP_KEYWORDS = """
alignas alignof asm auto bool break case catch char const constexpr continue decltype default delete do double else
enum explicit extern false float for friend goto if inline int long mutable namespace new noexcept nullptr operator
private protected public register reinterpret_cast return short signed sizeof static static_assert static_cast
struct switch template this throw true try typedef typename union unsigned using virtual void volatile while
const_cast dynamic_cast int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t size_t half
""".split()
# Names that say how a kernel works: launch geometry, memory spaces, synchronisation, vector types, OpenMP,
# Triton's language, and the torch extension calls a kernel is built and fed with.
_KERNEL_NAMES = """
threadIdx blockIdx blockDim gridDim warpSize dim3 float2 float4 int4 half2 bfloat16 nv_bfloat16
atomicAdd atomicMax atomicMin atomicCAS cudaStream_t cudaMemcpy cudaMemcpyAsync cudaDeviceSynchronize
expf exp logf log sqrtf rsqrtf fmaxf fminf fabsf tanhf powf max min fmaf
pragma omp parallel simd reduction collapse schedule unroll include
triton jit tl program_id arange load store where dot sum max min exp cdiv constexpr atomic_add
load_inline data_ptr empty empty_like zeros contiguous numel size stride view reshape cuda cpu Tensor torch
""".split()
_KEEP = set(_CPP_KEYWORDS) | set(_KERNEL_NAMES) | set(keyword.kwlist)
# Identifiers (C++ scope `::` kept apart), numbers, two-character operators, any other single character.
_TOKEN_RE = re.compile(r"[A-Za-z_]\w*|\d[\w.]*|::|->|<<|>>|[-+*/%&|^=!<>]=|&&|\|\||\+\+|--|\S")
_CPP_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def _strip_python_comments(code: str) -> str:
    """Python source without comments and docstrings; string contents (the kernel sources) are kept."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return code
    out, prev = [], tokenize.INDENT
    for t in toks:
        if t.type == tokenize.COMMENT:
            continue
        if t.type == tokenize.STRING and prev in (tokenize.INDENT, tokenize.NEWLINE, tokenize.DEDENT):
            prev = t.type  # a bare string statement: a docstring
            continue
        if t.type not in (tokenize.NL, tokenize.COMMENT):
            prev = t.type
        out.append(t.string if t.type != tokenize.STRING else _string_body(t.string))
    return " ".join(out)


def _string_body(s: str) -> str:
    """The text inside a string literal (raw, triple-quoted or not), so the code it holds is tokenised too."""
    s = s.lstrip("rRbBuUfF")
    q = s[:3] if s[:3] in ('"""', "'''") else s[:1]
    return " " + s[len(q):-len(q)] + " "


def normalise(code: str, keep: Collection[str] = ()) -> list[str]:
    """The token sequence two implementations are compared by; `keep`: more names kept as written (task code keeps
    its operators' names, which say what the task computes)."""
    text = _CPP_COMMENT_RE.sub(" ", _strip_python_comments(code))
    out = []
    for tok in _TOKEN_RE.findall(text):
        if tok[0].isdigit():
            out.append("NUM")
        elif tok[0].isalpha() or tok[0] == "_":
            out.append(tok if tok in _KEEP or tok in keep or tok.startswith("__") else "ID")
        else:
            out.append(tok)
    return out


def shingles(code: str, k: int = 5, keep: Collection[str] = ()) -> set[str]:
    toks = normalise(code, keep)
    if len(toks) < k:
        return {" ".join(toks)}
    return {" ".join(toks[i:i + k]) for i in range(len(toks) - k + 1)}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


@dataclass
class ClusterSettings(Settings):
    threshold: float = 0.7  # estimated Jaccard similarity of shingle sets at or above which two share a cluster
    num_perm: int = 128  # MinHash permutations: more is a finer estimate, slower
    shingle: int = 5  # tokens per shingle


def cluster(codes: list[str], settings: ClusterSettings | None = None) -> list[int]:
    """Cluster id per code (0, 1, ... in order of first member): connected components of the pairs that LSH
    proposes and whose MinHash similarity reaches the threshold (single linkage)."""
    from datasketch import MinHash, MinHashLSH

    s = settings or ClusterSettings()
    hashes = []
    for code in codes:
        m = MinHash(num_perm=s.num_perm, seed=1)
        m.update_batch([sh.encode() for sh in shingles(code, s.shingle)])
        hashes.append(m)
    lsh = MinHashLSH(threshold=s.threshold, num_perm=s.num_perm)
    parent = list(range(len(codes)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, m in enumerate(hashes):
        for j in lsh.query(m):
            if m.jaccard(hashes[j]) >= s.threshold:
                parent[root(i)] = root(j)
        lsh.insert(i, m)
    ids: dict[int, int] = {}
    return [ids.setdefault(root(i), len(ids)) for i in range(len(codes))]


def mean_pairwise_distance(codes: list[str], k: int = 5) -> float:
    """Mean exact Jaccard distance (1 - similarity) of shingle sets over all pairs; 0.0 below two codes."""
    sets = [shingles(c, k) for c in codes]
    pairs = list(combinations(sets, 2))
    return sum(1 - jaccard(a, b) for a, b in pairs) / len(pairs) if pairs else 0.0
