"""verifier/judge.py: the judge's peak memory over one job stays a few tensor sizes whatever the number of trials,
and its determinism re-run cannot be skipped by raising (a judge in this process, on the cpu backend).

The judge holds a constant number of tensor-sized buffers during a job, whatever the number of trials: its peak
resident memory over one strict-profile job (correctness trials with shape and distribution variants, then timing)
on the cpu backend, where every buffer it shares with a subject is a shared-memory file it touches (so VmHWM counts
it) as a CUDA judge holds them in device memory. When the judge kept one buffer set per shape, full-size copies and
float64 temporaries, it peaked at 13-15.5x the input size here (61.5 GiB for a 6 GiB Softmax input on an H100)."""

import os
from pathlib import Path

import pytest

from musacoder.config import VerifyConfig

MIB = 2**20
ROWS = 256


def _task(mib: int) -> str:
    return f'''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x.clone()


batch_size = {ROWS}
dim = {mib * MIB // 4 // ROWS}


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
'''


# Its own op (a Python custom op counts as its own launch) so the job is legal and reaches the timing loop without a
# C++ build; inside it, only allowlisted ops.
CANDIDATE = '''import torch
import torch.nn as nn


@torch.library.custom_op("memtest::copy", mutates_args=())
def copy(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


class ModelNew(nn.Module):
    def forward(self, x):
        return copy(x)
'''


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


@pytest.fixture(scope="module")
def judge(cache_dir):
    """A judge in this process: its memory is this process's."""
    from musacoder.backends import get_backend
    from musacoder.verifier.judge import Judge

    j = Judge(get_backend("cpu"), Path(cache_dir))
    j.settle()
    yield j
    j.close()


def _config(cache_dir) -> VerifyConfig:
    cfg = VerifyConfig(backend="cpu", cache_dir=cache_dir, run_timeout_s=120)
    cfg.correctness.seeds = 2  # 2 seeds + sign + x8 + 2 shape variants + the ragged one + 3 small ones: 10 trials
    cfg.timing.baselines = ("eager",)
    cfg.timing.warmup, cfg.timing.min_reps, cfg.timing.max_reps = 1, 2, 2
    # one call a block at the memory test's size, as it means to measure: a noisy probe on a busy 2-core machine once
    # planned more, whose input sets then counted in the peak (13.1x, CI 2026-11-29)
    cfg.timing.block_mem_gb = 1.0
    return cfg


def _job(cfg, mib: int, candidate: str = CANDIDATE):
    from musacoder.verifier.protocol import EvaluateJob

    return EvaluateJob(task_code=_task(mib), task_key=f"memtest/{mib}", candidate_code=candidate, config=cfg)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc (VmHWM reset)")
def test_judge_peak_memory_is_a_few_tensor_sizes(judge, cache_dir):
    cfg = _config(cache_dir)
    mib = int(os.environ.get("MEMTEST_MIB", "192"))
    warm = judge.evaluate(_job(cfg, 1))  # every code path once: what it pages in is not the job's memory
    assert warm.timing is not None, warm
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := current RSS
    base = _status("VmHWM")
    facts = judge.evaluate(_job(cfg, mib))
    peak = _status("VmHWM") - base
    print(f"judge peak {peak / MIB:.0f} MiB = {peak / (mib * MIB):.2f}x the input")
    assert len(facts.trials) == 13 and all(t.passed for t in facts.trials), facts.trials
    assert facts.timing is not None and not facts.spot_check, facts
    # two input copies (the candidate's and the reference's own, since 2026-11-28) + reference output + candidate
    # output buffers (4), one input-sized temporary (the task's fresh tensors, or the copy kept for the in-place
    # check), comparison slices; a timing window of one call a block reuses them: 4.1-4.4x seen with one input copy;
    # before: 13.0x at 192 MiB
    assert peak < 6 * mib * MIB, (f"judge peak {peak / MIB:.0f} MiB = {peak / (mib * MIB):.2f}x the input, "
                                  f"{facts.timing.calls} calls a block")


def test_raising_on_the_determinism_rerun_fails_the_trial(judge, cache_dir):
    """The first trial's second run on the same inputs is checked whether it answers or raises (it used to pass a
    candidate that raised there)."""
    cand = CANDIDATE.replace("class ModelNew(nn.Module):\n    def forward(self, x):\n        return copy(x)\n", '''
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.last = None

    def forward(self, x):
        if self.last is not None and self.last.shape == x.shape and torch.equal(self.last, x):
            raise RuntimeError("not twice")
        self.last = x.clone()
        return copy(x)
''')
    assert "not twice" in cand
    cfg = _config(cache_dir)
    cfg.timing_enabled = False
    facts = judge.evaluate(_job(cfg, 1, cand))
    first = facts.trials[0]
    assert not first.passed and "second run on the same inputs raised" in first.reason, first
    assert all(t.passed for t in facts.trials[1:]), facts.trials
