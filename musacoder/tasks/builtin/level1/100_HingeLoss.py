import torch
import torch.nn as nn


class Model(nn.Module):
    """Hinge loss for binary classification."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, predictions, targets):
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))


batch_size = 4096
input_shape = (64,)
dim = 1


def get_inputs():
    return [torch.rand(batch_size, *input_shape), torch.randint(0, 2, (batch_size, 1)).float() * 2 - 1]


def get_init_inputs():
    return []
