"""verifier/correctness.py: comparing outputs and checking inputs, exactly."""


import torch

from musacoder.verifier import inputs as inp
from musacoder.verifier.correctness import compare, inputs_unchanged


def test_compare_structure_and_values():
    r = torch.tensor([1.0, -2.0, 3.0])
    assert compare(r.clone(), r, 1e-4).ok
    assert "shape" in compare(r[:2], r, 1e-4).reason
    assert "dtype" in compare(r.double(), r, 1e-4).reason
    assert "all zeros" in compare(torch.zeros(3), r, 1e-4).reason
    assert "NaN" in compare(torch.tensor([1.0, float("nan"), 3.0]), r, 1e-4).reason
    bad = compare(torch.tensor([1.0, -2.0, 3.01]), r, 1e-4)
    assert not bad.ok and bad.where == "index (2,)" and abs(bad.max_abs - 0.01) < 1e-6

    class Lying(torch.Tensor):
        pass

    assert "not a plain torch.Tensor" in compare(r.clone().as_subclass(Lying), r, 1e-4).reason
    assert "2 values" in compare((r, r), r, 1e-4).reason or "values" in compare((r, r), r, 1e-4).reason


def test_inputs_unchanged():
    a = [torch.ones(3)]
    b = [torch.ones(3)]
    assert inputs_unchanged(a, b) is None
    b[0][1] = 0
    assert "input #0" in inputs_unchanged(a, b)


def test_compare_in_chunks_matches_whole_and_leaves_buffers_alone(monkeypatch):
    """The judge compares SLICE elements at a time in work copies it modifies in place: the result is the
    whole-tensor one, and neither tensor (float64 ones included, whose .double() is themselves) is touched."""

    g = torch.Generator().manual_seed(0)
    r = torch.randn(7, 13, generator=g, dtype=torch.float64)
    o = r + 1e-3 * torch.randn(7, 13, generator=g, dtype=torch.float64)
    o[3, 5], r[4, 1], o[4, 1] = 0.5, float("inf"), float("inf")
    o0, r0 = o.clone(), r.clone()
    small = 1e-5 * torch.randn(7, 13, generator=g, dtype=torch.float64)  # every element within atol, all wrong
    whole, whole_rel = compare(o, r, 1e-4), compare(2 * small, small, 1e-4, 1e-3)
    monkeypatch.setattr(inp, "SLICE", 5)
    chunked, chunked_rel = compare(o, r, 1e-4), compare(2 * small, small, 1e-4, 1e-3)
    assert torch.equal(o, o0) and torch.equal(r, r0)
    assert not chunked.ok and chunked.reason == whole.reason and chunked.where == "index (3, 5)"
    assert not chunked_rel.ok and "relative error" in chunked_rel.reason
    assert chunked_rel.reason.split(" is over")[0] == whole_rel.reason.split(" is over")[0]
    # elements over atol: the mismatch is what is reported, never "every element is within atol"
    assert compare(o, r, 1e-4, 1e-3).reason == whole.reason
    assert compare(r.clone(), r, 1e-4, 1e-3).ok
    nan_late = r.clone()
    nan_late[6, 12] = float("nan")
    assert "NaN" in compare(nan_late, r, 1e-4).reason


def test_compare_counts_like_isclose_in_float64_and_squares_past_float32(monkeypatch):
    """Values are compared in float32 for float32/16/bf16 outputs: the elements counted over tolerance are
    isclose's in float64 (random values, a tenth of them near the bound); an L2 whose squares overflow float32
    is computed again in float64 instead of passing against an infinite reference norm."""
    from musacoder.verifier import correctness

    g = torch.Generator().manual_seed(1)
    r = torch.randn(4099, generator=g)
    o = r + 1e-4 * (1 + r.abs()) * (0.9 + 0.2 * torch.rand(4099, generator=g))
    monkeypatch.setattr(inp, "SLICE", 1000)
    want = int((~torch.isclose(o.double(), r.double(), rtol=1e-4, atol=1e-4)).sum())
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        oo, rr = o.to(dtype), r.to(dtype)
        n = int((~torch.isclose(oo.double(), rr.double(), rtol=1e-4, atol=1e-4)).sum()) if dtype != torch.float32 else want
        res = compare(oo, rr, 1e-4)
        assert 0 < n < 4099 and f" {n}/4099 elements" in res.reason, (dtype, n, res.reason)
    # the lean pass (every difference finite) and the exact one (NaN/Inf present) count the same on finite values
    lean = correctness._lean_stats(o, r, 1e-4, True, 1000, torch.float32)
    assert lean == correctness._exact_stats(o, r, 1e-4, True, 1000, torch.float32) and lean[2] == want
    assert correctness._lean_stats(torch.tensor([1.0, float("inf")]), torch.ones(2), 1e-4, False, 1000,
                                   torch.float32) is None
    big = torch.full((4,), 1e20)
    assert compare(big * 1.01, big, 0.1).ok  # every element within atol + rtol * |ref|
    res = compare(big * 1.01, big, 0.1, 1e-3)
    assert not res.ok and "relative error 0.01" in res.reason


def test_inputs_unchanged_nan_aware_and_chunked(monkeypatch):

    monkeypatch.setattr(inp, "SLICE", 4)
    a = torch.tensor([1.0, float("nan"), 0.0, 2.0, float("inf"), 3.0, 4.0, 5.0, 6.0])
    assert inputs_unchanged([a], [a.clone()]) is None  # NaN where it was: unchanged
    for i, v in [(2, float("nan")), (4, torch.finfo(torch.float32).max), (8, 6.5)]:
        b = a.clone()
        b[i] = v
        assert "input #0" in inputs_unchanged([a], [b]), (i, v)  # 0 -> NaN and inf -> max were missed before
    assert "input #1" in inputs_unchanged([1, torch.arange(9)], [1, torch.arange(9).flip(0)])
