"""GRPO (rl_text.algorithm: grpo): its formulas on numbers worked by hand, the infogain reward on a 4-candidate
game, and the stage on the built-in model: rounds, val, early stopping, a resume mid-round."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from pipeline.core.stage import StageContext, declaration, execute, stage_module
from pipeline.params import load_params
from pipeline.text.grpo import discounted_returns, group_advantages, token_loss, turn_advantages

TINY_BOOTSTRAP = ["bootstrap.episodes=24", "bootstrap.epochs=1", "bootstrap.n_layer=1", "bootstrap.n_embd=32",
                  "bootstrap.n_head=2", "bootstrap.vocab_size=800", "bootstrap.batch_size=4",
                  "bootstrap.n_positions=512"]


def test_group_advantages_by_hand():
    # returns 1, 0, 0, 1: mean 0.5, sample std sqrt((4 x 0.25) / 3) = 0.57735; A = ±0.5 / (0.57735 + 1e-4)
    a = group_advantages([1.0, 0.0, 0.0, 1.0])
    assert a == pytest.approx([0.86588, -0.86588, -0.86588, 0.86588], abs=1e-5)
    assert group_advantages([-20.0, -20.0, -20.0]) is None  # no signal: the group is skipped
    assert group_advantages([3.0]) is None


def test_discounted_and_turn_returns_by_hand():
    assert discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert discounted_returns([1.0, -1.0], 1.0) == [0.0, -1.0]
    # G = [[1, 1], [0, 0]] with gamma 1: normalised over the group's four turns as above
    adv = turn_advantages([[0.0, 1.0], [0.0, 0.0]], 1.0)
    assert adv == [pytest.approx([0.86588] * 2, abs=1e-5), pytest.approx([-0.86588] * 2, abs=1e-5)]
    assert turn_advantages([[0.0], [0.0]], 1.0) is None


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
    # token-level mean over the masked tokens of the batch (two rows, three tokens)
    loss, _ = token_loss(torch.zeros(2, 2), torch.zeros(2, 2), torch.tensor([[1.0, 2.0], [3.0, 0.0]]),
                         torch.tensor([[1.0, 1.0], [1.0, 0.0]]), clip_eps=0.2)
    assert float(loss) == pytest.approx(-(1 + 2 + 3) / 3)


def test_infogain_on_a_four_candidate_game_by_hand(monkeypatch):
    """Secrets a, b, c, d; "big?" is yes for a, "red?" for b and c, "b?" (a guess) for b. The questions' answers
    split 1/4, then 2/3 of the three left, then 1/2 of the two left: H(1/4), H(2/3), H(1/2) bits."""
    import pipeline.text.multiturn_pairs as mp
    from pipeline.text.turn_rewards import InfogainTurnRewards

    yes = {"big?": {"a"}, "red?": {"b", "c"}, "b?": {"b"}}

    def consistent(history):
        left = {"a", "b", "c", "d"}
        for q, reply in history:
            left = left & yes[q] if reply.lower().startswith("yes") else left - yes[q]
        return sorted(left)

    monkeypatch.setattr(mp, "knowledge_base_candidates", lambda game, task: consistent)

    class Game:
        name = "fake"

        @staticmethod
        def parse_action(text):
            return text

    conversation = [{"role": "system", "content": "play"}, {"role": "user", "content": "start"},
                    {"role": "assistant", "content": "big?"}, {"role": "user", "content": "No."},
                    {"role": "assistant", "content": "red?"}, {"role": "user", "content": "Yes."},
                    {"role": "assistant", "content": "b?"}, {"role": "user", "content": "Yes. Goal reached."}]
    row = {"group": "fake", "task_id": "b", "secret": "{}", "category": "x", "difficulty": "easy", "split": "train",
           "conversation": conversation}
    [gains] = InfogainTurnRewards(None)(None, None, [Game()], [row], 0, 0)

    def h(p):
        return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))

    assert gains == pytest.approx([h(1 / 4), h(2 / 3), 1.0])
    assert gains == pytest.approx([0.811278, 0.918296, 1.0], abs=1e-6)


def test_infogain_needs_a_knowledge_base():
    from pipeline.core.config import ConfigError

    with pytest.raises(ConfigError, match="infogain reads the game's knowledge base"):
        load_params("params.yaml", ["rl_text.reward=infogain", "games.groups=[twenty_questions,wordle]"])


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


def test_grpo_rounds_val_early_stopping_and_resume_mid_round(bootstrapped, tmp_path, monkeypatch):
    import pipeline.rl_text.grpo as grpo

    def fresh(where):
        shutil.copytree(bootstrapped / "data" / "bootstrap" / "model", where / "data" / "train_policy" / "dpo")
        return declaration("rl-text").slice(grpo_params(where))  # the stage reads only the params it declares

    straight = fresh(tmp_path / "straight")
    stage_module("rl-text").run(straight, StageContext())
    history = json.loads(straight.plots_path("rl_rounds.json").read_text())
    assert [h["round"] for h in history] == [0, 1] and all(h["algorithm"] == "grpo" for h in history)
    assert all(0.0 <= h["val_success"] <= 1.0 for h in history)
    assert history[0]["grpo/replies"] > 0  # infogain gives every group a spread: replies were trained on
    assert history[0]["grpo/groups_skipped"] == 0

    killed = fresh(tmp_path / "killed")
    real_update, plays, updates = grpo.update, [], []
    real_play = grpo.play_episodes

    def update(*args, **kwargs):
        updates.append(1)
        if len(updates) == 2:
            raise Killed
        return real_update(*args, **kwargs)

    def play(*args, **kwargs):
        plays.append(kwargs.get("policy_name"))
        return real_play(*args, **kwargs)

    monkeypatch.setattr(grpo, "update", update)
    monkeypatch.setattr(grpo, "play_episodes", play)
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
    assert [t.task_id for _, t in train_jobs(follow, games)] == [t.task_id for t in game_tasks(follow, games[0],
                                                                                                "train")][:2]
    five = load_params("params.yaml", [*base, "rl_text.max_train_tasks=5"])
    every = load_params("params.yaml", [*base, "rl_text.max_train_tasks=0"])
    val = {t.task_id for t in game_tasks(every, games[0], "val")}
    assert len(train_jobs(five, games)) == 5 and train_jobs(five, games)[:2] == train_jobs(follow, games)
    all_train = {t.task_id for _, t in train_jobs(every, games)}
    assert len(all_train) + len(val) == len(games[0].tasks("train")) and not all_train & val


def test_grpo_val_rounds_take_their_own_cap_not_evaluations():
    """games.max_eval_tasks caps evaluation only (training stages do not watch it); rl_text.grpo.max_val_tasks caps
    the val tasks GRPO's early stopping plays."""
    from pipeline.rl_text.grpo import val_jobs_of
    from pipeline.text.policies import game_tasks, make_games

    base = ["games.groups=[twenty_questions]", "games.val_fraction=0.2", "games.max_eval_tasks=2"]
    params = load_params("params.yaml", base)
    game = make_games(params)[0]
    every_val = game_tasks(params, game, "val", cap=0)
    assert len(game_tasks(params, game, "val")) == 2 < len(every_val)  # evaluation's cap
    assert [t for _, t in val_jobs_of(params, [game])] == every_val
    capped = load_params("params.yaml", [*base, "rl_text.grpo.max_val_tasks=3"])
    assert [t for _, t in val_jobs_of(capped, [game])] == every_val[:3]


def test_compare_rounds_plays_each_round_as_evaluate_text_played_the_kept_one(bootstrapped, tmp_path):
    """`curio compare rounds`: every round's policy on held-out through evaluate-text's own stage (same tasks,
    episodes, seed), so the kept round's row is the run's own RL row to the task; paired against DPO by hand; a
    rerun scores nothing again."""
    from pipeline.breakdown import task_means
    from pipeline.core.artifacts import read_rows
    from pipeline.tools.compare_rl_text import make_project
    from pipeline.tools.compare_rounds import compare_rounds

    data = tmp_path / "data"
    # the bandit's 2 arms: an untrained policy wins about half its games, so rows differ task by task; no val, so
    # the last round is the one kept
    overrides = [f"data_dir={data}", *TINY_BOOTSTRAP, "games.groups=[bandit@easy2]", "rl_text.algorithm=grpo",
                 "games.max_train_tasks=6", "games.val_fraction=0.34", "rl_text.rounds=2", "rl_text.tasks_per_round=2",
                 "rl_text.trajectories_per_task=3", "rollout_text.max_new_tokens=8", "rl_text.grpo.lr=0.001",
                 "rl_text.grpo.val_trajectories=0", "policy.free_answers=true", "games.max_eval_tasks=6",
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
