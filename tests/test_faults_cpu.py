"""Bad input never crashes the run or loses other results: each fault gets a verdict and the worker is replaced.

Uses the cpu backend (real C++ builds, real worker processes); the CUDA equivalents are in test_gpu.py.
"""


import pytest

from musacoder.pool.local import LocalPool
from musacoder.tasks import Task, builtin_task

pytestmark = pytest.mark.slow

HEAD = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"
HONEST = HEAD + '''
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, x):
        return torch.empty_like(x).copy_(x)  # allowed ops only; a plain copy, judged by correctness alone
'''
SEGFAULT = HEAD + '''
SRC = "#include <torch/extension.h>\\ntorch::Tensor boom(torch::Tensor x){ volatile float* p = nullptr; p[0] = 1.f; return x; }"
ext = load_inline(name="boom", cpp_sources=SRC, functions=["boom"])
class ModelNew(nn.Module):
    def forward(self, x):
        return ext.boom(x)
'''
HANG = HEAD + '''
class ModelNew(nn.Module):
    def forward(self, x):
        while True:
            x = x
'''
BAD_CPP = HEAD + '''
ext = load_inline(name="bad", cpp_sources="torch::Tensor f(torch::Tensor x) { return x +; }", functions=["f"])
class ModelNew(nn.Module):
    def forward(self, x):
        return ext.f(x)
'''
IMPORT_RAISES = HEAD + "raise ValueError('at import')\nclass ModelNew(nn.Module):\n    pass\n"
OOM = HEAD + '''
class ModelNew(nn.Module):
    def forward(self, x):
        big = torch.ones(2**34, dtype=torch.uint8)  # 16 GiB: over the worker cap
        return big[: x.numel()].float().view_as(x)
'''


@pytest.fixture(scope="module")
def pool(cache_dir):
    from musacoder.config import VerifyConfig

    cfg = VerifyConfig(backend="cpu", cache_dir=cache_dir, timing_enabled=False, run_timeout_s=30, worker_mem_gb=8)
    with LocalPool(cfg, compile_workers=1) as p:
        yield p


def test_faults_each_get_a_verdict_and_nothing_is_lost(pool):
    relu = builtin_task("level1/19_ReLU")
    broken_task = Task(name="77_Broken", level=1, code="import torch\nclass Model:\n    pass\n"
                       "def get_inputs():\n    raise RuntimeError('no inputs')\ndef get_init_inputs():\n    return []\n")
    cases = [(relu, SEGFAULT), (relu, HONEST), (relu, HANG), (relu, HONEST), (relu, BAD_CPP), (relu, IMPORT_RAISES),
             (relu, OOM), (broken_task, HONEST), (relu, HONEST)]
    verdicts = dict(pool.verify_many(cases))
    assert sorted(verdicts) == list(range(len(cases)))  # nothing lost
    st = {i: v.status.value for i, v in verdicts.items()}
    assert st[0] == "runtime_error" and "SIGSEGV" in verdicts[0].reason
    assert st[2] == "timeout" and "killed" in verdicts[2].reason
    assert st[4] == "compile_error" and "error" in verdicts[4].compile_log
    assert "expected" in verdicts[4].feedback or "error" in verdicts[4].feedback
    assert st[5] == "runtime_error" and "at import" in verdicts[5].reason
    assert st[6] in ("runtime_error", "incorrect")
    assert st[7] == "infra_error" and "77_Broken" in verdicts[7].reason
    # a plain copy launches nothing of its own (illegal);
    # but it must be judged the same way before and after every fault
    honest = {verdicts[i].status for i in (1, 3, 8)}
    assert len(honest) == 1 and st[1] == "illegal"
