"""verifier/pipeline.py: the pure decision, the verdict made once from the stages' findings."""

import pytest

from musacoder.config import VerifyConfig
from musacoder.verifier.pipeline import decide
from musacoder.verifier.protocol import Facts
from musacoder.verifier.static import StaticResult
from musacoder.verifier.verdict import Status


def _decide(facts):
    return decide(VerifyConfig(), StaticResult(), None, Facts.model_validate(facts))


def test_decide_orders_legality_before_correctness():
    trial_ok = {"kind": "seed", "passed": True, "max_abs": 0.0, "mean_abs": 0.0}
    v = _decide({"trials": [trial_ok], "illegal_ops": ["aten::relu"], "ops": {"aten::relu": 2}, "launches": 1})
    assert v.status is Status.ILLEGAL and "aten::relu x2" in v.reason and v.reward == -1
    v = _decide({"trials": [trial_ok], "launches": 0})
    assert v.status is Status.ILLEGAL and "decoy" in v.reason
    bad = {"kind": "sign-symmetric inputs", "passed": False, "reason": "mismatch", "max_abs": 1.0, "mean_abs": 0.5}
    v = _decide({"trials": [trial_ok, bad], "launches": 3})
    assert v.status is Status.INCORRECT and v.correctness == 0.5 and v.reward == pytest.approx(-0.25)
    timing = {"candidate_ms": 1.0, "reference_ms": 2.0, "compile_ms": 1.5, "speedup": 2.0, "speedup_low": 1.8,
              "speedup_high": 2.2, "compile_speedup": 1.5, "rse": 0.01, "reps": 10, "floor_ms": 0.05}
    v = _decide({"trials": [trial_ok], "launches": 3, "timing": timing, "bytes": 4e9, "flops": 0,
                 "rates": {"bytes_per_s": 1e12, "flops_per_s": 1e12}})
    assert v.status is Status.OK and v.speedup_eager == 2.0 and v.speedup_compile == 1.5 and v.reward == 1.5
    assert v.sol_flag and "speed-of-light" in v.reason  # 1 ms < 0.5 * 4 ms floor
    # a speedup whose interval includes 1 earns no bonus, and the reason says it is noise
    v = _decide({"trials": [trial_ok], "launches": 3, "timing": {**timing, "speedup_low": 0.7, "speedup_high": 3.1}})
    assert v.status is Status.OK and v.speedup_eager == 2.0 and v.reward == 1.0 and "within noise" in v.reason
    v = _decide({"trials": [trial_ok], "launches": 3, "spot_check": "timed iteration 4: mismatch"})
    assert v.status is Status.INCORRECT and v.correctness == 0.5
    v = _decide({"trials": [{"kind": "seed", "passed": False, "reason": "RuntimeError: x", "error": "tb"}]})
    assert v.status is Status.RUNTIME_ERROR
    v = _decide({"integrity": ["time.perf_counter"], "trials": []})
    assert v.status is Status.ILLEGAL and "time.perf_counter" in v.reason
    v = _decide({"symbol_problems": ["imports at::native::relu(at::Tensor const&): ATen compute"], "trials": []})
    assert v.status is Status.ILLEGAL and "native code imports at::native::relu" in v.reason
    v = _decide({"busy_after_return": "the candidate process used 0.5s of CPU after forward returned",
                 "trials": [trial_ok], "launches": 1})
    assert v.status is Status.ILLEGAL and "after forward returned" in v.reason
