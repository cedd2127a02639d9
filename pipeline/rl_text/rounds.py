"""What rl-text's algorithms share (stages/rl_text.py runs them): the stage's name and params, each round's tasks.

Each round's tasks are a uniform sample of the train tasks (seeded by the round), or with
``rl_text.curriculum.enabled`` the picks of PAPRIKA's UCB curriculum updated by the learning potential of the
policy's own episodes of the rounds before (``pipeline.text.curriculum.OnlineCurriculum``, rebuilt from the
rounds' rows on disk: a resumed run picks what an uninterrupted one does).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.params import Params

if TYPE_CHECKING:
    from pipeline.envs.base import Game, Task
    from pipeline.text.curriculum import OnlineCurriculum

NAME = "rl-text"
#: The params rl-text reads (its STAGE declaration's): each algorithm keys its resumable state by their hash.
PARAMS = [
    "seed", "policy", "games.groups", "games.max_train_tasks", "games.val_fraction", "rollout_text", "rl_text",
    "train_policy.lora",  # filtered_bc's adapters with rl_text.lora
    "evaluate_text.temperature", "eval_seed",  # grpo's val rounds sample as evaluation does
]


def params_key(params: Params) -> str:
    """The hash of rl-text's params: what the algorithms' and the rewards' state on disk is keyed by."""
    return params.section_hash(PARAMS)


def online_curriculum(params: Params, jobs: list[tuple[Game, Task]],
                      rows_of: Callable[[int], list[dict]]) -> OnlineCurriculum | None:
    """The curriculum that picks each round's tasks (None: ``rl_text.curriculum.enabled`` is off); ``rows_of``
    gives a finished round's episode rows (``group``, ``task_id``, ``sample``, ``score``)."""
    from pipeline.core.artifacts import chunk_seed
    from pipeline.text.curriculum import OnlineCurriculum, task_key

    cfg = params.rl_text
    if not cfg.curriculum.enabled:
        return None
    by_group = cfg.curriculum.arms == "group_difficulty"
    arm_of = {task_key(g.name, t.task_id): f"{g.name}/{t.difficulty}" if by_group else t.difficulty for g, t in jobs}
    return OnlineCurriculum(arm_of, cfg.curriculum.alpha, cfg.tasks_per_round, cfg.trajectories_per_task,
                            rng_of=lambda i: random.Random(chunk_seed(params.seed, f"{NAME}/curriculum", i)),
                            rows_of=rows_of)


def round_episodes(params: Params, jobs: list[tuple[Game, Task]], r: int,
                   curriculum: OnlineCurriculum | None) -> list[tuple[str, int]]:
    """Round ``r``'s episodes as (task key, sample): the curriculum's picks, or a uniform sample of ``jobs``."""
    from pipeline.core.artifacts import chunk_seed
    from pipeline.text.curriculum import task_key

    if curriculum is not None:
        return curriculum.episodes(r)
    cfg = params.rl_text
    picked = random.Random(chunk_seed(params.seed, NAME, r)).sample(jobs, min(cfg.tasks_per_round, len(jobs)))
    return [(task_key(g.name, t.task_id), s) for g, t in picked for s in range(cfg.trajectories_per_task)]


def train_jobs(params: Params, games: list[Game]) -> list[tuple[Game, Task]]:
    """The train tasks the rounds draw from: ``rl_text.max_train_tasks`` per group (null: ``games.max_train_tasks``,
    the tasks rollout-text played)."""
    from pipeline.text.policies import game_tasks

    return [(g, t) for g in games for t in game_tasks(params, g, "train", cap=params.rl_text.max_train_tasks)]


def episode_jobs(jobs: list[tuple[Game, Task]], keys: list[tuple[str, int]]) -> list[tuple[Game, Task, int]]:
    from pipeline.text.curriculum import task_key

    task_of = {task_key(g.name, t.task_id): (g, t) for g, t in jobs}
    return [(*task_of[key], s) for key, s in keys]


def curriculum_metrics(params: Params, curriculum: OnlineCurriculum | None) -> dict[str, float]:
    """Pulls and mean learning potential per arm after the last round."""
    if curriculum is None:
        return {}
    c = curriculum.state_before(params.rl_text.rounds)
    out: dict[str, float] = {}
    for arm in c.arms:
        out[f"curriculum/{arm}/pulls"] = c.pulls[arm]
        out[f"curriculum/{arm}/mean_potential"] = c.mean_potential(arm)
    return out
