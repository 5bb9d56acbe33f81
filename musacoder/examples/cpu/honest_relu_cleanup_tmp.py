import os
import shutil
import tempfile

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load

# Sources written into a private temporary directory, built with `cpp_extension.load`, then the temporary files
# removed again: many projects clean up after themselves.
SRC = r"""
#include <torch/extension.h>

torch::Tensor relu(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    const int64_t n = xc.numel();
    #pragma omp parallel for simd
    for (int64_t i = 0; i < n; i++) out[i] = in[i] > 0.f ? in[i] : 0.f;
    return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("relu", &relu); }
"""

_dir = tempfile.mkdtemp()
_src = os.path.join(_dir, "relu.cpp")
with open(_src, "w") as f:
    f.write(SRC)
ext = load(name="relu_from_tmp", sources=[_src], extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])
os.remove(_src)
shutil.rmtree(_dir, ignore_errors=True)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.relu(x)
