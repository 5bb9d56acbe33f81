"""Loading task/candidate modules from source, generating inputs on the device, and input/shape variants."""

from __future__ import annotations

import hashlib
import importlib.util
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


def scaled_constants(module, scale: float, min_size: int) -> dict:
    """Module-level size constants (ints >= min_size, or tuples of them) rescaled; {} when there are none."""
    out = {}
    for k, v in vars(module).items():
        if k.startswith("_"):
            continue
        if isinstance(v, int) and not isinstance(v, bool) and v >= min_size:
            out[k] = max(1, int(round(v * scale)))
        elif isinstance(v, tuple) and v and all(isinstance(e, int) and not isinstance(e, bool) for e in v) \
                and any(e >= min_size for e in v):
            out[k] = tuple(max(1, int(round(e * scale))) if e >= min_size else e for e in v)
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


def make_inputs(module, shape: Shape, seed: int, device: torch.device, precision: str, transform: str = "") -> list:
    """Run the task's get_inputs under the device (so tensors are born there), seeded; optional float variant."""
    old = shape.apply(module)
    try:
        torch.manual_seed(seed)
        with torch.device(device):
            inputs = list(module.get_inputs())
    finally:
        for k, v in old.items():
            setattr(module, k, v)
    dtype = DTYPES[precision]
    gen = torch.Generator(device=device).manual_seed(seed + 7919)

    def prep(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device)
        if not t.is_floating_point():
            return t
        if transform == "sign":
            t = t * (torch.randint(0, 2, t.shape, generator=gen, device=device, dtype=t.dtype) * 2 - 1)
        elif transform.startswith("scale"):
            t = t * float(transform[5:])
        return t.to(dtype)

    return [_map(x, prep) for x in inputs]


def init_inputs(module, shape: Shape) -> list:
    old = shape.apply(module)
    try:
        return list(module.get_init_inputs())
    finally:
        for k, v in old.items():
            setattr(module, k, v)
