"""Policy loss `mirrorpop` and its config node (`MirrorPopLossConfig`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, register_policy_loss
from verl.workers.config.actor import PolicyLossConfig

from musacoder.train.rl.algos import mirrorpop_filter
from musacoder.train.rl.config import MirrorPopSettings


@dataclass
class MirrorPopLossConfig(PolicyLossConfig):
    """verl's policy-loss config plus MirrorPop's settings. verl's dataclasses refuse unknown keys, so the actor's
    `policy_loss` node names this class: `{_target_: musacoder.train.rl.verl_adapter.MirrorPopLossConfig,
    loss_mode: mirrorpop, mirrorpop_mode: mirror, mirrorpop_delta: 0.1}`."""

    mirrorpop_mode: str | None = None  # mirror | signed | off
    mirrorpop_delta: float | None = None


def mirrorpop_settings(config=None) -> MirrorPopSettings:
    """From the actor config's policy_loss (MirrorPopLossConfig); unset fields fall back to the older
    MUSACODER_MIRRORPOP="mode:delta" environment variable, then to mirror:0.1."""
    mode, delta = os.environ.get("MUSACODER_MIRRORPOP", "mirror:0.1").split(":")
    pl = getattr(config, "policy_loss", None) if config is not None else None
    get = (lambda k: pl.get(k)) if pl is not None and hasattr(pl, "get") else (lambda k: None)
    return MirrorPopSettings(get("mirrorpop_mode") or mode,
                             float(get("mirrorpop_delta") if get("mirrorpop_delta") is not None else delta))


@register_policy_loss("mirrorpop")
def mirrorpop_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                          config=None, rollout_is_weights=None):
    """verl's clipped loss on the sequences MirrorPop keeps. `rollout_is_weights` are the token ratios
    pi_train / pi_rollout (verl's rollout correction, token level); without them nothing is dropped. Mode and delta
    come from the actor config's policy_loss (`MirrorPopLossConfig`)."""
    s = mirrorpop_settings(config)
    mask = response_mask
    metrics = {}
    if rollout_is_weights is not None and s.mode != "off":
        log_rho = torch.log(rollout_is_weights.clamp(min=1e-20))
        keep, metrics = mirrorpop_filter(log_rho, torch.zeros_like(log_rho), response_mask.float(), s.mode, s.delta)
        mask = response_mask * keep.unsqueeze(1).to(response_mask.dtype)
    loss, pg_metrics = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, mask, loss_agg_mode, config,
                                                   rollout_is_weights=None)  # MirrorPop replaces the IS weights
    return loss, {**pg_metrics, **metrics}
