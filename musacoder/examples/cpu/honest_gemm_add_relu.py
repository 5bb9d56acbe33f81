import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

GEMM_SRC = r"""
#include <torch/extension.h>

// y = relu(x @ w^T + bias), w in nn.Linear's (out, in) layout.
torch::Tensor gemm_add_relu(torch::Tensor x, torch::Tensor w, torch::Tensor bias) {
    auto X = x.contiguous(), W = w.contiguous(), Bv = bias.contiguous();
    const int64_t n = X.size(0), k = X.size(1), m = W.size(0);
    TORCH_CHECK(W.size(1) == k && Bv.numel() == m, "shape mismatch");
    auto Y = torch::empty({n, m}, X.options());
    const float *px = X.data_ptr<float>(), *pw = W.data_ptr<float>(), *pb = Bv.data_ptr<float>();
    float* py = Y.data_ptr<float>();
    #pragma omp parallel for collapse(2)
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            float acc = 0.f;
            for (int64_t p = 0; p < k; p++) acc += px[i * k + p] * pw[j * k + p];
            acc += pb[j];
            py[i * m + j] = acc > 0.f ? acc : 0.f;
        }
    return Y;
}
"""

gemm_ext = load_inline(name="gemm_ext", cpp_sources=GEMM_SRC, functions=["gemm_add_relu"], extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)  # kept so weights match under the same seed
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return gemm_ext.gemm_add_relu(x, self.gemm.weight, self.bias)
