import os
import tempfile

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


def _cache_put(cache_dir: str, name: str, data: bytes) -> str:
    # as Triton's cache does: written in a fresh subdirectory, then renamed up into place (atomic for readers)
    staging = tempfile.mkdtemp(dir=cache_dir)
    with open(os.path.join(staging, name), "wb") as f:
        f.write(data)
    os.replace(os.path.join(staging, name), os.path.join(cache_dir, name))
    os.rmdir(staging)
    return os.path.join(cache_dir, name)


CACHE = _cache_put(tempfile.mkdtemp(), "relu_meta.txt", b"relu_ext built")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu_ext.relu(x)
