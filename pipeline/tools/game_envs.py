"""Curio's games for other trainers: ``curio env serve`` (an OpenEnv server) and :func:`trl_environment` (TRL's
``environment_factory``), both over the tasks the DAG plays.

A group's tasks are those of ``pipeline.text.policies.game_tasks``, with the params' caps and ``games.val_fraction``;
its prompts are the DAG's too (``policy.format_prompt``, ``policy.free_answers``). The held-out ``eval`` split is
served only when named, so a trainer cannot pick up Curio's evaluation tasks by accident. The protocol adapters are in
``pipeline/envs/protocols/``; the protocol packages are the ``envs`` extra (docs/serve-games.md).
"""

from __future__ import annotations

import errno
import socket
import sys
from collections.abc import Callable
from typing import Any

from pipeline.envs.base import Game, Task, game_class
from pipeline.tools import ToolError

SPLITS = ("train", "val", "eval")


def served_tasks(params: Any, group: str, split: str) -> tuple[Game, list[Task]]:
    """The game of ``group`` and the tasks of ``split`` the DAG plays (ToolError: an unknown group or tier, a split
    that is not there)."""
    from pipeline.text.policies import game_tasks, make_games  # the LLM layer (an LLM-hosted game's environment)

    if split not in SPLITS:
        raise ToolError(f"unknown split {split!r} ({', '.join(SPLITS)}; eval, the held-out tasks, only by name)")
    try:
        game_class(group)
    except KeyError:
        raise ToolError(f"unknown game group {group!r}") from None
    except ValueError as e:  # a tier the game cannot play
        raise ToolError(f"{group!r}: {e}") from None
    game = make_games(params, [group])[0]
    try:
        tasks = game_tasks(params.games, game, split)  # type: ignore[arg-type]
    except ValueError as e:  # val without games.val_fraction
        raise ToolError(f"{group} {split}: {e}") from None
    if not tasks:
        raise ToolError(f"{group} has no {split} tasks under these params")
    return game, tasks


def trl_environment(group: str, split: str = "train", params_file: str = "params.yaml",
                    overrides: list[str] | None = None) -> tuple[Callable[[], Any], Any]:
    """``(environment_factory, train_dataset)`` for TRL's ``GRPOTrainer``: a factory of
    :class:`pipeline.envs.protocols.trl_env.GameToolEnv` over ``group``'s ``split`` tasks, and a dataset with one
    row per task (an empty user prompt and the task's ``task_index``), so that the rollouts of one GRPO group play one
    task."""
    from datasets import Dataset

    from pipeline.envs.protocols.trl_env import GameToolEnv
    from pipeline.params import load_params

    game, tasks = served_tasks(load_params(params_file, overrides or []), group, split)
    rows = {"prompt": [[{"role": "user", "content": ""}] for _ in tasks], "task_index": list(range(len(tasks)))}
    return GameToolEnv.factory(game, tasks), Dataset.from_dict(rows)


def check_port(host: str, port: int) -> None:
    """ToolError when ``host:port`` cannot be listened on (taken, or not an address of this machine)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            why = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be listened on ({e.strerror})"
            raise ToolError(f"{host}:{port} {why}") from None


def serve(params: Any, group: str, split: str, host: str, port: int, max_sessions: int,
          echo: Callable[[str], None]) -> None:
    """Serve ``group``'s ``split`` tasks as an OpenEnv environment on ``host:port`` until SIGINT / SIGTERM."""
    check_port(host, port)
    game, tasks = served_tasks(params, group, split)
    try:
        import uvicorn

        from pipeline.envs.protocols.openenv_server import make_app  # openenv-core: the envs extra
    except ImportError as e:
        raise ToolError(f"curio env serve needs the envs extra ({e.name} is missing): pip install -e '.[envs]'"
                        ) from None
    app = make_app(game, tasks, split, params.rollout_text.max_format_retries, max_sessions)
    address = f"[{host}]" if ":" in host else host
    echo(f"curio env serve: {game.name}, {split} split ({len(tasks)} tasks) as an OpenEnv environment on "
         f"http://{address}:{port} (WebSocket sessions at /ws)")
    sys.stdout.flush()
    uvicorn.run(app, host=host, port=port, log_level="warning")
