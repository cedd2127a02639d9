"""Per-group evaluation, leave-one-group-out params, and the eval-sweep's per-group table and plots.

Play uses the games' scripted player (``policy.backend: scripted``) unless a test needs a model.
"""

import json
import math
from pathlib import Path

import pytest
import yaml
from conftest import REPO, curio

from pipeline.core.artifacts import read_rows
from pipeline.core.config import ConfigError, _set_dotted, parse_override
from pipeline.core.stage import execute, stage_module
from pipeline.params import load_params
from pipeline.text.logo import logo_params, logo_report, run_logo, stages_for
from pipeline.text.play import summarize
from pipeline.text.policies import eval_groups

GROUPS = ["wordle", "cellular_automata", "mastermind"]
SCRIPTED = [
    "tracking.enabled=false", "policy.backend=scripted", "policy.model=scripted:0.4",
    f"games.groups=[{','.join(GROUPS[:2])}]", "games.max_eval_tasks=3", "evaluate_text.trajectories_per_task=2",
    "evaluate_text.policies=[base]",
]


def params_in(data_dir: Path, *extra: str):
    return load_params(REPO / "params.yaml",
                       [*SCRIPTED, f"data_dir={data_dir}", f"metrics_dir={data_dir}/metrics", *extra])


def write_params(path: Path, overrides: list[str]) -> Path:
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    for o in overrides:
        _set_dotted(raw, *parse_override(o))
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


# -- evaluate-text per group ---------------------------------------------------------------------------------
def test_evaluate_text_reports_success_and_turns_per_group(tmp_path):
    params = params_in(tmp_path)
    metrics = execute("evaluate-text", params).metrics
    rows = read_rows(tmp_path / "evaluate_text")
    assert {r["group"] for r in rows} == set(GROUPS[:2]) and {r["split"] for r in rows} == {"eval"}
    for g in GROUPS[:2]:
        mine = summarize([r for r in rows if r["group"] == g])
        assert mine["episodes"] == 3 * 2
        assert metrics[f"base/{g}/success_rate"] == mine["success_rate"]
        assert metrics[f"base/{g}/mean_turns"] == mine["mean_turns"]
    assert metrics["base/episodes"] == 12
    assert metrics["base/success_rate"] == summarize(rows)["success_rate"]
    on_disk = json.loads((tmp_path / "metrics" / "stages" / "evaluate-text.json").read_text())
    assert on_disk["base/wordle/success_rate"] == metrics["base/wordle/success_rate"]
    plots = tmp_path / "metrics" / "plots"
    assert (plots / "eval.png").stat().st_size > 1000
    assert (plots / "eval_groups.png").stat().st_size > 1000  # two groups: per-group bars

    one = params_in(tmp_path, "games.eval_groups=[wordle]")
    metrics = execute("evaluate-text", one).metrics
    assert {r["group"] for r in read_rows(tmp_path / "evaluate_text")} == {"wordle"}
    assert "base/wordle/success_rate" in metrics and "base/cellular_automata/success_rate" not in metrics
    assert not (plots / "eval_groups.png").exists()  # one group: no stale per-group plot


# -- leave-one-group-out -----------------------------------------------------------------------------------
def test_eval_groups_default_to_the_training_groups(tmp_path):
    assert eval_groups(params_in(tmp_path).games) == GROUPS[:2]
    assert eval_groups(params_in(tmp_path, "games.eval_groups=[mastermind]").games) == ["mastermind"]
    with pytest.raises(ConfigError, match="games.eval_groups"):
        params_in(tmp_path, "games.eval_groups=[]")


def test_logo_params_train_without_the_group_and_evaluate_on_it_alone(tmp_path):
    base = params_in(tmp_path, f"games.groups=[{','.join(GROUPS)}]")
    logo = logo_params(base, "wordle")
    assert logo.games.groups == ["cellular_automata", "mastermind"]
    assert logo.games.eval_groups == ["wordle"]
    assert Path(logo.data_dir) == tmp_path / "logo_wordle"
    assert logo.tracking.experiment == "curio-logo-wordle"
    assert logo_params(base, "wordle", data_root="elsewhere").data_dir == str(Path("elsewhere") / "logo_wordle")
    # A group outside the pool: train on the whole pool, evaluate on it.
    assert logo_params(params_in(tmp_path), "mastermind").games.groups == GROUPS[:2]
    assert logo_params(base, "mastermind", pool=["wordle", "mastermind"]).games.groups == ["wordle"]
    with pytest.raises(ConfigError, match="no training group left"):
        logo_params(params_in(tmp_path, "games.groups=[wordle]"), "wordle")
    with pytest.raises(ConfigError, match="unknown task group"):
        logo_params(base, "chess")


def test_training_stages_ignore_eval_groups_and_evaluation_does_not(tmp_path):
    a = params_in(tmp_path)
    b = params_in(tmp_path, "games.eval_groups=[mastermind]", "games.max_eval_tasks=5")
    for name in ("rollout-text", "rl-text"):
        keys = stage_module(name).STAGE.params
        assert a.section_hash(keys) == b.section_hash(keys), name
    # Evaluation plays them; pre-training (the model's world knowledge) covers them too.
    for name in ("evaluate-text", "bootstrap"):
        keys = stage_module(name).STAGE.params
        assert a.section_hash(keys) != b.section_hash(keys), name


def test_bootstrap_pretrains_on_training_then_evaluation_only_groups(tmp_path):
    from stages.bootstrap import pretraining_groups

    assert pretraining_groups(params_in(tmp_path)) == GROUPS[:2]
    assert pretraining_groups(params_in(tmp_path, "games.eval_groups=[mastermind,cellular_automata]")) == [
        "wordle", "cellular_automata", "mastermind"]


def test_run_logo_walks_the_text_dag_with_the_logo_params(tmp_path, monkeypatch):
    import pipeline.text.logo as logo_mod

    seen = []
    monkeypatch.setattr(logo_mod, "execute", lambda name, p: seen.append((name, p.games.groups, p.data_dir)))
    logo = logo_params(params_in(tmp_path, f"games.groups=[{','.join(GROUPS)}]"), "mastermind")
    ran = run_logo(logo, REPO / "dvc.yaml")
    assert ran == stages_for("evaluate-text", REPO / "dvc.yaml") == [  # the two motif stages: idle by default
        "bootstrap", "rollout-text", "annotate-text", "annotate-utterances", "pairs-text", "train-reward-text",
        "train-sft", "reflogprobs", "train-dpo", "rl-text", "evaluate-text"]
    assert seen == [(n, GROUPS[:2], str(tmp_path / "logo_mastermind")) for n in ran]


def test_held_out_group_is_pretrained_on_but_never_fine_tuned_on(tmp_path):
    """The before-training half of a LOGO run for real: the built-in model is pre-trained on scripted play of
    both groups (world knowledge), rollouts play wordle only, evaluation cellular_automata only;
    `curio logo --report-only` prints the held-out table."""
    overrides = [
        "tracking.enabled=false", f"data_dir={tmp_path / 'data'}", "games.groups=[wordle,cellular_automata]",
        "games.max_eval_tasks=2", "evaluate_text.trajectories_per_task=1", "evaluate_text.policies=[base]",
        "games.max_train_tasks=2", "rollout_text.trajectories_per_task=1", "bootstrap.episodes=30",
        "bootstrap.n_layer=1", "bootstrap.n_embd=32", "bootstrap.n_head=2",
        "bootstrap.vocab_size=300", "bootstrap.epochs=1", "rollout_text.max_new_tokens=12",
    ]
    logo = logo_params(load_params(REPO / "params.yaml", overrides), "cellular_automata")
    execute("bootstrap", logo)
    scripted = read_rows(Path(logo.data_dir) / "bootstrap" / "scripted", ["group"])
    assert {r["group"] for r in scripted} == {"wordle", "cellular_automata"}
    execute("rollout-text", logo)
    assert {r["group"] for r in read_rows(Path(logo.data_dir) / "rollout_text", ["group"])} == {"wordle"}
    execute("evaluate-text", logo)
    assert {r["group"] for r in read_rows(Path(logo.data_dir) / "evaluate_text")} == {"cellular_automata"}
    table = logo_report(logo, "cellular_automata")
    assert "| base (before) |" in table and "trained on: wordle" in table

    params_file = write_params(tmp_path / "params.yaml", overrides)
    (tmp_path / "dvc.yaml").write_text((REPO / "dvc.yaml").read_text())
    res = curio(["logo", "cellular_automata", "--report-only"], tmp_path)
    assert "Held-out group: cellular_automata" in res.stdout and "| base (before) |" in res.stdout
    assert params_file.exists() and (Path(logo.data_dir) / "logo.md").read_text() == table
    bad = curio(["logo", "wordle", "--pool", "wordle"], tmp_path, check=False)
    assert bad.returncode == 2 and "no training group left" in bad.stderr


# -- eval-sweep ----------------------------------------------------------------------------------------------
def sweep_row(checkpoint, group, seed, success, turns):
    return {"checkpoint": checkpoint, "split": "eval", "group": group, "seed": seed, "episodes": 10,
            "success_rate": success, "mean_turns": turns, "mean_score": 0.0, "invalid_rate": 0.0}


def test_sweep_markdown_has_mean_and_std_over_seeds_per_group_and_plots(tmp_path):
    from pipeline.orchestration.flows import aggregate_over_seeds, plot_sweep, results_markdown

    rows = [sweep_row("base", "wordle", 0, 0.4, 4.0), sweep_row("base", "wordle", 1, 0.6, 5.0),
            sweep_row("base", "mastermind", 0, 0.2, 8.0), sweep_row("base", "mastermind", 1, 0.2, 8.0),
            sweep_row("dpo", "wordle", 0, 0.9, 3.0)]
    agg = {(a["checkpoint"], a["group"]): a for a in aggregate_over_seeds(rows)}
    assert agg[("base", "wordle")]["success_rate"] == pytest.approx(0.5)
    assert agg[("base", "wordle")]["success_rate_std"] == pytest.approx(math.sqrt(0.02))  # sample std
    assert agg[("dpo", "wordle")]["seeds"] == 1 and agg[("dpo", "wordle")]["success_rate_std"] == 0.0
    md = results_markdown(rows)
    assert "| base | eval | wordle | 2 | 20 | 0.500 ± 0.141 | 4.50 ± 0.71 | 0.000 ± 0.000 |" in md
    assert "| base | eval | mastermind | 2 | 20 | 0.200 ± 0.000 |" in md
    assert "| dpo | eval | wordle | 1 | 10 | 0.900 ± 0.000 |" in md
    assert "| base | eval | wordle | 1 | 10 | 0.600 | 5.00 | 0.000 |" in md  # the per-seed table follows
    written = plot_sweep(rows, tmp_path)
    assert [p.name for p in written] == ["success.png", "mean_turns.png"]
    assert all(p.stat().st_size > 1000 for p in written)


def test_eval_sweep_flow_writes_per_group_rows_markdown_and_plots(tmp_path, monkeypatch, prefect_home):
    monkeypatch.setenv("PREFECT_HOME", str(prefect_home))
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    params_file = write_params(tmp_path / "params.yaml", [*SCRIPTED, f"data_dir={tmp_path / 'data'}"])
    res = curio(["eval-sweep", "-p", str(params_file), "--checkpoint", "base", "--seed", "0", "--seed", "1",
                 "-S", "eval_sweep.splits=[eval]"], tmp_path)
    out = tmp_path / "data" / "eval_sweep"
    rows = json.loads((out / "results.json").read_text())
    assert {(r["group"], r["seed"]) for r in rows} == {(g, s) for g in [*GROUPS[:2], "all"] for s in (0, 1)}
    for r in rows:
        assert r["episodes"] == (12 if r["group"] == "all" else 6)
    md = (out / "results.md").read_text()
    for g in GROUPS[:2]:
        assert f"| base | eval | {g} | 2 | 12 |" in md
    assert "±" in md and "| base | eval | all | 2 | 24 |" in md
    assert (out / "success.png").stat().st_size > 1000 and (out / "mean_turns.png").stat().st_size > 1000
    assert (out / "results.parquet").exists() and "| checkpoint |" in res.stdout + res.stderr  # printed (log_prints)
