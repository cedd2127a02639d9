"""The tools beside the DAG, through the `curio` command (typer's CliRunner on ``pipeline.cli.app``): `curio table`,
`curio choose hparams|tiers|format-prompt`, `curio compare runs|rollouts|rl-text`, `curio check-imports`,
`curio params-hashes`, `curio bench fresh-clone`, `curio soak`, `curio profile`. Each prints what it measured on small
hand-made inputs; bad input is one `curio: ...` line and exit 2, before anything is played or trained."""

import json
import os
from pathlib import Path

import pytest
import yaml
from conftest import assert_one_line
from typer.testing import CliRunner

from pipeline import cli
from pipeline.core.artifacts import ChunkedDataset
from pipeline.generate import declared_stages
from pipeline.tools.choose_tiers import pick

REPO = Path(__file__).resolve().parents[1]
SCRIPTED = ["-S", "tracking.enabled=false", "-S", "policy.backend=scripted", "-S", "policy.model=scripted:0.3",
            "-S", "games.val_fraction=0.5", "-S", "games.max_eval_tasks=4"]


def run(args: list[str]):
    return CliRunner().invoke(cli.app, args)




def episode(policy: str, group: str, task: int, sample: int, won_at: int | None, replies: list[str]) -> dict:
    conversation = [m for r in replies for m in ({"role": "user", "content": "?"},
                                                 {"role": "assistant", "content": r})]
    return {"policy": policy, "group": group, "task_id": f"t{task}", "sample": sample, "success": won_at is not None,
            "turns": won_at or len(replies), "conversation": conversation}


def write_dataset(path: Path, rows: list[dict]) -> Path:
    ds = ChunkedDataset(path, params_hash="test")
    ds.write_part(0, rows)
    ds.mark_complete(1)
    return path


# -- curio table ----------------------------------------------------------------------------------------------------
G = "twenty_questions@shown4"  # 4 candidates, 3 turns


def evaluated(data: Path) -> Path:
    """base wins 1 of 4 (at turn 1); sft wins 3 of 4 (at turns 1, 2, 3; one episode repeats a reply)."""
    rows = [episode("base", G, 0, 0, 1, ["a"]), episode("base", G, 1, 0, None, ["a", "b", "c"]),
            episode("base", G, 2, 0, None, ["a", "b", "c"]), episode("base", G, 3, 0, None, ["a", "b", "c"]),
            episode("sft", G, 0, 0, 1, ["a"]), episode("sft", G, 1, 0, 2, ["a", "b"]),
            episode("sft", G, 2, 0, 3, ["a", "b", "a"]), episode("sft", G, 3, 0, None, ["a", "b", "c"])]
    write_dataset(data / "evaluate_text", rows)
    return data


def test_table_prints_success_its_standard_error_turns_on_wins_and_the_change_from_base(tmp_path):
    data = evaluated(tmp_path / "data")
    res = run(["table", "--data", str(data)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    # p = 1/4: s.e. sqrt(.25 * .75 / 4) = 21.65 %; p = 3/4: the same; the difference: hypot(21.65, 21.65) = 30.6
    # one episode per task: no pass@4 ("-")
    assert lines[1] == "base  25.0 ± 21.7 (1.00) n=4  25.0 ± 21.7 (1.00) n=4    -"
    assert lines[2] == "sft  75.0 ± 21.7 (2.00) n=4  75.0 ± 21.7 (2.00) n=4  +50.0 ± 30.6  -"
    # paired per task: base won tasks [1, 0, 0, 0], sft [1, 1, 1, 0]: d = [0, 1, 1, 0], mean .5,
    # s.e. sqrt(4 · .25 / (4 · 3)) = 28.9 %
    assert lines[-1] == "  sft − base: +50.0 ± 28.9 (4 tasks)"
    md = run(["table", "--data", str(data), "--markdown"]).stdout.splitlines()
    assert md[1] == "|---|---|---|---|---|"
    assert md[3] == "| sft | 75.0 ± 21.7 (2.00) n=4 | 75.0 ± 21.7 (2.00) n=4 | +50.0 ± 30.6 | - |"
    # four episodes of one task, one won: pass@4 = 1 - C(3, 4) / C(4, 4) = 100 %; none won: 0 %
    rows = [episode("base", G, 0, s, 1 if s == 0 else None, ["a"]) for s in range(4)] + \
        [episode("sft", G, 0, s, None, ["a"]) for s in range(4)]
    write_dataset(tmp_path / "four" / "evaluate_text", rows)
    lines = run(["table", "--data", str(tmp_path / "four")]).stdout.splitlines()
    assert lines[1].endswith("  100.0") and lines[2].endswith("  0.0")


def test_table_win_turns_counts_wins_per_turn_repeats_and_the_fewest_turns_bound(tmp_path):
    res = run(["table", "--data", str(evaluated(tmp_path / "data")), "--win-turns"])
    assert res.exit_code == 0, res.output
    # base: 1/4 won, the bound at 25 % is 1 turn; sft: 3/4 won at turns 1, 2, 3 -> at least (1 + 2 + 3) / 3 = 2
    assert (f"{G} base: 4 episodes, won at turn 1: 1; 0 repeat an earlier reply of theirs; turns on wins at 25.0 % "
            "are at least 1.00 (this policy: 1.00)") in res.stdout
    assert (f"{G} sft: 4 episodes, won at turn 1: 1, turn 2: 1, turn 3: 1; 1 repeat an earlier reply of theirs; "
            "turns on wins at 75.0 % are at least 2.00 (this policy: 2.00)") in res.stdout


def test_table_of_a_run_without_evaluate_text_is_one_line(tmp_path):
    assert_one_line(run(["table", "--data", str(tmp_path)]), "evaluate_text")


# -- curio compare runs / rollouts / rl-text ---------------------------------------------------------------------
def finished_run(root: Path, md5: str, success: float, seconds: float) -> Path:
    root.mkdir(parents=True)
    lock = {"schema": "2.0", "stages": {"rollout-text": {"outs": [{"path": "data/rollout_text", "md5": md5},
                                                                  {"path": "metrics/stages/rollout-text.json"}]}}}
    (root / "dvc.lock").write_text(yaml.safe_dump(lock))
    (root / "metrics" / "stages").mkdir(parents=True)
    (root / "metrics" / "stages" / "rollout-text.json").write_text(
        json.dumps({"success_rate": success, "seconds": seconds}))
    return root


def test_compare_runs_leaves_out_wall_clock_keys_and_names_what_differs(tmp_path):
    before = finished_run(tmp_path / "before", "aaa", 0.5, 10.0)
    same = finished_run(tmp_path / "same" / "curio", "aaa", 0.5, 99.0)  # curio bench fresh-clone --keep DIR: DIR/curio
    res = run(["compare", "runs", str(before), str(tmp_path / "same")])
    assert res.exit_code == 0 and "rollout-text       1/1 the same" in res.stdout and "row-identical" in res.stdout
    other = finished_run(tmp_path / "other", "bbb", 0.25, 10.0)
    res = run(["compare", "runs", str(same), str(other)])
    assert res.exit_code == 1 and res.stdout.rstrip().endswith("DIFFERENT")
    assert "out data/rollout_text: aaa -> bbb" in res.stdout and "metric success_rate: 0.5 -> 0.25" in res.stdout


def test_compare_runs_gives_the_held_out_shift_paired_over_tasks(tmp_path):
    """Per policy: success in each run and AFTER − BEFORE paired over the same held-out tasks. Worked by hand:
    base wins t1 1/2, t2 0/2, t3 2/2 before and 2/2, 1/2, 2/2 after; d = (0.5, 0.5, 0), mean 1/3,
    SE = sqrt(((1/6)² + (1/6)² + (1/3)²) / (3·2)) = 1/6. A train-split episode and a policy only one run has
    are left out."""
    def with_evaluation(root: Path, wins: dict[str, list[int]], extra: list[dict]) -> Path:
        rows = [{"policy": "base", "group": G, "task_id": t, "split": "eval", "success": bool(w)}
                for t, ws in wins.items() for w in ws] + extra
        write_dataset(root / "data" / "evaluate_text", rows)
        return root

    before = with_evaluation(finished_run(tmp_path / "b", "aaa", 0.5, 1.0), {"t1": [1, 0], "t2": [0, 0], "t3": [1, 1]},
                             [{"policy": "base", "group": G, "task_id": "t9", "split": "train", "success": True}])
    after = with_evaluation(finished_run(tmp_path / "a", "aaa", 0.5, 1.0), {"t1": [1, 1], "t2": [1, 0], "t3": [1, 1]},
                            [{"policy": "sft", "group": G, "task_id": "t1", "split": "eval", "success": True}])
    res = run(["compare", "runs", str(before), str(after)])
    assert res.exit_code == 0, res.stdout
    assert "base     0.5000 -> 0.8333   +0.3333 ± 0.1667 (+2.0 s.e., 3 tasks)" in res.stdout
    assert "sft" not in res.stdout
    (after / "data" / "evaluate_text" / "part-00000.parquet").write_bytes(b"not parquet")
    assert_one_line(run(["compare", "runs", str(before), str(after)]), "not evaluate-text's episodes")


def test_compare_runs_without_a_dvc_lock_is_one_line(tmp_path):
    assert_one_line(run(["compare", "runs", str(tmp_path), str(tmp_path)]), "no dvc.lock under")


def tokenizer_dir(path: Path) -> Path:
    from pipeline.models.tiny import train_tokenizer

    train_tokenizer(["a b c", "yes no", "<Answer>a</Answer>"], vocab_size=300).save_pretrained(path)
    return path


def test_compare_rollouts_of_the_same_draws_finds_no_difference(tmp_path):
    rows = [episode("base", G, 0, 0, 1, ["a"]), episode("base", G, 1, 0, None, ["a b", "c", "yes no"])]
    a, b = write_dataset(tmp_path / "a", rows), write_dataset(tmp_path / "b", rows)
    res = run(["compare", "rollouts", str(a), str(b), "--tokenizer", str(tokenizer_dir(tmp_path / "tok"))])
    assert res.exit_code == 0, res.output
    # 1 of 2 won, s.e. sqrt(.5 * .5 / 2) = 35.4 %; mean turns (1 + 3) / 2, on wins 1; difference 0 s.e.
    for group in (G, "all"):
        assert f"{group:<28}   50.0% ± 35.4%   50.0% ± 35.4%       +0.00  2.00/2.00   1.00/1.00" in res.stdout
    assert "Kolmogorov-Smirnov D = 0.000, p = 1.000" in res.stdout
    assert "replies identical at the same position: 4 of 4" in res.stdout


def test_compare_rollouts_of_other_episodes_is_one_line(tmp_path):
    a = write_dataset(tmp_path / "a", [episode("base", G, 0, 0, 1, ["a"])])
    b = write_dataset(tmp_path / "b", [episode("base", G, 1, 0, 1, ["a"])])
    assert_one_line(run(["compare", "rollouts", str(a), str(b)]), "do not play the same episodes")


def test_compare_rl_text_rows_name_grpo_with_turn_credit(tmp_path):
    from pipeline.params import load_params
    from pipeline.tools.compare_rl_text import GRID, parse_row, rl_overrides

    row = parse_row("grpo_turn/infogain")
    assert row == ("grpo_turn", "infogain", False)
    (tmp_path / "params.yaml").write_text("{}\n")
    params = load_params(tmp_path / "params.yaml", rl_overrides(tmp_path / "d", row, GRID["grpo_turn"][0]))
    cfg = params.rl_text
    assert (cfg.algorithm, cfg.reward, cfg.grpo.credit, cfg.grpo.lr) == ("grpo", "infogain", "turn", 1e-4)
    plain = load_params(tmp_path / "params.yaml", rl_overrides(tmp_path / "d", parse_row("grpo/outcome"),
                                                               GRID["grpo"][0]))
    assert (plain.rl_text.algorithm, plain.rl_text.grpo.credit) == ("grpo", "trajectory")


@pytest.mark.parametrize("args, needle", [
    (["--rows", "filtered_bc/outcome,ppo/outcome"], "--rows: bad row 'ppo/outcome'"),
    (["--rows", "archer/outcome+more"], "bad row"),
    (["-S", "games.val_fraction=0"], "games.val_fraction"),  # the configurations are chosen on val: there must be one
])
def test_compare_rl_text_refuses_bad_rows_and_no_val_split_before_any_stage(tmp_path, args, needle):
    assert_one_line(run(["compare", "rl-text", "--project", str(tmp_path / "p"), *args]), needle)
    assert not (tmp_path / "p" / "data").exists()


# -- curio choose hparams / tiers / format-prompt --------------------------------------------------------------
@pytest.mark.parametrize("args, needle", [
    (["--grid", "train_policy.sft.lr=1e-4,2e-4"], "--grid needs --stage"),
    (["--stage", "pairs-text", "--grid", "pairs_text.turn_threshold=0,1"], "trains no policy: add --through"),
    (["--stage", "train-dpo", "--through", "train-sft"], "train-sft is not downstream of train-dpo"),
    (["--stage", "train-sft", "--through", "evaluate-text"], "--through evaluate-text"),
    (["--stage", "no-such-stage", "--through", "train-dpo"], "no stage 'no-such-stage'"),
    (["--stage", "train-sft", "--grid", "train_policy.sft.lr"], "expected KEY=V1,V2"),
    (["--from", "/no/such/run"], "--from /no/such/run: not a directory"),
    # no val split: refused before any stage trains
    (["--from", "tests", "--stage", "train-sft", "--grid", "train_policy.sft.lr=1e-4", "-S", "games.val_fraction=0"],
     "games.val_fraction > 0"),
])
def test_choose_hparams_refuses_bad_options_in_one_line(tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(REPO)
    assert_one_line(run(["choose", "hparams", "--out", str(tmp_path / "out"), *args]), needle)
    assert not (tmp_path / "out").exists()


def test_choose_tiers_plays_every_candidate_on_val_and_picks_per_game_inside_the_band(tmp_path):
    candidates = ["twenty_questions@shown4", "twenty_questions@shown10", "bandit@easy2"]
    out = tmp_path / "tiers.json"
    res = run(["choose", "tiers", *SCRIPTED, "--k", "1", "--candidates", " ".join(candidates), "--low", "0",
               "--high", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    table = json.loads(out.read_text())
    assert list(table["results"]) == candidates
    assert all(r["episodes"] > 0 and 0 <= r["success_rate"] <= 1 for r in table["results"].values())
    assert table["chosen"] == pick(table["results"], 0.0, 1.0)  # every tier inside: per game the nearest 0.5
    assert set(table["chosen"]) == {"twenty_questions", "bandit"} and all(table["chosen"].values())
    for c in candidates:
        assert f"{c:28s} val success {table['results'][c]['success_rate']:.3f}" in res.stdout
    assert "chosen on val (success in [0.00, 1.00], nearest its middle)" in res.stdout and "(2 groups)" in res.stdout


@pytest.mark.parametrize("args, needle", [
    (["-S", "games.val_fraction=0"], "games.val_fraction > 0"),
    (["-S", "games.val_fraction=0.5", "--low", "0.7", "--high", "0.2"], "--low 0.7 is above --high 0.2"),
    (["-S", "games.val_fraction=0.5", "--candidates", "no_such_game@x"], "games.groups"),
])
def test_choose_tiers_refuses_bad_input_in_one_line(args, needle):
    assert_one_line(run(["choose", "tiers", "-S", "policy.backend=scripted", "-S", "policy.model=scripted",
                         *args]), needle)


def test_choose_format_prompt_plays_each_candidate_and_names_the_choice(tmp_path):
    out = tmp_path / "format.json"
    res = run(["choose", "format-prompt", *SCRIPTED, "-S", "games.groups=[twenty_questions@shown4]", "--k", "1",
               "--candidates", "game,rule+free", "--json", str(out)])
    assert res.exit_code == 0, res.output
    table = json.loads(out.read_text())
    assert list(table["results"]) == ["game", "rule+free"]
    assert all(r["parsed"] == 1.0 for r in table["results"].values())  # the scripted players always use the tags
    best = max(table["results"], key=lambda c: (table["results"][c]["success_rate"], table["results"][c]["parsed"]))
    assert table["chosen"] == best
    prompt, _, free = best.partition("+")
    assert (f"chosen on val: policy.format_prompt={prompt} policy.free_answers={str(free == 'free').lower()}"
            in res.stdout)


@pytest.mark.parametrize("args, needle", [
    (["--candidates", "game+tags"], "'game+tags' is not FORMAT_PROMPT or FORMAT_PROMPT+free"),
    (["--candidates", "shout"], "policy.format_prompt"),
    (["-S", "games.val_fraction=0"], "games.val_fraction > 0"),
])
def test_choose_format_prompt_refuses_bad_input_in_one_line(args, needle):
    assert_one_line(run(["choose", "format-prompt", *SCRIPTED, *args]), needle)


# -- curio check-imports / params-hashes -----------------------------------------------------------------------
def test_check_imports_without_its_config_is_one_line(tmp_path):
    assert_one_line(run(["check-imports", "--config", str(tmp_path / "pyproject.toml")]), "no such file")


def test_params_hashes_covers_every_stage_of_params_yaml_and_of_each_preset(monkeypatch):
    monkeypatch.chdir(REPO)
    res = run(["params-hashes"])
    assert res.exit_code == 0, res.output
    hashes = json.loads(res.stdout)
    labels = ["params.yaml", *(p.name for p in (REPO / "presets").glob("*.yaml"))]
    assert set(hashes) == {f"{label}:{stage}" for label in labels
                            for stage in (s.name for s in declared_stages())} | {"schema", "defaults"}
    # what a stage records is the hash of its own slice
    assert all(h["hash"] == h["slice_hash"] for key, h in hashes.items() if ":" in key)
    smollm2 = hashes["smollm2.yaml:rollout-text"]["hash"]
    assert smollm2 != hashes["params.yaml:rollout-text"]["hash"]  # the preset changes the policy rollout-text plays


def test_compare_rl_text_scores_pass_at_k_and_the_paired_difference_from_dpo_by_hand(tmp_path):
    from pipeline.tools.compare_rl_text import choose_row, paired, score, write

    def rows(wins_per_task):  # task t won in the first wins_per_task[t] of its 4 samples
        return [{"group": "g", "task_id": str(t), "policy": "_", "success": s < w, "turns": 2, "score": 0.0,
                 "invalid": False} for t, w in enumerate(wins_per_task) for s in range(4)]

    dpo, rl = score(rows([0, 1, 2]), 4), score(rows([1, 3, 2]), 4)
    # mean@4 = success: DPO 3/12, RL 6/12; pass@4 with 4 samples a task = share of tasks with a win: 2/3, 3/3
    assert (dpo["success_rate"], rl["success_rate"]) == (0.25, 0.5)
    assert (dpo["pass_at_k"], rl["pass_at_k"]) == (2 / 3, 1.0)
    # per-task differences .25, .5, 0: mean .25, SE = sqrt(((0)² + .25² + .25²) / (3 · 2)) = .25 / sqrt(3)
    d = paired(rl, dpo)
    assert d["tasks"] == 3 and d["diff"] == pytest.approx(0.25) and d["se"] == pytest.approx(0.25 / 3 ** 0.5)
    chosen = {"history": [{"episodes": 96}], "config": ["rl_text.grpo.lr=0.0001"], "val": rl, "val_vs_dpo": d,
              "eval": {"all": rl}, "eval_vs_dpo": {"all": d}}
    worse = {**chosen, "val": dpo}
    results = {"dpo": {"val": dpo, "eval": {"all": dpo}},
               "rows": {"grpo/outcome": {"chosen": chosen}, "filtered_bc/outcome": {"chosen": worse}}}
    results["chosen_row"] = choose_row(results["rows"])
    assert results["chosen_row"] == "grpo/outcome"
    write(tmp_path, results, "curio compare rl-text")
    table = (tmp_path / "compare.md").read_text()
    assert "| dpo (the start) | | 25.0 | 0 | all | 25.0 ± 12.5 | 66.7 |" in table
    assert "| grpo/outcome | rl_text.grpo.lr=0.0001 | 50.0 (+25.0 ± 14.4) | 96 | all | 50.0 ± 14.4 | 100.0 | " \
           "+25.0 ± 14.4 (3) |" in table
    assert "Chosen on val: **grpo/outcome**" in table


def test_fresh_clone_results_give_the_headline_in_pipeline_order_and_each_stage_longest_first():
    from pipeline.tools.fresh_clone import Options, Run, printed, results_markdown

    run = Run(commit="abc1234", stages={"bootstrap": 60.0, "report": 5.5, "rollout-text": 30.25}, dag_s=95.75,
              build_s=70.0, summaries={"text_success": {"text": {"base": 0.41, "dpo": 0.47, "rl": 0.46, "sft": 0.44}},
                                       "nethack_return": {"nethack": {"motif": 24.9, "random": 9.1}}},
              headline="Path  text.base\nmetrics/text_success.json  0.41\n")
    options = Options(budget_min=3.0)
    page = results_markdown(run, options, "curio bench fresh-clone --results FILE")
    assert "`curio bench fresh-clone --results FILE`" in page and "commit `abc1234`" in page
    text = page[page.index("| text (success) |"):]
    assert [line.split(" | ")[0] for line in text.splitlines()[2:6]] == ["| base", "| sft", "| dpo", "| rl"]
    assert "| random | 9.1 |\n| motif | 24.9 |" in page
    timing = page[page.index("| stage | seconds |"):]
    assert timing.splitlines()[2:5] == ["| bootstrap | 60.0 |", "| rollout-text | 30.2 |", "| report | 5.5 |"]
    assert "| in all | 165.8 (2.8 min) |" in page
    lines = printed(run, options)
    assert lines[0].startswith("commit abc1234  one stage at a time, warm start, the CPU's own ISA")
    assert lines[-1] == "total 2.8 min (venv build included) vs budget 3 min: within"


def test_soak_waits_for_and_stops_only_the_vllm_servers_its_own_project_started(tmp_path):
    """A soak beside a user's run on vLLM: the servers it waits for (and kills when they outlive their stage) are those
    whose working directory is its project, never the other run's."""
    import subprocess
    import sys
    import time

    from pipeline.tools.soak import servers

    ours, theirs = tmp_path / "soak" / "project", tmp_path / "run"
    (ours / "data").mkdir(parents=True)
    theirs.mkdir()
    # a stand-in with a vLLM server's command line, started in each project (a stage's server runs where it does)
    cmd = [sys.executable, "-c", "import time; time.sleep(60)", "-m", "vllm.entrypoints.openai.api_server"]
    procs = [subprocess.Popen(cmd, cwd=ours / "data"), subprocess.Popen(cmd, cwd=theirs)]
    try:
        deadline = time.monotonic() + 30  # until both have exec'd (a fork's command line is still pytest's)
        while len(servers(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert servers(ours) == [procs[0].pid]
        assert servers(theirs) == [procs[1].pid]
        assert servers(tmp_path / "elsewhere") == []
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_stopped_soak_stops_the_run_it_started_and_leaves_no_process(tmp_path):
    """`curio soak` runs each `dvc repro` in a process group of its own (its interruptions go to that group), which a
    SIGTERM to the soak does not reach: the soak stops it itself before it exits 143."""
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "soak.py"
    script.write_text(
        "import sys, time\nfrom pathlib import Path\nfrom pipeline.tools.soak import Repro, stop_on_signals\n"
        "stop_on_signals(5.0)\n"
        f"run = Repro(Path({str(tmp_path)!r}), sys.stderr, command=('sh', '-c', 'sleep 60 & sleep 60'))\n"
        "print(run.proc.pid, flush=True)\ntime.sleep(60)\n")
    soak = subprocess.Popen([sys.executable, str(script)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    group = int(soak.stdout.readline())
    soak.send_signal(signal.SIGTERM)
    assert soak.wait(30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the soak's run outlived it")


def test_soak_summary_counts_interruptions_by_signal_and_stage_and_names_how_sigterms_stopped():
    import signal

    from pipeline.tools.soak import Interruption, stop_text, summary

    done = [Interruption(signal.SIGKILL, "bootstrap", 3.0, 1.0),
            Interruption(signal.SIGTERM, "bootstrap", 5.0, 2.5, 143, "curio: stopped by SIGTERM: bootstrap at step 7"),
            Interruption(signal.SIGTERM, "report", 1.0, 0.5, 0)]
    lines = summary(done, 4, {"bootstrap": 60.0, "report": 5.0}, False, 20.0, 0, [], (300.0, 100.0), [],
                    ["1 interruption(s) not sent"])
    assert lines[0] == "\ninterruptions survived: 3 of 4 planned (1 SIGKILL, 2 SIGTERM)"
    assert lines[2:4] == [f"{'bootstrap':<20} {1:>8} {1:>8}", f"{'report':<20} {0:>8} {1:>8}"]
    assert any(line.startswith("SIGTERM, the stage's exit: {143: 1, 0: 1}") and "slowest stop 2.5 s" in line
               for line in lines)
    assert "rows lost: 0 (goal 0)" in lines and "time: 300 s interrupted vs 100 s uninterrupted (overhead +200 s, " \
        "+200%)" in lines and lines[-1] == "problem: 1 interruption(s) not sent"
    assert stop_text(done[1], {1: "curio stage bootstrap"}) == "stopped by SIGTERM: bootstrap at step 7"
    assert stop_text(done[2], {1: "curio stage report"}) == "(the stage had finished its work: exit 0)"
    assert stop_text(done[0], {}) == ""


def test_soak_plans_its_interruptions_on_the_stages_asked_for():
    """`curio soak --stages`: every interruption goes to those stages (in turn), none to the others."""
    import random

    from pipeline.tools.soak import plan

    durations = {"rollout-text": 30.0, "train-dpo": 20.0, "rl-text": 60.0, "evaluate-text": 10.0}
    planned = plan(durations, 20, random.Random(0), 0.5, ["rl-text"])
    assert list(planned) == list(durations) and len(planned["rl-text"]) == 20
    assert not any(planned[s] for s in durations if s != "rl-text")
    both = plan(durations, 20, random.Random(0), 0.5, ["rl-text", "train-dpo"])
    assert len(both["rl-text"]) == len(both["train-dpo"]) == 10
    assert sum(map(len, plan(durations, 20, random.Random(0), 0.5).values())) == 20
    with pytest.raises(SystemExit, match="none of them runs"):
        plan(durations, 5, random.Random(0), 0.5, ["nope"])



def test_a_soak_of_some_stages_reruns_them_from_the_uninterrupted_runs_inputs(tmp_path):
    """`curio soak --stages B`: the interrupted project is the uninterrupted one less the outputs of B and of the
    stages after it (what a vLLM-sampled upstream would not repeat); a forced rerun names its stage once (dvc repro
    takes one run of targets: `dvc repro B --force --single-item B` is an argparse error)."""
    from pipeline.tools.soak import forced_command, persistent_outs, reuse_upstream

    straight = tmp_path / "uninterrupted"
    stages = {
        "a": {"cmd": "curio stage a", "outs": [{"data/a": {"persist": True}}], "metrics": ["metrics/a.json"]},
        "b": {"cmd": "curio stage b", "deps": ["data/a"], "outs": [{"data/b": {"persist": True}}, "data/b2"],
              "metrics": ["metrics/b.json"]},
        "c": {"cmd": "curio stage c", "deps": ["data/b"], "outs": ["data/c"]},
        "d": {"cmd": "curio stage d", "deps": ["data/a"], "outs": ["data/d"]},
    }
    (straight / "metrics").mkdir(parents=True)
    (straight / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    for out in ("data/a", "data/b", "data/b2", "data/c", "data/d"):
        (straight / out).mkdir(parents=True)
        (straight / out / "part-0.parquet").write_text(out)
    for m in ("a", "b"):
        (straight / "metrics" / f"{m}.json").write_text("{}")
    soaked = reuse_upstream(straight, tmp_path / "run", ["b"])
    kept = sorted(str(p.relative_to(soaked)) for p in soaked.rglob("*") if p.is_file())
    assert kept == ["data/a/part-0.parquet", "data/d/part-0.parquet", "dvc.yaml", "metrics/a.json"]
    assert (straight / "data/b/part-0.parquet").exists()  # the uninterrupted run is left as it was
    assert persistent_outs(straight / "dvc.yaml", "b") == ["data/b"]
    assert forced_command(("dvc", "repro", "b"), stages, "b") == ("dvc", "repro", "--force", "--single-item", "b")
    assert forced_command(("python", "-m", "pipeline.orchestration.run_dvc"), stages, "c") == (
        "python", "-m", "pipeline.orchestration.run_dvc", "--force", "--single-item", "c")

def test_profile_of_an_unknown_stage_is_one_line_exit_2():
    res = run(["profile", "rollout-txt"])
    line = assert_one_line(res, "unknown stage 'rollout-txt'")
    assert "rollout-text" in line


def test_fresh_clone_bench_keeps_a_relative_directory_as_an_absolute_one(tmp_path, monkeypatch):
    """`curio bench fresh-clone --keep DIR` with DIR relative: every command runs in the clone (another cwd), so the
    clone's paths must not be relative to where the bench was started."""
    from pipeline.tools import fresh_clone as fc

    seen = {}

    def prepare(work, options, env):
        seen["work"] = work
        raise RuntimeError("stop after the clone's path is known")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(fc, "prepare", prepare)
    with pytest.raises(RuntimeError, match="stop after"):
        fc.fresh_clone_run(fc.Options(keep=Path("kept")))
    assert seen["work"] == tmp_path / "kept" / "curio" and seen["work"].is_absolute()
