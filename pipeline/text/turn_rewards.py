"""rl-text's dense per-utterance rewards, one per value of ``rl_text.reward`` (:data:`TURN_REWARDS`).

- ``outcome``: none here, the game's reward, which each algorithm reads itself (:func:`outcome_rewards`);
- ``judge``: each utterance's CollabLLM-style multi-turn-aware reward
  (``pipeline.text.multiturn_pairs.utterance_rewards``): the mean R of ``judge_reward.num_samples`` continuations
  that the round's policy plays from the utterance on, scored by ``judge_reward.judge``;
- ``motif``: the utterance reward model of train-reward-text (Motif's Bradley-Terry model, distilled from the
  judge's pairwise preferences of annotate-utterances), normalised, thresholded and count-discounted
  (:func:`motif_rewards`);
- ``oni``: the judge labels the moves while rl-text plays, in ONI's annotator process
  (pipeline/text/oni_rewards.py);
- ``infogain``: each question's expected information gain over the secrets still consistent among those the task
  shows, from the game's knowledge base (:class:`InfogainTurnRewards`).

A reward is computed once per round, right after the round is played; the algorithms store it with the round's
episodes (``turn_rewards``), so a resumed round learns from the same numbers. Each takes the rl-text stage's
params (a :class:`~pipeline.core.config.ParamsSlice`) and the hash of them, which state it keeps on disk is keyed by.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from pipeline.core.config import ConfigError, ParamsSlice
from pipeline.text.oni_rewards import OniTurnRewards
from pipeline.text.play import PROMPT_MESSAGES

if TYPE_CHECKING:
    from pipeline.envs.base import Game
    from pipeline.llm.base import ChatBackend


class TurnRewards(Protocol):
    """The dense per-utterance reward of an ``rl_text.reward`` (all but ``outcome``): called once per played round."""

    def __call__(self, policy: ChatBackend, tokenizer, games: list[Game], rows: list[dict], seed: int,
                 round_index: int) -> list[list[float]]:
        """Per played row, the reward of each of its agent utterances in order."""
        ...

    def metrics(self) -> dict[str, float]:
        """What the stage reports of the rewards computed (this run's rounds)."""
        ...

    def close(self) -> None:
        """Release what the reward holds (a judge's server, an annotator process)."""
        ...


class JudgeTurnRewards:
    """Each utterance's multi-turn-aware reward: continuations played by the round's policy, judged."""

    def __init__(self, params: ParamsSlice) -> None:
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


class MotifTurnRewards:
    """train-reward-text's model: r = outcome_coef·r_outcome + intrinsic_coef·1[r̃ > ε]·r̃ / N^β (rl_text.motif).
    Under grpo the outcome term is left out: GRPO adds the game's outcome itself (``grpo.outcome_coef``), and it is
    counted once."""

    def __init__(self, params: ParamsSlice) -> None:
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
        self.outcome_coef = 0.0 if params.rl_text.algorithm == "grpo" else self.cfg.outcome_coef
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
            out.append([self.cfg.intrinsic_coef * a + self.outcome_coef * b
                        for a, b in zip(intrinsic, outcome, strict=True)])
        return out

    def metrics(self):
        if not self.scored:
            return {}
        above = sum(x > self.threshold for x in self.scored) if self.threshold is not None else len(self.scored)
        return {"rl/motif/mean_normalised": sum(self.scored) / len(self.scored),
                "rl/motif/above_threshold": above / len(self.scored)}

    def close(self):
        pass


class InfogainTurnRewards:
    """Each question's expected information gain: the entropy (bits) of its yes / no answer over the secrets still
    consistent with the replies before it among those the task shows (``knowledge_base_candidates``: the scripted
    player's set), read off the game's knowledge base (an even split: 1 bit; a question whose answer is already
    known: 0). The twenty-questions seed's reward, computed by a program."""

    def __init__(self, params: ParamsSlice) -> None:
        self.gains: list[float] = []

    def __call__(self, policy, tokenizer, games, rows, seed, round_index):
        from pipeline.text.multiturn_pairs import knowledge_base_candidates, split_quality
        from pipeline.text.play import history_of, task_from_row

        by_name = {g.name: g for g in games}
        out = []
        for row in rows:
            game = by_name[row["group"]]
            consistent = knowledge_base_candidates(game, task_from_row(row))
            moves = history_of(row["conversation"], parse=game.parse_action)
            gains = [split_quality(consistent, moves[:i], question) for i, (question, _) in enumerate(moves)]
            self.gains.extend(gains)
            out.append(gains)
        return out

    def metrics(self):
        return {"rl/infogain/mean_bits": sum(self.gains) / len(self.gains)} if self.gains else {}

    def close(self):
        pass


#: ``rl_text.reward`` → its implementation, built from the rl-text stage's params and their hash (``None``:
#: ``outcome``, the game's own reward). A value the params schema allows without an entry here fails the tests.
TURN_REWARDS: dict[str, Callable[[ParamsSlice, str], TurnRewards] | None] = {
    "outcome": None,
    "judge": lambda params, key: JudgeTurnRewards(params),
    "motif": lambda params, key: MotifTurnRewards(params),
    "oni": OniTurnRewards,
    "infogain": lambda params, key: InfogainTurnRewards(params),
}


def make_turn_rewards(params: ParamsSlice, key: str) -> TurnRewards | None:
    """The reward of ``rl_text.reward`` (None: ``outcome``); ``key``: the hash of the rl-text stage's params."""
    name = params.rl_text.reward
    if name not in TURN_REWARDS:
        raise ConfigError(f"rl_text.reward: no turn reward named {name!r}; known: {', '.join(TURN_REWARDS)}")
    factory = TURN_REWARDS[name]
    return factory(params, key) if factory is not None else None
