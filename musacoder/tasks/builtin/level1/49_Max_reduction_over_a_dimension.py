import torch
import torch.nn as nn


class Model(nn.Module):
    """Simple model that performs Max reduction over a specific dimension."""

    def __init__(self, dim: int):
        super(Model, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.max(x, dim=self.dim)[0]


# KernelBench's (128, 4096, 4095) scaled down for the cpu backend
batch_size = 16
dim1 = 256
dim2 = 255


def get_inputs():
    x = torch.rand(batch_size, dim1, dim2)
    return [x]


def get_init_inputs():
    return [1]
