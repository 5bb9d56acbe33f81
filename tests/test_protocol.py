"""verifier/protocol.py: the typed messages keep their types across the JSON wire."""

import json

import pytest
from pydantic import ValidationError

from musacoder.config import VerifyConfig
from musacoder.verifier.protocol import (
    BuildRecord,
    BuildReply,
    EvaluateJob,
    Facts,
    Msg,
    PrebuildJob,
    PrebuildResult,
    WorkerHello,
)


def wire(msg: Msg):
    """`msg` as the process at the other end reads it (protocol.send, WorkerProcess.call: JSON of model_dump)."""
    return type(msg).model_validate(json.loads(json.dumps(msg.model_dump())))


def test_build_records_cross_as_records():
    """What a candidate built reaches the pool (PrebuildResult) and the verdict (Facts) as typed records, on the
    wire as the same keys the verdict's `builds` always had."""
    failed = BuildRecord.of(BuildReply(key="k2", seconds=0.12345, error="x" * 600 + "the error"))
    assert failed.seconds == 0.123 and len(failed.error) == 500 and failed.error.endswith("the error")
    builds = [BuildRecord.of(BuildReply(key="k1", seconds=1.5, cached=True)), failed]
    for msg in (PrebuildResult(builds=builds, kernels=["relu_kernel"]), Facts(builds=builds)):
        back = wire(msg)
        assert back == msg and all(isinstance(b, BuildRecord) for b in back.builds)
    assert PrebuildResult(builds=builds).model_dump()["builds"][0] == {"key": "k1", "seconds": 1.5, "cached": True,
                                                                      "error": None}
    with pytest.raises(ValidationError):
        PrebuildResult.model_validate({"builds": [{"key": "k", "seconds": 1.0, "cahced": True}]})


def test_the_verify_config_crosses_typed_and_unresolved(tmp_path):
    """The judge's settings arrive as a VerifyConfig equal to the pool's, on the wire as its to_dict(); a backend
    'auto' stays 'auto' (resolved where a device is known)."""
    cfg = VerifyConfig(backend="auto", profile="kernelbench", cache_dir=tmp_path, run_timeout_s=11, cpus=(0,))
    cfg.timing.baselines = ("eager",)
    job = EvaluateJob(task_code="t", task_key="k", candidate_code="c", config=cfg)
    assert job.model_dump()["config"] == cfg.to_dict()
    for msg in (job, PrebuildJob(candidate_code="c", config=cfg)):
        back = wire(msg)
        assert isinstance(back.config, VerifyConfig) and back.config == cfg and back.config.backend == "auto"


@pytest.mark.parametrize("typo", [{"run_timeout": 5}, {"timing": {"max_rep": 3}}])
def test_a_mistyped_setting_in_a_job_is_refused(typo):
    """A setting the judge does not know is refused when the job is read, not ignored (Settings.from_dict)."""
    job = json.loads(json.dumps(EvaluateJob(task_code="t", task_key="k", candidate_code="c",
                                            config=VerifyConfig(backend="cpu")).model_dump()))
    job["config"] = {**job["config"], **typo}
    with pytest.raises(ValidationError, match="unknown .*setting"):
        EvaluateJob.model_validate(job)


def test_a_worker_hello_carries_what_the_pool_adds():
    """A device worker's hello as the pool keeps it: the Ray node it runs on, or why it did not start."""
    hello = WorkerHello(pid=7, role="device", device="cpu").model_copy(update={"node": "n1"})
    assert wire(hello) == hello and hello.error is None
    failed = WorkerHello(pid=0, role="device", error="the device worker failed to start")
    assert wire(failed).error == "the device worker failed to start"
