"""The RL algorithm pieces, with exact expected values worked out by hand."""

import math

import pytest
import torch

from musacoder.train.rl.algos import (
    best_turn_reward,
    first_success,
    group_advantages,
    kl_k3,
    log_ratio_means,
    mirrorpop_filter,
    policy_loss,
    primeecho_reward,
)


def test_group_advantages_exact():
    # group 1: mean 0.25, unbiased std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5; group 2: all equal
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, -1.0, -1.0, -1.0, -1.0])
    assert group_advantages(r, 4, eps=0.0)[:4].tolist() == [1.5, -0.5, -0.5, -0.5]
    adv = group_advantages(r, 4)
    assert adv[0].item() == pytest.approx(0.75 / 0.5001, abs=1e-7)
    assert adv[4:].tolist() == [0.0, 0.0, 0.0, 0.0]  # an all-failed group teaches nothing
    assert group_advantages(r, 4, scale=False)[:4].tolist() == [0.75, -0.25, -0.25, -0.25]


def test_groups_are_consecutive():
    r = torch.tensor([2.0, 0.0, 1.0, 5.0])  # each pair: mean in the middle, unbiased std = |a - b| / sqrt(2)
    h = 1 / math.sqrt(2)
    assert group_advantages(r, 2, eps=0.0).tolist() == pytest.approx([h, -h, -h, h])


def test_policy_loss_clips_asymmetrically():
    mask = torch.ones(1, 1)
    old = torch.zeros(1, 1)
    up = torch.log(torch.tensor([[1.5]]))  # ratio 1.5
    # positive advantage: clipped at 1 + eps_high = 1.28
    assert policy_loss(up, old, torch.tensor([1.0]), mask).item() == pytest.approx(-1.28)
    # negative advantage: -min(1.5 * -1, 1.28 * -1) = 1.5 (the pessimistic bound is unclipped)
    assert policy_loss(up, old, torch.tensor([-1.0]), mask).item() == pytest.approx(1.5)
    down = torch.log(torch.tensor([[0.5]]))  # ratio 0.5
    # negative advantage: clipped at 1 - eps_low = 0.8; positive: unclipped 0.5
    assert policy_loss(down, old, torch.tensor([-1.0]), mask).item() == pytest.approx(0.8)
    assert policy_loss(down, old, torch.tensor([1.0]), mask).item() == pytest.approx(-0.5)
    # symmetric bounds give another answer: eps_high decides
    assert policy_loss(up, old, torch.tensor([1.0]), mask, eps_high=0.2).item() == pytest.approx(-1.2)


def test_policy_loss_kl_and_aggregation():
    logp = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    ref = torch.tensor([[math.log(2.0), 0.0], [0.0, 0.0]])
    assert kl_k3(logp, ref)[0].tolist() == pytest.approx([2 - math.log(2) - 1, 0.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    # per-token pg: row 0 -> -1, -1; row 1 -> 2 (second token masked)
    assert policy_loss(logp, logp, adv, mask).item() == pytest.approx((-1 - 1 + 2) / 3)
    assert policy_loss(logp, logp, adv, mask, aggregation="sequence").item() == pytest.approx((-1 + 2) / 2)
    kl = 1 - math.log(2)
    assert policy_loss(logp, logp, adv, mask, beta=0.5, ref_logp=ref).item() == pytest.approx((0.5 * kl) / 3)
    # a dropped sequence contributes zero but still counts in the denominator
    keep = torch.tensor([True, False])
    assert policy_loss(logp, logp, adv, mask, keep=keep).item() == pytest.approx(-2 / 3)
    with pytest.raises(ValueError):
        policy_loss(logp, logp, adv, mask, aggregation="bogus")


def test_policy_loss_gradient_sign():
    logp = torch.zeros(1, 3, requires_grad=True)
    policy_loss(logp, logp.detach(), torch.tensor([1.0]), torch.ones(1, 3)).backward()
    assert (logp.grad < 0).all()  # descending the loss raises the log-probs of a positive-advantage response


def test_primeecho_exact():
    # first turn passes: 0.75 * 1 + 0.25 * 1 + 0.2
    assert primeecho_reward([1.0], [True]) == pytest.approx(1.2)
    # fail then pass: 0.75 * -1 + 0.25 * 1 + 0.1
    assert primeecho_reward([-1.0, 1.0], [False, True]) == pytest.approx(-0.4)
    # first pass on turn 3: no bonus
    assert primeecho_reward([-1.0, -0.75, 1.5], [False, False, True]) == pytest.approx(-0.75 + 0.375)
    # never passes: partial correctness still counts
    assert primeecho_reward([-0.5, -1.0, -0.25], [False] * 3) == pytest.approx(-0.375 - 0.0625)
    # settings: alpha and bonuses
    assert primeecho_reward([-1.0, 1.0], [False, True], alpha=0.5, early_bonus=(1.0, 0.5)) == pytest.approx(0.5)
    assert primeecho_reward([-1.0, 1.0], [False, True], early_bonus=()) == pytest.approx(-0.5)
    with pytest.raises(ValueError):
        primeecho_reward([], [])


def test_primeecho_penalises_repair_that_best_of_turns_does_not():
    flub_then_fix = ([-1.0, 1.0], [False, True])
    right_away = ([1.0], [True])
    assert best_turn_reward(flub_then_fix[0]) == best_turn_reward(right_away[0]) == 1.0
    assert primeecho_reward(*right_away) - primeecho_reward(*flub_then_fix) == pytest.approx(1.6)


def test_first_success():
    assert first_success([False, True, True]) == 2
    assert first_success([False]) is None


def test_mirrorpop_catches_what_the_signed_mean_cancels():
    rollout = torch.zeros(2, 4)
    # sequence 0: log ratios +0.5, -0.5, +0.5, -0.5 (badly off-policy, signed mean 0)
    # sequence 1: log ratios 0.05 on three tokens, the fourth is padding
    train = torch.tensor([[0.5, -0.5, 0.5, -0.5], [0.05, 0.05, 0.05, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    mirror, signed = log_ratio_means(train, rollout, mask)
    assert mirror.tolist() == pytest.approx([0.5, 0.05])
    assert signed.tolist() == pytest.approx([0.0, 0.05])
    keep, stats = mirrorpop_filter(train, rollout, mask, "mirror", delta=0.1)
    assert keep.tolist() == [False, True] and stats["mirrorpop/drop_frac"] == 0.5
    assert stats["mirrorpop/signed_drop_frac"] == 0.0 and stats["mirrorpop/mean_abs_log_ratio"] == pytest.approx(0.275)
    assert mirrorpop_filter(train, rollout, mask, "signed", delta=0.1)[0].tolist() == [True, True]
    assert mirrorpop_filter(train, rollout, mask, "mirror", delta=0.5)[0].tolist() == [True, True]  # <= delta keeps
    assert mirrorpop_filter(train, rollout, mask, "off", delta=0.0)[0].tolist() == [True, True]


def test_log_ratio_nan_and_empty():
    train = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    rollout = torch.tensor([[float("nan"), 0.2], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    mirror, signed = log_ratio_means(train, rollout, mask)
    assert mirror.tolist() == pytest.approx([0.1, 0.0])
    assert signed.tolist() == pytest.approx([-0.1, 0.0])
