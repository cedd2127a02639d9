"""Other people's games through Curio's DAG: ``textarena:ENV_ID`` and ``openenv:URL`` groups
(pipeline/envs/external.py). A tiny OpenEnv server (tests/openenv_server.py, openenv-core's own server classes) and
TextArena's GuessTheNumber are played by the built-in model, pre-trained on mastermind's scripted play."""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO, curio, make_project, stage_here

from pipeline.core.artifacts import read_manifest, read_part, read_rows
from pipeline.core.config import ConfigError
from pipeline.core.errors import CurioError
from pipeline.core.stage import StageContext, stage_module
from pipeline.envs.external import EVAL_SEED_BASE, TURN_LIMIT, ExternalEnvError, observation_text
from pipeline.params import load_params
from pipeline.text.policies import game_tasks, make_games

TINY_BOOTSTRAP = ["bootstrap.episodes=24", "bootstrap.epochs=1", "bootstrap.n_layer=1", "bootstrap.n_embd=32",
                  "bootstrap.n_head=2", "bootstrap.vocab_size=800", "bootstrap.batch_size=4",
                  "bootstrap.n_positions=1024"]
GUESS = "textarena:GuessTheNumber-v0"
# Small plays of the external groups: 6 train tasks x 2 episodes in chunks of 2 tasks, moves read without tags; no
# val split (whatever params.yaml says), so the train tasks are the first seeds.
ROLLOUT = ["tracking.enabled=false", "games.val_fraction=0", "games.max_train_tasks=6", "games.max_eval_tasks=3",
           "rollout_text.trajectories_per_task=2", "rollout_text.tasks_per_chunk=2", "rollout_text.max_new_tokens=8",
           "policy.free_answers=true"]


def groups(*names: str) -> str:
    return f"games.groups={json.dumps(list(names))}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """tests/openenv_server.py on ``port`` (its flags: ``args``) while the block runs."""

    def __init__(self, port: int, *args: str) -> None:
        self.port, self.args = port, args
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> Server:
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "openenv_server.py"), str(self.port),
                                      *self.args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=1)
                return self
            except OSError:
                assert self.proc.poll() is None, "the OpenEnv test server exited at start"
                time.sleep(0.2)
        raise AssertionError("the OpenEnv test server did not come up")

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """data/bootstrap of a tiny built-in model pre-trained on mastermind (it writes digits: the test server's
    game reads the first digit of a move)."""
    tmp = tmp_path_factory.mktemp("external-base")
    params = load_params("params.yaml", [f"data_dir={tmp / 'data'}", *TINY_BOOTSTRAP, groups("mastermind")])
    stage_module("bootstrap").run(params, StageContext())
    return tmp / "data" / "bootstrap"


def project(tmp_path: Path, base: Path, *overrides: str, name: str = "proj") -> Path:
    """A project (this checkout's code, params.yaml with ``overrides``) whose data/bootstrap is ``base``."""
    root = tmp_path / name
    root.mkdir()
    proj = make_project(root, [*ROLLOUT, *overrides])
    (proj / "data").mkdir()
    os.symlink(base, proj / "data" / "bootstrap")
    return proj


def seeds(tasks) -> list[int]:
    return [t.env["seed"] for t in tasks]


def test_tasks_are_the_environments_seeds_and_the_splits_are_disjoint():
    for group in (f"{GUESS}@train=40,eval=10", "openenv:http://127.0.0.1:9@train=40,eval=10"):
        params = load_params("params.yaml", [groups(group), "games.val_fraction=0.25"])
        (game,) = make_games(params)  # no server is contacted for the tasks: they are seeds
        train, val, held_out = (seeds(game_tasks(params.games, game, s)) for s in ("train", "val", "eval"))
        assert len(train) == 30 and len(val) == 10 and len(held_out) == 10
        assert not set(train) & set(val) and not set(train) & set(held_out) and not set(val) & set(held_out)
        assert sorted(train + val) == list(range(40))  # val is carved out of the train seeds
        assert held_out == list(range(EVAL_SEED_BASE, EVAL_SEED_BASE + 10))
        assert seeds(game_tasks(params.games, make_games(params)[0], "val")) == val  # the same val every run


def test_an_openenv_observation_says_its_chat_messages_else_its_text_fields():
    # OpenEnv's own TextArena environment: a prompt, and the new messages as objects with a content
    textarena_like = {"prompt": "the whole game so far", "messages": [
        {"sender_id": -1, "content": "The target number is higher.", "category": "GAME_MESSAGE"}],
        "current_player_id": 0, "info": {}}
    assert observation_text(textarena_like) == "The target number is higher."
    assert observation_text({**textarena_like, "messages": []}) == "the whole game so far"
    assert observation_text({"text": "Not 3: higher."}) == "Not 3: higher."
    assert observation_text({"board": "A1 .", "status": "your move"}) == "board: A1 .\nstatus: your move"
    assert observation_text({"count": 3, "messages": []}) is None


def test_an_openenv_server_that_speaks_chat_messages_is_played_by_them():
    with Server(free_port(), "--chat") as server:
        (game,) = make_games(load_params("params.yaml", [groups(f"openenv:{server.url}")]))
        task = game.tasks("train")[0]
        state = game.reset(task, random.Random(0))
        assert game.conversation_start(task)[1]["content"] == "Guess my digit (0-9) in at most 5 moves."
        replies = []
        for digit in range(10):
            replies.append(game.step(state, str(digit)))
            if replies[-1].done:
                break
    assert replies[-1].done and 1 <= len(replies) <= 5  # the game's own end, within its 5 moves
    assert all(re.fullmatch(r"Not \d: (higher|lower)\.|Right!|Out of moves: it was \d\.", r.reply) for r in replies)


def test_a_textarena_game_that_ends_with_a_reward_that_is_no_number_is_one_line():
    # ThreeCardMonte-v0 (textarena 0.7.4) passes its reason as the reward of a second invalid move
    (game,) = make_games(load_params("params.yaml", [groups("textarena:ThreeCardMonte-v0")]))
    state = game.reset(game.tasks("eval")[0], random.Random(0))
    first = game.step(state, "the left cup")  # TextArena's one allowed invalid move: a warning, the game goes on
    assert not first.done and "Reason: 0.0" in first.reply  # the swapped arguments show here too
    with pytest.raises(ExternalEnvError, match=r"^textarena:ThreeCardMonte-v0: the game ended episode "
                       r"textarena:ThreeCardMonte-v0-eval-0000 \(seed 1000000\), turn 2 with a reward of 'Bad "
                       r"action\. Use `\[k\]`\.', not a number \(a fault of the game's code\); choose another game$"):
        game.step(state, "the right cup")


def test_the_built_in_model_needs_a_game_with_a_scripted_player(tmp_path):
    params = load_params("params.yaml", [f"data_dir={tmp_path}", *TINY_BOOTSTRAP, groups(GUESS)])
    with pytest.raises(ConfigError, match=r"^params: bootstrap: .*none of textarena:GuessTheNumber-v0 has one"):
        stage_module("bootstrap").run(params, StageContext())
    assert not (tmp_path / "bootstrap").exists()
    with pytest.raises(ConfigError, match="policy.backend: scripted .* another project's environment"):
        load_params("params.yaml", [groups("mastermind", GUESS), "policy.backend=scripted", "policy.model=scripted"])
    with pytest.raises(ConfigError, match="policy.format_prompt: example .* another project's environment"):
        load_params("params.yaml", [groups("mastermind", GUESS), "policy.format_prompt=example"])
    with pytest.raises(ConfigError, match=r"games.groups: 'openenv:localhost:8000': .* URL must be http://"):
        load_params("params.yaml", [groups("openenv:localhost:8000")])
    with pytest.raises(ConfigError, match=r"games.groups: unknown game group 'gym:CartPole-v1'"):
        load_params("params.yaml", [groups("gym:CartPole-v1")])
    with pytest.raises(ConfigError, match=r"games.groups: 'textarena:GuessTheNumber-v0@turns=3': .*unknown key"):
        load_params("params.yaml", [groups(f"{GUESS}@turns=3")])


def test_a_textarena_game_resumes_after_sigkill_with_every_episode_once(tmp_path, base):
    ref = project(tmp_path, base, groups(GUESS), name="ref")
    stage_here("rollout-text", ref)  # uninterrupted
    expected = sorted(read_rows(ref / "data" / "rollout_text"), key=lambda r: (r["task_id"], r["sample"]))
    assert len(expected) == 12 and {r["group"] for r in expected} == {GUESS}
    assert all(json.loads(r["secret"])["seed"] < 6 and r["split"] == "train" for r in expected)
    assert all(r["conversation"][1]["content"].startswith("You are Player 0. You are playing Guess The Number")
               for r in expected)

    proj = project(tmp_path, base, groups(GUESS))
    out = proj / "data" / "rollout_text"
    env = {**os.environ, "TQDM_DISABLE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "stage", "rollout-text"], cwd=proj, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        manifest = read_manifest(out) if (out / "_manifest.json").exists() else None
        if manifest and manifest.get("parts") and not manifest.get("complete"):
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the rollout was not killed between its chunks"
    written = len(read_manifest(out)["parts"])
    assert 1 <= written < 3
    curio(["stage", "rollout-text"], proj)
    assert read_manifest(out)["complete"]
    rows = sorted(read_rows(out), key=lambda r: (r["task_id"], r["sample"]))
    assert [(r["task_id"], r["sample"]) for r in rows] == [(r["task_id"], r["sample"]) for r in expected]
    assert rows == expected  # every episode once, each as the uninterrupted run played it


def test_an_openenv_game_plays_through_every_text_stage(tmp_path, base):
    with Server(free_port()) as server:
        group = f"openenv:{server.url}"
        params = load_params("params.yaml", [
            f"data_dir={tmp_path / 'data'}", *TINY_BOOTSTRAP, *ROLLOUT, groups(group), "games.max_train_tasks=8",
            "rollout_text.trajectories_per_task=4", "train_policy.sft.epochs=1", "train_policy.dpo.epochs=1",
            "train_policy.save_steps=2", "rl_text.rounds=1", "rl_text.tasks_per_round=4",
            "rl_text.trajectories_per_task=2", "rl_text.epochs=1", "evaluate_text.trajectories_per_task=2",
            "evaluate_text.policies=[base, rl]", "games.val_fraction=0.25", "rl_text.max_val_tasks=2",
            "rl_text.val_trajectories=2"])
        (game,) = make_games(params)
        train_seeds, val_seeds = (set(seeds(game_tasks(params.games, game, s))) for s in ("train", "val"))
        (tmp_path / "data").mkdir()
        os.symlink(base, tmp_path / "data" / "bootstrap")
        run = {name: stage_module(name).run(params, StageContext()).metrics
               for name in ("rollout-text", "annotate-text", "pairs-text", "train-sft", "reflogprobs", "train-dpo",
                            "rl-text", "evaluate-text")}

    played = read_rows(tmp_path / "data" / "rollout_text")
    assert len(played) == 8 * 4 and {r["group"] for r in played} == {group}
    assert {json.loads(r["secret"])["seed"] for r in played} == train_seeds and not train_seeds & val_seeds
    assert any(r["success"] for r in played) and not all(r["success"] for r in played)
    assert all(r["success"] == (r["reward"] == 1.0) for r in played)  # the server's reward is the outcome
    judged = read_rows(tmp_path / "data" / "annotate_text")
    assert [r["judge_label"] == "VALID" for r in judged] == [r["success"] for r in judged]  # the env's reward
    pairs = read_rows(tmp_path / "data" / "reflogprobs")
    assert pairs and all(p["group"] == group for p in pairs)
    assert (tmp_path / "data" / "train_policy" / "dpo" / "model.safetensors").exists()
    rl_played = read_rows(tmp_path / "data" / "rl_text" / "rollouts")  # its round played the server's game
    assert len(rl_played) == 4 * 2 and {r["group"] for r in rl_played} == {group}
    assert run["rl-text"]["rollouts/episodes"] == 8
    assert {json.loads(r["secret"])["seed"] for r in rl_played} <= train_seeds
    assert run["rl-text"]["rl/kept_by_val"] == 1 and 0 <= run["rl-text"]["rl/val_success_start"] <= 1  # val played
    evaluated = read_rows(tmp_path / "data" / "evaluate_text")
    assert {r["policy"] for r in evaluated} == {"base", "rl"} and {r["split"] for r in evaluated} == {"eval"}
    assert {json.loads(r["secret"])["seed"] for r in evaluated} == {EVAL_SEED_BASE + i for i in range(3)}
    assert 0.0 <= run["evaluate-text"][f"rl/{group}/success_rate"] <= 1.0
    assert run["evaluate-text"][f"rl/{group}/turn_limit"] == 0.0  # the game ends itself within 5 moves


def fails_in_one_line(res: subprocess.CompletedProcess, pattern: str) -> str:
    """The command's one-line failure (exit 2, no traceback), matching ``pattern``."""
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("curio: ") and re.search(pattern, line), line
    return line


@pytest.mark.parametrize(("group", "pattern"), [
    ("textarena:GuessTheNumbr-v0", r"TextArena has no environment 'GuessTheNumbr-v0' \(did you mean "
                                   r"GuessTheNumber-v0"),
    ("textarena:Wordle-v0", r"downloads nltk's .* corpus when it loads, and Curio plays offline"),
])
def test_a_textarena_id_that_cannot_be_played_is_refused_in_one_line(tmp_path, base, group, pattern):
    proj = project(tmp_path, base, groups(group))
    fails_in_one_line(curio(["stage", "rollout-text"], proj, check=False), pattern)
    assert not (proj / "data" / "rollout_text" / "_manifest.json").exists()


def refused_in_one_line(proj: Path, pattern: str) -> None:
    """rollout-text in this process (:func:`stage_here`) fails as ``curio`` reports in one line with exit 2 (the
    command's own way of saying it: the unreachable server's case below), matching ``pattern``; nothing written."""
    with pytest.raises(CurioError) as failed:
        stage_here("rollout-text", proj)
    message = str(failed.value)
    assert failed.value.exit_code == 2 and "\n" not in message and re.search(pattern, message), message
    assert not list((proj / "data" / "rollout_text").glob("part-*"))


def test_an_unreachable_or_malformed_openenv_server_is_one_line(tmp_path, base):
    port = free_port()  # nothing listens there
    proj = project(tmp_path, base, groups(f"openenv:http://127.0.0.1:{port}"), name="unreachable")
    fails_in_one_line(curio(["stage", "rollout-text"], proj, check=False),
                      rf"cannot reach the OpenEnv server at http://127.0.0.1:{port} .* start it or fix the URL")
    assert not list((proj / "data" / "rollout_text").glob("part-*"))

    with Server(free_port(), "--malformed") as server:
        proj = project(tmp_path, base, groups(f"openenv:{server.url}"), name="malformed")
        refused_in_one_line(proj, r"malformed observation at .*-train-0000 \(seed 0\), reset: no text field "
                                  r"\(fields: count\)")
    with Server(free_port(), "--two-fields") as server:
        proj = project(tmp_path, base, groups(f"openenv:{server.url}"), name="two-fields")
        refused_in_one_line(proj, r"the server's action has 2 text fields \(move, note")
    with Server(free_port(), "--max-sessions", "3") as server:  # a chunk plays 2 tasks x 2 episodes at once
        proj = project(tmp_path, base, groups(f"openenv:{server.url}"), name="sessions")
        refused_in_one_line(proj, r"(closed a new session|refused a session) .* max_concurrent_envs")


def test_a_game_that_never_ends_stops_at_the_turn_limit_and_says_so(tmp_path, base):
    with Server(free_port(), "--never-ends") as server:
        group = f"openenv:{server.url}@max_turns=3"
        proj = project(tmp_path, base, groups(group), "games.max_train_tasks=2")
        curio(["stage", "rollout-text"], proj)
    rows = read_rows(proj / "data" / "rollout_text")
    assert len(rows) == 4 and {r["group"] for r in rows} == {group}
    note = TURN_LIMIT.format(n=3)
    assert all(r["turns"] == 3 and not r["success"] and r["conversation"][-1]["content"].endswith(note) for r in rows)
    metrics = json.loads((proj / "metrics" / "stages" / "rollout-text.json").read_text())
    assert metrics[f"train/{group}/turn_limit"] == 1.0


def test_a_server_that_dies_mid_episode_keeps_the_chunks_and_the_rerun_resumes(tmp_path, base):
    port = free_port()
    group = f"openenv:http://127.0.0.1:{port}"  # the same URL throughout: it names the task group
    ref = project(tmp_path, base, groups(group), name="ref")
    with Server(port):
        stage_here("rollout-text", ref)
    expected = sorted(read_rows(ref / "data" / "rollout_text"), key=lambda r: (r["task_id"], r["sample"]))
    first_chunk_steps = sum(r["turns"] for r in read_part(ref / "data" / "rollout_text", 0, ["turns"]))
    second_chunk = {r["task_id"] for r in read_part(ref / "data" / "rollout_text", 1, ["task_id"])}

    proj = project(tmp_path, base, groups(group))
    out = proj / "data" / "rollout_text"
    with Server(port, "--die-after", str(first_chunk_steps + 2)):  # in the middle of the second chunk
        line = fails_in_one_line(curio(["stage", "rollout-text"], proj, check=False),
                                 r"the server went away at .*: restart it and rerun to resume")
    assert any(f"at {task} (seed" in line for task in second_chunk)  # mid-episode, in the second chunk
    assert sorted(read_manifest(out)["parts"]) == ["00000"] and not read_manifest(out)["complete"]
    kept = read_part(out, 0)
    with Server(port):
        curio(["stage", "rollout-text"], proj)
    assert read_part(out, 0) == kept  # the chunk written before the fault, as it was
    rows = sorted(read_rows(out), key=lambda r: (r["task_id"], r["sample"]))
    assert len({(r["task_id"], r["sample"]) for r in rows}) == len(rows) == 12
    assert rows == expected


HOWTO = REPO / "docs" / "bring-your-own-environment.md"


def test_the_howtos_textarena_commands_run_as_written(tmp_path):
    """docs/bring-your-own-environment.md's first commands, at a tiny budget (the -S keys appended)."""
    block = HOWTO.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [shlex.split(line) for line in block.splitlines() if line.startswith("curio ")]
    assert [c[:3] for c in commands] == [["curio", "stage", "bootstrap"], ["curio", "stage", "rollout-text"]]
    proj = make_project(tmp_path, ["tracking.enabled=false"])
    tiny = [*TINY_BOOTSTRAP, "games.max_train_tasks=2", "rollout_text.trajectories_per_task=1",
            "rollout_text.max_new_tokens=8"]
    for command in commands:
        curio([*command[1:], *(arg for key in tiny for arg in ("-S", key))], proj)
    rows = read_rows(proj / "data" / "rollout_text")
    assert {r["group"] for r in rows} == {"mastermind", GUESS} and len(rows) == 4
