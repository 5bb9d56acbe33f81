"""verifier/reward.py: the paper's reward (eq. 2)."""

import pytest

from musacoder.verifier.reward import reward
from musacoder.verifier.verdict import Status


@pytest.mark.parametrize("status, q, nu, expected", [
    (Status.OK, 1.0, 3.0, 2.0),  # 1 + 0.5 * min(2, 4)
    (Status.OK, 1.0, 20.0, 3.0),  # capped at nu_max = 4
    (Status.OK, 1.0, 0.5, 1.0),  # slower than the baseline: no bonus, no penalty
    (Status.INCORRECT, 0.6, None, -0.2),
    (Status.INCORRECT, 0.0, None, -1.0),
    (Status.ILLEGAL, 1.0, 5.0, -1.0),
    (Status.COMPILE_ERROR, 0.0, None, -1.0),
])
def test_reward_eq2(status, q, nu, expected):
    assert reward(status, q, nu) == pytest.approx(expected)


def test_partial_correctness_and_its_own_weights():
    assert reward(Status.RUNTIME_ERROR, 0.5, None) == pytest.approx(-0.25)  # failed while timed, trials half passed
    assert reward(Status.OK, 1.0, None) == 1.0  # correct, not timed: no speed term
    assert reward(Status.OK, 1.0, 3.0, lam=0.25, nu_max=1.0) == pytest.approx(1.25)  # lam * min(nu - 1, nu_max)
    assert reward(Status.TIMEOUT, 1.0, 9.0) == reward(Status.INFRA_ERROR, 1.0, None) == -1.0
