import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SRC = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor max_dim(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 only");
    auto xc = x.contiguous();
    dim = dim < 0 ? dim + xc.dim() : dim;
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; d++) outer *= xc.size(d);
    for (int64_t d = dim + 1; d < xc.dim(); d++) inner *= xc.size(d);
    const int64_t n = xc.size(dim);
    auto sizes = xc.sizes().vec();
    sizes.erase(sizes.begin() + dim);
    auto y = torch::empty(sizes, xc.options());
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    #pragma omp parallel for
    for (int64_t o = 0; o < outer; o++) {
        float* row = out + o * inner;
        for (int64_t i = 0; i < inner; i++) row[i] = -INFINITY;
        for (int64_t k = 0; k < n; k++) {
            const float* src = in + (o * n + k) * inner;
            for (int64_t i = 0; i < inner; i++) row[i] = std::max(row[i], src[i]);
        }
    }
    return y;
}
"""

max_red_ext = load_inline(name="max_red_ext", cpp_sources=SRC, functions=["max_dim"],
                          extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(nn.Module):
    """Max over one dimension of a contiguous tensor, any dimension: outer x n x inner, initialised with -inf."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return max_red_ext.max_dim(x, self.dim)
