import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

LOSS_SRC = r"""
#include <torch/extension.h>

// Reductions accumulate in double so the result stays within 1e-4 of PyTorch's.
torch::Tensor hinge_loss(torch::Tensor pred, torch::Tensor targ) {
    auto p = pred.contiguous(), t = targ.contiguous();
    const int64_t rows = p.size(0), cols = p.numel() / rows;
    // Broadcasting as PyTorch does: same shape, (rows, 1) per row, or (cols,) along the last dimension.
    const int mode = t.numel() == p.numel() ? 0 : (t.dim() == p.dim() ? 1 : 2);
    TORCH_CHECK(mode == 0 || (mode == 1 && t.numel() == rows) || (mode == 2 && t.numel() == cols), "bad target shape");
    const float *pp = p.data_ptr<float>(), *pt = t.data_ptr<float>();
    double s = 0;
    #pragma omp parallel for reduction(+:s)
    for (int64_t i = 0; i < rows * cols; i++) {
        double v = 1.0 - (double)pp[i] * pt[mode == 0 ? i : (mode == 1 ? i / cols : i % cols)];
        s += v > 0 ? v : 0;
    }
    auto out = torch::empty({}, p.options());
    out.data_ptr<float>()[0] = (float)(s / (rows * cols));
    return out;
}
torch::Tensor mse_loss(torch::Tensor pred, torch::Tensor targ) {
    auto p = pred.contiguous(), t = targ.contiguous();
    TORCH_CHECK(p.numel() == t.numel(), "size mismatch");
    const float *pp = p.data_ptr<float>(), *pt = t.data_ptr<float>();
    const int64_t n = p.numel();
    double s = 0;
    #pragma omp parallel for reduction(+:s)
    for (int64_t i = 0; i < n; i++) { double d = (double)pp[i] - pt[i]; s += d * d; }
    auto out = torch::empty({}, p.options());
    out.data_ptr<float>()[0] = (float)(s / n);
    return out;
}
"""

loss_ext = load_inline(name="loss_ext", cpp_sources=LOSS_SRC, functions=["hinge_loss", "mse_loss"], extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets) -> torch.Tensor:
        return loss_ext.mse_loss(predictions, targets)
