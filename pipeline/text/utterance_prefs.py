"""Motif for the text agent: which of two utterances of the same task is the better move, and the text the
utterance reward model reads.

- **Pairs** (:func:`utterance_pairs`): two plays of one task, the agent's move at the same turn in each (so both
  moves face a game at the same depth), a seeded sample of all such pairs.
- **Judges** (:class:`UtterancePreferenceJudge`): rules ``exact`` prefers the move with the larger one-turn
  multi-turn-aware reward computed from the game's knowledge base (interactivity = how evenly its question
  splits the secrets still possible, information gain = the share of the entropy it removed, accuracy = it
  named the secret; ``pipeline.text.multiturn_pairs.exact_scores``), a tie when equal; any chat backend answers
  the Motif-style ``prompts/utterance_preference.yaml`` through ``pipeline.llm.pairwise.ask_pairwise`` (parse
  ``("best_move": 1|2|None)``, one retry prompt, the response cache, UNKNOWN when still unparseable). Moves the
  reward model cannot tell apart (the same text) are a TIE without a call, as Motif's identical captions.
- **Reward-model text** (:func:`utterance_text`): the move first, then the turns before it, newest first, so a
  byte limit cuts the oldest context, never the move.
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from pipeline.envs.base import Game, Task
from pipeline.llm import make_backend, sampling_from_config
from pipeline.llm.base import ChatBackend, Conversation, Sampling
from pipeline.llm.config import LLMConfig
from pipeline.llm.ledger import Ledger
from pipeline.llm.pairwise import Annotation, ask_pairwise
from pipeline.llm.prompts import load_prompt, render
from pipeline.text.multiturn_pairs import UNPARSEABLE_REWARD, exact_scores, knowledge_base_candidates
from pipeline.text.multiturn_reward import multiturn_aware_reward
from pipeline.text.play import PROMPT_MESSAGES, history_of, task_from_row

_prompt = functools.partial(load_prompt, Path(__file__).parent / "prompts")
_PREFERENCE_RE = re.compile(r"best[ _]move[\"']?\s*[:=]\s*[\"']?\s*(1|2|none)\b", re.IGNORECASE)
_LABELS = {"1": "FIRST", "2": "SECOND", "none": "TIE"}
#: Motif's sampling of the annotator: temperature 0.1, top-p 0.95; the seed makes an answer cacheable.
PREFERENCE_SAMPLING = Sampling(temperature=0.1, top_p=0.95, max_tokens=512, seed=0)
TIE_MARGIN = 1e-9
#: y of a label, as the Bradley-Terry loss reads it (UNKNOWN has none: left out)
Y_OF = {"FIRST": 0.0, "SECOND": 1.0, "TIE": 0.5}


def assistant_indices(conversation: list[dict]) -> list[int]:
    return [i for i in range(PROMPT_MESSAGES, len(conversation)) if conversation[i]["role"] == "assistant"]


def utterance_text(conversation: list[dict], index: int, context_messages: int) -> str:
    """What the reward model reads for the agent message at ``index``: the message, then up to
    ``context_messages`` messages before it (not the game's opening ones), newest first."""
    before = conversation[max(PROMPT_MESSAGES, index - context_messages):index]
    lines = [conversation[index]["content"].strip()]
    lines += [f"<{m['role']}> {m['content'].strip()}" for m in reversed(before)]
    return "\n".join(lines)


@dataclass(frozen=True)
class UtterancePair:
    group: str
    task_id: str
    turn: int  # agent turn, from 0
    rows: tuple[dict, dict]  # the two plays (episode rows)
    indices: tuple[int, int]  # the move's message index in each conversation


def utterance_pairs(rows: list[dict], num_pairs: int, rng: random.Random) -> list[UtterancePair]:
    """A seeded sample of ``num_pairs`` pairs of moves (all of them, if fewer): the same task and agent turn in
    two different plays. Format-invalid moves (the last message of an invalid play) are left out."""
    by_task: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        by_task[(r["group"], r["task_id"])].append(r)
    candidates: list[UtterancePair] = []
    for (group, task_id), plays in sorted(by_task.items()):
        plays = sorted(plays, key=lambda r: r["sample"])
        moves = [playable_moves(r) for r in plays]
        for a in range(len(plays)):
            for b in range(a + 1, len(plays)):
                for t in range(min(len(moves[a]), len(moves[b]))):
                    candidates.append(UtterancePair(group, task_id, t, (plays[a], plays[b]),
                                                    (moves[a][t], moves[b][t])))
    if len(candidates) <= num_pairs:
        return candidates
    return [candidates[i] for i in sorted(rng.sample(range(len(candidates)), num_pairs))]


def playable_moves(row: dict) -> list[int]:
    """Indices of the agent messages the game played (an invalid play's unparseable last message is not)."""
    moves = assistant_indices(row["conversation"])
    return moves[:-1] if row["invalid"] and moves else moves


def exact_move_reward(game: Game, task: Task, conversation: list[dict], index: int) -> float:
    """R of one move from the knowledge base, as the rules judge of continuations scores a one-turn window:
    mean(interactivity, information gain) + accuracy (no token cost). A move without a parseable answer gets
    R's floor."""
    if game.parse_action(conversation[index]["content"]) is None:
        return UNPARSEABLE_REWARD
    moves = history_of(conversation[: index + 2], parse=game.parse_action)
    action = moves[-1][0]
    try:
        accuracy = float(game.is_correct_guess(task, action))
    except NotImplementedError:
        accuracy = 0.0
    scores = exact_scores(knowledge_base_candidates(game, task), moves[:-1], moves[-1:], accuracy)
    return multiturn_aware_reward(scores.accuracy, scores.interactivity, scores.information_gain, 0)


def preference_messages(pair: UtterancePair) -> Conversation:
    """The Motif-style question for one pair (the two moments as the agent saw them, the secret)."""
    p = _prompt("utterance_preference")
    row = pair.rows[0]
    conv = row["conversation"]

    def context(c: list[dict], i: int) -> str:
        turns = [f"{'Agent' if m['role'] == 'assistant' else 'Environment'}: {m['content'].strip()}"
                 for m in c[PROMPT_MESSAGES:i]]
        return "\n".join(turns) if turns else p["no_turns"]

    secret = row["secret"] if isinstance(row["secret"], str) else json.dumps(row["secret"])
    (c1, c2), (i1, i2) = (pair.rows[0]["conversation"], pair.rows[1]["conversation"]), pair.indices
    user = render(p["user"], game_text=conv[0]["content"].strip(), secret=secret, category=row["category"],
                  context_1=context(c1, i1), move_1=c1[i1]["content"].strip(),
                  context_2=context(c2, i2), move_2=c2[i2]["content"].strip())
    return [{"role": "system", "content": render(p["system"])}, {"role": "user", "content": user}]


def parse_preference(text: str) -> str:
    """FIRST / SECOND / TIE from the last ``("best_move": 1|2|None)`` of the answer, else UNKNOWN."""
    found = _PREFERENCE_RE.findall(text)
    return _LABELS[found[-1].lower()] if found else "UNKNOWN"


RETRY_PROMPT: str = _prompt("utterance_preference")["retry"].strip()


class UtterancePreferenceJudge:
    """Prefers one of two moves: rules ``exact`` (knowledge base) or a chat backend (the Motif-style prompt)."""

    def __init__(self, cfg: LLMConfig, games: dict[str, Game], context_messages: int,
                 backend: ChatBackend | None = None) -> None:
        self.rules = cfg.backend == "rules"
        self.games = games
        self.context_messages = context_messages
        self.backend = backend
        if not self.rules and backend is None:
            self.backend = make_backend(cfg, role="judge")  # type: ignore[assignment]
        self.sampling = PREFERENCE_SAMPLING if self.rules else sampling_from_config(cfg)
        self.ledger: Ledger = getattr(self.backend, "ledger", None) or Ledger("judge")

    def texts(self, pair: UtterancePair) -> tuple[str, str]:
        return tuple(utterance_text(r["conversation"], i, self.context_messages)  # type: ignore[return-value]
                     for r, i in zip(pair.rows, pair.indices, strict=True))

    def judge(self, pairs: list[UtterancePair]) -> list[Annotation]:
        out: list[Annotation | None] = [None] * len(pairs)
        asked = []
        for k, pair in enumerate(pairs):
            first, second = self.texts(pair)
            if first == second:
                out[k] = Annotation("TIE", "")
            elif self.rules:
                out[k] = self._exact(pair)
            else:
                asked.append(k)
        if asked:
            got = ask_pairwise(self.backend, [preference_messages(pairs[k]) for k in asked],  # type: ignore[arg-type]
                               parse_preference, RETRY_PROMPT, self.sampling)
            for k, annotation in zip(asked, got, strict=True):
                out[k] = annotation
        return [a for a in out if a is not None]

    def _exact(self, pair: UtterancePair) -> Annotation:
        game = self.games[pair.group]
        task = task_from_row(pair.rows[0])
        r1, r2 = (exact_move_reward(game, task, row["conversation"], i)
                  for row, i in zip(pair.rows, pair.indices, strict=True))
        label = "TIE" if abs(r1 - r2) <= TIE_MARGIN else ("FIRST" if r1 > r2 else "SECOND")
        return Annotation(label, f"R 1={r1:.4f} 2={r2:.4f}")

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
