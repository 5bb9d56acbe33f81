"""A trial whose reference is itself rounding noise: found by `synth solve` (Inductor's honest Triton code for a
generated `mish(x) - x -> max_pool2d -> amax` task was refused on an H200: under inputs x8 the outputs are ~1e-6, the
difference of two float32 numbers near 8, and Inductor's order of the float32 operations gives other noise).
Every element was within atol; the strict profile's relative L2 check refused it. The cpu backend shows the same
with an honest C++ kernel that computes the difference without the cancellation, nearer the exact value than the
reference (real build, real judge and reference processes)."""

import pytest
import torch

from musacoder.config import VerifyConfig
from musacoder.pool.local import LocalPool
from musacoder.tasks import Task

TASK = '''import torch
import torch.nn as nn
import torch.nn.functional as F
batch_size = 64
dim = 256
class Model(nn.Module):
    def forward(self, x):
        return torch.amax(F.mish(x) - x, dim=-1)
def get_inputs():
    return [torch.rand(batch_size, dim)]
def get_init_inputs():
    return []
'''

HONEST = r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline
SRC = """
#include <torch/extension.h>
#include <cmath>
torch::Tensor mish_sub_amax(torch::Tensor x, double scale) {
    auto xc = x.contiguous();
    int64_t rows = xc.size(0), cols = xc.size(1);
    auto out = torch::empty({rows}, xc.options());
    const float* p = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < rows; ++i) {
        float best = -INFINITY;
        for (int64_t j = 0; j < cols; ++j) {
            float v = p[i * cols + j];
            // mish(v) - v = v * (tanh(softplus(v)) - 1) = -2v / (n + 2), n = e^v (e^v + 2): no cancellation, so
            // closer to the exact value than the reference's float32 difference of two numbers near v
            float e = std::exp(v), n = e * (e + 2.0f);
            float m = -2.0f * v / (n + 2.0f);
            best = m > best ? m : best;
        }
        o[i] = best * (float)scale;
    }
    return out;
}
"""
ext = load_inline(name="mish_sub_amax", cpp_sources=SRC, functions=["mish_sub_amax"])
class ModelNew(nn.Module):
    def forward(self, x):
        return ext.mish_sub_amax(x, 1.0)
'''

WRONG = HONEST.replace("mish_sub_amax(x, 1.0)", "mish_sub_amax(x, 0.5)")  # the same build, half the output


def test_a_bound_per_output_leaf():
    from musacoder.verifier.correctness import compare

    ref = (torch.full((64,), 1e-6), torch.ones(64))
    out = (ref[0] * 1.04, ref[1].clone())
    refused = compare(out, ref, 1e-4, 1e-3)
    assert not refused.ok and refused.leaf == 0 and abs(refused.rel_error - 0.04) < 1e-3
    assert compare(out, ref, 1e-4, [0.16, 1e-3]).ok
    assert not compare((out[0], out[1] * 1.01), ref, 1e-2, [0.16, 1e-3]).ok  # the other leaf keeps its own bound


@pytest.mark.slow  # one C++ build (~70 s of CI's 2 cores); the test above and tests/test_subject.py's are its CI share
def test_an_ill_conditioned_trial_does_not_refuse_an_honest_kernel(cache_dir):
    """Before the reference's own float32 error was asked: `incorrect`, "1/16 trials failed; first: [inputs x8] out
    relative error 0.0391 (L2, against the reference's magnitude) is over 0.001, although every element is within
    atol 0.0001". A wrong kernel (half the output) must still fail: the bound is the reference's error x4, not
    nothing."""
    _honest_ok_wrong_incorrect("cpu", HONEST, WRONG, cache_dir)


def _honest_ok_wrong_incorrect(backend: str, honest: str, wrong: str, cache_dir):
    task = Task(name="mish_sub_amax", code=TASK)
    cfg = VerifyConfig(backend=backend, cache_dir=cache_dir, timing_enabled=False)
    with LocalPool(cfg) as pool:
        got = dict(pool.verify_many([(task, honest), (task, wrong)]))  # completion order: keyed by index
    assert got[0].status.value == "ok", got[0].reason
    assert got[1].status.value == "incorrect", got[1].reason


HONEST_TRITON = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def mish_sub_amax(x_ptr, out_ptr, cols, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    v = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0)
    e = tl.exp(v)
    m = -2.0 * v / (e * (e + 2.0) + 2.0)  # mish(v) - v without the cancellation
    tl.store(out_ptr + row, tl.max(tl.where(mask, m, float("-inf")), axis=0) * scale)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.empty(rows, device=x.device, dtype=x.dtype)
        mish_sub_amax[(rows,)](x, out, cols, 1.0, BLOCK=triton.next_power_of_2(cols))
        return out
'''


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
def test_an_ill_conditioned_trial_does_not_refuse_an_honest_triton_kernel(cache_dir):
    """The same on a GPU, the kernel in Triton as synthesis found it; half the output still fails."""
    _honest_ok_wrong_incorrect("triton", HONEST_TRITON, HONEST_TRITON.replace("1.0, BLOCK", "0.5, BLOCK"), cache_dir)
