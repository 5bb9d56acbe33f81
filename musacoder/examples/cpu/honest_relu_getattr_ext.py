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

relu_ext = load_inline(name="relu_ext", cpp_sources=RELU_SRC, functions=["relu"], extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(nn.Module):
    def __init__(self, op: str = "relu"):
        super().__init__()
        # the kernel is picked by name from the extension, as a model dispatching several ops would
        self.kernel = getattr(relu_ext, op)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x)
