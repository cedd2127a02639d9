"""One resume idiom (pipeline.core.checkpoints): a rerun of the same key resumes, a stale checkpoint never does.

The bugs these pin down: bootstrap resumed the previous run's last trainer checkpoint after a params change and
trained nothing; rl-text resumed (and left behind) the SFT checkpoints of a killed run under other params.
"""

import shutil

import pytest
import torch

from pipeline.core.artifacts import read_rows
from pipeline.core.checkpoints import finished, keyed_dir, mark_finished, run_key
from pipeline.core.stage import StageContext, stage_module
from pipeline.params import load_params

TINY_BOOTSTRAP = ["bootstrap.episodes=24", "bootstrap.epochs=1", "bootstrap.n_layer=1", "bootstrap.n_embd=32",
                  "bootstrap.n_head=2", "bootstrap.vocab_size=800", "bootstrap.batch_size=4",
                  "bootstrap.n_positions=512"]


class Killed(Exception):
    """Stands for a kill right after a trainer wrote its last checkpoint."""


def params_at(tmp_path, *overrides):
    return load_params("params.yaml", [f"data_dir={tmp_path / 'data'}", *TINY_BOOTSTRAP, *overrides])


def test_keyed_dir_keeps_its_own_key_and_empties_another(tmp_path):
    root = keyed_dir(tmp_path / "ckpt", run_key("params-a", "input-1"))
    (root / "checkpoint-4").mkdir()
    assert (keyed_dir(root, run_key("params-a", "input-1")) / "checkpoint-4").exists()  # same key: resume
    assert not (keyed_dir(root, run_key("params-a", "input-2")) / "checkpoint-4").exists()  # new input: stale
    (tmp_path / "unkeyed" / "checkpoint-9").mkdir(parents=True)  # written before keys: nobody knows its run
    assert list(keyed_dir(tmp_path / "unkeyed", "k").iterdir()) == [tmp_path / "unkeyed" / "KEY"]
    mark_finished(tmp_path, "k")
    assert finished(tmp_path, "k") and not finished(tmp_path, "other")


@pytest.fixture(scope="module")
def bootstrapped(tmp_path_factory):
    """A tiny bootstrap run: its data directory and metrics."""
    tmp = tmp_path_factory.mktemp("bootstrap")
    metrics = stage_module("bootstrap").run(params_at(tmp), StageContext()).metrics
    return tmp, metrics


def test_bootstrap_trains_afresh_after_a_params_change(bootstrapped):
    tmp, first = bootstrapped
    assert first["resumed_from_step"] == 0 and first["final_loss"] > 0
    assert list((tmp / "data" / "bootstrap" / "checkpoints").glob("checkpoint-*"))  # the finished run's last one

    changed = stage_module("bootstrap").run(params_at(tmp, "bootstrap.lr=0.001"), StageContext()).metrics
    assert changed["resumed_from_step"] == 0  # the old checkpoint was not resumed: the new lr trained
    assert changed["final_loss"] > 0 and changed["final_loss"] != first["final_loss"]


def test_rl_text_never_resumes_or_leaves_a_stale_checkpoint(bootstrapped, tmp_path, monkeypatch):
    import pipeline.rl_text.filtered_bc as fbc

    shutil.copytree(bootstrapped[0] / "data" / "bootstrap" / "model", tmp_path / "data" / "train_policy" / "dpo")
    run = ["games.max_train_tasks=2", "rl_text.rounds=1", "rl_text.tasks_per_round=1", "rollout_text.max_new_tokens=8",
           "rl_text.trajectories_per_task=1", "rl_text.epochs=1", "rl_text.batch_size=2"]
    # A tiny policy rarely plays a valid episode: each round clones scripted play instead, so that it trains.
    scripted = read_rows(bootstrapped[0] / "data" / "bootstrap" / "scripted")[:4]
    monkeypatch.setattr(fbc, "top_fraction", lambda rows, fraction: scripted)
    real_sft, resumed, kill = fbc.sft_train, [], [True]

    def sft_train(*args, **kwargs):
        result = real_sft(*args, **kwargs)
        resumed.append(result[2])
        if kill[0]:
            raise Killed
        return result

    monkeypatch.setattr(fbc, "sft_train", sft_train)
    out = tmp_path / "data" / "rl_text"
    for _ in range(2):  # killed after round 0's SFT checkpoint, twice under the same params
        with pytest.raises(Killed):
            stage_module("rl-text").run(params_at(tmp_path, *run), StageContext())
    assert resumed[0] == 0 and resumed[1] > 0  # the same key resumed the killed run's checkpoint
    assert list(out.rglob("checkpoint-*")) and not list(out.rglob("README.md"))  # no model card (tags in set order)
    assert list((out / "checkpoints").rglob("checkpoint-*"))

    kill[0] = False
    stage_module("rl-text").run(params_at(tmp_path, *run, "rl_text.lr=0.0003"), StageContext())
    assert resumed[2] == 0  # other params: the killed run's checkpoint was dropped, not resumed
    assert not (out / "checkpoints").exists() and (out / "model").is_dir()  # nothing stale left behind


CURRICULUM_RUN = ["games.max_train_tasks=6", "rl_text.rounds=3", "rl_text.tasks_per_round=2",
                  "rl_text.trajectories_per_task=2", "rollout_text.max_new_tokens=8", "rl_text.epochs=1",
                  "rl_text.batch_size=2", "rl_text.curriculum.enabled=true", "rl_text.judge_reward.num_samples=1",
                  "rl_text.judge_reward.window_size=1", "rl_text.critic.steps=1", "rl_text.critic.batch_size=4",
                  "rl_text.critic.max_state_tokens=64", "rl_text.archer.actor_steps=1", "rl_text.archer.batch_size=2",
                  "rl_text.archer.warmup_rounds=0"]


def played_rounds(out, algorithm: str, rounds: int) -> list[list[dict]]:
    """Each round's episodes as the stage stored them (filtered BC: its rollouts; ArCHer: data/rl_text/episodes)."""
    import json

    if algorithm == "filtered_bc":
        rows = read_rows(out / "rollouts")
        return [[r for r in rows if r["policy"] == f"rl-round-{i}"] for i in range(rounds)]
    return [json.loads((out / "episodes" / f"round-{i:03d}.json").read_text()) for i in range(rounds)]


def save_utterance_reward_model(path):
    """A small utterance reward model (train-reward-text's output) that prefers questions to guesses."""
    import numpy as np

    from pipeline.models.reward_net import RewardNetConfig, fit_reward_model, save_reward_model

    first = ["Is it alive?", "Is it big?", "Does it fly?", "Is it red?"]
    second = ["cat", "dog", "car", "pen"]
    fit = fit_reward_model(first, second, np.zeros(4, dtype=np.float32), np.ones(4, dtype=bool),
                           RewardNetConfig(max_len=64), epochs=5, batch_size=2, lr=1e-2, weight_decay=0.0, seed=0,
                           shuffle_seed=1)
    save_reward_model(fit.model, fit.stats, path, extra={"metrics": fit.metrics, "context_messages": 2})


@pytest.mark.parametrize(("algorithm", "reward"), [("filtered_bc", "outcome"), ("filtered_bc", "judge"),
                                                   ("archer", "judge"), ("filtered_bc", "motif"),
                                                   ("archer", "motif")])
def test_rl_text_curriculum_picks_from_its_own_rollouts_and_a_resume_picks_the_same(
        bootstrapped, tmp_path, monkeypatch, algorithm, reward):
    """rl_text.curriculum.enabled: each round plays the curriculum's picks, updated from the rounds the stage itself
    played; killed once round 1's episodes (and, with a dense reward, their utterance rewards) are stored, the
    resumed run plays and learns from exactly what an uninterrupted run does."""
    import pipeline.rl_text.archer as archer
    import pipeline.rl_text.filtered_bc as fbc
    from pipeline.rl_text.rounds import online_curriculum
    from pipeline.text.curriculum import task_key
    from pipeline.text.policies import game_tasks, make_games

    run = [*CURRICULUM_RUN, f"rl_text.algorithm={algorithm}", f"rl_text.reward={reward}",
           # the tiny policy rarely writes <Answer> tags: its first lines are its moves, so utterances get judged
           f"policy.free_answers={str(reward != 'outcome').lower()}"]
    kill, calls = [False], []
    if algorithm == "filtered_bc":
        def killing(real):
            def ranked(rows, fraction):
                calls.append(1)
                if kill[0] and len(calls) == 2:
                    raise Killed
                return real(rows, fraction)
            return ranked

        for name in ("top_fraction", "top_by_turn_reward"):  # called once per round, after its rollouts are stored
            monkeypatch.setattr(fbc, name, killing(getattr(fbc, name)))
    else:
        real_save = archer.save_round

        def save_round(state_dir, r, *args):
            if kill[0] and r == 1:
                raise Killed
            return real_save(state_dir, r, *args)
        monkeypatch.setattr(archer, "save_round", save_round)

    results = {}
    for name, killed in (("whole", False), ("resumed", True)):
        root = tmp_path / name
        shutil.copytree(bootstrapped[0] / "data" / "bootstrap" / "model", root / "data" / "train_policy" / "dpo")
        if reward == "motif":
            save_utterance_reward_model(root / "data" / "reward_model_text")
        params = params_at(root, *run)
        if killed:
            kill[0] = True
            calls.clear()
            with pytest.raises(Killed):
                stage_module("rl-text").run(params, StageContext())
            kill[0] = False
        metrics = stage_module("rl-text").run(params, StageContext()).metrics
        results[name] = (params, metrics, played_rounds(params.data_path("rl_text"), algorithm, 3))

    params, metrics, rounds = results["whole"]
    picks = [[(r["task_id"], r["sample"]) for r in part] for part in rounds]
    assert picks == [[(r["task_id"], r["sample"]) for r in part] for part in results["resumed"][2]]
    assert [[r["score"] for r in part] for part in rounds] == [[r["score"] for r in part]
                                                               for part in results["resumed"][2]]
    # The picks are the curriculum's over the stage's own episodes, round by round.
    jobs = [(g, t) for g in make_games(params) for t in game_tasks(params.games, g, "train")]
    curriculum = online_curriculum(params.rl_text, params.seed, jobs, lambda i: rounds[i])
    for i, part in enumerate(rounds):
        assert [(task_key(r["group"], r["task_id"]), r["sample"]) for r in part] == curriculum.episodes(i)
    assert sum(v for k, v in metrics.items() if k.endswith("/pulls")) == 3 * 2
    if reward != "outcome" and algorithm == "filtered_bc":
        judged = [r["turn_rewards"] for r in read_rows(params.data_path("rl_text", "rollouts"))]
        assert [len(x) for x in judged] == [r["turns"] for r in read_rows(params.data_path("rl_text", "rollouts"))]
        assert sum(map(len, judged)) > 0
        assert judged == [r["turn_rewards"] for r in read_rows(results["resumed"][0].data_path("rl_text", "rollouts"))]
        assert metrics["rl/mean_turn_reward"] == results["resumed"][1]["rl/mean_turn_reward"]
    if reward != "outcome" and algorithm == "archer":
        replay = read_rows(params.data_path("rl_text", "replay"), ["reward"])
        assert replay and any(r["reward"] not in (-1.0, 0.0) for r in replay)  # the dense reward, not the outcome
        assert replay == read_rows(results["resumed"][0].data_path("rl_text", "replay"), ["reward"])


def test_a_finished_phase_skipped_still_leaves_its_declared_plot(bootstrapped, tmp_path):
    """A finished train-sft (its model restored by DVC, or copied in) trains nothing on a rerun, yet writes the loss
    plot dvc.yaml declares, with the curve it trained — else `dvc commit` fails on a missing output — and reports
    the metrics it trained with; all but where that run resumed, run history the model's directory does not keep
    (an interrupted run's model directory is byte for byte an uninterrupted one's)."""
    import json

    from pipeline.core.runners import run_chunked

    shutil.copytree(bootstrapped[0] / "data" / "bootstrap", tmp_path / "data" / "bootstrap")
    scripted = read_rows(tmp_path / "data" / "bootstrap" / "scripted")[:10]
    run_chunked(tmp_path / "data" / "pairs_text" / "sft", num_chunks=1, params_hash="hand-made",
                make_chunk=lambda i: [{"messages": r["conversation"]} for r in scripted])
    # 5 steps: one logged loss
    params = params_at(tmp_path, "train_policy.sft.epochs=1", "train_policy.sft.batch_size=2")
    first = stage_module("train-sft").run(params, StageContext()).metrics
    plot = params.plots_path("sft_loss.json")
    curve = plot.read_text()
    assert first["sft/trajectories"] == 10 and len(json.loads(curve)) >= 1
    plot.unlink()
    again = stage_module("train-sft").run(params, StageContext()).metrics  # finished: nothing trained
    assert first["sft/resumed_from_step"] == 0
    # the metrics it reported when it trained, not an empty metrics/stages/train-sft.json
    assert again == {k: v for k, v in first.items() if k != "sft/resumed_from_step"}
    assert plot.read_text() == curve


@pytest.mark.parametrize("lora", [True, False])
def test_filtered_bc_clones_into_lora_adapters_only_when_asked(bootstrapped, tmp_path, monkeypatch, lora):
    """rl_text.lora: the round's cloning trains train_policy.lora's adapters (GPT-2: c_attn), merged, and leaves
    every other weight as DPO left it; without it every weight trains (the built-in default)."""
    from safetensors.torch import load_file

    import pipeline.rl_text.filtered_bc as fbc

    init = tmp_path / "data" / "train_policy" / "dpo"
    shutil.copytree(bootstrapped[0] / "data" / "bootstrap" / "model", init)
    scripted = read_rows(bootstrapped[0] / "data" / "bootstrap" / "scripted")[:4]
    monkeypatch.setattr(fbc, "top_fraction", lambda rows, fraction: scripted)
    run = ["games.max_train_tasks=2", "rl_text.rounds=1", "rl_text.tasks_per_round=1", "rollout_text.max_new_tokens=8",
           "rl_text.trajectories_per_task=1", "rl_text.epochs=1", "rl_text.batch_size=2", "rl_text.lr=0.01",
           f"rl_text.lora={str(lora).lower()}", "games.val_fraction=0"]  # no val: the round is kept
    stage_module("rl-text").run(params_at(tmp_path, *run), StageContext())
    before = load_file(init / "model.safetensors")
    after = load_file(tmp_path / "data" / "rl_text" / "model" / "model.safetensors")
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    if lora:  # the adapters' target only, merged into its weights (its biases untouched)
        assert changed and all(k.endswith(".c_attn.weight") for k in changed), sorted(changed)
    else:
        assert any(".mlp." in k for k in changed), sorted(changed)


def test_implicit_margin_by_hand():
    from pipeline.models.training import implicit_margins

    # β = 0.1: chosen gained 2 nats over the reference (-10 → -8), rejected lost 3 (-12 → -15): 0.1 · (2 + 3) = 0.5;
    # the second pair moved the wrong way: 0.5 · ((-5 + 4) - (-3 + 4)) = -1
    assert implicit_margins([-8.0, -5.0], [-15.0, -3.0], [-10.0, -4.0], [-12.0, -4.0], 0.1)[0] == pytest.approx(0.5)
    assert implicit_margins([-5.0], [-3.0], [-4.0], [-4.0], 0.5) == [pytest.approx(-1.0)]


def test_train_dpo_scores_every_pair_with_the_trained_policy_and_resumes_the_scoring(bootstrapped, tmp_path,
                                                                                      monkeypatch):
    """After training, train-dpo writes each pair's log-probs under the trained policy and its implicit reward margin
    β·[(log π − log π_ref)(chosen) − (log π − log π_ref)(rejected)] (the reference: reflogprobs' stored log-probs);
    a run killed while scoring keeps the finished chunks and does not train again."""
    import stages.train_dpo as train_dpo
    from pipeline.core.artifacts import read_manifest, read_table
    from pipeline.core.runners import run_chunked
    from pipeline.llm.hf import load_policy
    from pipeline.models.training import sequence_logps

    shutil.copytree(bootstrapped[0] / "data" / "bootstrap", tmp_path / "data" / "bootstrap")
    scripted = read_rows(tmp_path / "data" / "bootstrap" / "scripted")[:12]
    pairs = [{"group": r["group"], "task_id": r["task_id"], "prompt": r["conversation"][:2],
              "chosen": r["conversation"][2:4], "rejected": scripted[(i + 1) % 12]["conversation"][2:4]}
             for i, r in enumerate(scripted)]
    run_chunked(tmp_path / "data" / "pairs_text" / "preferences", num_chunks=1, params_hash="hand-made",
                make_chunk=lambda i: pairs)
    params = params_at(tmp_path, "train_policy.dpo.init=base", "train_policy.dpo.beta=0.1",
                       "train_policy.dpo.epochs=1", "train_policy.dpo.batch_size=4", "train_policy.dpo.lr=0.01",
                       "train_policy.lora.enabled=false")
    stage_module("reflogprobs").run(params, StageContext())
    monkeypatch.setattr(train_dpo, "PAIRS_PER_CHUNK", 5)  # chunks of 5, 5 and 2 pairs
    real_chunk, chunks = train_dpo.margin_chunk, []

    def margin_chunk(*args):
        chunks.append(args[-2])
        if len(chunks) == 2:
            raise Killed
        return real_chunk(*args)

    monkeypatch.setattr(train_dpo, "margin_chunk", margin_chunk)
    real_train, trained = train_dpo.dpo_train, []
    monkeypatch.setattr(train_dpo, "dpo_train", lambda *a, **k: trained.append(1) or real_train(*a, **k))
    with pytest.raises(Killed):
        stage_module("train-dpo").run(params, StageContext())
    margins = tmp_path / "data" / "train_policy" / "dpo_margins"
    assert len(read_manifest(margins)["parts"]) == 1
    metrics = stage_module("train-dpo").run(params, StageContext()).metrics
    assert chunks == [0, 1, 1, 2] and trained == [1]  # trained once; the finished chunk kept
    assert metrics["dpo/pairs"] == 12  # the rerun reports what the phase trained on, kept beside its model

    rows = read_table(margins).to_pylist()
    ref = read_rows(tmp_path / "data" / "reflogprobs")
    assert [r["pair"] for r in rows] == list(range(12)) and [r["task_id"] for r in rows] == [p["task_id"] for p in ref]
    policy, _ = load_policy(tmp_path / "data" / "train_policy" / "dpo")
    chosen = sequence_logps(policy, [(p["prompt_ids"], p["chosen_ids"], p["chosen_mask"]) for p in ref])
    rejected = sequence_logps(policy, [(p["prompt_ids"], p["rejected_ids"], p["rejected_mask"]) for p in ref])
    for r, p, c, j in zip(rows, ref, chosen, rejected, strict=True):
        assert r["policy_chosen_logps"] == pytest.approx(c, abs=1e-3)
        assert r["policy_rejected_logps"] == pytest.approx(j, abs=1e-3)
        expected = 0.1 * ((c - p["ref_chosen_logps"]) - (j - p["ref_rejected_logps"]))
        assert r["implicit_margin"] == pytest.approx(expected, abs=1e-3) and r["prefers_chosen"] == (expected > 0)
    assert any(abs(r["implicit_margin"]) > 1e-3 for r in rows)  # training moved the policy off its reference
    assert metrics["dpo/mean_implicit_margin"] == pytest.approx(sum(r["implicit_margin"] for r in rows) / 12)
    assert metrics["dpo/implicit_accuracy"] == sum(r["prefers_chosen"] for r in rows) / 12
    assert metrics["dpo/pairs_scored"] == 12
