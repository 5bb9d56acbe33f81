import threading

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

RELU_SRC = r"""
#include <torch/extension.h>

torch::Tensor relu(torch::Tensor x) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 only");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    const int64_t n = xc.numel();
    #pragma omp parallel for simd
    for (int64_t i = 0; i < n; i++) out[i] = in[i] > 0.f ? in[i] : 0.f;
    return y;
}
"""

# The extension is built on first use, once, even when models are constructed from several threads.
_build_lock = threading.Lock()
_ext = None


def relu_ext():
    global _ext
    with _build_lock:
        if _ext is None:
            _ext = load_inline(name="relu_ext", cpp_sources=RELU_SRC, functions=["relu"], extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])
    return _ext


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = relu_ext()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ext.relu(x)
