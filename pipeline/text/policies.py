"""Where each policy lives and how to load it; which games a run plays.

Policies are addressed by name: ``base`` (bootstrap output, or ``policy.model`` when that names an HF model),
``sft`` and ``dpo`` (train-sft / train-dpo outputs) and ``rl`` (rl-text output); any other string is a path or model id.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Literal

from pipeline.core.config import ParamsSlice
from pipeline.core.errors import InputError
from pipeline.envs.base import Game, Split, Task, format_note, make_game
from pipeline.llm import make_backend, make_environment
from pipeline.llm.base import ChatBackend
from pipeline.llm.config import LLMConfig
from pipeline.models.gguf import resolve_model
from pipeline.models.tiny import is_builtin
from pipeline.text.config import GamesConfig, PolicyConfig, parse_noise
from pipeline.text.scripted import ScriptedPolicy


def policy_path(params: ParamsSlice, name: str) -> str:
    paths = {
        "base": (str(params.data_path("bootstrap", "model")) if is_builtin(params.policy.model)
                 else resolve_model(params.policy.model)),
        "sft": str(params.data_path("train_policy", "sft")),
        "dpo": str(params.data_path("train_policy", "dpo")),
        "rl": str(params.data_path("rl_text", "model")),
    }
    return paths.get(name, name)


#: The stage that writes each named policy (the built-in base: bootstrap; a real ``policy.model`` base is the
#: model itself).
POLICY_STAGES = {"base": "bootstrap", "sft": "train-sft", "dpo": "train-dpo", "rl": "rl-text"}
#: The dvc.yaml data dep holding each named policy a stage writes.
POLICY_DEPS = {"base": "data/bootstrap", "sft": "data/train_policy/sft", "dpo": "data/train_policy/dpo",
               "rl": "data/rl_text"}


def policy_deps(policy: PolicyConfig, *names: str, served: bool = True) -> list[str]:
    """The data deps holding the named policies (a stage's ``needs``, :class:`pipeline.core.stage.Stage`), from the
    ``policy`` params section: the base policy only when it is the built-in model (a real ``policy.model`` is the
    model itself), and, for a policy ``served`` by its backend (not trained from), none for the scripted backend,
    which loads no weights."""
    if served and policy.backend == "scripted":
        return []
    return [POLICY_DEPS[n] for n in names if n in POLICY_DEPS and (n != "base" or is_builtin(policy.model))]


def require_policy(params: ParamsSlice, name: str) -> str:
    """``policy_path``, checked: a named policy its stage has not written yet is an InputError (exit 2) naming that
    stage, for the built-in model and a real ``policy.model`` alike (not a loader's traceback half-way)."""
    path = policy_path(params, name)
    written_by_stage = name in ("sft", "dpo", "rl") or (name == "base" and is_builtin(params.policy.model))
    if written_by_stage and not Path(path).exists():
        raise InputError(f"policy {name!r} not found at {path}: run {POLICY_STAGES[name]} first")
    return path


def load_policy_backend(params: ParamsSlice, name_or_path: str, batch_size: int | None = None,
                        groups: list[str] | None = None) -> ChatBackend:
    """A chat backend serving the named policy (hf by default; vllm / openai when ``policy.backend`` says so).
    ``groups``: the task groups it will play (default the training groups; the scripted policy needs them)."""
    path = policy_path(params, name_or_path)
    if params.policy.backend == "scripted":
        return ScriptedPolicy(make_games(params, groups), parse_noise(params.policy.model))
    if params.policy.backend == "hf":
        from pipeline.llm.hf import HFBackend  # torch and transformers: only for an hf policy

        require_policy(params, name_or_path)
        backend = HFBackend(path, device=params.policy.device,
                            batch_size=batch_size or params.rollout_text.batch_size,
                            drop_finished=params.policy.drop_finished, dtype=params.policy.dtype,
                            cpu_linear=params.policy.cpu_linear, kv_cache_bytes=int(params.policy.kv_cache_gib * 2**30))
        from pipeline.text.critic import is_chai_model, load_reranked  # torch, as above

        return load_reranked(backend, path, params.policy.device) if is_chai_model(path) else backend
    require_policy(params, name_or_path)
    # vllm: a server of this policy's weights for the stage, as many requests in flight as hf would batch, and
    # the policy's own dtype (float32 by default: the distribution hf plays)
    batch = batch_size or params.rollout_text.batch_size
    cfg = LLMConfig(backend=params.policy.backend, model=path, batch_size=batch, max_concurrency=batch,
                    max_tokens=8192, timeout_s=900.0, device=params.policy.device, dtype=params.policy.dtype)
    return make_backend(cfg, role="policy")


def eval_groups(games: GamesConfig) -> list[str]:
    """The task groups evaluation plays: ``games.eval_groups``, or the training groups when that is null."""
    return list(games.eval_groups or games.groups)


def make_games(params: ParamsSlice, groups: list[str] | None = None) -> list[Game]:
    """The games of ``groups`` (default: the training groups, ``games.groups``); None as environment = the
    game's own program answers, else an LLM simulates it. Their system prompts teach the answer format as
    ``policy.format_prompt`` says (an example exchange is played on the game's first train task)."""
    env = make_environment(params.rollout_text.environment)
    games = [make_game(g, environment=env) for g in (params.games.groups if groups is None else groups)]
    for game in games:
        game.free_answers = params.policy.free_answers
        if params.policy.format_prompt != "game":
            first = game_tasks(params.games, game, "train")[0]
            game.format_note = format_note(game, params.policy.format_prompt, first)
    return games


def game_tasks(games: GamesConfig, game: Game, split: Split | Literal["val"], cap: int | None = None) -> list[Task]:
    """Tasks of ``split``, as the ``games`` params section says: ``eval`` is the game's held-out split; ``val`` is
    ``games.val_fraction`` of its train tasks, carved out of ``train`` (the same ones every run), for choosing
    hyperparameters without the held-out split. Caps: ``max_train_tasks`` on train, ``max_eval_tasks`` on val and
    eval; ``cap`` instead when given (0 = none)."""
    tasks = game.tasks("eval" if split == "eval" else "train")
    if split != "eval" and games.val_fraction > 0:
        order = list(range(len(tasks)))
        random.Random(f"val-split/{game.name}").shuffle(order)
        val = set(order[: max(1, round(games.val_fraction * len(tasks)))])
        tasks = [t for i, t in enumerate(tasks) if (i in val) == (split == "val")]
    elif split == "val":
        raise ValueError("split 'val' needs games.val_fraction > 0")
    if cap is None:
        cap = games.max_train_tasks if split == "train" else games.max_eval_tasks
    return tasks[:cap] if cap else tasks
