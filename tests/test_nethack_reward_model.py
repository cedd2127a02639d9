"""Soft-label Bradley-Terry loss (hand-computed, ties included) and the message reward network."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.nethack.reward import (
    MessageRewardNet,
    RewardNetConfig,
    RewardStats,
    encode_texts,
    load_reward_model,
    save_reward_model,
    soft_bt_loss,
)


def nll(x: float) -> float:
    """−log σ(x)"""
    return math.log1p(math.exp(-x))


def test_soft_bt_loss_by_hand_with_a_winner_and_a_tie():
    r1 = torch.tensor([1.0, 1.0, 1.0, 0.3])
    r2 = torch.tensor([0.0, 0.0, 0.0, 0.3])
    y = torch.tensor([0.0, 1.0, 0.5, 0.5])  # first wins, second wins, tie, tie between equal rewards
    expected = [nll(1.0), nll(-1.0), 0.5 * nll(1.0) + 0.5 * nll(-1.0), math.log(2.0)]
    assert soft_bt_loss(r1, r2, y).item() == pytest.approx(sum(expected) / 4, rel=1e-6)
    assert soft_bt_loss(r1[:1], r2[:1], y[:1]).item() == pytest.approx(0.313262, abs=1e-6)
    assert soft_bt_loss(r1[2:3], r2[2:3], y[2:3]).item() == pytest.approx(0.813262, abs=1e-6)


def test_a_tie_pulls_the_two_rewards_together():
    r1 = torch.tensor([2.0], requires_grad=True)
    r2 = torch.tensor([-1.0], requires_grad=True)
    soft_bt_loss(r1, r2, torch.tensor([0.5])).backward()
    assert r1.grad.item() > 0 > r2.grad.item()  # gradient descent lowers r1, raises r2
    equal = torch.tensor([0.7], requires_grad=True)
    soft_bt_loss(equal, equal.detach(), torch.tensor([0.5])).backward()
    assert equal.grad.item() == pytest.approx(0.0)


def test_a_captions_reward_does_not_depend_on_its_batch():
    torch.manual_seed(0)
    model = MessageRewardNet(RewardNetConfig(max_len=64))
    texts = ["You kill the newt!", "x" * 80, "", "It's a wall.", "Welcome to experience level 2."]
    together = model.score(texts)
    alone = [model.score([t])[0] for t in texts]
    assert together == pytest.approx(alone, abs=1e-5)
    assert encode_texts(["ab"], 4).tolist() == [[ord("a") + 1, ord("b") + 1, 0, 0]]


def test_saved_model_reloads_with_the_same_rewards(tmp_path):
    torch.manual_seed(1)
    model = MessageRewardNet(RewardNetConfig(embed_dim=8, channels=8, hidden=8))
    stats = RewardStats(0.5, 2.0, [0.0, 1.0], [-1.0, 1.0])
    save_reward_model(model, stats, tmp_path / "rm")
    loaded, loaded_stats = load_reward_model(tmp_path / "rm")
    texts = ["You find a hidden door.", ""]
    assert loaded.score(texts) == pytest.approx(model.score(texts))
    assert loaded_stats == stats
