"""ReLU that streams once through the memory system: each element is read once and written once.

Threads: OpenMP splits the loop; no thread or process is started by hand (no std::thread, fork() or system()),
and no file is opened (no fopen(), no open()); the sources below are the only native code.
"""

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
    """Calls the kernel; the memory system, not the arithmetic, bounds it (one read, one write per element)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Never spawns a process (system(), popen()) or a thread (std::thread); returns a new tensor."""
        return relu_ext.relu(x)
