"""Correctness: compare a candidate's output with the reference's, structure first, then values."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Captured at import, before any candidate code exists in the process: later patches of torch do not reach these.
_isclose = torch.isclose
_isfinite = torch.isfinite
_equal = torch.equal
_TensorType = torch.Tensor


@dataclass
class Comparison:
    ok: bool
    reason: str = ""
    max_abs: float | None = None
    mean_abs: float | None = None
    where: str | None = None


def _leaves(obj, path="out"):
    if isinstance(obj, (list, tuple)):
        for i, o in enumerate(obj):
            yield from _leaves(o, f"{path}[{i}]")
    else:
        yield path, obj


def compare(out, ref, tol: float) -> Comparison:
    """atol = rtol = tol; NaN/Inf must match the reference's; all-zero output against non-zero reference fails."""
    outs, refs = list(_leaves(out)), list(_leaves(ref))
    if len(outs) != len(refs):
        return Comparison(False, f"output has {len(outs)} values, reference has {len(refs)}")
    worst = Comparison(True, max_abs=0.0, mean_abs=0.0)
    for (path, o), (_, r) in zip(outs, refs):
        if not isinstance(r, _TensorType):
            if o != r:
                return Comparison(False, f"{path} is {o!r}, expected {r!r}")
            continue
        if type(o) is not _TensorType:  # subclasses can lie in comparisons
            return Comparison(False, f"{path} is {type(o).__module__}.{type(o).__name__}, not a plain torch.Tensor")
        if o.shape != r.shape:
            return Comparison(False, f"{path} has shape {tuple(o.shape)}, expected {tuple(r.shape)}")
        if o.dtype != r.dtype:
            return Comparison(False, f"{path} has dtype {o.dtype}, expected {r.dtype}")
        if o.device != r.device:
            return Comparison(False, f"{path} is on {o.device}, expected {r.device}")
        if o.numel() == 0:
            continue
        of, rf = o.detach().double(), r.detach().double()
        ofin, rfin = _isfinite(of), _isfinite(rf)
        if not _equal(ofin, rfin):
            bad = int((ofin != rfin).sum())
            return Comparison(False, f"{path} has {bad} NaN/Inf values where the reference differs")
        if not bool(rfin.all()) and not _equal(of[~rfin].nan_to_num(), rf[~rfin].nan_to_num()):
            return Comparison(False, f"{path} non-finite values differ from the reference's")
        of, rf = of[rfin], rf[rfin]
        if of.numel() and not bool(of.any()) and bool(rf.any()):
            return Comparison(False, f"{path} is all zeros but the reference is not")
        diff = (of - rf).abs()
        mx = float(diff.max()) if diff.numel() else 0.0
        mean = float(diff.mean()) if diff.numel() else 0.0
        close = _isclose(of, rf, rtol=tol, atol=tol)
        if not bool(close.all()):
            idx = int((diff - tol * rf.abs()).argmax())
            where = _unravel(idx, o, rfin)
            return Comparison(False, f"{path} mismatch: max abs error {mx:.3g}, mean {mean:.3g}, "
                              f"{int((~close).sum())}/{close.numel()} elements over tolerance {tol:g}, worst at {where}",
                              mx, mean, where)
        if mx >= (worst.max_abs or 0.0):
            worst = Comparison(True, max_abs=mx, mean_abs=mean)
    return worst


def _unravel(flat_idx: int, t: torch.Tensor, mask: torch.Tensor) -> str:
    full = int(mask.reshape(-1).nonzero()[flat_idx]) if not bool(mask.all()) else flat_idx
    idx = []
    for s in reversed(t.shape):
        idx.append(full % s)
        full //= s
    return "index " + str(tuple(reversed(idx)))


def inputs_unchanged(before: list, after: list) -> str | None:
    """The reason if the candidate modified any input in place (NaNs compare equal)."""
    for i, (b, a) in enumerate(zip(_leaves(before), _leaves(after))):
        (_, bt), (_, at) = b, a
        if isinstance(bt, _TensorType):
            same = bt.shape == at.shape and (_equal(bt.nan_to_num(), at.nan_to_num()) if bt.is_floating_point()
                                             else _equal(bt, at))
            if not same:
                return f"the candidate modified input #{i} in place"
    return None
