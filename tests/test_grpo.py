"""GRPO (rl_text.algorithm: grpo): its formulas on numbers worked by hand, the infogain reward on a 4-candidate
game, and the stage on the built-in model: rounds, val, early stopping, a resume mid-round."""

from __future__ import annotations

import json
import math
import os
import shutil

import pytest
import torch

from pipeline.core.stage import StageContext, declaration, execute, stage_module
from pipeline.params import load_params
from pipeline.text.grpo import (
    Steps,
    discounted_returns,
    gigpo_advantages,
    group_advantages,
    pack_episode,
    reply_logps,
    rollout_weights,
    round_advantages,
    token_logps,
    token_loss,
    turn_advantages,
)

TINY_BOOTSTRAP = ["bootstrap.episodes=24", "bootstrap.epochs=1", "bootstrap.n_layer=1", "bootstrap.n_embd=32",
                  "bootstrap.n_head=2", "bootstrap.vocab_size=800", "bootstrap.batch_size=4",
                  "bootstrap.n_positions=512"]


def test_group_advantages_by_hand():
    # returns 1, 0, 0, 1: mean 0.5, sample std sqrt((4 x 0.25) / 3) = 0.57735; A = ±0.5 / (0.57735 + 1e-4)
    a = group_advantages([1.0, 0.0, 0.0, 1.0])
    assert a == pytest.approx([0.86588, -0.86588, -0.86588, 0.86588], abs=1e-5)
    assert group_advantages([1.0, 0.0, 0.0, 1.0], scale="none") == [0.5, -0.5, -0.5, 0.5]  # Dr. GRPO: R - mean
    assert group_advantages([1.0, 0.0], scale="batch", batch_std=2.0) == pytest.approx([0.5 / 2.0001, -0.5 / 2.0001])
    assert group_advantages([-20.0, -20.0, -20.0]) is None  # no signal: the group is skipped
    assert group_advantages([3.0]) is None


def test_batch_scaling_divides_by_the_rounds_std_of_returns():
    # two groups, returns [0, 2] and [1, 1]: the round's returns 0, 2, 1, 1 have sample std sqrt(2 / 3) = 0.816497
    groups = [[Steps([0.0]), Steps([2.0])], [Steps([1.0]), Steps([1.0])]]
    first, second = round_advantages(groups, "trajectory", scale="batch")
    assert first == [[pytest.approx(-1 / 0.816597, abs=1e-5)], [pytest.approx(1 / 0.816597, abs=1e-5)]]
    assert second is None


# The group of four, scored as the stage scores a 3-turn game (-1 a turn, 0 on the winning one, a loss pays
# every turn): a win at turn 2, a win at turn 3, a loss at turn 3, a win at turn 1.
WIN2, WIN3, LOSS3, WIN1 = [-1.0, 0.0], [-1.0, -1.0, 0.0], [-1.0, -1.0, -1.0], [0.0]


def test_turn_credit_compares_each_step_with_the_same_step_of_the_others():
    adv = turn_advantages([Steps(r) for r in (WIN2, WIN3, LOSS3, WIN1)], gamma=1.0)
    # step 1: G = -1, -2, -3, 0 (mean -1.5, sample std sqrt(5 / 3) = 1.290994)
    s1 = 1.290994 + 1e-4
    assert [a[0] for a in adv] == pytest.approx([0.5 / s1, -0.5 / s1, -1.5 / s1, 1.5 / s1], abs=1e-5)
    # step 2: G = 0, -1, -2 (mean -1, std 1); step 3: G = 0, -1 (mean -0.5, std 0.707107)
    assert [adv[0][1], adv[1][1], adv[2][1]] == pytest.approx([1 / 1.0001, 0.0, -1 / 1.0001], abs=1e-5)
    assert [adv[1][2], adv[2][2]] == pytest.approx([0.5 / 0.707207, -0.5 / 0.707207], abs=1e-5)
    assert adv[2][2] < 0  # the losing final guess is blamed (pooling every turn of the group gave it +0.11)
    assert adv[1][0] == pytest.approx(-0.387262, abs=1e-5)  # the 3-turn win's first question: -0.84 pooled
    # four identical 3-turn wins: nothing to compare, the group is skipped (pooled: [-1.17, 0, 1.17] each)
    assert round_advantages([[Steps(WIN3) for _ in range(4)]], "turn") == [None]


def test_gigpo_adds_the_step_advantage_of_steps_taken_in_the_same_state():
    # three episodes of a task; all share state "s0"; the first two also share "a1" (the same first move and reply)
    group = [Steps([-1.0, 0.0], ["s0", "a1"]), Steps([-1.0, -1.0, -1.0], ["s0", "a1", "a2"]),
             Steps([-1.0, 0.0], ["s0", "b1"])]
    omega = 0.5
    adv = gigpo_advantages(group, gamma=1.0, omega=omega, scale="none")
    # episode: R = -1, -3, -1 (mean -5/3): A_E = 2/3, -4/3, 2/3
    # step groups: s0 holds G = -1, -3, -1 (mean -5/3) -> 2/3, -4/3, 2/3; a1 holds G = 0, -2 -> +1, -1; b1 and a2 alone
    assert adv[0] == pytest.approx([2 / 3 + omega * 2 / 3, 2 / 3 + omega * 1.0])
    assert adv[1] == pytest.approx([-4 / 3 + omega * -4 / 3, -4 / 3 + omega * -1.0, -4 / 3])
    assert adv[2] == pytest.approx([2 / 3 + omega * 2 / 3, 2 / 3])
    # with std scaling of both: s0's G = -1, -3, -1 have sample std 1.154701; a1's G = 0, -2 have 1.414214
    scaled = gigpo_advantages(group, gamma=1.0, omega=1.0, step_scale="group")
    e = [x / 1.154801 for x in (2 / 3, -4 / 3, 2 / 3)]
    assert scaled[0] == pytest.approx([2 * e[0], e[0] + 1 / 1.414314], abs=1e-5)
    assert scaled[2] == pytest.approx([2 * e[2], e[2]], abs=1e-5)
    # step_scale none (the default, verl-agent's): the episode part scaled by its std, the step part mean only
    mean_only = gigpo_advantages(group, gamma=1.0, omega=1.0)
    assert mean_only[0] == pytest.approx([e[0] + 2 / 3, e[0] + 1.0], abs=1e-5)
    assert mean_only[1] == pytest.approx([e[1] - 4 / 3, e[1] - 1.0, e[1]], abs=1e-5)
    # gamma discounts the step returns: G of episode 2 = [-1 - 0.5 - 0.25, -1.5, -1]
    assert discounted_returns([-1.0, -1.0, -1.0], 0.5) == [-1.75, -1.5, -1.0]


def test_a_step_group_of_two_keeps_the_size_of_its_difference_under_mean_only_scaling():
    """Two steps in one state whose returns differ by 0.1 or by 10: std scaling gives ±0.707 for both (any difference
    of a pair), mean-only gives ±0.05 and ±5, as verl-agent's step-level default does."""
    for gap in (0.1, 10.0):
        group = [Steps([0.0], ["s"]), Steps([-gap], ["s"])]
        std = gigpo_advantages(group, gamma=1.0, omega=1.0, scale="none", step_scale="group")
        mean = gigpo_advantages(group, gamma=1.0, omega=1.0, scale="none", step_scale="none")
        a_e = gap / 2  # the episode part, R - mean R, unscaled here
        assert [std[0][0] - a_e, std[1][0] + a_e] == pytest.approx([0.70711, -0.70711], abs=2e-3)  # std + 1e-4
        assert [mean[0][0] - a_e, mean[1][0] + a_e] == pytest.approx([gap / 2, -gap / 2])


def test_turn_credit_indexes_steps_by_game_turn_not_by_reply():
    """Episode 1 re-samples an unparsed reply on turn 0 (steps: retry, move, move); episode 2 plays two moves. By game
    turn, episode 1's second move (turn 1) is compared with episode 2's second move; by reply index it was compared
    with nothing (episode 2 has no third reply) and its first move with episode 2's second."""
    one = Steps([-0.5, -1.0, 0.0], turns=[0, 0, 1])
    two = Steps([-1.0, -1.0], turns=[0, 1])
    adv = turn_advantages([one, two], gamma=1.0, scale="none")
    # turn 0: G = -1.5 (retry), -1 (move) | -2: mean -1.5; turn 1: G = 0 | -1: mean -0.5
    assert adv[0] == pytest.approx([0.0, 0.5, 0.5])
    assert adv[1] == pytest.approx([-0.5, -0.5])
    from pipeline.rl_text.grpo import step_turns

    assert step_turns({"reply_parsed": [False, True, False, False, True, True]}) == [0, 0, 1, 1, 1, 2]


def test_clipped_loss_and_kl_by_hand():
    log15 = math.log(1.5)
    logp, old = torch.tensor([[log15, 0.0]]), torch.tensor([[0.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0]])  # the second token is not a sampled reply token: no loss
    # ratio 1.5, eps 0.2: A = +1 -> -min(1.5, 1.2) = -1.2; A = -1 -> -min(-1.5, -1.2) = 1.5
    loss, stats = token_loss(logp, old, torch.tensor([1.0]), mask, clip_eps=0.2)
    assert float(loss) == pytest.approx(-1.2) and stats["clipped"] == 1.0
    loss, stats = token_loss(logp, old, torch.tensor([-1.0]), mask, clip_eps=0.2)
    assert float(loss) == pytest.approx(1.5) and stats["clipped"] == 0.0
    # KL (k3) to a reference at log-prob 0: exp(0 - ln 1.5) - (0 - ln 1.5) - 1 = 0.666667 + 0.405465 - 1
    loss, stats = token_loss(logp, old, torch.tensor([1.0]), mask, clip_eps=0.2, beta=0.1,
                             ref=torch.zeros_like(logp))
    assert stats["kl"] == pytest.approx(0.072132, abs=1e-6) and float(loss) == pytest.approx(-1.2 + 0.0072132)


def test_loss_types_average_token_losses_as_trl_names_them():
    # two replies at ratio 1 (loss = -A per token): reply 1 has 2 tokens at A = 1, 2; reply 2 one token at A = 3
    zeros, mask = torch.zeros(2, 2), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    dapo, _ = token_loss(zeros, zeros, adv, mask, clip_eps=0.2)
    assert float(dapo) == pytest.approx(-(1 + 2 + 3) / 3)  # every token alike
    grpo, _ = token_loss(zeros, zeros, adv, mask, clip_eps=0.2, loss_type="grpo")
    assert float(grpo) == pytest.approx(-((1 + 2) / 2 + 3) / 2)  # each reply's mean, then the mean over replies
    # dr_grpo: the sum over a constant budget (batch_size 4 x max_new_tokens 8 = 32), whatever the step holds
    dr, _ = token_loss(zeros, zeros, adv, mask, clip_eps=0.2, loss_type="dr_grpo", budget=32)
    assert float(dr) == pytest.approx(-(1 + 2 + 3) / 32)
    dr3, _ = token_loss(zeros[:1], zeros[:1], adv[:1], mask[:1], clip_eps=0.2, loss_type="dr_grpo", budget=32)
    assert float(dr3) == pytest.approx(-(1 + 2) / 32)  # one reply in the step: the same denominator
    # the rollout correction scales each token's loss, and a token it weighs 0 (mask) is not counted by dapo
    weighted, _ = token_loss(zeros, zeros, adv, mask, clip_eps=0.2, weights=torch.tensor([[0.5, 1.0], [0.0, 0.0]]))
    assert float(weighted) == pytest.approx(-(0.5 + 2) / 2)


def test_rollout_correction_by_hand():
    # trainer minus sampler log-probs: ln 3, -ln 4 (reply 1), ln 1.5 (reply 2): token ratios 3, 1/4, 1.5
    old = torch.tensor([[math.log(3), -math.log(4)], [math.log(1.5), 0.0]])
    sampler = torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    w, stats = rollout_weights(old, sampler, mask, "tis", "token", cap=2.0)
    assert w.flatten().tolist() == pytest.approx([2.0, 0.25, 1.5, 0.0])  # min(rho, C)
    assert stats["corrected"] == pytest.approx(1 / 3)
    assert stats["gap_mean"] == pytest.approx((math.log(3) + math.log(4) + math.log(1.5)) / 3)
    assert stats["gap_max"] == pytest.approx(math.log(4))
    w, stats = rollout_weights(old, sampler, mask, "mask", "token", cap=2.0)
    assert w.flatten().tolist() == pytest.approx([0.0, 0.0, 1.5, 0.0])  # outside [1/2, 2]: 0
    assert stats["corrected"] == pytest.approx(2 / 3)
    # per reply: the product of its tokens' ratios, 3 x 1/4 = 0.75 and 1.5, both inside [1/2, 2]
    w, stats = rollout_weights(old, sampler, mask, "mask", "sequence", cap=2.0)
    assert w.flatten().tolist() == pytest.approx([0.75, 0.75, 1.5, 0.0]) and stats["corrected"] == 0.0
    w, stats = rollout_weights(old, sampler, mask, "tis", "sequence", cap=1.2)
    assert w.flatten().tolist() == pytest.approx([0.75, 0.75, 1.2, 0.0]) and stats["corrected"] == pytest.approx(1 / 3)
    assert rollout_weights(old, sampler, mask, "none", "token", cap=2.0)[0] is None


def test_log_probs_are_the_untruncated_temperature_softmax_whatever_the_sampler_kept():
    """π is scored as TRL and verl score it: log_softmax(logits / T), no top-k, top-p or min-p. Min-p 0.3 on
    probabilities 0.5, 0.3, 0.15, 0.05 would keep the first three (renormalised by 0.95) and drop the last; here each
    keeps its own probability, and the fourth is a finite log(0.05) with a gradient."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(4, 4).clone().requires_grad_()
    got = token_logps(logits, torch.tensor([0, 1, 2, 3]))
    assert got.tolist() == pytest.approx([math.log(p) for p in (0.5, 0.3, 0.15, 0.05)], abs=1e-6)
    got[3].backward()
    assert logits.grad[3].tolist() == pytest.approx([-0.5, -0.3, -0.15, 0.95], abs=1e-6)  # onehot - p: moves
    # temperature 0.5 squares the probabilities: 0.25, 0.09, 0.0225, 0.0025 (sum 0.365)
    hot = token_logps(logits.detach()[:1], torch.tensor([1]), temperature=0.5)
    assert hot.tolist() == pytest.approx([math.log(0.09 / 0.365)], abs=1e-5)
    # a token min-p kept alone (p = 0.99 against 0.01): truncated it had log-prob 0 and no gradient; here it has both
    confident = torch.log(torch.tensor([[0.99, 0.01]])).requires_grad_()
    lp = token_logps(confident, torch.tensor([0]))
    lp.sum().backward()
    assert float(lp.detach()) == pytest.approx(math.log(0.99), abs=1e-6) and confident.grad.abs().sum() > 0


def test_k3_kl_is_finite_and_pulls_back_where_one_side_drops_the_token():
    """beta 0.1, a token the reference gives p = 0.001 and the policy p = 0.5 (min-p 0.1 would drop it under the
    reference: the old scoring floored it at -1e4 and clamped the log-ratio at 20, k3 = e^20 with no gradient).
    Untruncated: log-ratio r = ln(0.001 / 0.5) = -6.214608; k3 = e^r - r - 1 = 0.002 + 6.214608 - 1 = 5.216608, and
    its gradient in logp is 1 - e^r = 0.998 (pushing logp down, towards the reference). The mirror case, a token the
    policy gives 0.001 and the reference 0.5: k3 = 500 - 6.214608 - 1 = 492.785392, gradient 1 - 500 = -499 (pulling
    it up)."""
    ref = torch.tensor([[math.log(0.001), math.log(0.5)]])
    logp = torch.tensor([[math.log(0.5), math.log(0.001)]], requires_grad=True)
    loss, stats = token_loss(logp, logp.detach(), torch.tensor([0.0]), torch.ones(1, 2), clip_eps=0.2, beta=0.1,
                             ref=ref)
    assert stats["kl"] == pytest.approx((5.216608 + 492.785392) / 2, rel=1e-5)
    assert math.isfinite(float(loss.detach()))
    loss.backward()
    # dapo over 2 tokens, beta 0.1: d/dlogp = 0.1 x (1 - e^r) / 2
    assert logp.grad.flatten().tolist() == pytest.approx([0.1 * 0.998 / 2, 0.1 * -499 / 2], rel=1e-4)
    assert stats["moving"] == 1.0  # every token gets a gradient, through the KL alone (A = 0 here)


def test_floored_tokens_stay_out_of_the_gap_and_of_the_replys_product():
    """Reply 1: two tokens at ratio 1.5 and one the sampler reports at -1e4 (an engine's -inf): the gap statistics
    count the two, and sequence-level TIS (cap 3) weighs the reply by 1.5 x 1.5 = 2.25, not by exp(1e4) or 0; the
    floored token weighs 0. Reply 2 has one token at ratio 0.5."""
    old = torch.tensor([[math.log(1.5), math.log(1.5), -2.0], [math.log(0.5), 0.0, 0.0]])
    sampler = torch.tensor([[0.0, 0.0, -1e4], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    w, stats = rollout_weights(old, sampler, mask, "tis", "sequence", cap=3.0)
    assert w.tolist()[0] == pytest.approx([2.25, 2.25, 0.0]) and w.tolist()[1][0] == pytest.approx(0.5)
    assert stats["gap_max"] == pytest.approx(math.log(2)) and stats["floored"] == pytest.approx(1 / 4)
    assert stats["gap_mean"] == pytest.approx((2 * math.log(1.5) + math.log(2)) / 3)


def test_infogain_counts_the_candidates_the_task_shows_by_hand():
    """twenty_questions@shown4's first train task: the secret dog, shown among tiger, dog, sheep, zebra (of 17
    mammals). "Stripes?" splits the four shown 2 / 2 (tiger, zebra): 1 bit (over all 17 mammals, 2 have stripes:
    H(2/17) = 0.52 bits). After "No." dog and sheep are left, and "hooves?" splits them 1 / 1: 1 bit. The guess of
    the one left: 0 bits. The real game and knowledge base, as the scripted player reasons."""
    from pipeline.envs.twenty_questions import knowledge_base
    from pipeline.text.policies import make_games
    from pipeline.text.turn_rewards import InfogainTurnRewards

    game = make_games(load_params("params.yaml", ["games.groups=[twenty_questions@shown4]"]))[0]
    task = game.tasks("train")[0]
    assert (task.env, game.shown(task)) == ("dog", ["tiger", "dog", "sheep", "zebra"])
    kb = knowledge_base()
    assert [kb.value(o, "stripes") for o in game.shown(task)] == [True, False, False, True]
    assert sum(kb.value(o, "stripes") for o in kb.members("mammal")) == 2 and len(kb.members("mammal")) == 17
    moves = [("Does it have stripes?", "No."), ("Does it have hooves?", "No."), ("Is it a dog?", "Yes. Goal reached.")]
    conversation = game.conversation_start(task)
    for move, reply in moves:
        conversation += [{"role": "assistant", "content": f"<Answer>{move}</Answer>"},
                         {"role": "user", "content": reply}]

    row = {"group": game.name, "task_id": task.task_id, "secret": json.dumps(task.env), "category": task.agent,
        "difficulty": task.difficulty, "split": task.split, "conversation": conversation}
    [gains] = InfogainTurnRewards(None)(None, None, [game], [row], 0, 0)
    assert gains == pytest.approx([1.0, 1.0, 0.0])


def test_infogain_needs_a_knowledge_base():
    from pipeline.core.config import ConfigError

    with pytest.raises(ConfigError, match="infogain reads the game's knowledge base"):
        load_params("params.yaml", ["rl_text.reward=infogain", "games.groups=[twenty_questions,wordle]"])


def test_rl_text_groups_are_a_subset_of_the_games_and_let_infogain_train_beside_a_game_without_a_base():
    from pipeline.core.config import ConfigError

    both = ["rl_text.reward=infogain", "games.groups=[twenty_questions,wordle]"]
    assert load_params("params.yaml", [*both, "rl_text.groups=[twenty_questions]"]).rl_text.groups == \
        ["twenty_questions"]
    with pytest.raises(ConfigError, match="infogain reads .* the groups it trains on also hold wordle"):
        load_params("params.yaml", [*both, "rl_text.groups=[wordle]"])
    with pytest.raises(ConfigError, match=r"rl_text.groups: guess_my_city not in games.groups "
                                          r"\(twenty_questions, wordle\)"):
        load_params("params.yaml", [*both, "rl_text.groups=[twenty_questions,guess_my_city]"])


@pytest.fixture(scope="module")
def bootstrapped(tmp_path_factory):
    """A tiny bootstrap run (the built-in policy the stage starts from): its directory."""
    tmp = tmp_path_factory.mktemp("bootstrap")
    stage_module("bootstrap").run(load_params("params.yaml", [f"data_dir={tmp / 'data'}", *TINY_BOOTSTRAP]),
                                  StageContext())
    return tmp


class Killed(Exception):
    """Stands for a kill during the second round's update."""


def grpo_params(tmp_path, *extra):
    return load_params("params.yaml", [f"data_dir={tmp_path / 'data'}", *TINY_BOOTSTRAP, "rl_text.algorithm=grpo",
                                       "rl_text.reward=infogain", "games.max_train_tasks=6", "games.val_fraction=0.34",
                                       "rl_text.rounds=2", "rl_text.tasks_per_round=2",
                                       "rl_text.trajectories_per_task=3", "rollout_text.max_new_tokens=8",
                                       "rl_text.grpo.lr=0.001", "policy.free_answers=true", "tracking.enabled=false",
                                       *extra])


def test_rl_text_plays_and_keeps_its_val_round_on_its_own_groups_only(bootstrapped, tmp_path, monkeypatch):
    """games.groups holds two games, rl_text.groups one: every train and val episode of the rounds is of that one."""
    import pyarrow.parquet as pq

    import pipeline.rl_text.rounds as rounds

    real, val_groups = rounds.val_success, set()

    def val_success(params, policy, val_jobs):
        val_groups.update(g.name for g, _ in val_jobs)
        return real(params, policy, val_jobs)

    monkeypatch.setattr(rounds, "val_success", val_success)
    shutil.copytree(bootstrapped / "data" / "bootstrap" / "model", tmp_path / "data" / "train_policy" / "dpo")
    params = grpo_params(tmp_path, "games.groups=[twenty_questions,guess_my_city]",
                         "rl_text.groups=[guess_my_city]", "rl_text.rounds=1", "rl_text.max_val_tasks=2",
                         "rl_text.val_trajectories=1")
    stage_module("rl-text").run(declaration("rl-text").slice(params), StageContext())
    rows = pq.read_table(tmp_path / "data" / "rl_text" / "rollouts").to_pylist()
    assert rows and {r["group"] for r in rows} == {"guess_my_city"}
    assert val_groups == {"guess_my_city"}


def test_grpo_rounds_val_early_stopping_and_resume_mid_round(bootstrapped, tmp_path, monkeypatch):
    import pipeline.rl_text.grpo as grpo
    import pipeline.rl_text.rounds as rounds

    def fresh(where):
        shutil.copytree(bootstrapped / "data" / "bootstrap" / "model", where / "data" / "train_policy" / "dpo")
        return declaration("rl-text").slice(grpo_params(where))  # the stage reads only the params it declares

    straight = fresh(tmp_path / "straight")
    stage_module("rl-text").run(straight, StageContext())
    history = json.loads(straight.plots_path("rl_rounds.json").read_text())
    assert [h["round"] for h in history] == [0, 1] and all(h["algorithm"] == "grpo" for h in history)
    assert history[0]["grpo/replies"] > 0  # infogain gives every group a spread: replies were trained on
    assert history[0]["grpo/groups_skipped"] == 0

    killed = fresh(tmp_path / "killed")
    real_update, plays, updates = grpo.update, [], []
    real_play = rounds.play_episodes

    def update(*args, **kwargs):
        updates.append(1)
        if len(updates) == 2:
            raise Killed
        return real_update(*args, **kwargs)

    def play(*args, **kwargs):
        plays.append(kwargs.get("policy_name"))
        return real_play(*args, **kwargs)

    monkeypatch.setattr(grpo, "update", update)
    monkeypatch.setattr(rounds, "play_episodes", play)
    with pytest.raises(Killed):
        stage_module("rl-text").run(killed, StageContext())
    assert plays.count("rl-round-1") == 1  # round 1 was played, then killed in its update
    stage_module("rl-text").run(killed, StageContext())
    assert plays.count("rl-round-0") == 1 and plays.count("rl-round-1") == 1  # nothing played again
    assert json.loads(killed.plots_path("rl_rounds.json").read_text()) == history  # the same rounds, the same val
    for name in ("model.safetensors",):
        a = (straight.data_path("rl_text", "model") / name).read_bytes()
        b = (killed.data_path("rl_text", "model") / name).read_bytes()
        assert a == b  # the resumed run kept the same model


def test_a_stop_during_the_update_ends_it_before_the_next_optimizer_step(bootstrapped, tmp_path, monkeypatch):
    """A SIGTERM while an optimizer step runs: the update stops before the next step (no log-prob pass after the
    signal), rather than running to the grace period's drop, and the line names the round whose episodes are kept."""
    import os
    import signal

    import pipeline.rl_text.grpo as grpo
    from pipeline.core import interrupt

    shutil.copytree(bootstrapped / "data" / "bootstrap" / "model", tmp_path / "data" / "train_policy" / "dpo")
    params = declaration("rl-text").slice(grpo_params(tmp_path, "rl_text.grpo.batch_size=1"))
    real, calls = grpo.reply_logps, []

    def reply_logps(*args, **kwargs):
        calls.append(interrupt.requested())
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # lands now, in the update's first step
        return real(*args, **kwargs)

    monkeypatch.setattr(grpo, "reply_logps", reply_logps)
    with pytest.raises(interrupt.Stopped, match=r"round 1 of 2 \(its episodes played\)"):
        with interrupt.stopping("rl-text", grace_s=None):  # no timers: the test process is not exited
            stage_module("rl-text").run(params, StageContext())
    assert calls == [None]  # the first step ran whole; no step after the signal


def test_the_model_kept_is_the_val_best_round_not_the_last(bootstrapped, tmp_path, monkeypatch):
    """Early stopping on val: with val success 0.2 for the DPO start, 0.6 after round 1 and 0.4 after round 2, the
    stage's model is round 1's, byte for byte (not the last round's, not the start's). Each round's val success and
    seconds go to the tracker at its own step; the stage's totals (logged at the tracker's step 0 when it ends) have
    names of their own, so round 0's values are not overwritten."""
    import pipeline.rl_text.rounds as rounds
    from pipeline.models.launch import _LoggedMetrics

    shutil.copytree(bootstrapped / "data" / "bootstrap" / "model", tmp_path / "data" / "train_policy" / "dpo")
    params = declaration("rl-text").slice(grpo_params(tmp_path))
    scores = iter([0.2, 0.6, 0.4])
    monkeypatch.setattr(rounds, "val_success", lambda *args, **kwargs: next(scores))
    tracker = _LoggedMetrics()  # keeps what the stage logs, with its step
    result = stage_module("rl-text").run(params, StageContext(tracker=tracker))
    assert result.metrics["rl/chosen_round"] == 1 and result.metrics["rl/val_success_chosen"] == 0.6
    assert result.metrics["rl/kept_by_val"] == 1
    per_round = {step: metrics for metrics, step in tracker.logged}
    assert sorted(per_round) == [0, 1] and [per_round[r]["rl/val_success"] for r in (0, 1)] == [0.6, 0.4]
    for key in ("grpo/update_s", "grpo/old_pass_s"):
        assert per_round[0][key] > 0 and per_round[1][key] > 0 and key not in result.metrics
        total = result.metrics[key.removesuffix("_s") + "_total_s"]
        assert total == pytest.approx(per_round[0][key] + per_round[1][key])
    assert not set(result.metrics) & set(per_round[0])  # nothing the end logs at step 0 hides round 0's
    rounds = tmp_path / "data" / "rl_text" / "rounds"
    first, last = rounds / "round-000" / "model.safetensors", rounds / "round-001" / "model.safetensors"
    kept = (tmp_path / "data" / "rl_text" / "model" / "model.safetensors").read_bytes()
    assert kept == first.read_bytes() and kept != last.read_bytes()


def test_pass_at_k_by_hand():
    from pipeline.text.play import pass_at_k

    def rows(task, wins, n):
        return [{"group": "g", "task_id": task, "success": i < wins} for i in range(n)]

    # 8 episodes, 1 win: 1 - C(7, 4) / C(8, 4) = 1 - 35 / 70 = 0.5; 4 episodes, 0 wins: 0; 8 episodes, 5 wins: 1
    assert pass_at_k(rows("a", 1, 8), 4) == pytest.approx(0.5)
    assert pass_at_k(rows("a", 1, 8) + rows("b", 0, 4) + rows("c", 5, 8), 4) == pytest.approx((0.5 + 0 + 1) / 3)
    assert pass_at_k(rows("a", 1, 3), 4) is None  # fewer than k episodes of a task


def test_rl_rounds_draw_from_their_own_count_of_train_tasks_and_never_from_val():
    from pipeline.rl_text.rounds import train_jobs
    from pipeline.text.policies import game_tasks, make_games

    base = ["games.groups=[twenty_questions]", "games.max_train_tasks=2", "games.val_fraction=0.2"]
    games = make_games(load_params("params.yaml", base))
    follow = load_params("params.yaml", base)  # null: the tasks rollout-text played
    def jobs(params):
        return train_jobs(params.games, params.rl_text.max_train_tasks, games)

    assert [t.task_id for _, t in jobs(follow)] == [t.task_id for t in game_tasks(follow.games, games[0], "train")][:2]
    five = load_params("params.yaml", [*base, "rl_text.max_train_tasks=5"])
    every = load_params("params.yaml", [*base, "rl_text.max_train_tasks=0"])
    val = {t.task_id for t in game_tasks(every.games, games[0], "val")}
    assert len(jobs(five)) == 5 and jobs(five)[:2] == jobs(follow)
    all_train = {t.task_id for _, t in jobs(every)}
    assert len(all_train) + len(val) == len(games[0].tasks("train")) and not all_train & val


def test_rl_val_rounds_take_their_own_cap_not_evaluations():
    """games.max_eval_tasks caps evaluation only (training stages do not watch it); rl_text.max_val_tasks caps the
    val tasks the rounds' early stopping plays; without a val split there are none (and no error)."""
    from pipeline.rl_text.rounds import val_jobs_of
    from pipeline.text.policies import game_tasks, make_games

    base = ["games.groups=[twenty_questions]", "games.val_fraction=0.2", "games.max_eval_tasks=2"]
    params = load_params("params.yaml", base)
    game = make_games(params)[0]
    every_val = game_tasks(params.games, game, "val", cap=0)
    assert len(game_tasks(params.games, game, "val")) == 2 < len(every_val)  # evaluation's cap
    assert [t for _, t in val_jobs_of(params.games, params.rl_text, [game])] == every_val
    capped = load_params("params.yaml", [*base, "rl_text.max_val_tasks=3"])
    assert [t for _, t in val_jobs_of(capped.games, capped.rl_text, [game])] == every_val[:3]
    no_val = load_params("params.yaml", ["games.groups=[twenty_questions]", "games.val_fraction=0"])
    assert val_jobs_of(no_val.games, no_val.rl_text, [game]) == []


def test_compare_rounds_plays_each_round_as_evaluate_text_played_the_kept_one(bootstrapped, tmp_path):
    """`curio compare rounds`: every round's policy on held-out through evaluate-text's own stage (same tasks,
    episodes, seed), so the kept round's row is the run's own RL row to the task; paired against DPO by hand; a
    rerun scores nothing again."""
    from pipeline.core.artifacts import read_rows
    from pipeline.reporting.breakdown import task_means
    from pipeline.tools.compare_rl_text import make_project
    from pipeline.tools.compare_rounds import compare_rounds

    data = tmp_path / "data"
    # the bandit's 2 arms: an untrained policy wins about half its games, so rows differ task by task; no val, so
    # the last round is the one kept
    overrides = [f"data_dir={data}", *TINY_BOOTSTRAP, "games.groups=[bandit@easy2]", "rl_text.algorithm=grpo",
                 "games.max_train_tasks=6", "games.val_fraction=0.34", "rl_text.rounds=2", "rl_text.tasks_per_round=2",
                 "rl_text.trajectories_per_task=3", "rollout_text.max_new_tokens=8", "rl_text.grpo.lr=0.001",
                 "rl_text.val_trajectories=0", "policy.free_answers=true", "games.max_eval_tasks=6",
                 "evaluate_text.trajectories_per_task=2", "evaluate_text.policies=[dpo,rl]"]
    make_project(tmp_path, overrides)
    shutil.copytree(bootstrapped / "data" / "bootstrap", data / "bootstrap")
    shutil.copytree(bootstrapped / "data" / "bootstrap" / "model", data / "train_policy" / "dpo")
    params = load_params(tmp_path / "params.yaml")
    for stage in ("rl-text", "evaluate-text"):
        execute(stage, params)  # as `curio stage` runs it: the metrics file too

    lines = compare_rounds(tmp_path, [])
    table = json.loads((data / "grpo_rounds" / "rounds.json").read_text())
    assert [r["rounds"] for r in table["rounds"]] == [0, 1, 2] and table["kept"] == 2
    assert "\n".join(lines).count("\n| ") == 4 and "the last, with no val rounds: 2" in lines[0]
    own = read_rows(data / "evaluate_text")

    def played(rows, policy):
        return sorted((r["group"], r["task_id"], r["sample"], r["turns"], r["final_action"], str(r["conversation"]))
                      for r in rows if r["policy"] == policy)

    kept = read_rows(data / "grpo_rounds" / "round-001" / "evaluate_text")
    assert played(kept, "rl") == played(own, "rl")  # the kept round played again: evaluate-text's own episodes
    means = task_means(own)
    for r in table["rounds"][1:]:
        rows = read_rows(data / "grpo_rounds" / f"round-{r['rounds'] - 1:03d}" / "evaluate_text")
        assert {x["policy"] for x in rows} == {"rl"} and len(rows) == len(played(own, "dpo"))
        m = task_means(rows)["rl"]
        d = [m[t] - means["dpo"][t] for t in m]
        assert r["vs_dpo"] == pytest.approx(sum(d) / len(d)) and r["tasks"] == len(d) == 6
    parts = sorted((data / "grpo_rounds").rglob("part-*.parquet"))
    stamps = [p.stat().st_mtime_ns for p in parts]
    compare_rounds(tmp_path, [])
    assert [p.stat().st_mtime_ns for p in parts] == stamps  # nothing played again


def test_compare_rounds_without_grpo_rounds_is_one_line(tmp_path):
    from pipeline.tools import ToolError
    from pipeline.tools.compare_rl_text import make_project
    from pipeline.tools.compare_rounds import compare_rounds

    with pytest.raises(ToolError, match="no params.yaml in"):
        compare_rounds(tmp_path, [])
    make_project(tmp_path, [f"data_dir={tmp_path / 'data'}", "games.val_fraction=0.2"])
    with pytest.raises(ToolError, match="no finished GRPO rounds under .*rl_text.algorithm=grpo"):
        compare_rounds(tmp_path, [])


def test_hf_plays_token_in_token_out_and_its_log_probs_are_the_trainers(smollm2_dir):
    """SmolLM2 plays twenty_questions@shown4 from ids as RL rounds sample by default (temperature 1, no top-k, top-p
    or min-p, not even the generation config's top-k 50): each reply's prompt extends the previous prompt and reply
    (an episode packs into one sequence), and the sampler's log-probs are the trainer's untruncated ones to float
    rounding. With min-p 0.3 kept, the sampler reports the truncated, renormalised log-probs: at or above the
    trainer's, so every rollout-correction ratio is at most 1."""
    from pipeline.llm.base import Sampling
    from pipeline.llm.hf import HFBackend, load_policy
    from pipeline.rl_text.rounds import round_sampling
    from pipeline.text.play import play_episodes
    from pipeline.text.policies import make_games

    params = load_params("params.yaml", ["policy.free_answers=true", "games.groups=[twenty_questions@shown4]",
                                         "rollout_text.max_new_tokens=24"])
    model, tok = load_policy(smollm2_dir)
    game = make_games(params)[0]
    sampling = round_sampling(params.rl_text.sampling, params.rollout_text.max_new_tokens)
    assert sampling.top_k == 0 and sampling.min_p == 0.0 and sampling.temperature == 1.0
    jobs = [(game, t, s) for t in game.tasks("train")[:2] for s in range(2)]
    backend = HFBackend(smollm2_dir, model_obj=model, tokenizer=tok)

    def gaps(rows):
        out = []
        for row in rows:
            replies = list(zip(row["reply_prompt_ids"], row["reply_token_ids"], strict=True))
            assert len(replies) == row["turns"] and all(row["reply_parsed"])
            [packed] = pack_episode(replies)  # every prompt extends the one before: one sequence
            assert [packed.ids[a:a + n] for a, n in packed.replies] == row["reply_token_ids"]
            assert [packed.ids[:a] for a, _ in packed.replies] == row["reply_prompt_ids"]
            with torch.no_grad():
                trainer = torch.cat(reply_logps(model, [packed]))
            out.append(torch.tensor([x for lp in row["reply_logprobs"] for x in lp]) - trainer)
        return torch.cat(out)

    untruncated = gaps(play_episodes(backend, jobs, sampling, seed=3, token_ids=True))
    assert float(untruncated.abs().max()) < 1e-3
    truncated = gaps(play_episodes(backend, jobs, Sampling(temperature=1.0, min_p=0.3, top_k=0, max_tokens=24),
                                   seed=3, token_ids=True))
    assert float(truncated.min()) > -1e-3 and float(truncated.max()) > 1e-2  # sampler >= trainer, and apart


def played(conversation_moves: list[tuple[str, bool]], success: bool, turns: int, dense=None) -> dict:
    """A hand-made GRPO row of twenty_questions@shown4: each sampled reply (text, parsed) in order."""
    conversation = [{"role": "system", "content": "play"}, {"role": "user", "content": "which one?"}]
    context = []
    for text, parsed in conversation_moves:
        context.append(len(conversation))
        if parsed:
            conversation += [{"role": "assistant", "content": text}, {"role": "user", "content": "No."}]
    return {"group": "twenty_questions@shown4", "task_id": "dog", "conversation": conversation, "success": success,
            "turns": turns, "reward": 0.0, "reply_parsed": [p for _, p in conversation_moves],
            "reply_context": context, "turn_rewards": dense or []}


def test_the_stages_step_rewards_and_advantages_by_hand():
    """rl-text's GRPO steps on three episodes of a 3-turn task: a re-sampled reply, then a first-turn win; three
    questions and a loss; a question, then four replies that never parse (the episode ends invalid). Rewards:
    -1 a turn, 0 on the winning one, -format_penalty for a reply that did not parse, a failure's unused turns on
    its last step; the dense reward is added to the move it belongs to."""
    from pipeline.rl_text.grpo import advantages_of, step_anchors, step_rewards
    from pipeline.text.policies import make_games

    params = load_params("params.yaml", ["games.groups=[twenty_questions@shown4]", "rl_text.grpo.format_penalty=0.5"])
    games = {g.name: g for g in make_games(params)}
    game, cfg = games["twenty_questions@shown4"], params.rl_text.grpo
    win = played([("???", False), ("dog", True)], success=True, turns=1, dense=[0.25])
    loss = played([("a", True), ("b", True), ("c", True)], success=False, turns=3)
    invalid = played([("a", True)] + [("???", False)] * 4, success=False, turns=1)
    assert step_rewards(win, game, cfg) == [-0.5, 0.25]
    assert step_rewards(loss, game, cfg) == [-1.0, -1.0, -1.0]
    assert step_rewards(invalid, game, cfg) == [-1.0, -0.5, -0.5, -0.5, -0.5 - 2.0]  # 2 turns left unused
    anchors = step_anchors(win)
    assert anchors[0] == anchors[1] and len(anchors[0]) == 2  # the re-sampled reply shares its turn's state
    assert step_anchors(loss)[0] == anchors[0] and len(step_anchors(loss)[2]) == 6
    # trajectory credit: returns -0.25, -3, -5 (mean -2.75, sample std sqrt(11.375 / 2) = 2.384848)
    scored, skipped = advantages_of([win, loss, invalid], games, cfg)
    s = 2.384848 + 1e-4
    assert skipped == 0 and [len(a) for _, a in scored] == [2, 3, 5]
    assert [a[0] for _, a in scored] == pytest.approx([2.5 / s, -0.25 / s, -2.25 / s], abs=1e-5)
    assert all(len(set(a)) == 1 for _, a in scored)  # the same advantage for every step of an episode
    # turn credit without std, by game turn (the re-sampled replies share their move's turn): game turns are
    # win [0, 0], loss [0, 1, 2], invalid [0, 1, 1, 1, 1]; returns G win [-0.25, 0.25], loss [-3, -2, -1], invalid
    # [-5, -4, -3.5, -3, -2.5]. Turn 0: -0.25, 0.25, -3, -5 (mean -2); turn 1: -2, -4, -3.5, -3, -2.5 (mean -3);
    # turn 2: the loss's -1 alone (0)
    turn = params.rl_text.grpo.model_copy(update={"credit": "turn", "scale_rewards": "none"})
    [(_, a_win), (_, a_loss), (_, a_invalid)] = advantages_of([win, loss, invalid], games, turn)[0]
    assert a_win == pytest.approx([1.75, 2.25], abs=1e-5)
    assert a_loss == pytest.approx([-1.0, 1.0, 0.0], abs=1e-5)
    assert a_invalid == pytest.approx([-3.0, -1.0, -0.5, 0.0, 0.5], abs=1e-5)
    # one episode alone, or all the same: no signal, skipped
    assert advantages_of([loss, dict(loss)], games, cfg) == ([], 1)


@pytest.mark.parametrize("algorithm,val", [("grpo", None), ("filtered_bc", None), ("archer", None), ("chai", None),
                                           ("grpo", "0"), ("filtered_bc", "0")])
def test_every_algorithm_runs_on_the_default_params_or_is_refused_in_one_line(algorithm, val, bootstrapped, tmp_path):
    """`curio stage rl-text -S rl_text.algorithm=A` on the repo's params.yaml, only the budget made small, and with
    games.val_fraction 0 (no val split): exit 0, or exit 2 with one line; never an internal error. Without val the
    round-based algorithms train and keep their last round, and say so (rl/kept_by_val 0); with the repo's val split
    they keep the val-best."""
    import subprocess
    import sys

    from stages.rl_text import ALGORITHMS

    assert set(ALGORITHMS) == {"grpo", "filtered_bc", "archer", "chai"}  # a new one joins the parametrisation
    shutil.copy("params.yaml", tmp_path / "params.yaml")
    for policy in ("sft", "dpo"):
        shutil.copytree(bootstrapped / "data" / "bootstrap" / "model", tmp_path / "data" / "train_policy" / policy)
    small = [*TINY_BOOTSTRAP, "tracking.enabled=false", f"rl_text.algorithm={algorithm}", "rl_text.rounds=1",
             "rl_text.tasks_per_round=2", "rl_text.trajectories_per_task=2", "rl_text.chai.num_samples=2",
             "rl_text.critic.steps=2", "rollout_text.max_new_tokens=8",
             *([f"games.val_fraction={val}"] if val is not None else [])]
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "stage", "rl-text",
                          *[x for o in small for x in ("-S", o)]], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}, timeout=600)
    assert "internal error" not in res.stderr, res.stderr[-3000:]
    assert res.returncode in (0, 2), res.stderr[-3000:]
    if res.returncode == 2:
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
        return
    metrics = json.loads((tmp_path / "metrics" / "stages" / "rl-text.json").read_text())
    if algorithm in ("grpo", "filtered_bc") and val == "0":
        assert metrics["rl/kept_by_val"] == 0 and metrics["rl/chosen_round"] == 1  # no val: the last round
    elif algorithm in ("grpo", "filtered_bc"):
        assert metrics["rl/kept_by_val"] == 1 and metrics["rl/chosen_round"] in (0, 1)


def test_motifs_outcome_is_counted_once_under_grpo(tmp_path, monkeypatch):
    """rl_text.reward motif with motif.outcome_coef 0.5 on a lost 3-turn episode whose three moves each score r̃ = 1
    (no threshold, distinct moves): filtered_bc's dense reward is 1 + 0.5 x (-1) = 0.5 a move; under grpo the dense
    reward is the intrinsic 1 alone and GRPO adds the outcome once, grpo.outcome_coef 1 x (-1): each step 0 (it was
    -1 + 0.5 = -0.5, the outcome weighed 1.5 times)."""
    import pipeline.models.reward_net as reward_net
    from pipeline.rl_text.grpo import step_rewards
    from pipeline.text.policies import make_games
    from pipeline.text.turn_rewards import MotifTurnRewards

    class Model:
        def score(self, texts):
            return [1.0] * len(texts)

    class Stats:
        def normalize(self, xs):
            return list(xs)

        def threshold(self, quantile):
            return None

    (tmp_path / "reward_model_text").mkdir()
    (tmp_path / "reward_model_text" / reward_net.STATS).write_text(json.dumps({"context_messages": 4}))
    monkeypatch.setattr(reward_net, "load_reward_model", lambda path: (Model(), Stats()))
    base = [f"data_dir={tmp_path}", "games.groups=[twenty_questions@shown4]", "rl_text.reward=motif",
            "rl_text.motif.outcome_coef=0.5", "rl_text.motif.threshold_quantile=null"]
    loss = played([("a", True), ("b", True), ("c", True)], success=False, turns=3)
    for algorithm, dense in (("filtered_bc", [0.5, 0.5, 0.5]), ("grpo", [1.0, 1.0, 1.0])):
        params = load_params("params.yaml", [*base, f"rl_text.algorithm={algorithm}"])
        games = make_games(params)
        got = MotifTurnRewards(params)(None, None, games, [loss], 0, 0)
        assert got == [pytest.approx(dense)]
    assert step_rewards({**loss, "turn_rewards": got[0]}, games[0], params.rl_text.grpo) == [0.0, 0.0, 0.0]


def test_dense_rewards_must_be_one_per_move():
    """A dense reward shorter than the moves was padded with 0 silently; now it is refused naming the episode."""
    from pipeline.rl_text.grpo import step_rewards
    from pipeline.text.policies import make_games

    params = load_params("params.yaml", ["games.groups=[twenty_questions@shown4]"])
    game = make_games(params)[0]
    loss = played([("a", True), ("b", True), ("c", True)], success=False, turns=3, dense=[0.5, 0.5])
    with pytest.raises(ValueError, match="3 moves but 2 dense rewards"):
        step_rewards(loss, game, params.rl_text.grpo)


def test_weight_decay_is_a_param_and_off_by_default(bootstrapped, tmp_path, monkeypatch):
    """The update's AdamW takes grpo.weight_decay: 0 by default (TRL's; torch's own default is 0.01), and the
    value set when one is."""
    params = load_params("params.yaml", [])
    assert params.rl_text.grpo.weight_decay == 0.0
    decays, real = [], torch.optim.AdamW

    class Recording(real):
        def __init__(self, *args, **kwargs):
            decays.append(kwargs.get("weight_decay"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", Recording)
    shutil.copytree(bootstrapped / "data" / "bootstrap" / "model", tmp_path / "data" / "train_policy" / "dpo")
    for decay in ("0.0", "0.05"):
        params = declaration("rl-text").slice(grpo_params(tmp_path, "rl_text.rounds=1", "games.val_fraction=0",
                                                         f"rl_text.grpo.weight_decay={decay}"))
        stage_module("rl-text").run(params, StageContext())
    assert decays == [0.0, 0.05]


def test_filtered_bc_keeps_the_val_best_round_as_grpo_does(bootstrapped, tmp_path, monkeypatch):
    """The shared round driver: filtered BC with val success 0.5 for the DPO start, 0.2 and 0.3 after its rounds keeps
    the DPO policy itself (round 0), byte for byte, where it used to keep its last round."""
    import pipeline.rl_text.rounds as rounds

    dpo = tmp_path / "data" / "train_policy" / "dpo"
    shutil.copytree(bootstrapped / "data" / "bootstrap" / "model", dpo)
    params = declaration("rl-text").slice(grpo_params(tmp_path, "rl_text.algorithm=filtered_bc",
                                                      "rl_text.reward=outcome", "rl_text.epochs=3",
                                                      "rl_text.batch_size=1"))
    scores = iter([0.5, 0.2, 0.3])
    monkeypatch.setattr(rounds, "val_success", lambda *args, **kwargs: next(scores))
    result = stage_module("rl-text").run(params, StageContext())
    assert result.metrics["rl/chosen_round"] == 0 and result.metrics["rl/val_success_chosen"] == 0.5
    kept = tmp_path / "data" / "rl_text" / "model" / "model.safetensors"
    assert kept.read_bytes() == (dpo / "model.safetensors").read_bytes()
    last = tmp_path / "data" / "rl_text" / "rounds" / "round-001" / "model.safetensors"
    assert last.read_bytes() != kept.read_bytes()
    history = json.loads(params.plots_path("rl_rounds.json").read_text())
    assert [h["val_success"] for h in history] == [0.2, 0.3] and all(h["algorithm"] == "filtered_bc" for h in history)
