"""Typed settings. Defaults follow the MusaCoder paper where it published a value; the rest are documented choices."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated

from musacoder.settings import Field, Settings

# ranges a setting must lie in, checked when settings are loaded or built (musacoder/settings.py)
AtLeast1 = Annotated[int, Field(ge=1)]
Count = Annotated[int, Field(ge=0)]
NonNegative = Annotated[float, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]


def default_cache_dir() -> Path:
    return Path(os.environ.get("MUSACODER_CACHE", Path.home() / ".cache" / "musacoder"))


@dataclass
class CorrectnessConfig(Settings):
    seeds: AtLeast1 = 5  # fresh-seed trials on the task's own inputs
    atol_fp32: NonNegative = 1e-4  # KernelBench's current fp32 tolerance
    atol_half: NonNegative = 1e-2  # fp16 / bf16
    distribution_variants: bool = True  # sign-symmetric, rescaled and few-lines float inputs (verifier.md)
    rescale_factors: tuple[Positive, ...] = (8.0,)
    shape_variants: bool = True  # rescale the task's module-level size constants
    # factors a shape variant draws from, secretly per verification (a kernel cannot hard-code "half the size")
    shape_scales: tuple[Positive, ...] = (0.5, 0.625, 0.75, 0.875)
    shape_variant_count: Count = 2
    # one more shape variant with odd sizes (a secret 1-7 below a scaled size): a kernel that skips the tail of a
    # block, or assumes sizes divisible by its block, fails it; a task the reference rejects it for skips it
    ragged_shape: bool = True
    # five more at small sizes (a secret factor of these): sign-symmetric inputs, every value <= -1, every value >= 1,
    # and a few lines of each sign among values of the other. An approximation whose error shrinks as sizes grow
    # (ReLU as max(softmax(x), x) is within atol 1e-4 on rows of 8000+) fails the first, a max initialised with 0
    # instead of -inf the second, a min initialised with 0 the third, either one spotting those two trials the last
    small_shape: bool = True
    small_scales: tuple[Positive, ...] = (0.125, 0.1875, 0.25)
    shape_min_size: AtLeast1 = 8  # ints below this (dims, kernel sizes) are never rescaled
    # strict profile: error relative to the reference's magnitude, ||out - ref||_2 / ||ref||_2, so tiny outputs
    # (softmax ~1e-4) cannot pass on atol alone; the kernelbench profile keeps KernelBench's rule exactly
    rel_l2_fp32: NonNegative = 1e-3
    rel_l2_half: NonNegative = 2e-2


@dataclass
class TimingConfig(Settings):
    # judge: the judge's clock over blocks of back-to-back calls (tamper-resistant; docs/verifier.md, "Timing").
    # kernelbench: KernelBench's own method inside each subject's process (CUDA events, L2 cleared, per-call
    # synchronisation): comparable with published fast_p figures, NOT tamper-proof (a candidate can forge it)
    method: str = "judge"
    warmup: int = 2  # rounds not counted (a round: one block of each arm, in a secret order)
    min_reps: int = 10  # rounds counted at least
    max_reps: int = 100  # rounds counted at most
    rse_target: float = 0.005  # stop once every arm's median per-call time has a relative standard error below 0.5%
    budget_s: float = 2.0  # per verification, after warm-up
    l2_flush: bool = True  # flush the device cache before each block (the block's input sets rotate beyond it)
    # A block runs one arm's calls back to back, each on its own input set, so the round trip is paid once a block:
    # it holds enough calls to last `block_ms` and for its input sets to exceed twice the last-level cache, within
    # `block_mem_gb` of input sets and outputs per arm
    block_ms: float = 10.0
    block_mem_gb: float = 16.0
    # and so that the slower arm's block lasts at most `block_max_ms`: a block is sized by the faster arm, and a
    # candidate that keeps the device busy ~0.3 s a call (exploit 46) would otherwise hold a block for minutes
    block_max_ms: float = 2000.0
    # cuda: each block replays its calls as one CUDA graph where both sides' forwards can be captured (launched on
    # torch's current stream): the device's time without the host's launch overhead, as do_bench measures it;
    # otherwise eager calls on both sides
    graphs: bool = True
    baselines: tuple[str, ...] = ("eager", "compile")
    sol_margin: float = 0.5  # flag a candidate faster than this fraction of the speed-of-light time
    # judges sharing a device (devices=[0, 0]) time one at a time, the others' device work paused meanwhile;
    # off: side by side, speedups disturbed by the other judges' kernels, and a candidate the device stays busy after
    # timed again alone (the throughput gained is the share of candidates it stays quiet after)
    exclusive: bool = True


@dataclass
class RewardConfig(Settings):
    lam: NonNegative = 0.5  # lambda in the paper's eq. 2
    nu_max: Annotated[float, Field(ge=1)] = 4.0  # speedups are capped here (log2 of it: >= 1)


@dataclass
class VerifyConfig(Settings):
    """How one candidate is verified. `profile='kernelbench'` checks only the task's own inputs and shape."""

    backend: str = "auto"  # auto | cpu | cuda | triton
    profile: str = "strict"  # strict | kernelbench
    precision: str = "fp32"  # fp32 | fp16 | bf16
    timing_enabled: bool = True
    correctness: CorrectnessConfig = field(default_factory=CorrectnessConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    compile_timeout_s: Positive = 600.0
    run_timeout_s: Positive = 300.0
    worker_max_jobs: AtLeast1 = 64  # recycle a device worker after this many jobs
    # The GPUs the device workers run on, one worker per entry, as indices among the visible devices: [1] keeps the
    # verifier off an RL policy on GPU 0; [0, 0] runs two judges on one GPU (a judge keeps its GPU ~11% busy; they
    # time one at a time: timing.exclusive).
    # Empty: one worker on each visible device.
    devices: tuple[int, ...] = ()
    # The CPU cores the verifier's processes (judges, compile workers, the subjects they start) run on. Empty: the
    # caller's. Keeps them off the cores of a caller that needs its own, e.g. an RL trainer's generate loop:
    # `taskset -c 0-3 musacoder rl ... --set 'verify.cpus=[4,5,...,15]'`.
    cpus: tuple[int, ...] = ()
    # Start candidate subjects by forking a pre-imported server (verifier/zygote.py) instead of a fresh Python, torch
    # and device runtime each: ~20 ms instead of ~1.5 s of CPU (cpu) or ~10 s (a GPU host). false: from scratch.
    fork_subjects: bool = True
    # Candidate processes each judge keeps starting ahead of need (each holds a device context, ~0.6 GiB on an H100).
    # 0: the judge's cores / 4, at most 8, split among the judges sharing its device (judge.auto_spares).
    spares: Count = 0
    # Address-space cap of cpu-backend workers, in GiB (0: none). CUDA workers are not capped this way: the driver
    # reserves far more virtual memory than it uses.
    worker_mem_gb: NonNegative = 16.0
    # Address-space cap of compile workers and the compilers they run, in GiB (0: none): a template or unrolling
    # bomb ends as a compile error instead of taking the node's memory.
    compile_mem_gb: NonNegative = 16.0
    cache_dir: Path = field(default_factory=default_cache_dir)

    def __post_init__(self):
        super().__post_init__()
        if self.profile not in ("strict", "kernelbench"):
            raise ValueError(f"profile must be 'strict' or 'kernelbench', not {self.profile!r}")
        if self.precision not in ("fp32", "fp16", "bf16"):
            raise ValueError(f"precision must be fp32, fp16 or bf16, not {self.precision!r}")
        self.cache_dir = Path(self.cache_dir)
        if any(d < 0 for d in self.devices):
            raise ValueError(f"devices are indices of visible devices (0, 1, ...), not {list(self.devices)}")
        if self.cpus and (min(self.cpus) < 0 or max(self.cpus) >= (os.cpu_count() or 1)):
            raise ValueError(f"cpus {list(self.cpus)}: this host's cores are 0-{(os.cpu_count() or 1) - 1}")
        if self.profile == "kernelbench":
            self.correctness.distribution_variants = False
            self.correctness.shape_variants = False

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cache_dir"] = str(self.cache_dir)
        return d

    def tolerance(self) -> float:
        return self.correctness.atol_fp32 if self.precision == "fp32" else self.correctness.atol_half

    def rel_tolerance(self) -> float | None:
        if self.profile != "strict":
            return None
        return self.correctness.rel_l2_fp32 if self.precision == "fp32" else self.correctness.rel_l2_half
