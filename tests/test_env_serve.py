"""`curio env serve`: Curio's games as OpenEnv environments, played by OpenEnv's own generic client.

The client side (``play_over_openenv``) imports only openenv-core: it sees what any outside trainer sees. The player
is Curio's noise-free scripted player, which reads only the messages an agent is shown; Curio's own play of the same
task with the same player is the reference outcome.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import REPO, command_env, curio


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(*args: str) -> Iterator[tuple[str, str]]:
    """``curio env serve ARGS --port P`` running: its base URL and the line it printed; stopped (and waited for) on
    the way out."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "env", "serve", *args, "--port", str(port)],
                            cwd=REPO, env=command_env(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"curio env serve exited {proc.returncode}:\n{proc.stdout.read()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "curio env serve did not come up in 120 s"
            time.sleep(0.5)
        yield url, proc.stdout.readline().rstrip("\n")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def listening_addresses(port: int) -> set[str]:
    """The IPv4 addresses a TCP socket listens on at ``port`` (from /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


def play_over_openenv(url: str, player: Callable[[list[dict]], str], **reset: object) -> dict:
    """One episode over OpenEnv's generic WebSocket client: the conversation, each step's reward, the last
    observation. Only openenv-core here."""
    from openenv.core import GenericEnvClient

    with GenericEnvClient(base_url=url) as env:
        result = env.reset(**reset)
        conversation = list(result.observation["messages"])
        rewards = []
        while not result.done:
            reply = player(conversation)
            result = env.step({"reply": reply})
            conversation += [{"role": "assistant", "content": reply}, *result.observation["messages"]]
            rewards.append(result.reward)
        return {"conversation": conversation, "rewards": rewards, "last": result.observation, "state": env.state()}


def scripted_player(group: str) -> tuple[Callable[[list[dict]], str], object]:
    """Curio's noise-free scripted player of ``group`` (it finds the task from the opening messages it is shown)."""
    from pipeline.envs import make_game
    from pipeline.llm.base import Sampling
    from pipeline.text.scripted import ScriptedPolicy

    policy = ScriptedPolicy([make_game(group)], noise=0.0)
    return (lambda conversation: policy.generate([conversation], Sampling())[0].text), policy


def reference_play(policy, group: str, split: str, task_index: int) -> tuple[object, dict]:
    """The task the server plays at ``task_index`` of ``split`` (the DAG's tasks under the checkout's params), and
    Curio's own play of it with ``policy``: what the served game must reach."""
    from pipeline.llm.base import Sampling
    from pipeline.params import load_params
    from pipeline.text.play import play_episodes
    from pipeline.tools.game_envs import served_tasks

    game, tasks = served_tasks(load_params(REPO / "params.yaml"), group, split)
    task = tasks[task_index]
    return task, play_episodes(policy, [(policy.games[0], task, 0)], Sampling(), seed=0)[0]


@pytest.mark.parametrize(("group", "split", "task_index"), [("twenty_questions", None, 5),
                                                            ("guess_my_city", "eval", 2)])
def test_openenv_client_plays_a_served_game_to_its_outcome(group, split, task_index):
    import torch

    player, policy = scripted_player(group)
    args = [group] + (["--split", split] if split else [])
    with served(*args) as (url, _):
        assert listening_addresses(int(url.rsplit(":", 1)[1])) == {"127.0.0.1"}  # loopback unless told otherwise
        torch.manual_seed(0)  # the scripted player's draws, as play_episodes(seed=0) seeds them
        episode = play_over_openenv(url, player, task_index=task_index)
        other = "eval" if split is None else "train"
        with pytest.raises(RuntimeError, match=f"serves the {split or 'train'} split, not '{other}'"):
            play_over_openenv(url, player, split=other)  # one server, one split: the held-out one only when named
        with urllib.request.urlopen(f"{url}/schema", timeout=5) as r:
            assert b'"reply"' in r.read()  # the action schema names the reply field
    conversation, rewards, last = episode["conversation"], episode["rewards"], episode["last"]
    task, ref = reference_play(policy, group, split or "train", task_index)
    assert task.split == (split or "train")  # the default serves train; the held-out split only by name
    assert ref["success"] and last["success"]
    assert not last["invalid"]
    assert conversation == ref["conversation"]  # the same messages, turn by turn
    assert last["turn"] == ref["turns"] == len(rewards)
    assert rewards == [-1.0] * (len(rewards) - 1) + [0.0]  # the DAG's outcome reward: -1 a move, 0 the winning one
    assert episode["state"]["done"] and episode["state"]["task_index"] == task_index
    assert episode["state"]["split"] == (split or "train")


def test_a_reply_without_a_move_is_asked_again_then_ends_the_episode_invalid():
    from pipeline.envs import make_game

    with served("guess_my_city", "-S", "rollout_text.max_format_retries=1") as (url, _):
        episode = play_over_openenv(url, lambda conversation: "I think it is Paris", seed=7)
    last, rewards = episode["last"], episode["rewards"]
    assert last["invalid"] and not last["success"] and last["turn"] == 0
    assert "<Answer>" in episode["conversation"][3]["content"]  # the format rule, then one more chance
    # the retry costs nothing; the invalid end costs the whole turn budget (lost at the limit, as PAPRIKA scores it)
    assert rewards == [0.0, -float(make_game("guess_my_city").max_turns)]


@pytest.mark.parametrize(("args", "says"), [
    (["no_such_game"], "unknown game group 'no_such_game'"),
    (["twenty_questions@shown99"], "twenty_questions"),
    (["twenty_questions", "--split", "test"], "unknown split 'test'"),
    (["twenty_questions", "--split", "val", "-S", "games.val_fraction=0"], "val_fraction"),
])
def test_bad_input_is_one_line_exit_2(args, says):
    res = curio(["env", "serve", *args, "--port", str(free_port())], cwd=REPO, check=False, timeout=120)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], res.stderr


def test_a_busy_port_is_one_line_exit_2():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = curio(["env", "serve", "twenty_questions", "--port", str(port)], cwd=REPO, check=False, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [f"curio: 127.0.0.1:{port} is in use"]


def test_the_default_run_does_not_need_the_envs_extra():
    """Nothing the DAG imports pulls in openenv or textarena: the adapters are imported by `curio env serve` only."""
    code = ("import sys, pipeline.cli, pipeline.text.policies, pipeline.envs.protocols.session, "
            "pipeline.envs.protocols.trl_env, pipeline.tools.game_envs; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('openenv', 'textarena')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
