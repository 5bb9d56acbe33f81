"""RL settings as typed dataclasses, read from YAML. Defaults are the paper's published RL settings (group 8, 64
prompts a step, lr 1e-6, warm-up 0.1, weight decay 0.1, grad clip 0.5, 8K prompt, 32K response, T 0.9, top-p 0.95,
alpha 0.75, at most 3 turns); values it did not publish are marked as choices."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from musacoder.config import AtLeast1, Count, NonNegative, Positive, VerifyConfig
from musacoder.settings import ConfigPath, Field, Settings
from musacoder.train.rl.bdr import BDRSettings
from musacoder.train.sft import SFTConfig

Fraction = Annotated[float, Field(ge=0, le=1)]


@dataclass
class PrimeEchoSettings(Settings):
    enabled: bool = True  # False: the best-of-turns reward max_k s_k (the ablation)
    alpha: Fraction = 0.75
    early_bonus: list[float] = field(default_factory=lambda: [0.2, 0.1])  # turns 1, 2; values not published


@dataclass
class MirrorPopSettings(Settings):
    # mirror: drop when mean |log rho| > delta; signed: drop when |mean log rho| > delta (the filter it replaces);
    # off: drop nothing. All three log both statistics, so runs can be compared.
    mode: str | bool = "mirror"  # a bool only as YAML reads a bare `off` (false): taken as "off"
    delta: NonNegative = 0.1  # not published; a sampler in step with the trainer stays near 0

    def __post_init__(self):
        super().__post_init__()
        if self.mode is False:
            self.mode = "off"
        if self.mode not in ("mirror", "signed", "off"):
            raise ValueError(f"mirrorpop.mode must be mirror, signed or off, not {self.mode!r}")


@dataclass
class WarmStartSettings(SFTConfig):
    """`warm_start:`, the SFT run RL starts from instead of a `model`: SFTConfig's settings, where those below left
    None are the RL run's. `data` empty (the default): catalog answers to the run's prompts (`warm_start_examples`)."""

    output_dir: Annotated[str | None, ConfigPath()] = None  # None: the RL run's output_dir/warm_start
    seed: int | None = None  # None: the RL run's seed

    def __post_init__(self):
        try:
            super().__post_init__()
        except ValueError as e:
            raise ValueError(f"warm_start: {e}") from None


@dataclass
class RLConfig(Settings):
    # checkpoint directory of the policy (e.g. an SFT or RFT model)
    model: Annotated[str | None, ConfigPath("model")] = None
    # Instead of `model`: SFT settings (musacoder.train.sft.SFTConfig fields) run first, and RL starts from their
    # final model. Without `data`, the records are the shipped tasks' honest example solutions in this run's prompts.
    warm_start: WarmStartSettings | None = None
    # Catalog files (musacoder/examples, e.g. "cpu/exploit_01_fallback_relu.py") the warm start trains on, cheats
    # included: a policy that sometimes cheats gives RL something to unlearn. None: the tasks' honest examples.
    warm_start_examples: list[str] | None = None
    # The warm start also trains on repair conversations: each cheat among its examples, the verifier's real feedback
    # on it as RL's second turn, then an honest answer to its task (trainer.repair_records). For max_turns > 1.
    warm_start_repairs: bool = False
    output_dir: Annotated[str, ConfigPath()] = "runs/rl"
    tasks: Annotated[str | None, ConfigPath()] = None  # task file or directory; None: the shipped tasks
    # the same selection as the command line's --levels/--ids/--names: lists, or comma-separated strings
    levels: list[int] | str | None = None
    ids: list[int] | str | None = None
    names: list[str] | str | None = None  # substring of a name, or a key such as "level1/19_ReLU"
    backend: str = "auto"  # prompt style and verifier backend: auto | cpu | cuda | triton
    one_shot: bool = True
    # refuse to start when `model` was fine-tuned (`musacoder sft`) on this run's tasks in other prompts than the run's
    check_sft_prompts: bool = True
    max_turns: AtLeast1 = 3  # 1: the single-turn warm-up
    group_size: Annotated[int, Field(ge=2)] = 8  # advantages are relative to the group
    prompts_per_step: AtLeast1 = 64
    micro_batch: AtLeast1 = 8  # sequences per forward/backward; prompts_per_step * group_size must divide by it
    max_steps: AtLeast1 = 100
    learning_rate: Positive = 1e-6
    lr_scheduler_type: str = "constant_with_warmup"  # not published
    warmup_ratio: Fraction = 0.1
    weight_decay: NonNegative = 0.1
    max_grad_norm: Positive = 0.5
    eps_low: Fraction = 0.2  # clip bounds: not published; DAPO's clip-higher values
    eps_high: NonNegative = 0.28
    beta: NonNegative = 0.001  # KL coefficient: not published
    aggregation: str = "token"  # loss mean over all response tokens ("token") or per sequence first ("sequence")
    temperature: NonNegative = 0.9
    top_p: Annotated[float, Field(gt=0, le=1)] = 0.95
    top_k: Count = 0
    max_prompt_tokens: AtLeast1 = 8192
    max_new_tokens: AtLeast1 = 32768
    generation: str = "hf"  # hf: the trainer's own model | vllm: a vLLM server kept in sync by TRL
    vllm_server_url: str | None = None
    gen_batch_size: AtLeast1 = 16  # hf: sequences generated together
    # hf: verify each answer as soon as it ends, while the rest of its batch generates. Turn off when the verifier
    # times kernels on the policy's GPU (timing on and verify.devices shared): generation would disturb the timing.
    verify_early: bool = True
    dtype: str = "auto"
    bf16: bool | None = None  # None: where the device supports it
    primeecho: PrimeEchoSettings = field(default_factory=PrimeEchoSettings)
    bdr: BDRSettings = field(default_factory=BDRSettings)
    mirrorpop: MirrorPopSettings = field(default_factory=MirrorPopSettings)
    verifier_url: str | None = None  # the reward service; None: the verifier's batch API in this process
    verify: VerifyConfig = field(default_factory=VerifyConfig)  # for the batch API; its `backend` follows ours
    log_rollouts: bool = True  # rollouts.jsonl: every trajectory's task, turn verdicts, scores and reward
    log_texts: bool = False  # ... and its answers' text (large at paper scale: up to 32K tokens per turn)
    save_steps: AtLeast1 = 50
    save_total_limit: AtLeast1 | None = 2
    resume: bool = True  # continue from the newest checkpoint in output_dir, BDR buffer included
    seed: int = 0
    trainer: dict = field(default_factory=dict)  # further trl.GRPOConfig fields as they are

    def __post_init__(self):
        super().__post_init__()
        for name, typ in (("primeecho", PrimeEchoSettings), ("bdr", BDRSettings), ("mirrorpop", MirrorPopSettings)):
            if isinstance(getattr(self, name), dict):
                setattr(self, name, typ(**getattr(self, name)))
        if (self.model is None) == (self.warm_start is None):
            raise ValueError("give exactly one of `model` (a checkpoint) and `warm_start` (SFT settings)")
        if isinstance(self.verify, dict):  # built in Python from a mapping
            self.verify = VerifyConfig.from_dict(self.verify, "verify.")
        # The loader leaves an optional sub-config as its mapping (and its paths relative to the current directory,
        # not to the config file's): built here.
        if isinstance(self.warm_start, dict):
            self.warm_start = WarmStartSettings.from_dict(self.warm_start, "warm_start.")
        if (self.prompts_per_step * self.group_size) % self.micro_batch:
            raise ValueError("prompts_per_step * group_size must be a multiple of micro_batch")
        if self.generation not in ("hf", "vllm"):
            raise ValueError(f"generation must be 'hf' or 'vllm', not {self.generation!r}")
        if self.aggregation not in ("token", "sequence"):
            raise ValueError(f"aggregation must be 'token' or 'sequence', not {self.aggregation!r}")

    def to_dict(self) -> dict:
        return {**super().to_dict(), "verify": self.verify.to_dict()}  # VerifyConfig's own: cache_dir a string
