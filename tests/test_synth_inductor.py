"""The compiler teacher (issue 14, 2a): Inductor's code for a task becomes a candidate that MooreEval verifies like any
other; library calls and fallbacks get no candidate, with the reason. cpu here; the Triton path is a GPU test."""

import pytest
import torch

from musacoder.config import VerifyConfig
from musacoder.pool.local import LocalPool
from musacoder.synth.inductor import compile_candidate
from musacoder.tasks import builtin_task

VIEWS_ONLY = """import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return x.view(-1)
def get_inputs():
    return [torch.randn(4, 4)]
def get_init_inputs():
    return []
"""


def test_no_candidate_says_why():
    mm = compile_candidate(builtin_task("level1/1_Square_matrix_multiplication_").code, "cpu")
    assert not mm.ok and mm.category == "extern library call" and "extern_kernels.mm" in mm.reason
    assert compile_candidate("def broken(:\n", "cpu").reason == "task failed: syntax error line 1"
    assert compile_candidate(VIEWS_ONLY, "cpu").category == "no kernel"
    with pytest.raises(ValueError, match="backend must be one of"):
        compile_candidate(VIEWS_ONLY, "cuda")


def _verified(backend: str, keys: list[str], cache_dir) -> dict:
    results = {k: compile_candidate(builtin_task(k).code, backend) for k in keys}
    assert all(r.ok for r in results.values()), {k: r.reason for k, r in results.items()}
    cfg = VerifyConfig(backend=backend, cache_dir=cache_dir, timing_enabled=False)
    with LocalPool(cfg) as pool:
        got = dict(pool.verify_many((builtin_task(k), results[k].candidate) for k in keys))
    return {k: (got[i], results[k]) for i, k in enumerate(keys)}


def test_cpu_candidate_is_verified_ok(cache_dir):
    (v, r), = _verified("cpu", ["level1/19_ReLU"], cache_dir).values()
    assert "load_inline" in r.candidate and "class ModelNew" in r.candidate and r.kernels == ["cpp_fused_relu_0"]
    # strict profile: seeds, input variants and a rescaled shape: the kernel is shape-generic, not specialised
    assert v.status.value == "ok" and v.correctness == 1.0, v.reason


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
def test_triton_candidates_are_verified_ok(cache_dir):
    keys = ["level1/19_ReLU", "level1/23_Softmax", "level1/94_MSELoss", "level1/100_HingeLoss"]
    for k, (v, r) in _verified("triton", keys, cache_dir).items():
        assert "@triton.jit" in r.candidate and "triton_poi_" not in r.candidate, k
        assert v.status.value == "ok", (k, v.reason)
