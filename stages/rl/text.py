"""The rl-text stage: online RL of the text policy from the DPO policy, by ``rl_text.algorithm``.

- ``filtered_bc`` (stages/rl/filtered_bc.py): clone the best trajectories so far (ArCHer's Online Filtered BC);
- ``archer`` (stages/rl/archer.py): utterance-level double critic + token-level policy gradient;
- ``chai`` (stages/rl/chai.py): the same critic re-ranks k sampled utterances; the policy is not updated.

All three play ``rounds × tasks_per_round × trajectories_per_task`` train episodes, so their results compare at
equal environment samples. Output: ``data/rl_text/model`` (CHAI adds its critic there) and the
success-vs-episodes history ``metrics/plots/rl_rounds.json``.

Each round's tasks are a uniform sample of the train tasks (seeded by the round), or with
``rl_text.curriculum.enabled`` the picks of PAPRIKA's UCB curriculum updated by the learning potential of the
policy's own episodes of the rounds before (``pipeline.text.curriculum.OnlineCurriculum``, rebuilt from the
rounds' rows on disk: a resumed run picks what an uninterrupted one does). ``rl_text.reward`` picks what the
algorithms learn from: ``outcome``, the game's reward, or ``judge``, each utterance's CollabLLM-style
multi-turn-aware reward (``pipeline.text.multiturn_pairs.utterance_rewards``): the mean R of
``judge_reward.num_samples`` continuations that the round's policy plays from the utterance on, scored by
``judge_reward.judge``. It is computed once per round, right after the round is played, and stored with the
round's episodes, so a resumed round learns from the same numbers.
"""

from __future__ import annotations

import importlib
import random
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.core.stage import Out, Plot, Stage, StageContext, StageResult
from pipeline.params import Params
from pipeline.text.policies import policy_deps

if TYPE_CHECKING:
    from pipeline.envs.base import Game, Task
    from pipeline.llm.base import ChatBackend
    from pipeline.text.curriculum import OnlineCurriculum
    from pipeline.text.multiturn_pairs import ContinuationJudge

NAME = "rl-text"


def _needs(params: Params) -> list[str]:
    return policy_deps(params, "dpo", served=False)  # every algorithm starts from the DPO policy


STAGE = Stage(
    NAME,
    params=[
        "seed", "policy", "games.groups", "games.max_train_tasks", "games.val_fraction", "rollout_text", "rl_text",
        "train_policy.lora",  # filtered_bc's adapters with rl_text.lora
    ],
    code=[
        "stages/rl/filtered_bc.py", "stages/rl/archer.py", "stages/rl/chai.py", "pipeline/text/critic.py",
        "pipeline/text/play.py", "pipeline/text/policies.py", "pipeline/models/training.py", "pipeline/envs",
        "pipeline/text/curriculum.py", "pipeline/text/multiturn_pairs.py", "pipeline/text/multiturn_reward.py",
        "pipeline/text/prompts/multiturn_judge.yaml",
    ],
    data=["data/train_policy/sft", "data/train_policy/dpo"],
    needs=_needs,
    outs=[Out("data/rl_text", persist=True)],
    plots=[
        Plot("metrics/plots/rl_rounds.json",
             "rl-text, success over environment samples (algorithms compare at equal samples)", x="episodes",
             y="success_rate"),
    ],
    models=["rl_text/model"],
    notes={"pipeline/envs": "the games it plays"},
)
# What each algorithm writes under data/rl_text besides model/; another algorithm's leftovers are removed.
OUTPUT_DIRS = {"filtered_bc": {"rollouts", "rounds", "checkpoints"}, "archer": {"replay", "state", "episodes"},
               "chai": {"replay", "state", "episodes"}}


def run(params: Params, ctx: StageContext) -> StageResult:
    algorithm = params.rl_text.algorithm
    out = params.data_path("rl_text")
    for name in set().union(*OUTPUT_DIRS.values()) - OUTPUT_DIRS[algorithm]:
        shutil.rmtree(out / name, ignore_errors=True)
    return importlib.import_module(f"stages.rl.{algorithm}").run(params, ctx)


# -- what the three algorithms share: each round's tasks, the judge's reward ---------------------------------
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


def make_judge(params: Params) -> ContinuationJudge | None:
    """The judge of ``rl_text.reward: judge`` (None for ``outcome``)."""
    if params.rl_text.reward != "judge":
        return None
    from pipeline.text.multiturn_pairs import ContinuationJudge

    return ContinuationJudge(params.rl_text.judge_reward.judge)


def judge_rewards(params: Params, judge: ContinuationJudge, policy: ChatBackend, tokenizer, games: list[Game],
                  rows: list[dict], seed: int, stats: dict[str, int]) -> list[list[float]]:
    """Each row's per-utterance judge rewards, continuations played by ``policy`` (sampled as rollouts are)."""
    from pipeline.llm import sampling_from_config
    from pipeline.text.multiturn_pairs import utterance_rewards

    def count_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return utterance_rewards(policy, judge, rows, {g.name: g for g in games}, params.rl_text.judge_reward,
                             sampling_from_config(params.rollout_text), seed,
                             params.rollout_text.max_format_retries, count_tokens, stats)
