"""A seed sweep: its tables on numbers worked by hand (pipeline/reporting/seeds.py), and ``curio sweep seeds`` as DVC
experiments, stopped mid-stage and resumed."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import make_project, run_in_project
from test_howtos import block, shell

from pipeline.reporting.seeds import SeedRun, cost, labeller_lags, nethack_lines, seed_tables, text_lines


def rows(policy: str, a: int, b: int) -> list[dict]:
    """One episode on each of two held-out tasks, won (1) or lost (0)."""
    return [{"policy": policy, "group": "g", "task_id": t, "success": bool(s)} for t, s in (("a", a), ("b", b))]


# three seeds: base wins (a, b) = (0, 0), (1, 0), (1, 1); RL wins (1, 0), (1, 1), (0, 1)
RUNS = [SeedRun(f"seed-{k}", k, {}, rows("base", *base) + rows("rl", *rl))
        for k, (base, rl) in enumerate([((0, 0), (1, 0)), ((1, 0), (1, 1)), ((1, 1), (0, 1))])]


def test_per_policy_mean_over_seeds_with_its_spread_beside_the_evaluation_se():
    (base, rl), _ = text_lines(RUNS)
    assert (base.label, base.values) == ("base", [0.0, 0.5, 1.0])
    assert base.mean == 0.5
    assert base.sd == pytest.approx(0.5)  # deviations -0.5, 0, 0.5: sqrt(0.5 / 2)
    assert base.se == pytest.approx(0.5 / math.sqrt(3))
    # the binomial s.e. of each seed's 2 episodes: sqrt(p (1 - p) / 2) = 0, sqrt(1/8), 0
    assert base.eval_se == pytest.approx([0.0, math.sqrt(1 / 8), 0.0])
    assert base.mean_eval_se == pytest.approx(math.sqrt(1 / 8) / 3)
    assert rl.values == [0.5, 1.0, 0.5]


def test_a_comparison_is_paired_per_task_in_each_seed_then_summarised_across_seeds():
    _, (diff,) = text_lines(RUNS)
    assert diff.label == "rl − base"
    # per task: seed 0 (1, 0), seed 1 (0, 1), seed 2 (-1, 0); each seed's s.e. sqrt(sum (d - d̄)² / (T (T - 1)))
    assert diff.values == [0.5, 0.5, -0.5]
    assert diff.eval_se == pytest.approx([0.5, 0.5, 0.5])
    assert diff.mean == pytest.approx(1 / 6)
    assert diff.sd == pytest.approx(math.sqrt(1 / 3))  # deviations 1/3, 1/3, -2/3: sqrt((6/9) / 2)
    assert diff.se == pytest.approx(1 / 3)
    assert diff.agreeing() == "2/3 > 0"


def test_the_table_has_a_column_per_seed_and_the_cost_of_the_sweep():
    runs = [SeedRun(r.name, r.seed, {"train-sft": {"seconds": 10.0 * (k + 1)},
                                     "annotate-text": {"seconds": 5.0, "judge_requests": 4, "judge_sent": 3,
                                                       "judge_tokens_in": 100, "judge_tokens_out": 7,
                                                       "judge_unique_requests": 2}}, r.rows)
            for k, r in enumerate(RUNS)]
    spent = cost(runs)
    assert spent["seconds"] == {"seed-0": 15.0, "seed-1": 25.0, "seed-2": 35.0} and spent["total_seconds"] == 75.0
    assert spent["ledger"] == {"requests": 12, "sent": 9, "tokens_in": 300, "tokens_out": 21}
    lines = seed_tables(runs, markdown=True)
    assert lines[0] == "3 seeds: seed-0 (seed 0), seed-1 (seed 1), seed-2 (seed 2)"
    row = next(x for x in lines if x.startswith("| rl − base |"))
    assert row == "| rl − base | 50.0 ± 50.0 | 50.0 ± 50.0 | -50.0 ± 50.0 | 16.7 ± 33.3 | 57.7 | 50.0 | 2/3 > 0 |"
    assert lines[-1].startswith("cost: stages' seconds seed-0 15, seed-1 25, seed-2 35; 75 s in all (1.2 min)")
    assert "12 requests, 9 sent, 300 tokens in, 21 tokens out" in lines[-1]


def test_nethack_claims_are_evaluate_nethacks_paired_differences_per_seed():
    """Motif − extrinsic and intrinsic only − extrinsic (Motif's claims), every other agent − Motif (ONI's)."""
    stages = [{"evaluate-nethack": {"extrinsic/return": 1.0, "motif/return": 2.0 + k, "intrinsic/return": 0.5,
                                    "oni/return": 4.0, "motif/return_sem": 0.5, "motif/return_vs_extrinsic": 1.0 + k,
                                    "motif/return_vs_extrinsic_sem": 0.25, "intrinsic/return_vs_extrinsic": -0.5,
                                    "intrinsic/return_vs_extrinsic_sem": 0.5, "intrinsic/return_vs_motif": -1.5 - k,
                                    "intrinsic/return_vs_motif_sem": 0.75, "oni/return_vs_motif": 2.0 - k,
                                    "oni/return_vs_motif_sem": 1.0}} for k in range(2)]
    runs = [SeedRun(f"seed-{k}", k, s) for k, s in enumerate(stages)]
    agents, claims = nethack_lines(runs)
    assert [(a.label, a.values) for a in agents] == [("extrinsic", [1.0, 1.0]), ("motif", [2.0, 3.0]),
                                                    ("intrinsic", [0.5, 0.5]), ("oni", [4.0, 4.0])]
    assert [(c.label, c.values, c.eval_se) for c in claims] == [("motif − extrinsic", [1.0, 2.0], [0.25, 0.25]),
                                                                ("intrinsic − extrinsic", [-0.5, -0.5], [0.5, 0.5]),
                                                                ("intrinsic − motif", [-1.5, -2.5], [0.75, 0.75]),
                                                                ("oni − motif", [2.0, 1.0], [1.0, 1.0])]
    assert claims[0].mean == 1.5 and claims[0].se == pytest.approx(0.5) and claims[0].agreeing() == "2/2 > 0"


def test_each_online_agents_labeller_lag_is_its_queue_over_the_messages_it_saw_per_seed():
    # seed 0: 30 labelled, 10 queued (10 of 40 = 25 %); seed 1: 45 labelled, 5 queued (5 of 50 = 10 %)
    stages = [{"rl-nethack": {"oni_classification/oni_labels": labels, "oni_classification/oni_pending": pending,
                              "motif/fps": 1000.0},
               "evaluate-nethack": {"motif/return": 1.0, "oni_classification/return": 2.0,
                                    "oni_classification/return_vs_motif": 1.0}}
              for labels, pending in ((30, 10), (45, 5))]
    runs = [SeedRun(f"seed-{k}", k, s) for k, s in enumerate(stages)]
    (lag,) = labeller_lags(runs)
    assert (lag.agent, lag.pending, lag.seen) == ("oni_classification", [10, 5], [40, 50])
    assert lag.shares == [0.25, 0.1]
    lines = seed_tables(runs, markdown=True)
    assert "| oni_classification | 25.0 % (10 of 40) | 10.0 % (5 of 50) | 17.5 % | 25.0 % |" in lines
    # an agent without online labels has no lag row; a run with no online agent has no labeller table
    assert labeller_lags([SeedRun("seed-0", 0, {"rl-nethack": {"motif/fps": 1.0}})]) == []
    assert not any("labeller" in x for x in seed_tables([SeedRun("s", 0, {"evaluate-nethack": {"motif/return": 1.0}})]))


def sweep_env(proj: Path) -> dict[str, str]:
    """The environment of a user who runs `.venv/bin/curio sweep` without activating the venv: its dvc and curio
    are not on PATH."""
    venv = Path(sys.executable).parent
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != venv)
    return {**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": str(proj), "PATH": path}


def descendants_alive(proj: Path) -> list[str]:
    """Processes still running in the project or in the queue's copies of it (their cwd under it)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and cwd.startswith(str(proj)):
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
    return found


def test_the_how_to_s_sweep_stopped_mid_stage_resumes_there(tmp_path):
    """docs/howto/seed-sweep.md's small sweep, its preset and commands read from the page: stopped with SIGTERM while
    its second seed trains, then the page's commands as written finish that seed from the step it stopped at (its
    worktree kept), and table both."""
    proj = make_project(tmp_path, [])
    (proj / "tiny.yaml").write_text(block("seed-sweep.md", "sweep-preset") + "\n")
    for args in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "core.analytics", "false"],
                 ["git", "add", "-A"], ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "p"]):
        run_in_project(args, proj)
    page = block("seed-sweep.md", "sweep-run")
    assert page.splitlines()[0] == "curio sweep seeds 2 tiny.yaml --target bootstrap"
    command = [sys.executable, "-m", "pipeline.cli", *page.splitlines()[0].split()[1:]]
    sweep = subprocess.Popen(command, cwd=proj, env=sweep_env(proj), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    said, second = [], False
    for line in sweep.stdout:  # seed 0 runs to the end; seed 1 is stopped at its first logged training loss
        said.append(line)
        second = second or "curio sweep: tiny-seed-1: runs in" in line
        if second and "'loss'" in line:
            sweep.send_signal(signal.SIGTERM)
            break
    out = "".join(said) + sweep.stdout.read()
    assert sweep.wait(timeout=180) == 128 + signal.SIGTERM, out[-3000:]
    assert "curio sweep: tiny-seed-0: runs in" in out and "sweep stopped (SIGTERM): tiny-seed-1 stopped" in out
    assert not descendants_alive(proj), descendants_alive(proj)  # the stop waited for every process of the seed
    assert (proj / ".dvc" / "tmp" / "sweeps" / "tiny-seed-1").is_dir()  # kept, to resume in

    again = shell(page, proj, timeout=600).stdout  # the sweep again, then the table, as the page writes them
    assert "curio sweep: tiny-seed-0: finished" in again  # not run again
    assert "curio sweep: tiny-seed-1: resumes in .dvc/tmp/sweeps/tiny-seed-1" in again
    assert again.count("2 seeds: tiny-seed-0 (seed 0), tiny-seed-1 (seed 1)") == 2, again[-3000:]  # sweep, table
    assert "cost: stages' seconds" in again
    assert not (proj / ".dvc" / "tmp" / "sweeps" / "tiny-seed-1").exists()  # saved as an experiment, then removed
    shown = json.loads(run_in_project(["dvc", "exp", "show", "--json"], proj))
    revs = {exp["name"]: exp["revs"][0]["rev"] for base in shown for exp in base.get("experiments") or []}
    resumed = {name: json.loads(run_in_project(["git", "show", f"{rev}:metrics/stages/bootstrap.json"], proj))
               ["resumed_from_step"] for name, rev in revs.items()}  # the stage's metrics, saved with the seed
    assert resumed["tiny-seed-0"] == 0 and resumed["tiny-seed-1"] > 0, resumed  # seed 1 went on from its checkpoint


def test_a_sweep_reusing_an_earlier_commits_runs_only_the_stages_that_differ(tmp_path):
    """A sweep of commit A up to rollout-text, then commit B doubling rollout-text's samples per task, swept with
    ``--reuse A``: bootstrap is A's (skipped by DVC, its model the same bytes), rollout-text runs again under B's
    params (twice the episodes); a commit without the seed's experiment is refused in one line before any seed runs."""
    proj = make_project(tmp_path, [])
    preset = (block("seed-sweep.md", "sweep-preset") + "\nrollout_text: {trajectories_per_task: %d}\n"
              "games: {groups: [wordle], max_train_tasks: 6}\n")
    (proj / "tiny.yaml").write_text(preset % 1)
    commit = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm"]
    for args in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "core.analytics", "false"],
                 ["git", "add", "-A"], [*commit, "a"]):
        run_in_project(args, proj)
    sweep = [sys.executable, "-m", "pipeline.cli", "sweep", "seeds", "1", "tiny.yaml", "--target", "rollout-text"]
    env = sweep_env(proj)
    first = subprocess.run(sweep, cwd=proj, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    a = run_in_project(["git", "rev-parse", "HEAD"], proj).strip()

    (proj / "tiny.yaml").write_text(preset % 2)
    run_in_project([*commit, "b", "tiny.yaml"], proj)
    refused = subprocess.run([*sweep, "--reuse", "HEAD"], cwd=proj, env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "no finished experiment tiny-seed-0 of that commit" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "runs in" not in refused.stdout

    second = subprocess.run([*sweep, "--reuse", a[:7]], cwd=proj, env=env, capture_output=True, text=True,
                            timeout=600)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-3000:]
    assert "runs again: check-params, rollout-text (code, params or inputs differ)" in out, out[-3000:]
    assert "Stage 'bootstrap' didn't change, skipping" in out and "Running stage 'rollout-text'" in out
    b = run_in_project(["git", "rev-parse", "HEAD"], proj).strip()
    revs = {rev: run_in_project(["git", "rev-parse", f"refs/exps/{rev[:2]}/{rev[2:]}/tiny-seed-0"], proj).strip()
            for rev in (a, b)}  # each commit's experiment, as DVC keeps it
    locks = {rev: yaml.safe_load(run_in_project(["git", "show", f"{sha}:dvc.lock"], proj))["stages"]
             for rev, sha in revs.items()}
    md5 = {rev: {name: [o["md5"] for o in stage.get("outs", []) if o["path"].startswith("data/")]
                 for name, stage in lock.items()} for rev, lock in locks.items()}
    assert md5[a]["bootstrap"] == md5[b]["bootstrap"]  # A's model, not trained again
    assert md5[a]["rollout-text"] != md5[b]["rollout-text"]
    episodes = {rev: json.loads(run_in_project(["git", "show", f"{sha}:metrics/stages/rollout-text.json"], proj))
                ["train/episodes"] for rev, sha in revs.items()}
    assert episodes[b] == 2 * episodes[a] > 0, episodes


def test_a_seeds_params_are_the_commits_with_the_presets_values_and_its_seed(tmp_path):
    from pipeline.tools.sweep import write_seed_params

    (tmp_path / "params.yaml").write_text("seed: 0\ngames: {groups: [wordle, bandit], val_fraction: 0.1}\n")
    write_seed_params(tmp_path, ["games.groups=[\"wordle\"]", "++rl_text.grpo.lr=0.0002"], 2)
    assert yaml.safe_load((tmp_path / "params.yaml").read_text()) == {
        "seed": 2, "games": {"groups": ["wordle"], "val_fraction": 0.1}, "rl_text": {"grpo": {"lr": 0.0002}}}


def test_a_stop_signals_every_process_of_the_seed_and_kills_those_still_there_after_the_wait(tmp_path):
    """The seed's dvc repro and the stage under it: each gets the signal (the stage saves its progress on it); one
    that ignores it is killed once the wait is over."""
    import psutil

    from pipeline.tools.sweep import SeedRepro

    child = (f"import signal, sys, time, pathlib\n"
             f"def saved(*_):\n    pathlib.Path({str(tmp_path / 'saved')!r}).write_text('1'); sys.exit(0)\n"
             f"signal.signal(signal.SIGTERM, saved)\ntime.sleep(60)\n")
    parent = (f"import signal, subprocess, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              f"subprocess.Popen([sys.executable, '-c', {child!r}])\ntime.sleep(60)\n")
    runner = SeedRepro()
    runner.proc = subprocess.Popen([sys.executable, "-c", parent])
    deadline = time.time() + 30
    while not psutil.Process(runner.proc.pid).children() and time.time() < deadline:
        time.sleep(0.1)
    stage = psutil.Process(runner.proc.pid).children()[0]
    time.sleep(0.5)  # the stage's handler is set
    start = time.monotonic()
    runner.stop(signal.SIGTERM, wait_s=2.0)
    assert (tmp_path / "saved").read_text() == "1"  # the stage got the signal and saved
    assert runner.proc.poll() is not None and time.monotonic() - start >= 2.0  # ignored it: killed after the wait
    assert not stage.is_running() or stage.status() == psutil.STATUS_ZOMBIE


def test_the_report_shows_a_sweeps_tables(tmp_path):
    import json

    from conftest import REPO

    from pipeline.reporting.report import render, seed_sweeps
    from pipeline.reporting.seeds import seed_summary

    (tmp_path / "seeds" / "default").mkdir(parents=True)
    (tmp_path / "seeds" / "default" / "seeds.json").write_text(json.dumps(seed_summary(RUNS)))
    page = render(tmp_path / "metrics", REPO / "dvc.yaml", {}, "t", sweeps=seed_sweeps(tmp_path / "seeds"))
    assert "<h2>Across seeds: the default sweep</h2>" in page
    assert "<td>rl − base</td><td>50.0 ± 50.0</td><td>50.0 ± 50.0</td><td>-50.0 ± 50.0</td><td>16.7 ± 33.3</td>" in page
    assert "<td>2/3 &gt; 0</td>" in page


def test_the_report_shows_a_sweeps_labeller_lag_and_reads_a_seeds_json_written_before_it(tmp_path):
    import json

    from conftest import REPO

    from pipeline.reporting.report import render, seed_sweeps
    from pipeline.reporting.seeds import seed_summary

    stages = {"rl-nethack": {"oni_classification/oni_labels": 30, "oni_classification/oni_pending": 10},
              "evaluate-nethack": {"motif/return": 1.0, "oni_classification/return": 2.0}}
    summary = seed_summary([SeedRun("seed-0", 0, stages)])
    assert summary["nethack"]["labellers"] == [{"agent": "oni_classification", "pending": [10], "seen": [40],
                                                "shares": [0.25]}]
    older = json.loads(json.dumps(summary))
    del older["nethack"]["labellers"]
    for name, s in (("nethack", summary), ("older", older)):
        (tmp_path / "seeds" / name).mkdir(parents=True)
        (tmp_path / "seeds" / name / "seeds.json").write_text(json.dumps(s))
    page = render(tmp_path / "metrics", REPO / "dvc.yaml", {}, "t", sweeps=seed_sweeps(tmp_path / "seeds"))
    assert page.count("<td>oni_classification</td><td>25.0 % (10 of 40)</td><td>25.0 %</td><td>25.0 %</td>") == 1
    assert "<h2>Across seeds: the older sweep</h2>" in page
