import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

RELU_SRC = r"""
#include <torch/extension.h>

// Writes relu(x) into out; both must be contiguous float32 of the same size (views are fine).
void relu_out(torch::Tensor x, torch::Tensor out) {
    TORCH_CHECK(x.is_contiguous() && out.is_contiguous() && x.numel() == out.numel(), "contiguous, same size");
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t n = x.numel();
    #pragma omp parallel for simd
    for (int64_t i = 0; i < n; i++) o[i] = in[i] > 0.f ? in[i] : 0.f;
}
"""

relu_ext = load_inline(name="relu_views_ext", cpp_sources=RELU_SRC, functions=["relu_out"], extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(nn.Module):
    """Processes the rows in two blocks through zero-copy views; every view op here only changes metadata."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if x.shape[-1] % 2 == 0:  # complex round trip of the same storage: a reinterpretation, no copy
            x = torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2)))).flatten(-2)
        y = torch.empty_like(x)
        h = x.shape[0] // 2
        for xs, ys in zip(x.split_with_sizes([h, x.shape[0] - h]), y.split_with_sizes([h, y.shape[0] - h])):
            relu_ext.relu_out(xs, ys)
        assert y.unfold(1, 2, 2).shape[-1] == 2 and y.diagonal().numel() == min(y.shape)
        return y
