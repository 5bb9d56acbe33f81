"""verifier/stages.py: per-stage seconds, summed when a stage is entered again, kept when it raises."""

import time

import pytest

from musacoder.verifier.protocol import Facts
from musacoder.verifier.stages import stage


def test_a_stage_is_timed_summed_and_recorded_on_failure():
    f = Facts()
    for _ in range(2):
        with stage(f, "trial"):
            time.sleep(0.02)
    assert 0.04 <= f.stage_seconds["trial"] < 1.0
    with pytest.raises(ValueError), stage(f, "build"):
        time.sleep(0.01)
        raise ValueError("the stage failed")
    assert f.stage_seconds["build"] >= 0.01  # a failed stage still says how long it took
