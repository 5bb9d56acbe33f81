"""Loading task/candidate modules from source, generating inputs on the device, and input/shape variants."""

from __future__ import annotations

import hashlib
import importlib.util
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def load_module(code: str, prefix: str, cache_root: Path):
    """Import source from a real file (Triton's @jit needs inspect.getsource) under a fresh module name."""
    digest = hashlib.sha256(code.encode()).hexdigest()[:16]
    d = Path(cache_root) / "modules"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{prefix}_{digest}.py"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(code)
        tmp.replace(path)
    name = f"musacoder_{prefix}_{digest}_{len(sys.modules)}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses and pickling inside the module look themselves up here
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def scaled_constants(module, scale: float, min_size: int, ragged=None) -> dict:
    """Module-level size constants (ints >= min_size, or tuples of them) rescaled; {} when there are none.
    `ragged` (a random.Random): each rescaled size then made odd, a secret 1-7 below, so that no power-of-two block
    divides it (power-of-two task sizes scaled by 0.5-0.875 stay multiples of 512 and hide a missing tail guard)."""

    def size(v: int) -> int:
        n = max(1, int(round(v * scale)))
        if ragged is not None:
            n = max(1, n - (1 - n % 2) - 2 * ragged.randrange(0, 4))
        return n

    out = {}
    for k, v in vars(module).items():
        if k.startswith("_"):
            continue
        if isinstance(v, int) and not isinstance(v, bool) and v >= min_size:
            out[k] = size(v)
        elif isinstance(v, tuple) and v and all(isinstance(e, int) and not isinstance(e, bool) for e in v) \
                and any(e >= min_size for e in v):
            out[k] = tuple(size(e) if e >= min_size else e for e in v)
    return out


@dataclass
class Shape:
    """A task shape: the module's own constants, or overrides of them."""

    overrides: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return repr(sorted(self.overrides.items()))

    def apply(self, module):
        old = {k: getattr(module, k) for k in self.overrides}
        for k, v in self.overrides.items():
            setattr(module, k, v)
        return old


def _map(obj, fn):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return obj


def clone_tree(obj):
    return _map(obj, lambda t: t.clone())


def tensor_bytes(obj) -> int:
    total = 0

    def add(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    _map(obj, add)
    return total


def raw_inputs(module, shape: Shape, seed: int, device: torch.device) -> list:
    """The task's get_inputs run under the device (so tensors are born there), seeded."""
    old = shape.apply(module)
    try:
        torch.manual_seed(seed)
        with torch.device(device):
            return list(module.get_inputs())
    finally:
        for k, v in old.items():
            setattr(module, k, v)


FEW = {"negfew": -1.0, "posfew": 1.0}  # the sign of the few lines; the rest have the other one


def _few_lines(shape, transform: str, gen, device) -> torch.Tensor | None:
    """For the `few` variants, which lines of a tensor of `shape` are the few (a boolean table over its lines). A
    line is the values that share their first and last index (in a matrix, a row): a sixteenth of them, at least one,
    drawn from the trial's secret generator and never the line of the first value. `_prep` gives those values a
    magnitude of at least 1 and FEW's sign, and every other value the input's own magnitude with the other sign: a
    reduction initialised with 0 instead of -inf (+inf) is off by 1 or more on the few lines, while a kernel that
    looks at some of its values to spot the negative (positive) trial most likely sees plain inputs."""
    if transform not in FEW:
        return None
    dims = tuple(shape)
    table = dims[:1] + dims[-1:] if len(dims) >= 3 else dims[:1] or (1,)
    n = math.prod(table)
    few = torch.zeros(n, dtype=torch.bool, device=device)
    if n > 1:
        few[torch.randperm(n - 1, generator=gen, device=device)[:max(1, n // 16)] + 1] = True
    return few.view(table)


def _few_mask(few: torch.Tensor | None, shape, start: int, part: torch.Tensor) -> torch.Tensor | None:
    """Which values of `part` are on the few lines, shaped like it: `part` holds the values from `start` on, in
    row-major order, of a tensor of `shape` (the whole of it, or one of the judge's slices of it)."""
    if few is None:
        return None
    dims, stop = tuple(shape), start + part.numel()
    if len(dims) <= 1:
        return (few[start:stop] if dims else few).view(part.shape)
    i = torch.arange(start, stop, device=few.device)
    row = i // (math.prod(dims) // dims[0])
    return (few[row, i % dims[-1]] if len(dims) >= 3 else few[row]).view(part.shape)


def _prep(t: torch.Tensor, device, dtype, transform: str, gen, few=None) -> torch.Tensor:
    """One tensor (or a slice of one) as a trial gets it: on the device, the float variant applied, in `dtype`.
    `few`: for the `few` variants, which of these values are on the few lines (shaped like them)."""
    t = t.to(device)
    if not t.is_floating_point():
        return t
    if few is not None:
        sign, mag = FEW[transform], t.abs()
        t = torch.where(few, sign * (mag + 1), -sign * mag)
    elif transform == "sign":
        t = t * (torch.randint(0, 2, t.shape, generator=gen, device=device, dtype=t.dtype) * 2 - 1)
    elif transform == "neg":  # every value at most -1: a max initialised with 0 instead of -inf shows
        t = -(t.abs() + 1)
    elif transform == "pos":  # every value at least 1: a min initialised with 0 instead of +inf shows
        t = t.abs() + 1
    elif transform.startswith("scale"):
        t = t * float(transform[5:])
    return t.to(dtype)


def make_inputs(module, shape: Shape, seed: int, device: torch.device, precision: str, transform: str = "") -> list:
    """Run the task's get_inputs under the device (so tensors are born there), seeded; optional float variant."""
    inputs = raw_inputs(module, shape, seed, device)
    dtype = DTYPES[precision]
    gen = torch.Generator(device=device).manual_seed(seed + 7919)
    def prep(t):
        return _prep(t, device, dtype, transform, gen, _few_mask(_few_lines(t.shape, transform, gen, device), t.shape,
                                                                 0, t))

    return [_map(x, prep) for x in inputs]


SLICE = 1 << 20  # elements the judge prepares or compares at a time on the cpu: a few 8 MB temporaries at any size
# On an accelerator each slice costs kernel launches and host synchronisations: 1 << 20 made a KernelBench ReLU's five
# trials (1.6e9 elements each) spend ~4 s in them, so slices there are 16x larger (~64 MB a float32 temporary).


def slice_elements(device) -> int:
    return SLICE if torch.device(device).type == "cpu" else SLICE << 4


def fill_inputs(dst: list, inputs: list, seed: int, device: torch.device, precision: str, transform: str = ""):
    """make_inputs' values of `inputs` (raw_inputs' result) written into the judge's buffers `dst` (the top-level
    tensors; other entries are left alone), a slice at a time: no full-size copy of an input is ever made besides
    the buffer itself. The float variants draw their random signs slice by slice from the same seeded generator."""
    dtype, chunk = DTYPES[precision], slice_elements(device)
    gen = torch.Generator(device=device).manual_seed(seed + 7919)
    for d, x in zip(dst, inputs):
        if not isinstance(d, torch.Tensor):
            continue
        if tuple(x.shape) != tuple(d.shape):
            raise ValueError(f"input of shape {tuple(x.shape)} for a buffer of shape {tuple(d.shape)}")
        few = _few_lines(x.shape, transform, gen, device)
        if x.dim() == 0 or x.numel() <= chunk:
            d.copy_(_prep(x, device, dtype, transform, gen, _few_mask(few, x.shape, 0, x)))
        elif x.is_contiguous() and d.is_contiguous():
            xf, df = x.view(-1), d.view(-1)
            for s in range(0, xf.numel(), chunk):
                part = xf[s:s + chunk]
                df[s:s + chunk].copy_(_prep(part, device, dtype, transform, gen, _few_mask(few, x.shape, s, part)))
        else:  # strided (a task's get_inputs returned a transposed view): slices of the first dimension
            step = max(1, chunk // max(1, x[0].numel()))
            for s in range(0, x.shape[0], step):
                rows = x[s:s + step]
                few_rows = _few_mask(few, x.shape, s * x[0].numel(), rows)
                d[s:s + step].copy_(_prep(rows, device, dtype, transform, gen, few_rows))


def init_inputs(module, shape: Shape) -> list:
    old = shape.apply(module)
    try:
        return list(module.get_init_inputs())
    finally:
        for k, v in old.items():
            setattr(module, k, v)
