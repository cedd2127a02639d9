"""`curio choose hparams` (pipeline/tools/choose_hparams.py) retrains a stage in a scratch tree linked to a finished
run's data/: everything the stage and its downstream stages write must be real directories there, never links into
the finished run."""

from pathlib import Path

import pytest

from pipeline.tools import ToolError
from pipeline.tools.choose_hparams import chain, link_upstream, remade


def test_retraining_dpo_remakes_its_margins_and_links_only_what_comes_before(tmp_path):
    run = tmp_path / "run"
    for d in ("rollout_text", "pairs_text/sft", "reflogprobs", "train_policy/sft", "train_policy/dpo",
              "train_policy/dpo_margins", "rl_text", "evaluate_text"):
        (run / d).mkdir(parents=True)
        (run / d / "part-0.parquet").write_text(d)
    scratch = tmp_path / "scratch"
    link_upstream(run, scratch, remade("train-dpo"))

    for d in ("rollout_text", "pairs_text", "reflogprobs", "train_policy/sft"):
        assert (scratch / d).is_symlink() and (scratch / d).resolve() == (run / d).resolve()
    assert (scratch / "train_policy").is_dir() and not (scratch / "train_policy").is_symlink()
    for d in ("train_policy/dpo", "train_policy/dpo_margins", "rl_text", "evaluate_text"):
        assert not (scratch / d).exists(), d  # the stage writes them anew, never into the finished run


def test_the_scratch_tree_takes_output_locks_of_its_own(tmp_path):
    """A stage still writing in the finished run (its lock held there) never blocks the scratch tree's stages."""
    from pipeline.core.locks import hold

    run = tmp_path / "run"
    (run / "train_policy" / "dpo").mkdir(parents=True)
    scratch = tmp_path / "scratch"
    with hold(run, ["rl_text"], "rl-text"):
        link_upstream(run, scratch, remade("rl-text"))
        assert not (scratch / ".locks").exists()
        with hold(scratch, ["rl_text"], "rl-text", wait=False):  # refused (Busy) if the run's lock were shared
            pass


def test_what_each_stage_remakes_follows_dvc_yaml():
    assert set(remade("train-sft")) >= {"train_policy/sft", "reflogprobs", "train_policy/dpo",
                                   "train_policy/dpo_margins", "rl_text", "evaluate_text"}
    assert "train_policy/sft" not in remade("train-dpo") and "reflogprobs" not in remade("train-dpo")
    assert "train_policy/dpo_margins" in remade("train-dpo")
    assert set(remade("rl-text")) >= {"rl_text", "evaluate_text"} and "train_policy/dpo" not in remade("rl-text")


def test_a_chain_runs_the_stages_between_two_in_the_dags_order():
    assert chain("pairs-text", "train-dpo") == ["pairs-text", "train-sft", "reflogprobs", "train-dpo"]
    assert chain("train-sft", "train-sft") == ["train-sft"]
    assert chain("train-dpo", "rl-text") == ["train-dpo", "rl-text"]
    with pytest.raises(ToolError, match="not downstream"):
        chain("train-dpo", "train-sft")


def test_candidates_are_settings_beside_the_grids_product():
    from pipeline.tools.choose_hparams import candidate_sets

    assert candidate_sets(["a=1,2", "b=x"], ["", "c=3 d=4"]) == [["a=1", "b=x"], ["a=2", "b=x"], [], ["c=3", "d=4"]]
    with pytest.raises(ToolError, match="KEY=VALUE"):
        candidate_sets([], ["rl_text.lr"])


def test_across_seeds_gives_each_value_its_mean_and_its_paired_difference_from_the_first():
    """Val success of two values over three seeds, by hand: A 0.40, 0.50, 0.60 (mean 50.0, s.e. 0.1/sqrt(3) =
    5.8 points); B 0.45, 0.50, 0.70: differences +5, 0, +10 points, mean +5.0, s.d. 5, s.e. 5/sqrt(3) = 2.9; two of
    three seeds above 0."""
    from pipeline.tools.choose_hparams import across_seeds

    rows = [{"run": f"s{i}", "label": lab, "success_rate": v}
            for lab, vals in (("A", (0.40, 0.50, 0.60)), ("B", (0.45, 0.50, 0.70))) for i, v in enumerate(vals)]
    lines = across_seeds(rows, ["A", "B"])
    assert lines[2] == "| A | 40.0 | 50.0 | 60.0 | 50.0 ± 5.8 |  |  |"
    assert lines[3] == "| B | 45.0 | 50.0 | 70.0 | 55.0 ± 7.6 | +5.0 ± 2.9 | 2/3 |"


def test_each_value_is_paired_with_the_first_value_of_the_same_policy_seed_by_seed():
    """Two values, each trained through SFT and DPO, over three seeds, by hand: dpo: B − dpo: A is +10, −1, +9
    points (mean +6.0, s.d. 6.08, s.e. 3.5; 2 of 3 above 0); sft: B − sft: A is 0 in every seed; the run's own
    policy (no value) is paired with nothing."""
    from pipeline.tools.choose_hparams import value_differences

    table = {"dpo (the run's)": (0.5, 0.5, 0.5), "sft: A": (0.5, 0.6, 0.5), "dpo: A": (0.50, 0.60, 0.50),
             "sft: B": (0.5, 0.6, 0.5), "dpo: B": (0.60, 0.59, 0.59)}
    rows = [{"run": f"s{i}", "label": lab, "success_rate": v}
            for lab, vals in table.items() for i, v in enumerate(vals)]
    lines = value_differences(rows, list(table))
    assert lines[0] == "| val, paired over the same tasks, points | s0 | s1 | s2 | mean ± s.e. over seeds | seeds > 0 |"
    assert lines[2:] == ["| sft: B − sft: A | +0.0 | +0.0 | +0.0 | +0.0 ± 0.0 | 0/3 |",
                         "| dpo: B − dpo: A | +10.0 | -1.0 | +9.0 | +6.0 ± 3.5 | 2/3 |"]
    assert value_differences(rows, ["dpo (the run's)", "sft: A", "dpo: A"]) == []


def two_experiments(ch, tmp_path, monkeypatch) -> None:
    """Experiments p-seed-3 and p-seed-7 (training seeds 3 and 7), each a data/ with a DPO policy, in place of
    copies out of DVC's cache."""
    runs = {}
    for name, seed in (("p-seed-3", 3), ("p-seed-7", 7)):
        data = tmp_path / "exps" / name / "data"
        (data / "train_policy" / "dpo").mkdir(parents=True)
        runs[name] = (data, seed)
    monkeypatch.setattr(ch, "materialize", lambda name, out: runs[name])


def test_every_value_is_trained_with_each_experiments_seed_and_a_rerun_skips_what_is_done(tmp_path, monkeypatch):
    """Over two experiments (seeds 3 and 7) and two candidates, rl-text runs once per (experiment, candidate) with
    that experiment's seed; the rows are on disk as they are made, and the same command again trains nothing."""
    import pipeline.core.stage as stage_mod
    from pipeline.tools import choose_hparams as ch

    two_experiments(ch, tmp_path, monkeypatch)
    trained = []
    monkeypatch.setattr(stage_mod, "execute", lambda name, params: trained.append(
        (name, params.seed, params.rl_text.lr)))
    success = {(3, 1e-4): 0.5, (3, 2e-4): 0.6, (7, 1e-4): 0.4, (7, 2e-4): 0.45}
    monkeypatch.setattr(ch, "val_rows", lambda params, policy, k: [
        {"group": "twenty_questions", "success": i < 100 * success[(params.seed, params.rl_text.lr)], "turns": 3}
        for i in range(100)])
    args = dict(preset=None, overrides=["games.val_fraction=0.2"], source=tmp_path, policies=[], stage="rl-text",
                through=None, grid=[], k=1, out=tmp_path / "out", candidates=["rl_text.lr=0.0001",
                                                                              "rl_text.lr=0.0002"],
                exps=["p-seed-3", "p-seed-7"])
    rows = ch.choose_hparams(**args)
    assert sorted(trained) == [("rl-text", 3, 1e-4), ("rl-text", 3, 2e-4), ("rl-text", 7, 1e-4), ("rl-text", 7, 2e-4)]
    assert [(r["run"], r["label"], r["success_rate"]) for r in rows] == [
        ("p-seed-3", "rl: rl_text.lr=0.0001", 0.5), ("p-seed-3", "rl: rl_text.lr=0.0002", 0.6),
        ("p-seed-7", "rl: rl_text.lr=0.0001", 0.4), ("p-seed-7", "rl: rl_text.lr=0.0002", 0.45)]
    trained.clear()
    assert len(ch.choose_hparams(**args)) == 4 and trained == []  # resumed: every row was already made
    assert ch.pick(rows, "rl", 2)[0] == "rl: rl_text.lr=0.0002"  # mean 52.5 against 45.0
    # the pick is among this command's values: rows of others in the same results file take no part
    picked = []

    def labels_picked_among(results, last, n_runs):
        picked.append({r["label"] for r in results})
        return None, {}

    monkeypatch.setattr(ch, "pick", labels_picked_among)
    ch.choose_hparams(**{**args, "candidates": ["rl_text.lr=0.0001"]})
    assert picked == [{"rl: rl_text.lr=0.0001"}]


def test_an_experiment_of_an_earlier_commit_is_found_by_its_ref_and_an_ambiguous_name_is_refused(tmp_path,
                                                                                                 monkeypatch):
    """Values are chosen with today's code on the policies a sweep of an earlier commit trained: a finished
    experiment is found under DVC's refs/exps/<baseline>/<name> whatever the baseline; the same name on two
    baselines is refused in one line rather than picked at random."""
    import subprocess

    from pipeline.tools import choose_hparams as ch

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "a")
    first = git("rev-parse", "HEAD")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "b")
    second = git("rev-parse", "HEAD")
    git("update-ref", f"refs/exps/{first[:2]}/{first[2:]}/preset-seed-0", first)
    git("update-ref", f"refs/exps/{first[:2]}/{first[2:]}/preset-seed-1", second)
    git("update-ref", f"refs/exps/{second[:2]}/{second[2:]}/preset-seed-1", first)
    monkeypatch.setattr(ch, "REPO", tmp_path)

    assert ch.finished_ref("preset-seed-0") == first
    for missing in ("seed-0", "preset-seed-2"):  # a name matches whole, never as a suffix of another
        with pytest.raises(ToolError, match="no finished experiment by that name"):
            ch.finished_ref(missing)
    with pytest.raises(ToolError, match="2 experiments by that name"):
        ch.finished_ref("preset-seed-1")


def test_an_experiment_is_copied_out_of_dvcs_cache_without_the_outs_its_targets_never_ran(tmp_path, monkeypatch,
                                                                                         capsys):
    """A sweep's experiment runs the text track's targets only: dvc.yaml's other outs (NetHack's) have no hash in
    its lock. Copying the experiment out of DVC's cache takes what it made and its seed, names what it skipped,
    and never fails on an out that was never made."""
    import subprocess

    import yaml

    from pipeline.tools import choose_hparams as ch

    def run(*args):
        return subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()

    (tmp_path / "params.yaml").write_text("seed: 3\n")
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "made": {"cmd": "mkdir -p data/made && echo x > data/made/part.txt", "outs": ["data/made"]},
        "never": {"cmd": "echo y > data/never", "outs": ["data/never"]}}}))
    run("git", "init", "-q")
    run("dvc", "init", "-q")
    run("dvc", "config", "core.analytics", "false")
    run("dvc", "repro", "-q", "made")
    run("git", "add", "-A")
    run("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a run")
    head = run("git", "rev-parse", "HEAD")
    run("git", "update-ref", f"refs/exps/{head[:2]}/{head[2:]}/p-seed-0", head)
    monkeypatch.setattr(ch, "REPO", tmp_path)

    data, seed = ch.materialize("p-seed-0", tmp_path / "out")
    assert seed == 3 and (data / "made" / "part.txt").read_text() == "x\n"
    assert not (data / "never").exists()
    assert "not made by the experiment, not copied: never" in capsys.readouterr().out
    assert (tmp_path / "out" / "exps" / "p-seed-0" / ".complete").read_text() == head


def test_held_out_reports_the_value_picked_and_the_first_once_paired_per_task(tmp_path, monkeypatch):
    """Three learning rates over two seeds (3 and 7); 2e-4 has the best mean val success, so only it, the first
    value (1e-4) and the run's DPO play the held-out split: 4 tasks, one episode each, worked by hand.
    seed 3: dpo 1000, first 1100, picked 1110; seed 7: dpo 0000, first 1000, picked 1111.
    picked − first per task: seed 3 (0,0,1,0): +25 ± 25 (s.d. 0.5 over 4 tasks); seed 7 (0,1,1,1): +75 ± 25;
    across seeds +50 ± 25, 2/2 > 0. picked − dpo: seed 3 (0,1,1,0): +50 ± 28.9; seed 7 (1,1,1,1): +100 ± 0;
    across +75 ± 25. A second call plays nothing again."""
    import pipeline.core.stage as stage_mod
    from pipeline.tools import choose_hparams as ch

    two_experiments(ch, tmp_path, monkeypatch)
    monkeypatch.setattr(stage_mod, "execute", lambda name, params: None)
    val = {1e-4: 0.5, 2e-4: 0.6, 3e-4: 0.3}
    monkeypatch.setattr(ch, "val_rows", lambda params, policy, k: [
        {"group": "twenty_questions", "success": i < 100 * val.get(params.rl_text.lr, 0.4), "turns": 3}
        for i in range(100)])
    wins = {(3, "dpo", None): "1000", (3, "rl", 1e-4): "1100", (3, "rl", 2e-4): "1110",
            (7, "dpo", None): "0000", (7, "rl", 1e-4): "1000", (7, "rl", 2e-4): "1111"}
    played = []

    def held_out(params, policy):
        lr = params.rl_text.lr if policy == "rl" else None
        played.append((params.seed, policy, lr, Path(params.data_dir).parent.name))
        return [{"group": "twenty_questions", "task_id": f"t{i}", "success": w == "1", "turns": 2, "policy": policy}
                for i, w in enumerate(wins[(params.seed, policy, lr)])]

    monkeypatch.setattr(ch, "held_out_rows", held_out)
    args = dict(preset=None, overrides=["games.val_fraction=0.2"], source=tmp_path, policies=["dpo"],
                stage="rl-text", through=None, grid=["rl_text.lr=0.0001,0.0002,0.0003"], k=1, out=tmp_path / "out",
                exps=["p-seed-3", "p-seed-7"], held_out=True)
    ch.choose_hparams(**args)
    assert sorted(played) == [(3, "dpo", None, "p-seed-3"), (3, "rl", 1e-4, "rl_text.lr=0.0001"),
                              (3, "rl", 2e-4, "rl_text.lr=0.0002"), (7, "dpo", None, "p-seed-7"),
                              (7, "rl", 1e-4, "rl_text.lr=0.0001"), (7, "rl", 2e-4, "rl_text.lr=0.0002")]
    lines = ch.report_held_out(tmp_path / "out", ["p-seed-3", "p-seed-7"], ["dpo"],
                               ["rl: rl_text.lr=0.0001", "rl: rl_text.lr=0.0002", "rl: rl_text.lr=0.0003"],
                               "rl: rl_text.lr=0.0002", {})  # every cell on disk: nothing played, no params needed
    assert lines[0] == ("| held-out success, % (± evaluation s.e.) | seed 3 | seed 7 | mean ± s.e. over seeds "
                        "| s.d. across seeds | mean evaluation s.e. |")
    # s.d. across seeds of (25, 0) is 17.7; the evaluation's binomial s.e. 21.7 (25 % of 4) and 0
    assert lines[2] == "| dpo (the run's) | 25.0 ± 21.7 | 0.0 ± 0.0 | 12.5 ± 12.5 | 17.7 | 10.8 |"
    assert lines[4] == "| rl: rl_text.lr=0.0002 | 75.0 ± 21.7 | 100.0 ± 0.0 | 87.5 ± 12.5 | 17.7 | 10.8 |"
    assert lines[8] == ("| rl: rl_text.lr=0.0002 − rl: rl_text.lr=0.0001 | 25.0 ± 25.0 | 75.0 ± 25.0 | 50.0 ± 25.0 "
                        "| 35.4 | 25.0 | 2/2 > 0 |")
    assert lines[9] == ("| rl: rl_text.lr=0.0001 − dpo (the run's) | 25.0 ± 25.0 | 25.0 ± 25.0 | 25.0 ± 0.0 | 0.0 "
                        "| 25.0 | 2/2 > 0 |")
    assert lines[10] == ("| rl: rl_text.lr=0.0002 − dpo (the run's) | 50.0 ± 28.9 | 100.0 ± 0.0 | 75.0 ± 25.0 | 35.4 "
                         "| 14.4 | 2/2 > 0 |")
    played.clear()
    ch.choose_hparams(**args)
    assert played == []
