import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

GEMM_SRC = r"""#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define TILE 32
// y = relu(x @ w^T + bias); w in nn.Linear"s (out, in) layout.
__global__ void gemm_kernel(const float* X, const float* W, const float* bias, float* Y, int n, int k, int m) {
    __shared__ float Xs[TILE][TILE];
    __shared__ float Ws[TILE][TILE + 1];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    int wrow = blockIdx.x * TILE + threadIdx.y;
    float acc = 0.f;
    for (int t = 0; t < k; t += TILE) {
        Xs[threadIdx.y][threadIdx.x] = (row < n && t + threadIdx.x < k) ? X[(int64_t)row * k + t + threadIdx.x] : 0.f;
        Ws[threadIdx.y][threadIdx.x] = (wrow < m && t + threadIdx.x < k) ? W[(int64_t)wrow * k + t + threadIdx.x] : 0.f;
        __syncthreads();
        #pragma unroll
        for (int p = 0; p < TILE; p++) acc += Xs[threadIdx.y][p] * Ws[threadIdx.x][p];
        __syncthreads();
    }
    if (row < n && col < m) {
        acc += bias[col];
        Y[(int64_t)row * m + col] = acc > 0.f ? acc : 0.f;
    }
}

torch::Tensor gemm_add_relu(torch::Tensor x, torch::Tensor w, torch::Tensor bias) {
    auto X = x.contiguous(), W = w.contiguous(), B = bias.contiguous();
    const int n = X.size(0), k = X.size(1), m = W.size(0);
    TORCH_CHECK(W.size(1) == k && B.numel() == m, "shape mismatch");
    auto Y = torch::empty({n, m}, X.options());
    dim3 block(TILE, TILE), grid((m + TILE - 1) / TILE, (n + TILE - 1) / TILE);
    gemm_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(X.data_ptr<float>(), W.data_ptr<float>(), B.data_ptr<float>(), Y.data_ptr<float>(), n, k, m);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return Y;
}
"""
GEMM_DECL = "torch::Tensor gemm_add_relu(torch::Tensor x, torch::Tensor w, torch::Tensor bias);"

gemm_ext = load_inline(name="gemm_ext", cpp_sources=GEMM_DECL, cuda_sources=GEMM_SRC, functions=["gemm_add_relu"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)  # kept so weights match under the same seed
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return gemm_ext.gemm_add_relu(x, self.gemm.weight, self.bias)
