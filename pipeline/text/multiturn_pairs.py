"""CollabLLM-style per-turn preference pairs, scored with the multi-turn-aware reward (``multiturn_reward``).

Per task, a seeded sample of conversation prefixes of the rollouts (each ending where the agent is to move);
per prefix, several next turns sampled from the base policy; per candidate, a few continuations played on for a
window of agent turns (``pipeline.text.play.resume_episodes``), each scored
R = w_llm·mean(interactivity, information gain) + w_task·accuracy − min(w_cost·tokens, 1) and averaged.
Chosen = the best candidate, rejected = the worst; ties (within a margin) give no pair. The scores come from a
judge: rules ``exact`` computes them from the game's knowledge base (twenty questions, guess my city: accuracy =
the continuation found the secret; interactivity = mean binary entropy of each question's yes/no answer over the
secrets still possible among those the task shows; information gain = the share of the entropy removed by the
continuation); any chat
backend answers the ``multiturn_judge`` prompt (``pipeline/text/prompts/multiturn_judge.yaml``). A candidate
without a parseable ``<Answer>`` never reaches the environment: it gets R's floor, −1, below every playable turn.
The ``pairs-text`` stage (``strategy: multiturn``) runs :func:`multiturn_chunk` per chunk of tasks; rl-text
(``rl_text.reward: judge``) scores every utterance its policy plays the same way (:func:`utterance_rewards`).
"""

from __future__ import annotations

import functools
import json
import math
import random
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from pipeline.envs.base import Game, Task
from pipeline.envs.twenty_questions import knowledge_base
from pipeline.llm import make_backend, sampling_from_config
from pipeline.llm.base import ChatBackend, Conversation, Sampling
from pipeline.llm.cache import ask
from pipeline.llm.config import LLMConfig
from pipeline.llm.ledger import Ledger
from pipeline.llm.prompts import load_prompt, render
from pipeline.text.config import EXACT_GROUPS, JudgeRewardConfig, PairsTextConfig
from pipeline.text.multiturn_reward import (
    ACCURACY_SCORES,
    ConsistentCandidates,
    History,
    RewardWeights,
    TurnPreference,
    exact_information_gain,
    multiturn_aware_reward,
    prefer_turn,
)
from pipeline.text.play import PROMPT_MESSAGES, history_of, resume_episodes, task_from_row

_prompt = functools.partial(load_prompt, Path(__file__).parent / "prompts")

# -- the LLM judge of a continuation (prompts/multiturn_judge.yaml) ---------------------------------------------
_SCORE_TAGS = ("interactivity", "information_gain")


def _transcript(messages: Conversation, speakers: dict[str, str]) -> str:
    return "\n".join(f"{speakers.get(m['role'], m['role'])}: {m['content']}" for m in messages
                     if m["role"] != "system")


def multiturn_judge_messages(secret: str, category: str, context: Conversation, continuation: Conversation
                             ) -> Conversation:
    """The judge's conversation for one continuation: the game so far (``context``, its system and opening
    messages included or not) and the turns played from there (``continuation``)."""
    p = _prompt("multiturn_judge")
    speakers = p["speakers"]
    user = render(
        p["user"],
        secret=secret,
        category=category,
        context=_transcript(context, speakers) or p["empty_context"],
        continuation=_transcript(continuation, speakers),
    )
    return [{"role": "system", "content": render(p["system"])}, {"role": "user", "content": user}]


def parse_multiturn_scores(text: str) -> dict[str, float] | None:
    """``{"interactivity", "information_gain", "accuracy"}`` in [0, 1] from the answer's last tag of each kind;
    None when a tag is missing, a score is not a number in [0, 1], or the accuracy label is unknown."""
    scores: dict[str, float] = {}
    for tag in _SCORE_TAGS:
        found = re.findall(rf"<\s*{tag}\s*>\s*([-+0-9.eE]+)\s*<\s*/\s*{tag}\s*>", text, re.IGNORECASE)
        if not found:
            return None
        try:
            value = float(found[-1])
        except ValueError:
            return None
        if not 0.0 <= value <= 1.0:
            return None
        scores[tag] = value
    labels = re.findall(r"<\s*accuracy\s*>(.*?)<\s*/\s*accuracy\s*>", text, re.IGNORECASE | re.DOTALL)
    label = " ".join(re.findall(r"[a-z]+", labels[-1].lower())) if labels else ""
    if label not in ACCURACY_SCORES:
        return None
    scores["accuracy"] = ACCURACY_SCORES[label]
    return scores


# -- the pairs -------------------------------------------------------------------------------------------------
MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
MULTITURN_PAIR_SCHEMA = pa.schema([
    ("group", pa.string()),
    ("task_id", pa.string()),
    ("prompt", MESSAGES),
    ("chosen", MESSAGES),
    ("rejected", MESSAGES),
    ("state_turn", pa.int32()),  # agent turns already played in the prompt
    ("candidates", pa.int32()),  # distinct candidate turns compared
    ("chosen_reward", pa.float64()),
    ("rejected_reward", pa.float64()),
    ("mean_rewards", pa.list_(pa.float64())),  # every candidate's mean reward
])
#: Reward of a candidate turn without a parseable <Answer>: R's floor (all scores 0, the whole token cost), so
#: a format failure ranks below every playable turn whatever their continuations cost.
UNPARSEABLE_REWARD = -1.0


@dataclass(frozen=True)
class Scores:
    """One continuation's judged dimensions, each in [0, 1]."""

    accuracy: float
    interactivity: float
    information_gain: float


@dataclass
class Candidate:
    text: str
    tokens: int  # tokens the policy generated for this turn
    rewards: list[float]  # one per scored continuation


def knowledge_base_candidates(game: Game, task: Task) -> ConsistentCandidates:
    """Which secrets of ``task`` agree with a (question, reply) history, as the game's scripted player reasons: the
    knowledge base's secrets consistent with the replies among those the task shows (a ``@shownN`` tier lists N;
    untiered, every object of the category or every city), or every shown one when the replies rule them all out."""
    if type(game).name == "twenty_questions":
        kb = knowledge_base()

        def consistent(history: History) -> list[str]:
            return kb.consistent(task.agent, list(history))
    elif type(game).name == "guess_my_city":
        def consistent(history: History) -> list[str]:
            return game.candidates(list(history))  # type: ignore[attr-defined]
    else:
        raise ValueError(f"the rules 'exact' judge needs a knowledge base ({', '.join(EXACT_GROUPS)}), not "
                         f"{game.name}")
    shown = list(game.shown(task))  # type: ignore[attr-defined]
    listed = set(shown)
    return lambda history: [c for c in consistent(history) if c in listed] or shown


def split_quality(consistent: ConsistentCandidates, history: History, question: str) -> float:
    """How evenly ``question`` splits the secrets still possible after ``history``: the binary entropy (bits) of
    its yes/no answer under a uniform prior; 1 = an even split, 0 = a question whose answer is already known."""
    before = set(consistent(history))
    if not before:
        return 0.0
    p = len(set(consistent([*history, (question, "Yes")])) & before) / len(before)
    return 0.0 if p in (0.0, 1.0) else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def exact_scores(consistent: ConsistentCandidates, history: History, continuation: History,
                 accuracy: float) -> Scores:
    """The rules judge: ``history`` = (action, reply) turns before the candidate, ``continuation`` = the turns
    played from the candidate on (candidate first). Interactivity = mean split quality of those turns'
    questions; information gain = share of the entropy about the secret they removed."""
    history, continuation = list(history), list(continuation)
    splits = [split_quality(consistent, history + continuation[:i], q) for i, (q, _) in enumerate(continuation)]
    return Scores(
        accuracy=accuracy,
        interactivity=sum(splits) / len(splits) if splits else 0.0,
        information_gain=exact_information_gain(consistent, history, history + continuation),
    )


def candidate_reward(scores: Scores, tokens: int, weights: RewardWeights) -> float:
    return multiturn_aware_reward(scores.accuracy, scores.interactivity, scores.information_gain, tokens, weights)


class ContinuationJudge:
    """Scores continuations: rules ``exact`` (knowledge base) or a chat backend with the multiturn_judge prompt."""

    def __init__(self, cfg: LLMConfig, backend: ChatBackend | None = None) -> None:
        self.rules = cfg.backend == "rules"
        self.backend = backend
        if not self.rules and backend is None:
            self.backend = make_backend(cfg, role="judge")  # type: ignore[assignment]
        self.sampling = sampling_from_config(cfg)
        self.ledger: Ledger = getattr(self.backend, "ledger", None) or Ledger("judge")

    def score(self, items: list[tuple[Game, Task, list[dict], dict]]) -> list[Scores | None]:
        """One Scores (None = the judge's answer could not be read) per (game, task, prefix, continuation row)."""
        if self.rules:
            return [self._exact(*item) for item in items]
        asks = []
        for _, task, prefix, row in items:
            secret = task.env if isinstance(task.env, str) else json.dumps(task.env, sort_keys=True)
            asks.append(multiturn_judge_messages(secret, task.agent, prefix, row["conversation"][len(prefix):]))
        out: list[Scores | None] = []
        # Only answers that parse are cached as answers; the others are re-asked on a rerun (bounded).
        def parses(text: str) -> bool:
            return parse_multiturn_scores(text) is not None

        for g in ask(self.backend, asks, self.sampling, parses):  # type: ignore[arg-type]
            parsed = parse_multiturn_scores(g.text) if g.error is None else None
            if parsed is None:
                self.ledger.count_unknown()
            out.append(None if parsed is None else Scores(**parsed))
        return out

    @staticmethod
    def _exact(game: Game, task: Task, prefix: list[dict], row: dict) -> Scores:
        moves = history_of(row["conversation"], parse=game.parse_action)  # free answers too
        n = row["start_turns"]
        accuracy = 0.0
        if row["success"] and row["final_action"] is not None:
            try:
                accuracy = float(game.is_correct_guess(task, row["final_action"]))
            except NotImplementedError:
                accuracy = 1.0
        return exact_scores(knowledge_base_candidates(game, task), moves[:n], moves[n:], accuracy)

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()


def task_states(rows: list[dict], k: int, rng: random.Random) -> list[tuple[list[dict], int]]:
    """Up to ``k`` distinct conversation prefixes of one task's rollouts where the agent is to move, seeded.

    A prefix ends before an agent turn that was played (or, for a format-invalid episode, the turn that failed).
    Returns (prefix, agent turns in it), in the order the prefixes first appear.
    """
    seen: dict[str, tuple[list[dict], int]] = {}
    for r in sorted(rows, key=lambda r: r["sample"]):
        conv = r["conversation"]
        agent_turns = sum(m["role"] == "assistant" for m in conv[PROMPT_MESSAGES:])
        for turn in range(agent_turns + bool(r["invalid"])):
            prefix = conv[: PROMPT_MESSAGES + 2 * turn]
            seen.setdefault(json.dumps(prefix), (prefix, turn))
    states = list(seen.values())
    picked = sorted(rng.sample(range(len(states)), min(k, len(states))))
    return [states[i] for i in picked]


def choose_pair(candidates: Sequence[Candidate], min_margin: float) -> TurnPreference[Candidate] | None:
    """Chosen = the candidate with the best mean continuation reward, rejected = the worst; candidates with no
    scored continuation are left out. None on a tie (within ``min_margin``) or with fewer than two scored."""
    scored = [c for c in candidates if c.rewards]
    if len(scored) < 2:
        return None
    return prefer_turn(scored, [c.rewards for c in scored], min_margin)


def multiturn_chunk(
    policy: ChatBackend,
    judge: ContinuationJudge,
    tasks: list[tuple[Game, Task, list[dict]]],
    cfg: PairsTextConfig,
    sampling: Sampling,
    seed: int,
    max_format_retries: int,
    stats: dict[str, int] | None = None,
) -> list[dict]:
    """Per-turn pairs of some tasks, each given as (game, task, its annotated rollout rows)."""
    import torch

    stats = stats if stats is not None else defaultdict(int)
    rng = random.Random(seed)
    states = [(game, task, prefix, turn) for game, task, rows in tasks
              for prefix, turn in task_states(rows, cfg.states_per_task, rng)]
    stats["states"] += len(states)
    torch.manual_seed(seed)
    gens = policy.generate([prefix for _, _, prefix, _ in states for _ in range(cfg.num_candidates)], sampling)
    per_state: list[list[Candidate]] = []
    for i in range(len(states)):
        unique: dict[str, Candidate] = {}
        for g in gens[i * cfg.num_candidates : (i + 1) * cfg.num_candidates]:
            unique.setdefault(g.text, Candidate(g.text, g.tokens_out, []))
        per_state.append(list(unique.values()))
    compared = [(game, task, prefix, c) for (game, task, prefix, _), cands in zip(states, per_state, strict=True)
                if len(cands) >= 2 for c in cands]
    rewards = continuation_rewards(policy, judge, [(g, t, p, c.text, c.tokens) for g, t, p, c in compared], cfg,
                                   sampling, seed ^ 0x5EED, max_format_retries, stats)
    for (_, _, _, cand), got in zip(compared, rewards, strict=True):
        cand.rewards.extend(got)
    pairs = []
    for (_, task, prefix, turn), cands in zip(states, per_state, strict=True):
        pref = choose_pair(cands, cfg.min_margin)
        if pref is None:
            stats["states_without_pair"] += 1
            continue
        pairs.append({
            "group": task.group,
            "task_id": task.task_id,
            "prompt": prefix,
            "chosen": [{"role": "assistant", "content": pref.chosen.text}],
            "rejected": [{"role": "assistant", "content": pref.rejected.text}],
            "state_turn": turn,
            "candidates": len(pref.mean_rewards),
            "chosen_reward": pref.chosen_reward,
            "rejected_reward": pref.rejected_reward,
            "mean_rewards": list(pref.mean_rewards),
        })
    return pairs


def continuation_rewards(
    policy: ChatBackend,
    judge: ContinuationJudge,
    turns: list[tuple[Game, Task, list[dict], str, int]],
    cfg: PairsTextConfig | JudgeRewardConfig,
    sampling: Sampling,
    seed: int,
    max_format_retries: int,
    stats: dict[str, int] | None = None,
) -> list[list[float]]:
    """The multi-turn-aware reward R of each of ``cfg.num_samples`` continuations of each turn, given as (game,
    task, prefix, the turn's text, the tokens generated for it): the continuations are played by ``policy`` from
    the turn on (the environment's reply to it first, then ``cfg.window_size`` agent turns, seeded by ``seed``)
    and scored by ``judge``; a continuation the judge could not read has no R. A turn without a parseable
    ``<Answer>`` is not played: its only R is the floor, ``UNPARSEABLE_REWARD``."""
    stats = stats if stats is not None else defaultdict(int)
    out: list[list[float]] = [[] for _ in turns]
    starts, owners = [], []
    for j, (game, task, prefix, text, _) in enumerate(turns):
        if game.parse_action(text) is None:
            stats["unparseable_candidates"] += 1
            out[j].append(UNPARSEABLE_REWARD)
            continue
        for s in range(cfg.num_samples):
            starts.append((game, task, s, [*prefix, {"role": "assistant", "content": text}]))
            owners.append(j)
    rows = resume_episodes(policy, starts, sampling, seed=seed, max_format_retries=max_format_retries,
                           max_new_turns=cfg.window_size) if starts else []
    stats["continuations"] += len(rows)
    scores = judge.score([(turns[j][0], turns[j][1], turns[j][2], row) for j, row in zip(owners, rows,
                                                                                          strict=True)])
    for j, row, sc in zip(owners, rows, scores, strict=True):
        if sc is None:
            stats["unscored_continuations"] += 1
            continue
        out[j].append(candidate_reward(sc, turns[j][4] + row["tokens_out"], weights(cfg)))
    return out


def utterance_rewards(
    policy: ChatBackend,
    judge: ContinuationJudge,
    rows: list[dict],
    games: dict[str, Game],
    cfg: JudgeRewardConfig,
    sampling: Sampling,
    seed: int,
    max_format_retries: int,
    count_tokens: Callable[[str], int],
    stats: dict[str, int] | None = None,
) -> list[list[float]]:
    """Per played episode row (``pipeline.text.play`` rows; ``games`` by group), the reward of each of its agent
    utterances in order, as rl-text learns from it with ``rl_text.reward: judge``: the mean R over the
    utterance's scored continuations (:func:`continuation_rewards`; its tokens: ``count_tokens`` of its text),
    0.0 when the judge could read none of them."""
    turns, owners = [], []
    for j, row in enumerate(rows):
        game, task, conv = games[row["group"]], task_from_row(row), row["conversation"]
        for i in range(PROMPT_MESSAGES, len(conv)):
            if conv[i]["role"] == "assistant":
                turns.append((game, task, conv[:i], conv[i]["content"], count_tokens(conv[i]["content"])))
                owners.append(j)
    out: list[list[float]] = [[] for _ in rows]
    for j, got in zip(owners, continuation_rewards(policy, judge, turns, cfg, sampling, seed, max_format_retries,
                                                   stats), strict=True):
        out[j].append(sum(got) / len(got) if got else 0.0)
    return out


def weights(cfg: PairsTextConfig | JudgeRewardConfig) -> RewardWeights:
    w = cfg.reward_weights
    return RewardWeights(llm=w.llm, task=w.task, cost=w.cost)
