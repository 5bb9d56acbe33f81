"""Correctness: compare a candidate's output with the reference's, structure first, then values."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from musacoder.verifier.inputs import slice_elements

# Captured at import, before any candidate code exists in the process: later patches of torch do not reach these.
_isfinite = torch.isfinite
_equal = torch.equal
_isnan = torch.isnan
_dot = torch.dot
_f64 = torch.float64
_f32 = torch.float32
_zeros = torch.zeros
_maximum = torch.maximum
_stack = torch.stack
_TensorType = torch.Tensor


@dataclass
class Comparison:
    ok: bool
    reason: str = ""
    max_abs: float | None = None
    mean_abs: float | None = None
    where: str | None = None
    rel_error: float | None = None  # set when only the relative L2 check failed (every element within atol)
    leaf: int = 0  # the output leaf the result is about


def _leaves(obj, path="out"):
    if isinstance(obj, (list, tuple)):
        for i, o in enumerate(obj):
            yield from _leaves(o, f"{path}[{i}]")
    else:
        yield path, obj


def _work_dtype(t):
    """What values are compared in: float32 for float32/16/bf16 (|o - r| against atol + rtol*|r| is then off by a few
    float32 ulp, 1e-7 relative, far below any tolerance, at half float64's memory traffic); float64 for float64 and
    for integers (exact to 2**53)."""
    return _f32 if t.is_floating_point() and t.dtype != _f64 else _f64


def compare(out, ref, tol: float, rel_l2: float | list | None = None) -> Comparison:
    """atol = rtol = tol; NaN/Inf must match the reference's; all-zero output against non-zero reference fails;
    with `rel_l2`, also ||out - ref||_2 <= rel_l2 * ||ref||_2 over the finite values (scale-aware); a list gives
    each output leaf its own bound."""
    outs, refs = list(_leaves(out)), list(_leaves(ref))
    if len(outs) != len(refs):
        return Comparison(False, f"output has {len(outs)} values, reference has {len(refs)}")
    worst = Comparison(True, max_abs=0.0, mean_abs=0.0)
    for leaf, ((path, o), (_, r)) in enumerate(zip(outs, refs)):
        if not isinstance(r, _TensorType):
            if o != r:
                return Comparison(False, f"{path} is {o!r}, expected {r!r}", leaf=leaf)
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
        bound = rel_l2[leaf] if isinstance(rel_l2, (list, tuple)) else rel_l2
        res = _compare_tensor(path, o.detach().reshape(-1), r.detach().reshape(-1), tol, o.shape, bound)
        res.leaf = leaf
        if not res.ok:
            return res
        if res.max_abs >= (worst.max_abs or 0.0):
            worst = res
    return worst


def _compare_tensor(path, o, r, tol, shape, rel_l2=None) -> Comparison:
    """Chunk by chunk, never a full-size temporary (a `(o - r).abs()` of a 6 GB output is 6-12 GB more); the sums
    and counts stay on the device until one read at the end, so a large output costs memory traffic, not a host round
    trip per chunk."""
    n, step, work = o.numel(), slice_elements(o.device), _work_dtype(o)
    stats = _lean_stats(o, r, tol, rel_l2 is not None, step, work)
    if stats is None:  # a NaN or Inf somewhere: the exact pass decides
        stats = _exact_stats(o, r, tol, rel_l2 is not None, step, work)
    finite_bad, nonfinite_bad, bad, any_out, any_ref, mx, total, sq_diff, sq_ref = stats
    if finite_bad:
        return Comparison(False, f"{path} has {int(finite_bad)} NaN/Inf values where the reference differs")
    if nonfinite_bad:
        return Comparison(False, f"{path} non-finite values differ from the reference's")
    mean = total / n
    if not any_out and any_ref:
        return Comparison(False, f"{path} is all zeros but the reference is not")
    if bad:  # before the relative check, whose message says every element is within atol
        where = _unravel(_worst(o, r, tol, step, work), shape)
        return Comparison(False, f"{path} mismatch: max abs error {mx:.3g}, mean {mean:.3g}, {int(bad)}/{n} elements "
                          f"over tolerance {tol:g}, worst at {where}", mx, mean, where)
    if rel_l2 is not None and not math.isfinite(sq_diff + sq_ref):  # squares past float32's range: again in float64
        sq_diff, sq_ref = _squares64(o, r, step)
    if rel_l2 is not None and sq_ref > 0 and sq_diff > (rel_l2 ** 2) * sq_ref:
        rel = (sq_diff / sq_ref) ** 0.5
        return Comparison(False, f"{path} relative error {rel:.3g} (L2, against the reference's magnitude) is over "
                          f"{rel_l2:.3g}, although every element is within atol {tol:g}", mx, mean, rel_error=rel)
    return Comparison(True, max_abs=mx, mean_abs=mean)


class _Sums:
    """A comparison's counts and sums, on the device until `read`: (NaN/Inf mismatches, non-finite mismatches,
    elements over tolerance, output not all zero, reference not all zero, max |o - r|, sum |o - r|, sum (o - r)^2,
    sum r^2)."""

    def __init__(self, dev):
        z = lambda dtype=_f64: _zeros((), dtype=dtype, device=dev)  # noqa: E731
        self.finite_bad, self.nonfinite_bad, self.over, self.any_out, self.any_ref = z(), z(), z(), z(bool), z(bool)
        self.mx, self.total, self.sq_diff, self.sq_ref = z(), z(), z(), z()

    def add(self, out, ref, diff, tol: float, squares: bool):
        """One slice: its output and reference values (finite) and |out - ref| (`diff`, spent here)."""
        self.any_out |= out.any()
        self.any_ref |= ref.any()
        _maximum(self.mx, diff.max(), out=self.mx)
        self.total += diff.sum()
        if squares:
            self.sq_diff += _dot(diff, diff)
            self.sq_ref += _dot(ref, ref)
        self.over += _over(diff, ref, tol).sum()

    def read(self) -> list:
        """The numbers: the one host synchronisation of a comparison."""
        return _stack([t.to(_f64) for t in (self.finite_bad, self.nonfinite_bad, self.over, self.any_out,
                                            self.any_ref, self.mx, self.total, self.sq_diff, self.sq_ref)]).tolist()


def _lean_stats(o, r, tol: float, squares: bool, step: int, work) -> list | None:
    """_Sums' numbers in one pass of few temporaries; None when some difference is not finite, which is exactly when
    either tensor holds a NaN or an Inf (inf - inf and anything with NaN are NaN) or a difference overflows. The
    work dtype's sub never writes its inputs: no copy is needed."""
    sums = _Sums(o.device)
    finite = _zeros((), dtype=torch.bool, device=o.device).logical_not_()
    for s in range(0, o.numel(), step):
        ow, rw = o[s:s + step].to(work), r[s:s + step].to(work)
        diff = (ow - rw).abs_()
        finite &= _isfinite(diff).all()
        sums.add(ow, rw, diff, tol, squares)
        del ow, rw, diff
    return sums.read() if bool(finite) else None


def _over(diff, r, tol: float):
    """isclose's rule on finite values (atol = rtol = tol), |o - r| > tol + tol * |r|, written as
    |o - r| - tol * |r| > tol in `diff`'s storage (diff is spent afterwards)."""
    return diff.sub_(r.abs(), alpha=tol) > tol


def _exact_stats(o, r, tol: float, squares: bool, step: int, work) -> list:
    """_lean_stats' numbers where NaN or Inf occur: they must sit where the reference's do (NaN for NaN, the same
    infinity for an infinity); the rest is computed over the values that are finite in both."""
    sums = _Sums(o.device)
    for s in range(0, o.numel(), step):
        # copies, always (.to of a tensor already in the work dtype is the tensor itself): the in-place ops below
        # must never reach the judge's buffers
        of, rf = o[s:s + step].to(work, copy=True), r[s:s + step].to(work, copy=True)
        ofin, rfin = _isfinite(of), _isfinite(rf)
        sums.finite_bad += (ofin != rfin).sum()
        sums.nonfinite_bad += (~rfin & (of != rf) & ~(_isnan(of) & _isnan(rf))).sum()
        either = ~(ofin & rfin)
        of.masked_fill_(either, 0.0)
        rf.masked_fill_(either, 0.0)
        del ofin, rfin, either
        sums.add(of, rf, (of - rf).abs_(), tol, squares)
        del of, rf
    return sums.read()


def _finite_copies(o, r, s: int, step: int, dtype):
    of, rf = o[s:s + step].to(dtype, copy=True), r[s:s + step].to(dtype, copy=True)
    either = ~(_isfinite(of) & _isfinite(rf))
    return of.masked_fill_(either, 0.0), rf.masked_fill_(either, 0.0)


def _worst(o, r, tol: float, step: int, work) -> int:
    """The flat index where the error is largest against its tolerance (a failure's report: a second pass)."""
    best, at = -math.inf, 0
    for s in range(0, o.numel(), step):
        of, rf = _finite_copies(o, r, s, step, work)
        allowed = rf.abs().mul_(tol)
        score = of.sub_(rf).abs_().sub_(allowed)
        k = int(score.argmax())
        if float(score[k]) > best:
            best, at = float(score[k]), s + k
    return at


def _squares64(o, r, step: int) -> tuple[float, float]:
    """sum((o - r)^2) and sum(r^2) over the finite values, in float64."""
    sq_diff = sq_ref = 0.0
    for s in range(0, o.numel(), step):
        of, rf = _finite_copies(o, r, s, step, _f64)
        diff = of.sub_(rf)
        sq_diff += float(_dot(diff, diff))
        sq_ref += float(_dot(rf, rf))
    return sq_diff, sq_ref


def _unravel(flat_idx: int, shape) -> str:
    idx = []
    for size in reversed(shape):
        idx.append(flat_idx % size)
        flat_idx //= size
    return "index " + str(tuple(reversed(idx)))


def inputs_unchanged(before: list, after: list) -> str | None:
    """The reason if the candidate modified any input in place: every element equal, or NaN in both (NaN payloads and
    the sign of zero are not compared). Compared a chunk at a time, never a full-size temporary."""
    for i, (b, a) in enumerate(zip(_leaves(before), _leaves(after))):
        (_, bt), (_, at) = b, a
        if isinstance(bt, _TensorType):
            if bt.shape != at.shape or not _same_values(bt.reshape(-1), at.reshape(-1)):
                return f"the candidate modified input #{i} in place"
    return None


def all_finite(t) -> bool:
    """No NaN or Inf in `t`, a chunk at a time (isfinite of a whole tensor allocates ~2x its size)."""
    flat, step = t.reshape(-1), slice_elements(t.device)
    return all(bool(_isfinite(flat[s:s + step]).all()) for s in range(0, flat.numel(), step))


def _same_values(b, a) -> bool:
    step = slice_elements(b.device)
    for s in range(0, b.numel(), step):
        x, y = b[s:s + step], a[s:s + step]
        if _equal(x, y):
            continue
        if not (x.is_floating_point() or x.is_complex()) or not bool(((x == y) | (_isnan(x) & _isnan(y))).all()):
            return False
    return True
