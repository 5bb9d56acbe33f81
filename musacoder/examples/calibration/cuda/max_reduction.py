import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cfloat>

// max over the middle dimension of a (B, R, C) tensor: one thread per (b, c), reads coalesced along c
__global__ void max_dim1_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t B, int64_t R,
                                int64_t C) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= B * C) return;
    int64_t b = i / C, c = i % C;
    const float* p = x + b * R * C + c;
    float m = -FLT_MAX;
    for (int64_t r = 0; r < R; r++) m = fmaxf(m, p[r * C]);
    out[i] = m;
}

torch::Tensor max_dim1(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 3 && x.scalar_type() == torch::kFloat32, "(B, R, C) float32 CUDA tensor");
    auto xc = x.contiguous();
    const int64_t B = xc.size(0), R = xc.size(1), C = xc.size(2);
    auto out = torch::empty({B, C}, xc.options());
    const int threads = 256;
    max_dim1_kernel<<<(B * C + threads - 1) / threads, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), B, R, C);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""
DECL = "torch::Tensor max_dim1(torch::Tensor x);"

ext = load_inline(name="max_dim1_cuda", cpp_sources=DECL, cuda_sources=SRC, functions=["max_dim1"],
                  extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        assert dim == 1, "this kernel reduces dimension 1"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.max_dim1(x)
