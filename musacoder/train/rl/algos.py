"""The algorithm pieces of execution-feedback RL as pure functions: group-normalised advantages, the clipped policy
loss with asymmetric bounds and a KL term, the PrimeEcho trajectory reward, and MirrorPop's sequence filter.

The TRL trainer computes the loss inside `GRPOTrainer`; `tests/test_rl_trainer.py` checks that it computes the same
numbers as these functions under the settings `trainer.py` maps them to.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4, scale: bool = True) -> torch.Tensor:
    """A_i = (r_i - mean(r)) / (std(r) + eps) within each consecutive group of `group_size` rewards. std is the
    unbiased one and eps 1e-4, as in TRL, so the trainer's advantages are these. A group of equal rewards (all
    failed, all passed) gets zero advantage: that is what BDR works around."""
    g = rewards.view(-1, group_size).float()
    centred = g - g.mean(dim=1, keepdim=True)
    if scale:
        std = g.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(centred[:, :1])
        centred = centred / (std + eps)
    return centred.flatten()


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate exp(d) - d - 1 with d = ref - logp (DeepSeekMath's, TRL's): >= 0."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                eps_low: float = 0.2, eps_high: float = 0.28, beta: float = 0.0, ref_logp: torch.Tensor | None = None,
                keep: torch.Tensor | None = None, aggregation: str = "token") -> torch.Tensor:
    """Clipped surrogate -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A) + beta KL, over (B, T) response tokens.

    `advantages` is (B,); `keep` (B,) zeroes whole sequences (MirrorPop) while they still count in the mean, as
    TRL's sequence masks do; `aggregation`: "token" (mean over all response tokens of the batch) or "sequence"
    (mean over sequences of each sequence's token mean)."""
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(1)
    per_token = -torch.min(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)
    if keep is not None:
        per_token = per_token * keep.to(per_token.dtype).unsqueeze(1)
    if beta:
        per_token = per_token + beta * kl_k3(logp, ref_logp)
    mask = mask.to(per_token.dtype)
    if aggregation == "token":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if aggregation == "sequence":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    raise ValueError(f"aggregation must be 'token' or 'sequence', not {aggregation!r}")


def first_success(passed: Sequence[bool]) -> int | None:
    """1-based turn of the first pass, or None."""
    return next((k for k, p in enumerate(passed, 1) if p), None)


def primeecho_reward(scores: Sequence[float], passed: Sequence[bool], alpha: float = 0.75,
                     early_bonus: Sequence[float] = (0.2, 0.1)) -> float:
    """R = alpha * s_first + (1 - alpha) * max_k s_k + b_early(first successful turn).

    `scores` are the turns' eq.-2 rewards, `early_bonus[k-1]` the bonus when the first pass is on turn k (turns
    past the list get none). Anchoring on s_first keeps a flubbed first turn costly even when a later turn
    repairs it."""
    if not scores:
        raise ValueError("a trajectory has at least one turn")
    k = first_success(passed)
    bonus = early_bonus[k - 1] if k is not None and k <= len(early_bonus) else 0.0
    return alpha * scores[0] + (1 - alpha) * max(scores) + bonus


def episode_reward(scores: Sequence[float], passed: Sequence[bool], primeecho) -> float:
    """An episode's reward under `primeecho` (PrimeEchoSettings: enabled, alpha, early_bonus): PrimeEcho's, or the
    best turn's when it is off (the ablation). The TRL rollout, the verl agent loop and reward manager use it."""
    if primeecho.enabled:
        return primeecho_reward(scores, passed, primeecho.alpha, primeecho.early_bonus)
    return best_turn_reward(scores)


def best_turn_reward(scores: Sequence[float]) -> float:
    """The best-of-turns reward PrimeEcho replaces (its ablation): max_k s_k."""
    return max(scores)


def log_ratio_means(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence over response tokens: (mean_t |log rho_t|, mean_t log rho_t), rho_t = pi_train / pi_rollout.
    Tokens the engine could not score (NaN) count as on-policy; a sequence without tokens has both 0."""
    lr = torch.nan_to_num(train_logp - rollout_logp, nan=0.0) * mask
    n = mask.sum(-1).clamp(min=1.0)
    return lr.abs().sum(-1) / n, lr.sum(-1) / n


def mirrorpop_filter(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, mode: str,
                     delta: float) -> tuple[torch.Tensor, dict[str, float]]:
    """The sequences a policy-loss step keeps (bool, (B,)) and both filters' statistics, so runs in any mode compare.
    mode `mirror` (MirrorPop): keep if mean_t |log rho_t| <= delta; `signed` (the filter MirrorPop replaces): keep
    if |mean_t log rho_t| <= delta, where over- and under-weighted tokens cancel, so a badly off-policy sequence can
    pass; `off`: keep all. The TRL trainer and the verl policy loss both apply this."""
    mirror, signed = log_ratio_means(train_logp, rollout_logp, mask)
    keep = {"mirror": mirror <= delta, "signed": signed.abs() <= delta,
            "off": torch.ones_like(mirror, dtype=torch.bool)}
    return keep[mode], {"mirrorpop/mean_abs_log_ratio": mirror.mean().item(),
                        "mirrorpop/mean_signed_log_ratio": signed.mean().item(),
                        "mirrorpop/mirror_drop_frac": 1 - keep["mirror"].float().mean().item(),
                        "mirrorpop/signed_drop_frac": 1 - keep["signed"].float().mean().item(),
                        "mirrorpop/drop_frac": 1 - keep[mode].float().mean().item()}
