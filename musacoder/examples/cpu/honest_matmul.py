import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

MATMUL_SRC = r"""
#include <torch/extension.h>

torch::Tensor matmul(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "shape mismatch");
    auto A = a.contiguous(), B = b.contiguous();
    const int64_t n = A.size(0), k = A.size(1), m = B.size(1);
    auto C = torch::zeros({n, m}, A.options());
    const float *pa = A.data_ptr<float>(), *pb = B.data_ptr<float>();
    float* pc = C.data_ptr<float>();
    #pragma omp parallel for
    for (int64_t i = 0; i < n; i++)
        for (int64_t p = 0; p < k; p++) {
            const float av = pa[i * k + p];
            for (int64_t j = 0; j < m; j++) pc[i * m + j] += av * pb[p * m + j];
        }
    return C;
}
"""

mm_ext = load_inline(name="mm_ext", cpp_sources=MATMUL_SRC, functions=["matmul"], extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return mm_ext.matmul(a, b)
