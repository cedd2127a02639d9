"""rollout-text with PAPRIKA's curriculum: rounds picked by UCB over difficulty arms, exact under resume.

The policy is the games' scripted player (``policy.backend: scripted``): no weights, and it wins some games
in a varying number of turns, so learning potentials differ from zero and steer the curriculum.
"""

import json
import random
import statistics
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import REPO

import stages.rollout_text as rollout
from pipeline.core.artifacts import chunk_seed, read_manifest, read_part, read_rows
from pipeline.core.stage import StageContext
from pipeline.envs.base import make_game
from pipeline.params import load_params
from pipeline.text.curriculum import UCBCurriculum

K, PER_ROUND, ROUNDS = 3, 3, 5
SCRIPTED = [
    "tracking.enabled=false", "policy.backend=scripted", "policy.model=scripted:0.5",
    "games.groups=[wordle,cellular_automata]", "games.max_train_tasks=8", "games.val_fraction=0",
    f"rollout_text.trajectories_per_task={K}", "rollout_text.tasks_per_chunk=4",
]
CURRICULUM = [
    "rollout_text.curriculum.enabled=true", f"rollout_text.curriculum.tasks_per_round={PER_ROUND}",
    f"rollout_text.curriculum.rounds={ROUNDS}", "rollout_text.curriculum.alpha=0.2",
]


def params_in(data_dir: Path, *extra: str):
    return load_params(REPO / "params.yaml", [*SCRIPTED, f"data_dir={data_dir}", *extra])


def run_rollout(params):
    return rollout.run(params, StageContext())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    data = tmp_path_factory.mktemp("uninterrupted")
    result = run_rollout(params_in(data, *CURRICULUM))
    return data / "rollout_text", result.metrics


def part_shas(path: Path) -> dict[str, str]:
    return {k: v["sha256"] for k, v in read_manifest(path)["parts"].items()}


def test_rounds_follow_the_ucb_curriculum_fed_by_each_rounds_rows(uninterrupted):
    out, metrics = uninterrupted
    manifest = read_manifest(out)
    assert manifest["complete"] and len(manifest["parts"]) == ROUNDS
    games = {g: make_game(g) for g in ("wordle", "cellular_automata")}
    tasks = {f"{g}/{t.task_id}": t for g, game in games.items() for t in game.tasks("train")[:8]}
    # The spec, independently: arms = difficulty labels pooled over groups; each round picks PER_ROUND tasks
    # with its own seed, plays each K times, then each pick's potential = CoV of its K scores.
    curriculum = UCBCurriculum({key: t.difficulty for key, t in tasks.items()}, alpha=0.2)
    potentials = []
    for r in range(ROUNDS):
        picked = curriculum.select(random.Random(chunk_seed(0, "rollout-text/curriculum", r)), PER_ROUND)
        rows = read_part(out, r)
        assert [f"{row['group']}/{row['task_id']}" for row in rows] == [key for key in picked for _ in range(K)]
        assert {row["seed"] for row in rows} == {chunk_seed(0, "rollout-text", r)}
        by_task = defaultdict(list)
        for row in rows:
            max_turns = games[row["group"]].max_turns
            # failures count as the game's turn limit
            assert row["score"] == (row["turns"] if row["success"] else max_turns)
            by_task[row["group"] + "/" + row["task_id"]].append(row["score"])
        for key in picked:
            scores = by_task[key]
            cov = (1 + 1 / (4 * K)) * statistics.stdev(scores) / statistics.fmean(scores)
            potentials.append(curriculum.update(key, scores))
            assert potentials[-1] == pytest.approx(cov)
    assert any(p > 0 for p in potentials)  # the scripted player's turns vary: the arms see real signal
    assert metrics["curriculum/rounds"] == ROUNDS
    for arm in curriculum.arms:
        assert metrics[f"curriculum/{arm}/pulls"] == curriculum.pulls[arm]
        assert metrics[f"curriculum/{arm}/mean_potential"] == pytest.approx(curriculum.mean_potential(arm))
    assert sum(curriculum.pulls.values()) == ROUNDS * PER_ROUND
    assert metrics["train/episodes"] == ROUNDS * PER_ROUND * K


class Killed(Exception):
    pass


def test_a_killed_curriculum_rollout_resumes_with_identical_rows(uninterrupted, tmp_path, monkeypatch):
    out_a, _ = uninterrupted
    real_play = rollout.play_episodes
    calls = []

    def dies_in_round_three(*args, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise Killed  # like a SIGKILL between parts: rounds 0 and 1 are on disk, round 2 is not
        return real_play(*args, **kw)

    monkeypatch.setattr(rollout, "play_episodes", dies_in_round_three)
    with pytest.raises(Killed):
        run_rollout(params_in(tmp_path, *CURRICULUM))
    out_b = tmp_path / "rollout_text"
    killed = read_manifest(out_b)
    assert not killed["complete"] and sorted(killed["parts"]) == ["00000", "00001"]
    monkeypatch.setattr(rollout, "play_episodes", real_play)
    run_rollout(params_in(tmp_path, *CURRICULUM))  # a fresh stage run: state rebuilt from parts 0 and 1
    assert part_shas(out_b) == part_shas(out_a)
    assert read_rows(out_b) == read_rows(out_a)


def test_corrupt_middle_rounds_are_replayed_from_the_rounds_before_them(uninterrupted, tmp_path):
    out_a, _ = uninterrupted
    data = tmp_path / "data"
    run_rollout(params_in(data, *CURRICULUM))
    out = data / "rollout_text"
    for bad in ("part-00001.parquet", "part-00003.parquet"):  # rounds 1 and 3 recomputed, 0, 2, 4 kept
        (out / bad).write_bytes(b"not parquet")
    kept = {k: v for k, v in part_shas(out).items() if k in {"00000", "00002", "00004"}}
    run_rollout(params_in(data, *CURRICULUM))
    assert part_shas(out) == part_shas(out_a)
    assert all(part_shas(out)[k] == sha for k, sha in kept.items())


def test_disabled_curriculum_plays_every_train_task_k_times_in_chunks(tmp_path):
    result = run_rollout(params_in(tmp_path))
    out = tmp_path / "rollout_text"
    rows = read_rows(out)
    jobs = [(g, t.task_id) for g in ("wordle", "cellular_automata") for t in make_game(g).tasks("train")[:8]]
    assert [(r["group"], r["task_id"], r["sample"]) for r in rows] == [(g, t, s) for g, t in jobs for s in range(K)]
    assert len(read_manifest(out)["parts"]) == 4  # 16 tasks, 4 per chunk
    assert [read_part(out, i)[0]["seed"] for i in range(4)] == [chunk_seed(0, "rollout-text", i) for i in range(4)]
    assert not any(k.startswith("curriculum/") for k in result.metrics)


def test_default_rounds_match_the_uniform_episode_budget(tmp_path):
    params = params_in(tmp_path, "rollout_text.curriculum.enabled=true", "rollout_text.curriculum.tasks_per_round=5")
    games = rollout.make_games(params)
    jobs = [(g, t) for g in games for t in rollout.game_tasks(params.games, g, "train")]
    rounds = rollout.CurriculumRounds(params, jobs, tmp_path / "rollout_text")
    assert rounds.num_rounds == 4  # ceil(16 tasks / 5 per round): as many plays as every task once (or a few more)
    by_group = rollout.CurriculumRounds(
        params_in(tmp_path, "rollout_text.curriculum.arms=group_difficulty"), jobs, tmp_path / "x").new()
    labels = {f"{g}/{d}" for g in ("wordle", "cellular_automata") for d in ("easy", "medium", "hard")}
    assert set(by_group.arms) <= labels and len(by_group.arms) > 3
    assert json.dumps(params.rollout_text.curriculum.model_dump())  # plain JSON-able params section
