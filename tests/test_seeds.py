"""One ``seed`` for training, one ``eval_seed`` for evaluation: a training seed changes the policies it trains and
never the held-out episodes they are scored on, so the policies of every seed stay paired per task and episode."""

from __future__ import annotations

from pathlib import Path

from conftest import NETHACK_TINY, REPO

from pipeline.core.artifacts import dir_hash, read_rows
from pipeline.core.stage import execute
from pipeline.params import load_params

# The built-in model at the smallest size that trains (tests/test_evaluation_groups.py's LOGO run).
TINY_TEXT = [
    "tracking.enabled=false", "games.groups=[wordle]", "games.max_eval_tasks=3", "games.max_train_tasks=2",
    "evaluate_text.trajectories_per_task=2", "evaluate_text.policies=[base]", "rollout_text.max_new_tokens=12",
    "bootstrap.episodes=30", "bootstrap.n_layer=1", "bootstrap.n_embd=32", "bootstrap.n_head=2",
    "bootstrap.vocab_size=300", "bootstrap.epochs=1",
]


def episodes(rows: list[dict]) -> list[tuple]:
    """What makes a held-out episode the same episode: its task, its sample and the seed it was played with."""
    return sorted((r["group"], r["task_id"], r["sample"], r["seed"]) for r in rows)


def text_run(root: Path, *overrides: str) -> tuple[str, list[dict]]:
    """The built-in policy bootstrapped and evaluated under ``overrides``: its weights' hash and held-out rows."""
    params = load_params(REPO / "params.yaml", [*TINY_TEXT, f"data_dir={root}", f"metrics_dir={root}/metrics",
                                                *overrides])
    execute("bootstrap", params)
    execute("evaluate-text", params)
    return dir_hash(root / "bootstrap" / "model"), read_rows(root / "evaluate_text")


def test_a_training_seed_changes_the_policy_and_not_the_held_out_episodes(tmp_path):
    model_0, rows_0 = text_run(tmp_path / "seed0", "seed=0")
    model_1, rows_1 = text_run(tmp_path / "seed1", "seed=1")
    assert model_0 != model_1  # initialisation and data order follow the training seed
    assert episodes(rows_0) == episodes(rows_1) and len(rows_0) == 3 * 2
    # the evaluation has a seed of its own: moving it moves the episodes (with the same tasks)
    _, rows_moved = text_run(tmp_path / "eval1", "seed=0", "eval_seed=1")
    assert episodes(rows_moved) != episodes(rows_0)
    assert {(r["task_id"], r["sample"]) for r in rows_moved} == {(r["task_id"], r["sample"]) for r in rows_0}


def test_nethack_agents_of_every_training_seed_play_the_same_games(tmp_path):
    def games(root: Path, *overrides: str) -> list[tuple]:
        params = load_params(REPO / "params.yaml", [*NETHACK_TINY, "evaluate_nethack.policies=[random]",
                                                    f"data_dir={root}", f"metrics_dir={root}/metrics", *overrides])
        execute("evaluate-nethack", params)
        return sorted((r["episode"], r["seed"], r["return"]) for r in read_rows(root / "evaluate_nethack"))

    seed_0 = games(tmp_path / "seed0", "seed=0")
    assert games(tmp_path / "seed1", "seed=1") == seed_0
    assert [s for _, s, _ in games(tmp_path / "eval1", "eval_seed=1")] != [s for _, s, _ in seed_0]
