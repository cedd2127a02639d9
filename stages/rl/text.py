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
algorithms learn from (:func:`make_turn_rewards`):

- ``outcome``: the game's reward;
- ``judge``: each utterance's CollabLLM-style multi-turn-aware reward
  (``pipeline.text.multiturn_pairs.utterance_rewards``): the mean R of ``judge_reward.num_samples`` continuations
  that the round's policy plays from the utterance on, scored by ``judge_reward.judge``;
- ``motif``: the utterance reward model of train-reward-text (Motif's Bradley-Terry model, distilled from the
  judge's pairwise preferences of annotate-utterances), normalised, thresholded and count-discounted
  (:func:`motif_rewards`);
- ``oni``: the judge labels the moves while rl-text plays, in ONI's annotator process (the NetHack track's,
  ``pipeline.llm.online_annotation``); a move's reward is its label, or for an unlabelled one the
  classification reward of the model refit between rounds (stages/rl/oni_text.py, ``rl_text.oni``).

Dense rewards are computed once per round, right after the round is played, and stored with the round's
episodes (``turn_rewards``), so a resumed round learns from the same numbers.
"""

from __future__ import annotations

import importlib
import random
import shutil
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.core.stage import Out, Plot, Stage, StageContext, StageResult
from pipeline.params import Params
from pipeline.text.play import PROMPT_MESSAGES
from pipeline.text.policies import policy_deps

if TYPE_CHECKING:
    from pipeline.envs.base import Game, Task
    from pipeline.llm.base import ChatBackend
    from pipeline.text.curriculum import OnlineCurriculum

NAME = "rl-text"


def _needs(params: Params) -> list[str]:
    reward_model = ["data/reward_model_text"] if params.rl_text.reward == "motif" else []
    return policy_deps(params, "dpo", served=False) + reward_model  # every algorithm starts from the DPO policy


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
        "pipeline/text/prompts/multiturn_judge.yaml", "pipeline/models/reward_net.py",
        "pipeline/text/utterance_prefs.py", "stages/rl/oni_text.py", "pipeline/text/oni.py",
        "pipeline/text/prompts/oni_label.yaml", "pipeline/llm/online_annotation.py",
    ],
    data=["data/train_policy/sft", "data/train_policy/dpo", "data/reward_model_text"],
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
    if params.rl_text.reward != "oni":
        shutil.rmtree(out / "oni", ignore_errors=True)  # the ONI annotator's state (stages/rl/oni_text.py)
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


class TurnRewards:
    """The dense per-utterance reward of ``rl_text.reward`` (all but ``outcome``): called once per played round."""

    def __call__(self, policy: ChatBackend, tokenizer, games: list[Game], rows: list[dict], seed: int,
                 round_index: int) -> list[list[float]]:
        """Per played row, the reward of each of its agent utterances in order."""
        raise NotImplementedError

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


def make_turn_rewards(params: Params) -> TurnRewards | None:
    """The reward of ``rl_text.reward`` (None: ``outcome``, the game's own, which each algorithm reads itself)."""
    reward = params.rl_text.reward
    if reward == "judge":
        return JudgeTurnRewards(params)
    if reward == "motif":
        return MotifTurnRewards(params)
    if reward == "oni":  # imported by name, as the algorithms: stages/rl/oni_text.py builds on this module
        return importlib.import_module("stages.rl.oni_text").OniTurnRewards(params)
    return None


class JudgeTurnRewards(TurnRewards):
    """Each utterance's multi-turn-aware reward: continuations played by the round's policy, judged."""

    def __init__(self, params: Params) -> None:
        from pipeline.text.multiturn_pairs import ContinuationJudge

        self.params = params
        self.judge = ContinuationJudge(params.rl_text.judge_reward.judge)
        self.stats: dict[str, int] = defaultdict(int)

    def __call__(self, policy, tokenizer, games, rows, seed, round_index):
        from pipeline.llm import sampling_from_config
        from pipeline.text.multiturn_pairs import utterance_rewards

        def count_tokens(text: str) -> int:
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

        params = self.params
        return utterance_rewards(policy, self.judge, rows, {g.name: g for g in games}, params.rl_text.judge_reward,
                                 sampling_from_config(params.rollout_text), seed,
                                 params.rollout_text.max_format_retries, count_tokens, self.stats)

    def metrics(self):
        return {f"rl/judge_computed/{k}": v for k, v in sorted(self.stats.items())}  # this run's rounds

    def close(self):
        self.judge.close()


def outcome_rewards(row: dict, score_by_turns: bool) -> list[float]:
    """The game's reward of each agent utterance of a played row: games scored by turns pay −1 per turn and 0 on
    the winning one; games scored by reward pay the episode's reward on the last turn."""
    n = sum(m["role"] == "assistant" for m in row["conversation"][PROMPT_MESSAGES:])
    if score_by_turns:
        return [0.0 if k == n - 1 and row["success"] else -1.0 for k in range(n)]
    return [float(row["reward"]) if k == n - 1 else 0.0 for k in range(n)]


def motif_rewards(normalised: list[float], moves: list[str], threshold: float | None, count_exponent: float
                  ) -> list[float]:
    """Motif's intrinsic reward of one episode's utterances: r_int = 1[r̃ > ε]·r̃ / N^β, with r̃ the normalised
    reward-model output, ε the threshold (None: none) and N the count of the same move in the episode so far
    (this one included)."""
    seen: dict[str, int] = defaultdict(int)
    out = []
    for r, move in zip(normalised, moves, strict=True):
        seen[move.strip()] += 1
        kept = r if threshold is None or r > threshold else 0.0
        out.append(kept / seen[move.strip()] ** count_exponent)
    return out


class MotifTurnRewards(TurnRewards):
    """train-reward-text's model: r = outcome_coef·r_outcome + intrinsic_coef·1[r̃ > ε]·r̃ / N^β (rl_text.motif)."""

    def __init__(self, params: Params) -> None:
        import json

        from pipeline.core.errors import InputError
        from pipeline.core.stage import IDLE
        from pipeline.models.reward_net import STATS, load_reward_model

        path = params.data_path("reward_model_text")
        if (path / IDLE).exists() or not (path / STATS).exists():
            raise InputError(f"rl_text.reward: motif needs the utterance reward model at {path}, which holds none "
                             "(written for another rl_text.reward): run annotate-utterances and train-reward-text "
                             "with rl_text.reward=motif first")
        self.cfg = params.rl_text.motif
        self.model, self.stats = load_reward_model(path)
        self.context_messages = json.loads((path / STATS).read_text())["context_messages"]
        self.threshold = self.stats.threshold(self.cfg.threshold_quantile)
        self.scored: list[float] = []

    def __call__(self, policy, tokenizer, games, rows, seed, round_index):
        import numpy as np

        from pipeline.text.utterance_prefs import assistant_indices, utterance_text

        by_turns = {g.name: g.score_by_turns for g in games}
        moves_of = [assistant_indices(row["conversation"]) for row in rows]
        texts = [utterance_text(row["conversation"], i, self.context_messages)
                 for row, moves in zip(rows, moves_of, strict=True) for i in moves]
        normalised = np.asarray(self.stats.normalize(self.model.score(texts)), dtype=float).tolist()
        self.scored.extend(normalised)
        out, start = [], 0
        for row, indices in zip(rows, moves_of, strict=True):
            mine, start = normalised[start:start + len(indices)], start + len(indices)
            moves = [row["conversation"][i]["content"] for i in indices]
            intrinsic = motif_rewards(mine, moves, self.threshold, self.cfg.count_exponent)
            outcome = outcome_rewards(row, by_turns[row["group"]])
            out.append([self.cfg.intrinsic_coef * a + self.cfg.outcome_coef * b
                        for a, b in zip(intrinsic, outcome, strict=True)])
        return out

    def metrics(self):
        if not self.scored:
            return {}
        above = sum(x > self.threshold for x in self.scored) if self.threshold is not None else len(self.scored)
        return {"rl/motif/mean_normalised": sum(self.scored) / len(self.scored),
                "rl/motif/above_threshold": above / len(self.scored)}
