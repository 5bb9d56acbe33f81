import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# The launch most model-written CUDA has: `<<<grid, block>>>` with no stream, on the legacy default stream. It
# runs at once beside a CUDA-graph capture on torch's stream, so a verifier that trusts the graph replays nothing
# of it (H200, 2026-11-28: refused `incorrect` in the second timing round); it must be timed eagerly instead.
SRC = """
#include <torch/extension.h>
__global__ void relu_kernel(const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
torch::Tensor relu(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int64_t n = xc.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
ext = load_inline(name="relu_legacy_stream_ext", cpp_sources="torch::Tensor relu(torch::Tensor x);", cuda_sources=SRC,
                  functions=["relu"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu(x)
