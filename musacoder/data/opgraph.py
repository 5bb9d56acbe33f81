"""A task's computation as a canonical op graph, whatever its rank, sizes or spelling: the key `synth decontam`'s
`opgraph` detector, `synth dedupe`, `synth split` and `synth twins` compare.

One forward runs under a TorchDispatchMode (on the meta device: no memory, no compute) that records every aten op
with the ops whose outputs it reads, so the graph has its data flow, not only its op sequence (`relu(x) * x` and
`relu(x) * relu(x)` run the same ops). Canonical means:

- Same spelling, same graph: aliases dispatch to one aten op (`torch.relu`, `F.relu`, `nn.ReLU`, `x.relu()`;
  `x.sum(1)` and `torch.sum(x, 1)`); composite ops are decomposed by torch's own decomposition table
  (`torch._decomp`) for the activations, norms, softmaxes, losses and fused matmuls whose spelled-out forms are common
  (`F.silu(x)` is `x * torch.sigmoid(x)`, `F.hardtanh` a clamp, `nn.LayerNorm` its mean/var/rsqrt formula, `addmm`
  a matmul then an add); in-place ops are their out-of-place ops; `x / 2` is `x * 0.5`, `x - 1` is `x + -1`,
  `x ** 2` and `torch.square(x)` are `x * x`, `x.max(d).values` is `x.amax(d)`, `clamp(x, min=0)` is `relu(x)`.
- No ranks, sizes or hyper-parameters: views, reshapes, expands, casts and copies are transparent (a Linear on a
  rank-3 input runs view-addmm-view, on rank 2 addmm); integer and float arguments (dims, sizes, kernel sizes, eps,
  slopes, scalars) do not count, nor do dtypes (a fp16 variant is its fp32 task); 1-d, 2-d and 3-d variants of an op
  are one op (`max_pool1d` is `max_pool2d` on an unsqueezed input anyway). Boolean arguments count
  (`convolution[transposed=True]` is another problem), after their schema defaults are filled in, except the
  shape-only `keepdim` and backend switches.
- No argument order: inputs, parameters and buffers are anonymous tensors numbered by where the computation first
  reads them (so `forward(x, y)` and `forward(y, x)` are one problem), the operands of commutative ops (add, mul,
  maximum, ...) are sorted, and operands a pointwise op broadcasts (a bias over the last dim) are marked as such.
- Transposes: of a weight, dropped (its layout is the author's choice: `x @ W.t()` is a Linear); of anything else,
  pushed through ops of one tensor operand towards the output, where they are dropped (`transpose(x) * 0.5` is
  `transpose(x * 0.5)`, and under the dims-do-not-count rule a reduction of a transpose is that reduction), so they
  count only where they change what an op of several operands combines (`A.T @ B` is not `A @ B`).

What stays distinct: another op or another flag, another data flow (`x * x` against `x * y`, `relu(x) + x`
against `relu(x) + relu(x)`), a broadcast operand against a full one (`x + bias` against `x + y`). Known limits:
mathematically equal formulas that torch does not decompose to one form (`1 / (1 + exp(-x))` against `sigmoid`),
and computations that differ only in which dims they reduce (instance norm is batch norm over a reshaped input).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from functools import cache
from typing import NamedTuple

PASS = frozenset({"view", "_unsafe_view", "reshape", "_reshape_alias", "unsqueeze", "squeeze", "expand", "expand_as",
                  "flatten", "unflatten", "view_as", "as_strided", "alias", "detach", "lift_fresh", "lift_fresh_copy",
                  "clone", "contiguous", "_to_copy", "to", "type_as", "resolve_conj", "resolve_neg", "_conj"})
TRANSPOSES = frozenset({"t", "transpose", "permute", "numpy_T", "mT", "adjoint", "swapaxes", "swapdims", "movedim"})
ALLOC = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
                   "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "scalar_tensor",
                   "fill", "zero"})
COMMUTATIVE = frozenset({"add.Tensor", "mul.Tensor", "maximum", "minimum", "fmax", "fmin", "eq.Tensor", "ne.Tensor",
                         "logical_and", "logical_or", "logical_xor", "bitwise_and.Tensor", "bitwise_or.Tensor",
                         "bitwise_xor.Tensor", "hypot"})
IGNORED_FLAGS = frozenset({"keepdim", "half_to_float", "non_blocking", "copy", "cudnn_enabled", "benchmark",
                           "deterministic", "allow_tf32", "cudnn_enable"})
RENAMES = {"bmm": "mm", "mv": "mm", "dot": "mm", "max.dim": "amax", "min.dim": "amin", "hardtanh": "clamp",
           "clamp_min": "clamp", "clamp_max": "clamp"}
# composite ops whose spelled-out forms are common: decomposed by torch's own table, so both spellings meet
_DECOMPOSED = ("silu", "mish", "hardtanh", "hardswish", "hardsigmoid", "relu6", "gelu", "leaky_relu", "_softmax",
               "_log_softmax", "logsumexp", "native_layer_norm", "native_batch_norm", "_native_batch_norm_legit",
               "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "rsub", "threshold")
_ND = re.compile(r"(?<=[a-z])_?[123]d(?=_|$)")


class Ref(NamedTuple):
    """An operand: what produced it (("n", node) or ("leaf", k)), which of its outputs, transposed or not."""

    key: tuple
    out: int = 0
    transposed: bool = False


@dataclass
class Node:
    label: str
    children: tuple[Ref, ...]
    marks: tuple[str, ...]  # per child: "^" when the (pointwise) op broadcasts it
    commutative: bool


@dataclass
class OpGraph:
    nodes: list[Node] = field(default_factory=list)
    leaves: list[str] = field(default_factory=list)  # leaf k's label: tensor:f (float), tensor:i, tensor:b, alloc
    outputs: list[Ref] = field(default_factory=list)
    truncated: bool = False

    def canonical(self) -> str:
        """The graph as text, independent of names, argument order, ranks and sizes (the module docstring)."""
        hashes = self._tree_hashes()
        ids: dict[tuple, int] = {}
        tokens: list[str] = []
        outs = self.outputs if not self.truncated else self._sinks(hashes)
        stack: list[tuple[str, object]] = []
        for i, r in enumerate(reversed(outs)):
            stack.append(("ref", (r._replace(transposed=False), "")))
            if i < len(outs) - 1:
                stack.append(("text", ";"))
        while stack:  # iterative: an unrolled RNN's graph is thousands of nodes deep
            kind, item = stack.pop()
            if kind == "text":
                tokens.append(item)
                continue
            r, mark = item
            suffix = (f".{r.out}" if r.out else "") + ("'" if r.transposed else "") + mark
            if r.key in ids:
                tokens.append(f"#{ids[r.key]}{suffix}")
                continue
            ids[r.key] = len(ids)
            if r.key[0] == "leaf":
                tokens.append(self.leaves[r.key[1]] + suffix)
                continue
            node = self.nodes[r.key[1]]
            operands = list(zip(node.children, node.marks))
            if node.commutative:
                operands.sort(key=lambda cm: self._ref_hash(hashes, cm[0]) + cm[1])
            tokens.append(node.label + "(")
            stack.append(("text", ")" + suffix))
            for j, cm in enumerate(reversed(operands)):
                stack.append(("ref", cm))
                if j < len(operands) - 1:
                    stack.append(("text", ","))
        return "".join(tokens) + ("+truncated" if self.truncated else "")

    def labels(self) -> list[str]:
        """The node labels in creation order (a readable summary)."""
        return [n.label for n in self.nodes]

    def _ref_hash(self, hashes: list[str], r: Ref) -> str:
        base = self.leaves[r.key[1]] if r.key[0] == "leaf" else hashes[r.key[1]]
        return _h(f"{base}.{r.out}{chr(39) if r.transposed else ''}")

    def _tree_hashes(self) -> list[str]:
        """Per node, a hash of the computation it unfolds to (the order commutative operands are sorted in); nodes
        are created after their operands, so one pass in creation order suffices."""
        hashes: list[str] = []
        for n in self.nodes:
            parts = [self._ref_hash(hashes, c) + m for c, m in zip(n.children, n.marks)]
            hashes.append(_h(n.label + "(" + ",".join(sorted(parts) if n.commutative else parts) + ")"))
        return hashes

    def _sinks(self, hashes: list[str]) -> list[Ref]:
        """A truncated trace has no outputs: the nodes nothing read, in the order of their hashes."""
        used = {c.key for n in self.nodes for c in n.children}
        sinks = [i for i in range(len(self.nodes)) if ("n", i) not in used]
        return [Ref(("n", i)) for i in sorted(sinks, key=lambda i: hashes[i])]


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def graph_key(canonical: str) -> str:
    return hashlib.sha256(canonical.encode()).hexdigest()


@cache
def _decompositions() -> dict:
    import torch
    from torch._decomp import get_decompositions

    aten = torch.ops.aten
    return get_decompositions([getattr(aten, n) for n in _DECOMPOSED if hasattr(aten, n)])


def _label(func) -> str:
    ns, _, name = func._schema.name.partition("::")
    base, overload = name, func._overloadname
    if base.endswith("_") and not base.endswith("__"):
        base = base[:-1]  # in-place: the same computation
    base = _ND.sub("Nd", base.lstrip("_")).replace("_with_indices", "")
    label = base if overload in ("default", "") else f"{base}.{overload}"
    label = RENAMES.get(label, RENAMES.get(base, label))
    return label if ns == "aten" else f"{ns}::{label}"


def _flags(func, args, kwargs) -> str:
    """The op's boolean arguments (schema defaults filled in), but the shape-only and backend ones."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.name in IGNORED_FLAGS or str(a.type) != "bool":
            continue
        v = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name, a.default_value
                                                                          if a.has_default_value() else None)
        if isinstance(v, bool):
            out.append(f"{a.name}={v}")
    return f"[{','.join(out)}]" if out else ""


class LimitReached(Exception):
    """Raised inside forward once the recorder has `limit` top-level ops: the trace is the prefix."""


def _is_identity(label: str, scalar) -> bool:
    """x + 0, x - 0, x * 1, x / 1: the operand itself."""
    return label in ("add.Tensor", "sub.Tensor") and scalar == 0 or label in ("mul.Tensor", "div.Tensor") \
        and scalar == 1 and not isinstance(scalar, bool)


_BY_SCALAR = {"sub.Tensor": "add.Tensor", "div.Tensor": "mul.Tensor"}


def _rewrite(func, label: str, args, scalar, children: list[Ref], ins: list) -> tuple[str, list[Ref], list]:
    """(label, operand refs, operand tensors) of the op it equals, for an op with a scalar: x - 1 is x + -1, x / 2 is
    x * 0.5, x ** 2 is x * x, clamp(x, min=0) is relu(x)."""
    if label in _BY_SCALAR and scalar is not None:
        return _BY_SCALAR[label], children, ins
    if label == "pow.Tensor_Scalar" and scalar == 2:
        return "mul.Tensor", children * 2, ins * 2
    if func._schema.name in ("aten::clamp", "aten::clamp_min") and scalar == 0 and (len(args) < 3 or args[2] is None):
        return "relu", children, ins
    return label, children, ins


def _push_transposes(children: list[Ref], pointwise: bool) -> tuple[list[Ref], bool]:
    """(operands, output transposed): the transpose of the only operand, or of every operand of a pointwise op, moves
    to the output."""
    if len(children) == 1 and children[0].transposed or pointwise and all(c.transposed for c in children):
        return [c._replace(transposed=False) for c in children], True
    return children, False


class _Recording:
    """What the dispatch mode of `recorder_cls()` does with an op: the graph's bookkeeping and rewrites. Torch-free
    (this module imports without torch): the mode supplies `Tensor`, the `pointwise` tag and `leaf`."""

    Tensor: type
    pointwise: object
    graph: OpGraph
    ops: list[str]
    limit: int
    ignored_ops: frozenset[str]
    refs: dict  # tensor -> Ref, weakly keyed
    weights: set[tuple]
    depth: int  # > 0 inside a decomposition

    def ref(self, t) -> Ref:
        r = self.refs.get(t)
        return r if r is not None else self.leaf(t)  # an input, or a constant the task made outside forward

    def count(self, func, args, kwargs) -> None:
        """A top-level op, with its boolean flags, into `ops`; LimitReached at `limit` ops."""
        name = func.__name__.split(".")[0]
        if "aten::" + name in self.ignored_ops:
            return
        flags = [f"{a.name}={v}" for a, v in zip(func._schema.arguments, args) if isinstance(v, bool)]
        flags += [f"{k}={v}" for k, v in kwargs.items() if isinstance(v, bool)]
        self.ops.append(name + (f"[{','.join(flags)}]" if flags else ""))
        if len(self.ops) >= self.limit:
            self.graph.truncated = True
            raise LimitReached

    def decompose(self, decomposition, args, kwargs):
        """Torch's decomposition run under this mode: its ops are recorded, not counted as top-level ops."""
        self.depth += 1
        try:
            with self:
                return decomposition(*args, **kwargs)
        finally:
            self.depth -= 1

    def record(self, func, args, kwargs, ins: list, outs: list) -> None:
        """An op that returned a tensor; `ins` are the tensors among its arguments, `outs` its outputs."""
        base = func._schema.name.partition("::")[2].rstrip("_")
        if base == "copy" and len(ins) == 2:
            self.refs[ins[0]] = self.ref(ins[1])  # assignment: the destination now holds the source
        elif base in ALLOC or not ins:
            label = "alloc" if base in ALLOC else _label(func)
            for o in outs:
                if isinstance(o, self.Tensor):
                    self.leaf(o, label)
        elif base in PASS:
            self.alias(outs, self.ref(ins[0]))
        elif base in TRANSPOSES:
            self.transpose(ins[0], outs[0])
        else:
            self.node(func, args, kwargs, ins, outs)

    def alias(self, outs: list, r: Ref) -> None:
        """The op's tensor outputs are its operand `r`."""
        for o in outs:
            if isinstance(o, self.Tensor):
                self.refs[o] = r

    def transpose(self, t, out) -> None:
        """Transposed unless it is the identity or of a weight (whose layout is the author's choice)."""
        first = self.ref(t)
        identity = out.shape == t.shape and out.stride() == t.stride()
        flip = not identity and first.key not in self.weights
        self.refs[out] = first._replace(transposed=first.transposed != flip)

    def node(self, func, args, kwargs, ins, outs) -> None:
        """A computing op: a node of the graph, in its canonical form (or its operand, for x * 1)."""
        label = _label(func)
        children = [self.ref(t) for t in ins]
        shape = outs[0].shape if isinstance(outs[0], self.Tensor) else None
        scalar = args[1] if len(args) > 1 and not isinstance(args[1], self.Tensor) else None
        if _is_identity(label, scalar):
            self.alias(outs, children[0])
            return
        if label in ("addmm", "baddbmm", "addmv") and len(ins) == 3:
            self.matmul_add(children, ins[0].shape != shape, outs[0])
            return
        label, children, ins = _rewrite(func, label, args, scalar, children, ins)
        commutative = label in COMMUTATIVE
        if len(ins) == 1 and ins[0].numel() > 1 and shape is not None and math.prod(shape) == 1:
            label += "[all]"  # a reduction over everything, not per row: rank-free, unlike its dims
        label += _flags(func, args, kwargs)
        is_pointwise = self.pointwise in func.tags
        children, out_t = _push_transposes(children, is_pointwise)
        marks = tuple("^" if is_pointwise and shape is not None and t.shape != shape else "" for t in ins)
        key = self.append(label, children, marks, commutative)
        for i, o in enumerate(outs):
            if isinstance(o, self.Tensor):
                self.refs[o] = Ref(key, i, out_t)

    def matmul_add(self, children: list[Ref], broadcast: bool, out) -> None:
        """addmm and its kin as a matmul, then the add (torch's decomposition of these is slow: an RNN runs
        thousands)."""
        product = Ref(self.append("mm", children[1:], ("", ""), False))
        key = self.append("add.Tensor", [product, children[0]], ("", "^" if broadcast else ""), True)
        self.refs[out] = Ref(key)

    def append(self, label: str, children: list[Ref], marks: tuple[str, ...], commutative: bool) -> tuple:
        self.graph.nodes.append(Node(label, tuple(children), marks, commutative))
        return ("n", len(self.graph.nodes) - 1)


@cache
def recorder_cls():
    """The dispatch mode, built on first use (torch is imported then, not with this module)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from torch.utils.weak import WeakIdKeyDictionary

    class Recorder(_Recording, TorchDispatchMode):
        """Records the canonical op graph (`graph`) and the top-level op sequence with boolean flags (`ops`), one
        forward; raises LimitReached after `limit` top-level ops."""

        Tensor = torch.Tensor
        pointwise = torch.Tag.pointwise

        def __init__(self, limit: int, ignored_ops: frozenset[str]):
            super().__init__()
            self.graph = OpGraph()
            self.ops: list[str] = []
            self.limit, self.ignored_ops = limit, ignored_ops
            self.refs = WeakIdKeyDictionary()
            self.weights: set[tuple] = set()
            self.depth = 0

        def leaf(self, t, label: str | None = None, weight: bool = False) -> Ref:
            kind = "f" if t.is_floating_point() or t.is_complex() else "b" if t.dtype == torch.bool else "i"
            self.graph.leaves.append(label or f"tensor:{kind}")
            r = Ref(("leaf", len(self.graph.leaves) - 1))
            self.refs[t] = r
            if weight:
                self.weights.add(r.key)
            return r

        def output_refs(self, out) -> list[Ref]:
            return [self.ref(t)._replace(transposed=False) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]

        def __torch_dispatch__(self, func, types=(), args=(), kwargs=None):
            kwargs = kwargs or {}
            if self.depth == 0:
                self.count(func, args, kwargs)
            decomposition = _decompositions().get(func)
            if decomposition is not None:
                return self.decompose(decomposition, args, kwargs)
            out = func(*args, **kwargs)
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            if any(isinstance(o, torch.Tensor) for o in outs):  # not .item(), sizes
                ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
                self.record(func, args, kwargs, ins, outs)
            return out

    return Recorder


# operator family of an aten op: the first key its name contains (else "elementwise"); synth writes them as metadata
_FAMILY_OF = (("conv", "convolution"), ("pool", "pooling"), ("norm", "normalization"), ("softmax", "softmax"),
              ("mm", "matmul"), ("matmul", "matmul"), ("linear", "matmul"), ("addmm", "matmul"),
              ("loss", "loss"), ("cum", "scan"), ("index", "indexing"), ("gather", "indexing"),
              ("scatter", "indexing"), ("sum", "reduction"), ("mean", "reduction"), ("amax", "reduction"),
              ("max", "reduction"), ("min", "reduction"), ("relu", "activation"), ("gelu", "activation"),
              ("sigmoid", "activation"), ("tanh", "activation"), ("silu", "activation"), ("elu", "activation"),
              ("softplus", "activation"), ("mish", "activation"), ("hardtanh", "activation"),
              ("view", "reshape"), ("reshape", "reshape"), ("transpose", "reshape"), ("permute", "reshape"),
              ("flatten", "reshape"))
IGNORED_OPS = {  # allocation, copies and views: no computation of their own
   "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::to", "aten::_to_copy", "aten::copy_",
    "aten::detach", "aten::resolve_conj", "aten::resolve_neg", "aten::as_strided", "aten::expand",
    "aten::contiguous", "aten::clone", "aten::fill_", "aten::zero_", "aten::zeros", "aten::t",
    "aten::unsqueeze", "aten::squeeze", "aten::select", "aten::slice", "aten::lift_fresh"}


def families_of(aten_ops: list[str]) -> list[str]:
    out = []
    for op in aten_ops:
        name = op.removeprefix("aten::")
        fam = next((f for key, f in _FAMILY_OF if key in name), "elementwise")
        if fam not in out:
            out.append(fam)
    return out
