"""verifier/inputs.py: filling inputs and the trials' value patterns."""


import pytest
import torch

from musacoder.verifier import inputs as inp


@pytest.mark.parametrize("transform, precision", [("", "fp32"), ("scale8", "fp32"), ("", "fp16"), ("sign", "fp32"),
                                                  ("negfew", "fp32"), ("posfew", "bf16")])
def test_fill_inputs_writes_make_inputs_values_in_slices(monkeypatch, transform, precision):

    mod = type("M", (), {"get_inputs": staticmethod(lambda: [torch.randn(6, 5), 3, torch.randn(5, 6).t(),
                                                              torch.randn(4, 3, 5)])})
    cpu = torch.device("cpu")
    want = inp.make_inputs(mod, inp.Shape(), 11, cpu, precision, transform)
    monkeypatch.setattr(inp, "SLICE", 7)
    raw = inp.raw_inputs(mod, inp.Shape(), 11, cpu)
    dst = [torch.empty(6, 5, dtype=want[0].dtype), 3, torch.empty(6, 5, dtype=want[2].dtype),
           torch.empty(4, 3, 5, dtype=want[3].dtype)]
    inp.fill_inputs(dst, raw, 11, cpu, precision, transform)
    for d, w in [(dst[0], want[0]), (dst[2], want[2]), (dst[3], want[3])]:
        if transform == "sign":  # signs are drawn slice by slice: the same magnitudes, random signs
            assert torch.equal(d.abs(), w.abs())
        else:
            assert torch.equal(d, w)


def test_few_lines_trial_puts_all_one_sign_lines_where_no_probe_finds_them():
    """Every line (first and last index fixed) is all one sign: a few negative ones of magnitude >= 1 among lines
    of the input's own positive values, never the first line; so a max initialised with 0 is off by 1 or more
    there, and a kernel that looks at its first value to spot the negative trial (cpu/exploit_44) takes the 0 path.
    Secret: another seed puts them elsewhere."""
    mod = type("M", (), {"get_inputs": staticmethod(lambda: [torch.rand(8, 5, 6), torch.rand(7, 3), torch.rand(4)])})
    cpu = torch.device("cpu")
    raw = inp.raw_inputs(mod, inp.Shape(), 3, cpu)[0]
    x, m, v = inp.make_inputs(mod, inp.Shape(), 3, cpu, "fp32", "negfew")
    lines = (x < 0).all(dim=1)  # (8, 6): per first and last index, all of the middle dimension negative
    assert torch.equal(lines, (x < 0).any(dim=1)) and not lines[0, 0] and x[0, 0, 0] > 0
    assert lines.sum() == 48 // 16 and (m < 0).all(dim=1).sum() == 1 and (m < 0).any(dim=1).sum() == 1
    assert (x[x < 0] <= -1).all() and torch.equal(x[x > 0], raw[x > 0])  # the rest: the input's own values
    zero_init = torch.maximum(x.amax(dim=1), torch.zeros(()))  # max over the middle dimension, initialised with 0
    assert ((zero_init - x.amax(dim=1)) >= 1).sum() == 3
    other = inp.make_inputs(mod, inp.Shape(), 4, cpu, "fp32", "negfew")[0]
    assert not torch.equal((other < 0).all(dim=1), lines)
    p = inp.make_inputs(mod, inp.Shape(), 3, cpu, "fp32", "posfew")[0]
    assert torch.equal(p > 0, x < 0) and torch.equal(p, -x)  # the mirror, for a min initialised with 0
