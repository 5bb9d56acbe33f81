"""verifier/verdict.py: the verdict's statuses and its JSON, and the one constructor for a verdict of an item that
never reached the verifier (pipeline.unusable), which fills reward and feedback like any other."""

import json

from musacoder.verifier.pipeline import unusable
from musacoder.verifier.verdict import Status, Verdict


def test_verdict_json_roundtrip():
    v = Verdict(Status.OK, "correct and legal", task="level1/19_ReLU", stage_seconds={"total": 1.5},
                details={"speedup_interval": [1.1, 1.4]}, reward=1.1)
    d = json.loads(v.to_json())
    assert d["status"] == "ok" and d["details"]["speedup_interval"] == [1.1, 1.4]
    back = Verdict.from_dict(d)
    assert back == v and back.passed and back.status is Status.OK
    assert not Verdict(Status.INCORRECT, "").passed


def test_an_unusable_item_gets_a_complete_verdict():
    v = unusable("the pool refused the job: RuntimeError()", task="level1/19_ReLU", status=Status.INFRA_ERROR,
                 backend="cpu")
    assert (v.status, v.task, v.backend, v.reward) == (Status.INFRA_ERROR, "level1/19_ReLU", "cpu", -1.0)
    assert "infra_error" in v.feedback and "the pool refused the job" in v.feedback
    assert unusable("x" * 2000).reason == "x" * 500  # kept short: it travels in every reply
