"""Correctness: compare a candidate's output with the reference's, structure first, then values."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Captured at import, before any candidate code exists in the process: later patches of torch do not reach these.
_isclose = torch.isclose
_isfinite = torch.isfinite
_equal = torch.equal
_isnan = torch.isnan
_dot = torch.dot
_f64 = torch.float64
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


CHUNK = 1 << 20  # elements compared at a time: ~50 MB of float64 temporaries whatever the output's size


def compare(out, ref, tol: float, rel_l2: float | None = None) -> Comparison:
    """atol = rtol = tol; NaN/Inf must match the reference's; all-zero output against non-zero reference fails;
    with `rel_l2`, also ||out - ref||_2 <= rel_l2 * ||ref||_2 over the finite values (scale-aware)."""
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
        res = _compare_tensor(path, o.detach().reshape(-1), r.detach().reshape(-1), tol, o.shape, rel_l2)
        if not res.ok:
            return res
        if res.max_abs >= (worst.max_abs or 0.0):
            worst = res
    return worst


def spot_compare(out, ref, tol: float, k: int = 1 << 16, seed: int = 0) -> Comparison:
    """compare() on k random positions of each large output: what the timed loop checks every iteration. A memoised
    or stale output for other inputs differs almost everywhere, so a sample catches it at a fraction of the cost."""
    outs, refs = list(_leaves(out)), list(_leaves(ref))
    if len(outs) != len(refs) or any(isinstance(r, _TensorType) and (type(o) is not _TensorType or o.shape != r.shape)
                                     for o, r in zip((x for _, x in outs), (x for _, x in refs))):
        return compare(out, ref, tol)  # structure problems: let the full comparison describe them
    for (path, o), (_, r) in zip(outs, refs):
        if isinstance(r, _TensorType) and r.numel() > k:
            idx = torch.randint(0, r.numel(), (k,), device=r.device,
                                generator=torch.Generator(device=r.device).manual_seed(seed))
            res = compare(o.detach().reshape(-1)[idx], r.detach().reshape(-1)[idx], tol)
            if not res.ok:
                return Comparison(False, f"{path} (sampled): " + res.reason.split(" ", 1)[1], res.max_abs, res.mean_abs)
        else:
            res = compare(o, r, tol)
            if not res.ok:
                return res
    return Comparison(True)


def _compare_tensor(path, o, r, tol, shape, rel_l2=None) -> Comparison:
    """Chunk by chunk, in float64 copies of CHUNK elements that are modified in place: the extra memory is a few
    chunks whatever the output's size (a full-size `(o - r).abs()` on a 6 GB output is 12 GB more in float64)."""
    n = o.numel()
    mx, total, bad, any_out, any_ref, worst_at = 0.0, 0.0, 0, False, False, None
    sq_diff = sq_ref = 0.0
    for s in range(0, n, CHUNK):
        # copies, always (.double() of a float64 tensor is the tensor itself): the in-place ops below must never
        # reach the judge's buffers
        of, rf = o[s:s + CHUNK].to(_f64, copy=True), r[s:s + CHUNK].to(_f64, copy=True)
        ofin, rfin = _isfinite(of), _isfinite(rf)
        if not _equal(ofin, rfin):
            return Comparison(False, f"{path} has {int((ofin != rfin).sum())} NaN/Inf values where the reference "
                              "differs")
        del ofin
        if not bool(rfin.all()):
            nonfinite = ~rfin
            if not _equal(of[nonfinite].nan_to_num(), rf[nonfinite].nan_to_num()):
                return Comparison(False, f"{path} non-finite values differ from the reference's")
            of.masked_fill_(nonfinite, 0.0)
            rf.masked_fill_(nonfinite, 0.0)
            del nonfinite
        del rfin
        any_out = any_out or bool(of.any())
        any_ref = any_ref or bool(rf.any())
        nbad = int((~_isclose(of, rf, rtol=tol, atol=tol)).sum())
        diff = of.sub_(rf).abs_()  # of is |out - ref| from here on
        if rel_l2 is not None:
            sq_diff += float(_dot(diff, diff))
            sq_ref += float(_dot(rf, rf))
        mx = max(mx, float(diff.max()))
        total += float(diff.sum())
        if nbad:  # where the error is largest against its tolerance, over all chunks
            score = diff - tol * rf.abs()
            k = int(score.argmax())
            if worst_at is None or float(score[k]) > worst_at[0]:
                worst_at = (float(score[k]), s + k)
            del score
        bad += nbad
        del of, rf, diff
    mean = total / n
    if not any_out and any_ref:
        return Comparison(False, f"{path} is all zeros but the reference is not")
    if bad:  # before the relative check, whose message says every element is within atol
        where = _unravel(worst_at[1], shape)
        return Comparison(False, f"{path} mismatch: max abs error {mx:.3g}, mean {mean:.3g}, {bad}/{n} elements over "
                          f"tolerance {tol:g}, worst at {where}", mx, mean, where)
    if rel_l2 is not None and sq_ref > 0 and sq_diff > (rel_l2 ** 2) * sq_ref:
        return Comparison(False, f"{path} relative error {(sq_diff / sq_ref) ** 0.5:.3g} (L2, against the reference's "
                          f"magnitude) is over {rel_l2:g}, although every element is within atol {tol:g}", mx, mean)
    return Comparison(True, max_abs=mx, mean_abs=mean)


def _unravel(flat_idx: int, shape) -> str:
    idx = []
    for size in reversed(shape):
        idx.append(flat_idx % size)
        flat_idx //= size
    return "index " + str(tuple(reversed(idx)))


def inputs_unchanged(before: list, after: list) -> str | None:
    """The reason if the candidate modified any input in place: every element equal, or NaN in both (NaN payloads and
    the sign of zero are not compared). Compared CHUNK elements at a time, never a full-size temporary."""
    for i, (b, a) in enumerate(zip(_leaves(before), _leaves(after))):
        (_, bt), (_, at) = b, a
        if isinstance(bt, _TensorType):
            if bt.shape != at.shape or not _same_values(bt.reshape(-1), at.reshape(-1)):
                return f"the candidate modified input #{i} in place"
    return None


def all_finite(t) -> bool:
    """No NaN or Inf in `t`, CHUNK elements at a time (isfinite of a whole tensor allocates ~2x its size)."""
    flat = t.reshape(-1)
    return all(bool(_isfinite(flat[s:s + CHUNK]).all()) for s in range(0, flat.numel(), CHUNK))


def _same_values(b, a) -> bool:
    for s in range(0, b.numel(), CHUNK):
        x, y = b[s:s + CHUNK], a[s:s + CHUNK]
        if _equal(x, y):
            continue
        if not (x.is_floating_point() or x.is_complex()) or not bool(((x == y) | (_isnan(x) & _isnan(y))).all()):
            return False
    return True
