"""Where each policy lives and how to load it; which games a run plays.

Policies are addressed by name: ``base`` (bootstrap output, or ``policy.model`` when that names an HF model),
``sft`` and ``dpo`` (train-policy outputs) and ``rl`` (rl-text output); any other string is a path or model id.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import LLMConfig, Params
from pipeline.envs.base import Game, Split, Task, make_game
from pipeline.llm.base import ChatBackend
from pipeline.models.tiny import is_builtin


def policy_path(params: Params, name: str) -> str:
    paths = {
        "base": str(params.data_path("bootstrap", "model")) if is_builtin(params.policy.model) else params.policy.model,
        "sft": str(params.data_path("train_policy", "sft")),
        "dpo": str(params.data_path("train_policy", "dpo")),
        "rl": str(params.data_path("rl_text", "model")),
    }
    return paths.get(name, name)


def load_policy_backend(params: Params, name_or_path: str, batch_size: int | None = None) -> ChatBackend:
    """A chat backend serving the named policy (hf by default; vllm / openai when ``policy.backend`` says so)."""
    path = policy_path(params, name_or_path)
    if params.policy.backend == "scripted":
        from pipeline.scripted import ScriptedPolicy, parse_noise

        return ScriptedPolicy(make_games(params, list(dict.fromkeys(params.games.groups + eval_groups(params)))),
                              parse_noise(params.policy.model))
    if params.policy.backend == "hf":
        from pipeline.llm.hf import HFBackend

        if not Path(path).exists() and name_or_path in {"base", "sft", "dpo", "rl"} and is_builtin(params.policy.model):
            raise FileNotFoundError(f"policy {name_or_path!r} not found at {path}: run its stage first")
        return HFBackend(path, device=params.policy.device, batch_size=batch_size or params.rollout_text.batch_size)
    from pipeline.llm import make_backend

    cfg = LLMConfig(backend=params.policy.backend, model=path, batch_size=batch_size or 64)
    return make_backend(cfg, role="policy")


def eval_groups(params: Params) -> list[str]:
    """The task groups evaluation plays: ``games.eval_groups``, or the training groups when that is null."""
    return list(params.games.eval_groups or params.games.groups)


def make_games(params: Params, groups: list[str] | None = None) -> list[Game]:
    """The games of ``groups`` (default: the training groups, ``games.groups``); None as environment = the
    game's own program answers, else an LLM simulates it."""
    from pipeline.llm import make_environment

    env = make_environment(params.rollout_text.environment)
    return [make_game(g, environment=env) for g in (params.games.groups if groups is None else groups)]


def game_tasks(params: Params, game: Game, split: Split) -> list[Task]:
    tasks = game.tasks(split)
    cap = params.games.max_train_tasks if split == "train" else params.games.max_eval_tasks
    return tasks[:cap] if cap else tasks
