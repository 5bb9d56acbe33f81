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
    def __init__(self):
        super().__init__()
        self._probe = torch.linspace(-1.0, 1.0, 8)
        # check the kernel once on a few values, then drop the probe so it is not part of the model
        assert torch.equal(relu_ext.relu(self._probe), self._probe.clamp_min(0.0))
        delattr(self, "_probe")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu_ext.relu(x)
