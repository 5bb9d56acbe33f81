"""Ready-made MooreEval rewards for stock trainers: TRL's `GRPOTrainer` and verl's `naive` reward manager.

TRL::

    GRPOTrainer(model=..., reward_funcs=[musacoder.rewards.trl_reward], train_dataset=ds)  # ds has "prompt", "task"
    # or configured in code, whatever the environment says:
    reward = make_reward(VerifyConfig(backend="cpu", timing_enabled=False))     # or make_reward(url="http://...")

verl (`reward.custom_reward_function`)::

    path: pkg://musacoder.rewards
    name: compute_score            # or compute_score_async
    reward_kwargs: {verify: {backend: cuda, timing_enabled: false}}   # optional: settings in the config instead

The reward is the verifier's (the paper's eq. 2, in [-1, 1 + lambda * log2 nu_max]). `trl_reward` and
`compute_score` take where verification runs and with which settings from the environment, read when they are
called (so one function serves every run), and refuse a value they do not know:

- `MUSACODER_VERIFIER_URL`: the reward service (`musacoder serve`); its settings apply. Unset: a verifier pool in
  this process, with the settings below.
- `MUSACODER_TOKEN`: the service's bearer token.
- `MUSACODER_BACKEND`: auto | cpu | cuda | triton | musa | musa-on-cuda (default auto).
- `MUSACODER_PROFILE`: strict | kernelbench (default strict).
- `MUSACODER_TIMING`: 1 | 0 (also true/false, yes/no, on/off; default 1; 0 skips timing: correctness and legality
  only, reward at most 1).
- `MUSACODER_PRECISION`: fp32 | fp16 | bf16 (default fp32).
- `MUSACODER_CACHE`: the build cache directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter, ValidationError

from musacoder.api import Verifier, get_verifier, unusable
from musacoder.config import VerifyConfig
from musacoder.verifier.verdict import Verdict

_ENV = {"MUSACODER_BACKEND": "backend", "MUSACODER_PROFILE": "profile", "MUSACODER_PRECISION": "precision"}


def env_config() -> VerifyConfig:
    """The local verifier's settings from the MUSACODER_* environment variables; ValueError naming the variable for
    a value it does not know (`MUSACODER_TIMING=maybe` is not "on")."""
    from musacoder.backends import NAMES

    settings: dict[str, Any] = {key: os.environ[var] for var, key in _ENV.items() if var in os.environ}
    if settings.get("backend", "auto") not in ("auto", *NAMES):
        raise ValueError(f"MUSACODER_BACKEND={settings['backend']!r}: expected auto, {', '.join(NAMES)}")
    if "MUSACODER_TIMING" in os.environ:
        try:  # pydantic's reading of a flag: 1/0, true/false, yes/no, on/off
            settings["timing_enabled"] = TypeAdapter(bool).validate_python(os.environ["MUSACODER_TIMING"])
        except ValidationError:
            raise ValueError(f"MUSACODER_TIMING={os.environ['MUSACODER_TIMING']!r}: expected 1 or 0 (true/false, "
                             "yes/no, on/off)") from None
    try:
        return VerifyConfig.from_dict(settings)
    except ValueError as e:
        var = next((v for v, k in _ENV.items() if k in str(e)), "MUSACODER_*")
        raise ValueError(f"{var}: {e}") from None


def env_verifier(config: VerifyConfig | None = None, url: str | None = None, token: str | None = None) -> Verifier:
    """The service at `url`, else at MUSACODER_VERIFIER_URL when set (its settings apply; `token`, else
    MUSACODER_TOKEN), else a pool in this process with `config` (default: `env_config()`)."""
    return get_verifier(config or env_config(), url or os.environ.get("MUSACODER_VERIFIER_URL") or None,
                        token or os.environ.get("MUSACODER_TOKEN"))


def verdicts(pairs: list[tuple[Any, Any]], config: VerifyConfig | None = None) -> list[Verdict]:
    """One verdict per (task, completion) in order: the service when MUSACODER_VERIFIER_URL is set, else locally."""
    return env_verifier(config).verdicts(pairs)


async def verdicts_async(pairs: list[tuple[Any, Any]], config: VerifyConfig | None = None) -> list[Verdict]:
    """`verdicts` from async code."""
    return await env_verifier(config).verdicts_async(pairs)


def _log(vs: list[Verdict], kwargs: dict):
    """TRL hands reward functions `log_extra` (a completions-table column) and `log_metric`; use them if present."""
    if callable(kwargs.get("log_extra")):
        kwargs["log_extra"]("verdict", [v.status.value for v in vs])
    if callable(kwargs.get("log_metric")) and vs:
        kwargs["log_metric"]("musacoder/pass_rate", sum(v.passed for v in vs) / len(vs))


def _tasks(task, n: int) -> list:
    if task is None:
        raise ValueError("trl_reward needs the dataset column 'task' (the reference source, or a task dict)")
    return list(task) if isinstance(task, (list, tuple)) else [task] * n


def trl_reward(prompts=None, completions=None, task=None, **kwargs) -> list[float]:
    """TRL reward function: the verifier's reward of each completion (plain text or conversational messages)
    against its row's `task` column (reference source, a task dict, or a `.py` path). Settings: the environment."""
    vs = verdicts(list(zip(_tasks(task, len(completions)), completions)))
    _log(vs, kwargs)
    return [float(v.reward) for v in vs]


async def trl_reward_async(prompts=None, completions=None, task=None, **kwargs) -> list[float]:
    """`trl_reward` as a coroutine: TRL runs async reward functions concurrently with the others."""
    vs = await verdicts_async(list(zip(_tasks(task, len(completions)), completions)))
    _log(vs, kwargs)
    return [float(v.reward) for v in vs]


def make_reward(config: VerifyConfig | dict | None = None, *, url: str | None = None, token: str | None = None,
                is_async: bool = False) -> Callable:
    """`trl_reward` configured in code instead of the environment: verified locally with `config` (a
    VerifyConfig, or its fields as a mapping, validated as a config file's are), or by the service at `url`
    (`token`: its bearer token). `is_async`: the coroutine form. TRL logs it under the name `musacoder_reward`."""
    cfg = VerifyConfig.from_dict(config) if isinstance(config, dict) else config or VerifyConfig()
    verifier = get_verifier(cfg, url, token)

    if is_async:
        async def musacoder_reward(prompts=None, completions=None, task=None, **kwargs) -> list[float]:
            vs = await verifier.verdicts_async(list(zip(_tasks(task, len(completions)), completions)))
            _log(vs, kwargs)
            return [float(v.reward) for v in vs]
    else:
        def musacoder_reward(prompts=None, completions=None, task=None, **kwargs) -> list[float]:
            vs = verifier.verdicts(list(zip(_tasks(task, len(completions)), completions)))
            _log(vs, kwargs)
            return [float(v.reward) for v in vs]
    musacoder_reward.verifier = verifier  # what it verifies with, for the curious
    return musacoder_reward


def _reference(ground_truth, extra_info) -> Any:
    """The reference task: `ground_truth` (KernelGYM / Dr.Kernel datasets keep the reference source there), else
    extra_info's `reference_code` or `task` (musacoder's verl rows)."""
    if (isinstance(ground_truth, str) and "class Model" in ground_truth) or isinstance(ground_truth, dict):
        return ground_truth
    info = extra_info or {}
    for key in ("reference_code", "task"):
        if info.get(key):
            return info[key]
    raise ValueError("no reference: put its source in reward_model.ground_truth or extra_info['reference_code']")


def score_dict(v: Verdict) -> dict:
    """verl's result: `score` plus verdict fields, numbers or short strings (verl averages the numbers and skips the
    strings); `acc` is pass/fail, the key verl's validation metrics look for."""
    return {"score": float(v.reward), "acc": float(v.passed), "status": v.status.value,
            "correctness": float(v.correctness), "speedup": float(v.speedup_eager or 0.0), "reason": v.reason[:200]}


def _verl_verifier(verify: dict | None, verifier_url: str | None, token: str | None) -> Verifier:
    """verl's `reward_kwargs` (`verify`: VerifyConfig fields, `verifier_url`, `token`) over the environment's."""
    if type(verify).__module__.startswith("omegaconf"):  # verl hands reward_kwargs over as OmegaConf nodes
        from omegaconf import OmegaConf

        verify = OmegaConf.to_container(verify, resolve=True)
    return env_verifier(VerifyConfig.from_dict(verify) if verify is not None else None, verifier_url, token)


def compute_score(data_source=None, solution_str: str = "", ground_truth=None, extra_info=None, verify=None,
                  verifier_url=None, token=None, **kw) -> dict:
    """verl `custom_reward_function` (stock `naive` reward manager). `verify`, `verifier_url`, `token` come from
    `custom_reward_function.reward_kwargs` when set there; else the environment decides."""
    verifier = _verl_verifier(verify, verifier_url, token)
    try:
        pair = (_reference(ground_truth, extra_info), solution_str)
    except ValueError as e:
        return score_dict(unusable(str(e), verifier.config))
    return score_dict(verifier.verdicts([pair])[0])


async def compute_score_async(data_source=None, solution_str: str = "", ground_truth=None, extra_info=None,
                              verify=None, verifier_url=None, token=None, **kw) -> dict:
    """`compute_score` as a coroutine (verl awaits it on its reward loop instead of using a thread)."""
    verifier = _verl_verifier(verify, verifier_url, token)
    try:
        pair = (_reference(ground_truth, extra_info), solution_str)
    except ValueError as e:
        return score_dict(unusable(str(e), verifier.config))
    return score_dict((await verifier.verdicts_async([pair]))[0])
