"""The timing window on a GPU (marked gpu: run on the device machine): CUDA-graph blocks where both sides capture,
eager blocks where the candidate launches on the legacy default stream (not capturable), and speedups that agree with
an in-process measurement (`musacoder calibrate` is the full table)."""

import pytest

from musacoder.config import VerifyConfig
from musacoder.examples_catalog import EXAMPLES_DIR
from musacoder.pool.local import LocalPool
from musacoder.tasks import builtin_task

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def verdicts(cache_dir):
    cfg = VerifyConfig(backend="cuda", cache_dir=cache_dir, profile="kernelbench")
    cfg.timing.baselines = ("eager",)
    relu = builtin_task("level1/19_ReLU")
    honest = (EXAMPLES_DIR / "cuda" / "honest_relu.py").read_text()
    legacy = (EXAMPLES_DIR / "cuda" / "honest_relu_legacy_stream.py").read_text()
    with LocalPool(cfg) as pool:
        return {name: pool.submit(relu, code).result() for name, code in
                (("current_stream", honest), ("legacy_stream", legacy))}


def test_a_candidate_on_torchs_stream_is_timed_as_cuda_graph_replays(verdicts):
    v = verdicts["current_stream"]
    assert v.status.value == "ok", v.reason
    assert v.details["graphs"] is True and v.details["calls_per_block"] >= 2


def test_a_candidate_on_the_legacy_stream_is_timed_eagerly_on_both_sides(verdicts):
    v = verdicts["legacy_stream"]
    assert v.status.value == "ok", v.reason
    assert v.details["graphs"] is False and v.speedup_eager and v.candidate_ms > 0
