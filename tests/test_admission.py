"""verifier/admission.py: routing a candidate, the prebuild cache's policy, and the verdict made once at the end.
No worker runs here: the compile tier's outcomes are given as the dicts a compile worker returns."""

import dataclasses
from pathlib import Path

import pytest

from musacoder.config import VerifyConfig
from musacoder.tasks import builtin_task
from musacoder.verifier.admission import TASK_CONFIG, Admission, Case, Route
from musacoder.verifier.cache import Cache
from musacoder.verifier.protocol import PrebuildResult
from musacoder.verifier.verdict import Status
from musacoder.version import __version__

RELU = builtin_task("level1/19_ReLU")
NATIVE = (Path(__file__).parents[1] / "musacoder" / "examples" / "cpu" / "honest_relu.py").read_text()
PYTHON_ONLY = """import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x.clamp(min=0)
"""


@pytest.fixture
def admission(tmp_path):
    cache = Cache(tmp_path / "c.sqlite")
    yield Admission(VerifyConfig(backend="cpu", cache_dir=tmp_path), cache, lambda: {})
    cache.close()


def admitted(admission, code, **kw) -> tuple[Case, Route]:
    case = Case(RELU, f"```python\n{code}\n```")
    return case, admission.admit(case, **kw)


def test_unparseable_output_is_decided_at_admission(admission):
    case = Case(RELU, "no code block here")
    assert admission.admit(case) is Route.DONE
    v = admission.conclude(case)
    assert v.status is Status.FORMAT_ERROR and v.reward < 0 and v.task == RELU.key and v.backend == "cpu"
    assert v.stage_seconds["total"] >= 0 and v.versions["musacoder"] == __version__


def test_code_without_a_build_goes_straight_to_a_device(admission):
    case, route = admitted(admission, PYTHON_ONLY)
    assert route is Route.DEVICE and case.prebuild == PrebuildResult() and not case.pkey
    assert case.candidate_hash and "static" in case.stage_seconds


def test_a_build_failure_is_cached_and_not_built_again(admission):
    case, route = admitted(admission, NATIVE)
    assert route is Route.COMPILE and case.pkey
    assert not admission.compiled(case, PrebuildResult(build_error="error: expected ';'"), None, 12.0)
    v = admission.conclude(case)
    assert v.status is Status.COMPILE_ERROR and "expected ';'" in v.compile_log and v.stage_seconds["compile"] == 12.0
    again, route = admitted(admission, NATIVE)
    assert route is Route.DONE and again.details["build_cached"] and again.stage_seconds["compile"] == 0.0
    assert admission.conclude(again).status is Status.COMPILE_ERROR


def test_a_build_goes_to_a_device_while_its_artifacts_are_loadable(admission):
    case, _ = admitted(admission, NATIVE)
    assert admission.compiled(case, PrebuildResult(kernels=["relu_kernel"]), None, 3.0)
    again, route = admitted(admission, NATIVE)
    assert route is Route.DEVICE and again.prebuild.kernels == ["relu_kernel"]
    assert admitted(admission, NATIVE, loadable=lambda key: False)[1] is Route.COMPILE  # a lost cluster artifact


def test_device_dependent_outcomes_are_not_cached(admission):
    case, _ = admitted(admission, NATIVE)
    assert admission.compiled(case, PrebuildResult(import_error="CUDA driver too old"), None, 3.0)
    assert admitted(admission, NATIVE)[1] is Route.COMPILE


def test_an_unreadable_cache_entry_is_built_again(admission):
    case, _ = admitted(admission, NATIVE)
    admission.cache.put("prebuild", case.pkey, {"builds": "not a list"})  # another version's, or damaged
    assert admitted(admission, NATIVE)[1] is Route.COMPILE


def test_a_worker_failure_decides_the_verdict(admission):
    case, _ = admitted(admission, NATIVE)
    assert not admission.compiled(case, None, (Status.TIMEOUT, "build exceeded 600s (killed)"), 600.0)
    v = admission.conclude(case)
    assert (v.status, v.reason) == (Status.TIMEOUT, "build exceeded 600s (killed)") and v.reward == -1.0


def test_a_task_may_carry_its_own_settings_but_not_its_backend(admission, tmp_path):
    own = VerifyConfig(backend="cuda", cache_dir=Path("/elsewhere"), run_timeout_s=11).to_dict()
    task = dataclasses.replace(RELU, metadata={TASK_CONFIG: own})
    cfg = admission.config_for(task)
    assert cfg.run_timeout_s == 11 and cfg.backend == "cpu" and cfg.cache_dir == tmp_path
    assert admission.config_for(RELU) is admission.cfg
