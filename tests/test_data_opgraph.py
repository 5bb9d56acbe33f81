"""The canonical op graph (data/opgraph.py), the `opgraph` detector's key: the same computation at any rank, size or
spelling collides; computations that really differ stay apart. Traced on the meta device: cheap."""

import pytest

from musacoder.data.decontam import trace_task

TEMPLATE = '''import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        {init}

    def forward(self, {args}):
        {body}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
'''
X2, X3, X4 = "torch.rand(8, 32)", "torch.rand(4, 8, 32)", "torch.rand(2, 4, 8, 32)"


def task(body: str, inputs: str = X2, args: str = "x", init: str = "pass") -> str:
    return TEMPLATE.format(body=body, inputs=inputs, args=args, init=init)


LINEAR = "self.fc = nn.Linear(32, 16)"
PARAMS = "self.w = nn.Parameter(torch.rand(16, 32)); self.b = nn.Parameter(torch.rand(16))"
BIAS = "self.p = nn.Parameter(torch.rand(32))"
TWO = ("torch.rand(8, 32), torch.rand(8, 32)", "x, y")
MM = ("torch.rand(8, 32), torch.rand(32, 8)", "a, b")

SAME = {  # name: (task, task): one computation
    "relu at ranks 2 and 4": (task("return torch.relu(x)"), task("return torch.relu(x)", X4)),
    "relu spelled F.relu / nn.ReLU / x.relu()": (task("return F.relu(x)"),
                                                 task("return self.act(x)", X3, init="self.act = nn.ReLU()")),
    "relu as clamp(min=0)": (task("return x.relu()"), task("return torch.clamp(x, min=0)")),
    "sum as method and function, keepdim": (task("return x.sum(1)"),
                                            task("return torch.sum(x, dim=-1, keepdim=True)", X3)),
    "silu and x * sigmoid(x)": (task("return F.silu(x)"), task("return torch.sigmoid(x) * x", X3)),
    "x ** 2 and torch.square(x)": (task("return x ** 2"), task("return torch.square(x)")),
    "x * x and x.pow(2)": (task("return x * x"), task("return x.pow(2)", X4)),
    "scale by 0.5 and divide by 2": (task("return x * 0.5"), task("return x / 2.0", X3)),
    "argument order of forward": (task("return a @ b", *MM), task("return a @ b", "torch.rand(32, 8), "
                                                                  "torch.rand(8, 32)", "b, a")),
    "commutative operands": (task("return torch.relu(x) + x"), task("return x + torch.relu(x)", X4)),
    "Linear at ranks 2 and 3 and spelled out": (task("return self.fc(x)", init=LINEAR),
                                                task("return x @ self.w.t() + self.b", X3, init=PARAMS)),
    "max_pool1d and max_pool2d": (task("return F.max_pool1d(x, 2)", X3), task("return F.max_pool2d(x, 2)", X4)),
    "hardtanh and clamp(-1, 1)": (task("return F.hardtanh(x)"), task("return torch.clamp(x, -1.0, 1.0)", X3)),
    "leaky_relu and its where form": (task("return F.leaky_relu(x, 0.2)"),
                                      task("return torch.where(x > 0, x, x * 0.2)")),
    "softmax and its stable formula": (task("return torch.softmax(x, dim=-1)"), task(
        "e = torch.exp(x - x.max(dim=-1, keepdim=True).values)\n        return e / e.sum(dim=-1, keepdim=True)", X3)),
    "mse_loss and its formula": (task("return F.mse_loss(x, y)", *TWO), task("return ((x - y) ** 2).mean()", *TWO)),
    "LayerNorm at ranks 2 and 3": (task("return self.n(x)", init="self.n = nn.LayerNorm(32)"),
                                   task("return self.n(x)", X3, init="self.n = nn.LayerNorm(32)")),
    "a transpose pushed through a unary op": (task("return x.transpose(-1, -2) * 0.5", X3),
                                              task("return (x * 0.5).transpose(-1, -2)", X3)),
    "dtype variant": (task("return torch.tanh(x)"), task("return torch.tanh(x.half()).float()")),
    "SELU and ELU (float arguments do not count)": (task("return F.selu(x)"), task("return F.elu(x)")),
}

DIFFERENT = {  # name: (task, task): other computations
    "relu and tanh": (task("return torch.relu(x)"), task("return torch.tanh(x)")),
    "x * x and x * y": (task("return x * x", *TWO), task("return x * y", *TWO)),
    "relu(x) + x and relu(x) + relu(x)": (task("return torch.relu(x) + x"),
                                          task("y = torch.relu(x)\n        return y + torch.relu(x)")),
    "bias (broadcast) and a full operand": (task("return x + self.p", init=BIAS), task("return x + y", *TWO)),
    "add a scalar and add a parameter": (task("return x + 0.25"), task("return x + self.p", init=BIAS)),
    "scale and square": (task("return x * 0.5"), task("return x * x")),
    "x - y and x + y": (task("return x - y", *TWO), task("return x + y", *TWO)),
    "A @ B and A.T @ B": (task("return a @ b", *MM), task("return a.T @ b", "torch.rand(32, 8), torch.rand(32, 8)",
                                                         "a, b")),
    "convolution and transposed convolution": (
        task("return self.c(x)", "torch.rand(2, 4, 16, 16)", init="self.c = nn.Conv2d(4, 8, 3)"),
        task("return self.c(x)", "torch.rand(2, 4, 16, 16)", init="self.c = nn.ConvTranspose2d(4, 8, 3)")),
    "sum over a dim and over everything": (task("return x.sum(dim=1)"), task("return x.sum()")),
    "mean over a dim and over everything": (task("return x.mean(dim=-1)"), task("return x.mean()")),
    "softmax and log_softmax": (task("return torch.softmax(x, -1)"), task("return torch.log_softmax(x, -1)")),
    "sum then relu and relu then sum": (task("return torch.relu(x.sum(1))"), task("return torch.relu(x).sum(1)")),
    "LayerNorm and RMSNorm": (task("return self.n(x)", init="self.n = nn.LayerNorm(32)"),
                              task("return self.n(x)", init="self.n = nn.RMSNorm(32)")),
    "x.max(d).values and argmax": (task("return x.max(dim=1).values"), task("return x.argmax(dim=1)")),
}


@pytest.mark.parametrize("name", list(SAME))
def test_same_computation_collides(name):
    a, b = (trace_task(c) for c in SAME[name])
    assert a.graph == b.graph and a.signature == b.signature, (a.graph, b.graph)


@pytest.mark.parametrize("name", list(DIFFERENT))
def test_different_computations_stay_apart(name):
    a, b = (trace_task(c) for c in DIFFERENT[name])
    assert a.signature != b.signature, a.graph


def test_the_graph_is_readable_and_the_sequence_key_still_keys_on_ranks():
    lin = trace_task(task("return torch.relu(self.fc(x))", init=LINEAR))
    assert lin.graph == "relu(add.Tensor(mm(tensor:f,tensor:f),tensor:f^))"
    a, b = trace_task(task("return torch.relu(x)")), trace_task(task("return torch.relu(x)", X3))
    assert a.signature == b.signature and a.sequence_signature != b.sequence_signature  # what the issue found
