"""Stage 1a: random, well-typed operator graphs over KernelBench's operator families, rendered as KernelBench tasks.

A graph is grown one operator at a time from one input (rank 2, 3 or 4). Every operator declares what it accepts and
the shape it returns, as expressions over the task's module-level size constants (`batch_size`, `dim_1`, ...), so
every graph is valid by construction and stays valid when the verifier rescales those constants (its shape
variants). Parameters (Linear, Conv, norms, biases) are built in `Model.__init__` from `get_init_inputs()`, as in
KernelBench. Seeded: `generate(seed, spec)` is reproducible; `spec` holds the difficulty knobs (operators per graph,
families, fusion depth = how many binary merges join earlier branches).

Not covered (named, not silently missing): dtypes other than fp32 (stage 1c variants), scatter, attention, 3-D
convolutions, transposed convolutions, RNNs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

FAMILIES = ("elementwise", "activation", "broadcast", "binary", "reduction", "normalization", "softmax", "matmul",
            "convolution", "pooling", "indexing", "scan", "reshape", "loss")


@dataclass
class GraphSpec:
    min_ops: int = 2
    max_ops: int = 5
    families: tuple[str, ...] = FAMILIES
    fusion_depth: int = 1  # binary merges of two live branches, at most
    ranks: tuple[int, ...] = (2, 3, 4)
    size: float = 1.0  # multiplies the drawn sizes (KernelBench level-1 sizes are ~4-16x the defaults)

    def __post_init__(self):
        if unknown := sorted(set(self.families) - set(FAMILIES)):
            raise ValueError(f"unknown operator families {unknown}; known: {', '.join(FAMILIES)}")
        if not 1 <= self.min_ops <= self.max_ops:
            raise ValueError(f"need 1 <= min_ops <= max_ops, got {self.min_ops}, {self.max_ops}")
        if not set(self.ranks) <= {2, 3, 4}:
            raise ValueError(f"ranks must be among 2, 3, 4, not {self.ranks}")


@dataclass
class Value:
    name: str
    shape: tuple[str, ...]  # each dim an expression over the size constants


@dataclass
class Graph:
    seed: int
    sizes: dict[str, int] = field(default_factory=dict)  # module-level constants, in order
    inputs: list[Value] = field(default_factory=list)
    init_args: list[tuple[str, str]] = field(default_factory=list)  # (parameter name, expression)
    modules: list[str] = field(default_factory=list)  # lines of __init__
    body: list[str] = field(default_factory=list)  # lines of forward
    ops: list[str] = field(default_factory=list)  # operator names, in order
    families: list[str] = field(default_factory=list)
    out: Value | None = None
    _n: int = 0

    def fresh(self, prefix: str = "t") -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def size(self, rng: random.Random, choices: tuple[int, ...], scale: float, prefix: str = "dim") -> str:
        name = f"{prefix}_{len(self.sizes)}" if prefix in ("dim", "channels", "features") else prefix
        self.sizes[name] = max(2, int(rng.choice(choices) * scale))
        return name

    def value(self, expr: str) -> int:
        """A dim's size at the task's own constants."""
        return int(eval(expr, {}, dict(self.sizes)))  # expressions are the generator's own: names, ints, * and //

    def init_arg(self, expr: str, prefix: str) -> str:
        for name, e in self.init_args:
            if e == expr:
                return name
        name = f"{prefix}_{len(self.init_args)}"
        self.init_args.append((name, expr))
        return name

    def emit(self, op: str, family: str, expr: str, shape: tuple[str, ...]) -> Value:
        v = Value(self.fresh(), shape)
        self.body.append(f"{v.name} = {expr}")
        self.ops.append(op)
        self.families.append(family)
        return v


# ---- operators: (graph, value, rng, spec) -> new value, or None where the operator does not apply --------------------
Op = Callable[[Graph, Value, random.Random, GraphSpec], "Value | None"]

_ACT = {"relu": "torch.relu({x})", "gelu": "F.gelu({x})", "sigmoid": "torch.sigmoid({x})", "tanh": "torch.tanh({x})",
        "silu": "F.silu({x})", "leaky_relu": "F.leaky_relu({x}, 0.01)", "hardtanh": "F.hardtanh({x}, -1.0, 1.0)",
        "softplus": "F.softplus({x})", "mish": "F.mish({x})", "elu": "F.elu({x})"}
_ELT = {"scale": "{x} * 0.5", "shift": "{x} + 0.25", "abs": "torch.abs({x})",
        "clamp": "torch.clamp({x}, min=-0.5, max=0.5)", "square": "{x} * {x}"}


def _activation(g, x, rng, spec):
    name = rng.choice(sorted(_ACT))
    return g.emit(name, "activation", _ACT[name].format(x=x.name), x.shape)


def _elementwise(g, x, rng, spec):
    name = rng.choice(sorted(_ELT))
    return g.emit(name, "elementwise", _ELT[name].format(x=x.name), x.shape)


def _broadcast(g, x, rng, spec):
    """A learned bias over the last dim, or a per-channel scale (rank 4: shaped C x 1 x 1)."""
    p = f"p{len(g.modules)}"
    if len(x.shape) == 4 and rng.random() < 0.5:
        c = g.init_arg(x.shape[1], "channels")
        g.modules.append(f"self.{p} = nn.Parameter(torch.randn({c}, 1, 1) * 0.1 + 1.0)")
        return g.emit("channel_scale", "broadcast", f"{x.name} * self.{p}", x.shape)
    f = g.init_arg(x.shape[-1], "features")
    g.modules.append(f"self.{p} = nn.Parameter(torch.randn({f}) * 0.1)")
    return g.emit("bias_add", "broadcast", f"{x.name} + self.{p}", x.shape)


def _reduction(g, x, rng, spec):
    dim = rng.randrange(1, len(x.shape))
    name = rng.choice(("sum", "mean", "amax"))
    shape = x.shape[:dim] + ("1",) + x.shape[dim + 1:]
    return g.emit(f"{name}_dim", "reduction", f"torch.{name}({x.name}, dim={dim}, keepdim=True)", shape)


def _normalization(g, x, rng, spec):
    m = f"norm{len(g.modules)}"
    if x.shape[-1] == "1":
        return None
    choice = rng.choice(("layer_norm", "rms_norm") + (("instance_norm", "batch_norm") if len(x.shape) == 4 else ()))
    if choice == "layer_norm":
        f = g.init_arg(x.shape[-1], "features")
        g.modules.append(f"self.{m} = nn.LayerNorm({f})")
        return g.emit("layer_norm", "normalization", f"self.{m}({x.name})", x.shape)
    if choice == "rms_norm":
        expr = f"{x.name} * torch.rsqrt({x.name}.pow(2).mean(dim=-1, keepdim=True) + 1e-6)"
        return g.emit("rms_norm", "normalization", expr, x.shape)
    if choice == "instance_norm":
        return g.emit("instance_norm", "normalization", f"F.instance_norm({x.name})", x.shape)
    # batch statistics, no running buffers: forward leaves no state behind
    return g.emit("batch_norm", "normalization", f"F.batch_norm({x.name}, None, None, training=True)", x.shape)


def _softmax(g, x, rng, spec):
    if x.shape[-1] == "1":
        return None
    name = rng.choice(("softmax", "log_softmax"))
    return g.emit(name, "softmax", f"torch.{name}({x.name}, dim=-1)", x.shape)


def _matmul(g, x, rng, spec):
    if x.shape[-1] == "1" or len(x.shape) == 4:
        return None
    if len(x.shape) == 3 and rng.random() < 0.3:  # a Gram matrix: batched matmul with the transpose
        return g.emit("bmm", "matmul", f"torch.matmul({x.name}, {x.name}.transpose(-1, -2)) * 0.01",
                      x.shape[:-1] + (x.shape[-2],))
    m = f"linear{len(g.modules)}"
    out = g.size(rng, (128, 256, 384, 500, 512, 768, 1000, 1024), spec.size, "features")
    i, o = g.init_arg(x.shape[-1], "features"), g.init_arg(out, "features")
    g.modules.append(f"self.{m} = nn.Linear({i}, {o})")
    return g.emit("linear", "matmul", f"self.{m}({x.name})", x.shape[:-1] + (out,))


def _convolution(g, x, rng, spec):
    if len(x.shape) not in (3, 4) or "1" in x.shape[1:]:
        return None
    m = f"conv{len(g.modules)}"
    k = rng.choice((1, 3, 5))
    out = g.size(rng, (8, 16, 24, 32, 48, 64), 1.0, "channels")
    i, o = g.init_arg(x.shape[1], "channels"), g.init_arg(out, "channels")
    kind = "Conv2d" if len(x.shape) == 4 else "Conv1d"
    g.modules.append(f"self.{m} = nn.{kind}({i}, {o}, {k}, padding={k // 2})")
    return g.emit(kind.lower(), "convolution", f"self.{m}({x.name})", (x.shape[0], out) + x.shape[2:])


def _pooling(g, x, rng, spec):
    # at least 8 wide: still >= 2 after pooling when the verifier shrinks the sizes (x0.75) for its shape variant
    if len(x.shape) not in (3, 4) or any(g.value(s) < 8 for s in x.shape[2:]):
        return None
    name = rng.choice(("max", "avg"))
    d = "2d" if len(x.shape) == 4 else "1d"
    shape = x.shape[:2] + tuple(f"({s}) // 2" for s in x.shape[2:])
    return g.emit(f"{name}_pool{d}", "pooling", f"F.{name}_pool{d}({x.name}, 2)", shape)


def _indexing(g, x, rng, spec):
    """Every other element of the last dim, through an index buffer (gather-style access)."""
    if x.shape[-1] == "1":
        return None
    b = f"idx{len(g.modules)}"
    f = g.init_arg(x.shape[-1], "features")
    g.modules.append(f"self.register_buffer('{b}', torch.arange(0, {f}, 2))")
    return g.emit("index_select", "indexing", f"torch.index_select({x.name}, -1, self.{b})",
                  x.shape[:-1] + (f"(({x.shape[-1]}) + 1) // 2",))


def _scan(g, x, rng, spec):
    name = rng.choice(("cumsum", "cumprod")) if x.shape[-1] != "1" else "cumsum"
    inner = f"torch.sigmoid({x.name})" if name == "cumprod" else x.name  # keeps the product in (0, 1)
    return g.emit(name, "scan", f"torch.{name}({inner}, dim=-1)", x.shape)


def _reshape(g, x, rng, spec):
    if len(x.shape) >= 3 and rng.random() < 0.5:
        return g.emit("flatten", "reshape", f"torch.flatten({x.name}, 1)",
                      (x.shape[0], " * ".join(f"({s})" for s in x.shape[1:])))
    return g.emit("transpose", "reshape", f"{x.name}.transpose(-1, -2)", x.shape[:-2] + (x.shape[-1], x.shape[-2]))


OPS: dict[str, Op] = {"elementwise": _elementwise, "activation": _activation, "broadcast": _broadcast,
                      "reduction": _reduction, "normalization": _normalization, "softmax": _softmax,
                      "matmul": _matmul, "convolution": _convolution, "pooling": _pooling, "indexing": _indexing,
                      "scan": _scan, "reshape": _reshape}
_LOSSES = {"mse_loss": "F.mse_loss({x}, {y})", "smooth_l1_loss": "F.smooth_l1_loss({x}, {y})",
           "hinge_loss": "torch.mean(torch.clamp(1 - {x} * {y}, min=0))"}


def _first_input(g: Graph, rng: random.Random, spec: GraphSpec) -> Value:
    rank = rng.choice(spec.ranks)
    batch = g.size(rng, (8, 16, 32, 64), 1.0, "batch_size")
    if rank == 2:
        dims = (g.size(rng, (256, 512, 1000, 1024, 2048, 4000), spec.size),)
    elif rank == 3:
        dims = (g.size(rng, (16, 32, 64, 100, 128), spec.size), g.size(rng, (64, 128, 250, 256, 512), spec.size))
    else:
        dims = (g.size(rng, (3, 8, 16, 32), 1.0, "channels"), g.size(rng, (16, 24, 32, 50, 64), spec.size),
                g.size(rng, (16, 24, 32, 50, 64), spec.size))
    x = Value("x", (batch,) + dims)
    g.inputs.append(x)
    return x


def generate(seed: int, spec: GraphSpec | None = None) -> Graph:
    spec = spec or GraphSpec()
    rng = random.Random(seed)
    g = Graph(seed)
    live = [_first_input(g, rng, spec)]
    n_ops = rng.randint(spec.min_ops, spec.max_ops)
    unary = [f for f in spec.families if f in OPS]
    merges = 0
    while len(g.ops) < n_ops:
        x = live[-1]
        twin = [v for v in live[:-1] if v.shape == x.shape]
        if "binary" in spec.families and twin and merges < spec.fusion_depth and rng.random() < 0.5:
            y = rng.choice(twin)
            name = rng.choice(("add", "mul", "maximum", "sub"))
            expr = {"add": "{x} + {y}", "mul": "{x} * {y}", "sub": "{x} - {y}",
                    "maximum": "torch.maximum({x}, {y})"}[name].format(x=x.name, y=y.name)
            live.append(g.emit(name, "binary", expr, x.shape))
            merges += 1
            continue
        if not unary:
            break
        for _ in range(20):  # an operator that applies to this value
            v = OPS[rng.choice(unary)](g, x, rng, spec)
            if v is not None:
                live.append(v)
                break
        else:
            break
    out = live[-1]
    if "loss" in spec.families and rng.random() < 0.1:  # a mean over everything: often input-insensitive
        target = Value("target", out.shape)
        g.inputs.append(target)
        name = rng.choice(sorted(_LOSSES))
        out = g.emit(name, "loss", _LOSSES[name].format(x=out.name, y=target.name), ())
    g.out = out
    return g


def render(g: Graph) -> str:
    """KernelBench-format source: `Model`, module-level size constants, `get_inputs`, `get_init_inputs`."""
    args = "".join(f", {name}" for name, _ in g.init_args)
    init = "\n        ".join(g.modules) or "pass"
    body = "\n        ".join(g.body)
    sig = ", ".join(v.name for v in g.inputs)
    sizes = "\n".join(f"{k} = {v}" for k, v in g.sizes.items())
    inputs = ", ".join(f"torch.rand({', '.join(v.shape)})" for v in g.inputs)
    init_inputs = ", ".join(expr for _, expr in g.init_args)
    return f'''import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """{" -> ".join(g.ops)} (generated, seed {g.seed})"""

    def __init__(self{args}):
        super().__init__()
        {init}

    def forward(self, {sig}):
        {body}
        return {g.out.name}


{sizes}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return [{init_inputs}]
'''


def task_name(g: Graph) -> str:
    short = "_".join(dict.fromkeys(g.ops))[:60]
    return f"{g.seed}_{short}"
