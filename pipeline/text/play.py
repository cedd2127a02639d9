"""Play many text-game episodes at once with a chat policy: generation batched across episodes.

Used by rollout, online RL and evaluation alike, so every stage plays by the same rules: the action is the
text inside ``<Answer>…</Answer>``; an unparseable turn is re-sampled up to ``max_format_retries`` times and
then the episode ends as invalid; the environment replies; the episode ends on success or at the turn limit.
``resume_episodes`` plays on from given conversation prefixes (forward simulation for per-turn rewards).
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from pipeline.envs.base import Game, Task, extract_answer
from pipeline.llm.base import ChatBackend, Sampling
from pipeline.models.chat import continue_prompt, encode_prompt

PROMPT_MESSAGES = 2  # a game's conversation opens with a system and a user message; the agent's turns follow
#: What token-in / token-out play keeps of every reply the policy sampled, in play order (``play_episodes(...,
#: token_ids=True)``): the conversation's length when it was asked for (its state: the messages before it), the
#: prompt ids the policy was given, the ids it sampled, the sampler's log-prob of each (after temperature, top-k,
#: top-p and min-p), and whether it parsed as a move (a reply that did not is re-sampled and never reaches the game).
REPLY_FIELDS = [
    pa.field("reply_context", pa.list_(pa.int32())),
    pa.field("reply_prompt_ids", pa.list_(pa.list_(pa.int32()))),
    pa.field("reply_token_ids", pa.list_(pa.list_(pa.int32()))),
    pa.field("reply_logprobs", pa.list_(pa.list_(pa.float32()))),
    pa.field("reply_parsed", pa.list_(pa.bool_())),
]
EPISODE_SCHEMA = pa.schema(
    [
        ("group", pa.string()),
        ("task_id", pa.string()),
        ("secret", pa.string()),  # JSON of Task.env
        ("category", pa.string()),
        ("difficulty", pa.string()),
        ("split", pa.string()),
        ("sample", pa.int32()),
        ("conversation", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("final_action", pa.string()),
        ("success", pa.bool_()),
        ("invalid", pa.bool_()),
        ("turns", pa.int32()),
        ("score", pa.float64()),
        ("reward", pa.float64()),
        ("format_retries", pa.int32()),
        ("seed", pa.int64()),
        ("policy", pa.string()),
    ]
)


@dataclass
class Episode:
    game: Game
    task: Task
    sample: int
    state: Any
    conversation: list[dict]
    turns: int = 0
    done: bool = False
    success: bool = False
    invalid: bool = False
    reward: float = 0.0
    retries_this_turn: int = 0
    format_retries: int = 0
    final_action: str | None = None
    actions: list[str] = field(default_factory=list)
    tokens_out: int = 0  # tokens the policy generated in this episode, format retries included
    stop_at: int | None = None  # stop playing (without ending the game) once ``turns`` reaches this
    prompt_ids: list[int] | None = None  # token in, token out: the ids of the next turn's prompt
    replies: list[dict] = field(default_factory=list)  # token in, token out: every sampled reply (REPLY_FIELDS)

    def score(self) -> float:
        """PAPRIKA's score: turns used (failures count as the turn limit); reward tasks: minus total reward."""
        if not self.game.score_by_turns:
            return -self.reward
        return float(self.turns if self.success else self.game.max_turns)


def seed_torch(seed: int) -> None:
    """Seed torch's generator, imported here: stages that only read played rows (pairs-text, report) then start
    without importing torch (~2 s a process)."""
    import torch

    torch.manual_seed(seed)


def play_episodes(
    policy: ChatBackend,
    jobs: list[tuple[Game, Task, int]],
    sampling: Sampling,
    seed: int,
    max_format_retries: int = 3,
    policy_name: str = "",
    on_turn: Callable[[int], None] | None = None,
    token_ids: bool = False,
) -> list[dict]:
    """Play ``(game, task, sample_index)`` jobs to the end; returns one row per episode (EPISODE_SCHEMA).

    ``token_ids``: token in, token out (:class:`TokenPrompts`): each turn's prompt is the ids of the one before, the
    ids sampled after it and what the chat template adds (never a reply's text tokenized again), and the rows get
    REPLY_FIELDS; the backend plays from ids (``prompt_ids``) and returns its sampled ids and log-probs.

    Deterministic given ``seed`` and the job list (torch and Python RNGs are seeded here).
    """
    seed_torch(seed)
    rng = random.Random(seed)
    episodes = [
        Episode(game=g, task=t, sample=s, state=g.reset(t, rng), conversation=g.conversation_start(t))
        for g, t, s in jobs
    ]
    tokens = None
    if token_ids:
        tokens = TokenPrompts(policy, sampling.max_tokens)
        sampling = replace(sampling, logprobs=True)
        for e in episodes:
            e.prompt_ids = tokens.first(e.conversation)
    _play(policy, episodes, sampling, max_format_retries, on_turn, tokens)
    release(episodes)
    rows = [episode_row(e, seed, policy_name) for e in episodes]
    if token_ids:
        for row, e in zip(rows, episodes, strict=True):
            row.update({f.name: [r[f.name] for r in e.replies] for f in REPLY_FIELDS})
    return rows


class TokenPrompts:
    """Token-in / token-out prompts for a policy that plays from ids (``policy.tokenizer``): the first turn's is the
    chat template's rendering of the opening messages; each later one continues the ids played
    (``pipeline.models.chat.continue_prompt``). A prompt that would leave fewer than ``max_new_tokens`` of the
    model's context, or a template that does not render the conversation so far as a prefix, is rendered from the
    text again (oldest turns dropped): the rows show it (its prompt no longer extends the one before)."""

    def __init__(self, policy: ChatBackend, max_new_tokens: int) -> None:
        self.tokenizer = getattr(policy, "tokenizer", None)
        if self.tokenizer is None:
            raise ValueError(f"play: the {getattr(policy, 'name', 'policy')} backend has no tokenizer: it cannot "
                             "play from token ids")
        self.max_positions = getattr(policy, "max_positions", 0) or 0
        self.max_new = max_new_tokens

    def first(self, conversation: list[dict]) -> list[int]:
        return encode_prompt(self.tokenizer, conversation, self.max_positions, self.max_new)

    def after(self, conversation: list[dict], reply_at: int, prompt: list[int], sampled: list[int]) -> list[int]:
        ids = continue_prompt(self.tokenizer, conversation, reply_at, prompt, sampled)
        budget = self.max_positions - self.max_new if self.max_positions else 0
        if ids is None or (budget > 0 and len(ids) > budget):
            return self.first(conversation)
        return ids


def _play(
    policy: ChatBackend,
    episodes: list[Episode],
    sampling: Sampling,
    max_format_retries: int,
    on_turn: Callable[[int], None] | None = None,
    tokens: TokenPrompts | None = None,
) -> None:
    """Generate and step every unfinished episode, batched, until all are done (or reach ``stop_at``)."""
    active = [e for e in episodes if not e.done]
    while active:
        conversations = [e.conversation for e in active]
        if tokens is None:
            gens = policy.generate(conversations, sampling)
        else:
            gens = policy.generate(conversations, sampling, prompt_ids=[e.prompt_ids for e in active])
        stepping: dict[int, list[tuple[Episode, str]]] = defaultdict(list)
        for ep, gen in zip(active, gens, strict=True):
            ep.tokens_out += gen.tokens_out
            action = ep.game.parse_action(gen.text)
            if tokens is not None:
                ep.replies.append(sampled_reply(ep, gen, action is not None))
            if action is None:
                ep.retries_this_turn += 1
                ep.format_retries += 1
                if ep.retries_this_turn > max_format_retries:
                    ep.done, ep.invalid = True, True
                continue  # re-sampled next round, nothing appended
            ep.retries_this_turn = 0
            ep.conversation.append({"role": "assistant", "content": gen.text})
            ep.actions.append(action)
            ep.final_action = action
            stepping[id(ep.game)].append((ep, action))
        for group in stepping.values():
            game = group[0][0].game
            results = game.step_batch([e.state for e, _ in group], [a for _, a in group])
            for (ep, _), res in zip(group, results, strict=True):
                ep.turns += 1
                ep.reward += res.reward
                ep.conversation.append({"role": "user", "content": res.reply})
                if res.done or ep.turns >= game.max_turns:
                    ep.done = True
                    ep.success = bool(res.success)
                elif ep.stop_at is not None and ep.turns >= ep.stop_at:
                    ep.done = True  # the window ends here; the game itself goes on
                if tokens is not None and not ep.done:
                    last = ep.replies[-1]
                    ep.prompt_ids = tokens.after(ep.conversation, last["reply_context"], last["reply_prompt_ids"],
                                                 last["reply_token_ids"])
        n_before = len(active)
        active = [e for e in active if not e.done]
        if on_turn is not None:
            on_turn(n_before - len(active))


def release(episodes: list[Episode]) -> None:
    """Tell each game play is done with its episodes (an external environment closes the sessions of those that
    ended without it: out of format retries, or stopped at a window's end)."""
    for e in episodes:
        e.game.release(e.state)


def sampled_reply(ep: Episode, gen, parsed: bool) -> dict:
    """What token-in / token-out play keeps of a sampled reply (REPLY_FIELDS)."""
    if gen.meta.get("token_ids") is None or gen.token_logprobs is None:
        raise ValueError("play: the policy's backend returned no sampled ids or log-probs for a token-in / "
                         f"token-out turn{f' ({gen.error})' if gen.error else ''}")
    return {"reply_context": len(ep.conversation), "reply_prompt_ids": list(gen.meta.get("prompt_ids", ep.prompt_ids)),
            "reply_token_ids": list(gen.meta["token_ids"]), "reply_logprobs": list(gen.token_logprobs),
            "reply_parsed": parsed}


def history_of(conversation: list[dict], prompt_messages: int = PROMPT_MESSAGES,
               parse: Callable[[str], str | None] = extract_answer) -> list[tuple[str, str | None]]:
    """(action, reply) of each agent turn after the opening messages; reply None for a trailing agent turn.
    ``parse`` reads a move (default: the ``<Answer>`` content; a game's ``parse_action``).

    Raises ValueError for an agent message without a parseable move (play never records one).
    """
    moves: list[tuple[str, str | None]] = []
    rest = conversation[prompt_messages:]
    for i, msg in enumerate(rest):
        if msg["role"] != "assistant":
            continue
        action = parse(msg["content"])
        if action is None:
            raise ValueError(f"agent turn {len(moves) + 1} has no <Answer>: {msg['content'][:80]!r}")
        reply = rest[i + 1]["content"] if i + 1 < len(rest) and rest[i + 1]["role"] == "user" else None
        moves.append((action, reply))
    return moves


def resume_episodes(
    policy: ChatBackend,
    starts: list[tuple[Game, Task, int, list[dict]]],
    sampling: Sampling,
    seed: int,
    max_format_retries: int = 3,
    max_new_turns: int | None = None,
    policy_name: str = "",
) -> list[dict]:
    """Play ``(game, task, sample_index, conversation)`` on from the given conversations.

    Each conversation is a prefix of a game's conversation (opening messages, then agent / environment turns).
    A fresh game state is rebuilt by replaying the prefix's actions; the recorded environment replies stay in
    the conversation as they are. A trailing agent message (e.g. a candidate next turn) is played for real:
    the environment's reply to it is appended. Then the policy plays on, batched across episodes, for at most
    ``max_new_turns`` more agent turns (None = to the end of the game). Rows follow EPISODE_SCHEMA plus
    ``start_turns`` (agent turns already in the prefix, trailing one excluded) and ``tokens_out`` (tokens the
    policy generated after the prefix). Deterministic given ``seed`` and ``starts``.
    """
    seed_torch(seed)
    rng = random.Random(seed)
    episodes, moves = [], []
    for g, t, s, conversation in starts:
        episodes.append(Episode(game=g, task=t, sample=s, state=g.reset(t, rng),
                                conversation=[dict(m) for m in conversation]))
        moves.append(history_of(conversation, parse=g.parse_action))
    start_turns = [sum(reply is not None for _, reply in m) for m in moves]
    for k in range(max((len(m) for m in moves), default=0)):
        stepping: dict[int, list[tuple[Episode, str, str | None]]] = defaultdict(list)
        for ep, m in zip(episodes, moves, strict=True):
            if k < len(m) and not ep.done:
                stepping[id(ep.game)].append((ep, *m[k]))
        for group in stepping.values():
            game = group[0][0].game
            results = game.step_batch([e.state for e, _, _ in group], [a for _, a, _ in group])
            for (ep, action, recorded), res in zip(group, results, strict=True):
                ep.turns += 1
                ep.reward += res.reward
                ep.actions.append(action)
                ep.final_action = action
                if recorded is None:
                    ep.conversation.append({"role": "user", "content": res.reply})
                if res.done or ep.turns >= game.max_turns:
                    ep.done = True
                    ep.success = bool(res.success)
    for ep in episodes:
        if max_new_turns is not None:
            ep.stop_at = ep.turns + max_new_turns
            ep.done = ep.done or max_new_turns == 0
    _play(policy, episodes, sampling, max_format_retries)
    release(episodes)
    return [
        {**episode_row(e, seed, policy_name), "start_turns": n, "tokens_out": e.tokens_out}
        for e, n in zip(episodes, start_turns, strict=True)
    ]


def episode_row(e: Episode, seed: int, policy_name: str) -> dict:
    return {
        "group": e.task.group,
        "task_id": e.task.task_id,
        "secret": json.dumps(e.task.env, sort_keys=True),
        "category": e.task.agent,
        "difficulty": e.task.difficulty,
        "split": e.task.split,
        "sample": e.sample,
        "conversation": e.conversation,
        "final_action": e.final_action,
        "success": e.success,
        "invalid": e.invalid,
        "turns": e.turns,
        "score": e.score(),
        "reward": e.reward,
        "format_retries": e.format_retries,
        "seed": seed,
        "policy": policy_name,
    }


def task_from_row(row: dict) -> Task:
    return Task(
        group=row["group"],
        task_id=row["task_id"],
        env=json.loads(row["secret"]),
        agent=row["category"],
        difficulty=row["difficulty"],
        split=row["split"],
    )


def pass_at_k(rows: list[dict], k: int) -> float | None:
    """The unbiased pass@k of Chen et al. (2021): per task with n ≥ k episodes, c of them won,
    1 − C(n − c, k) / C(n, k), the chance that k of its episodes drawn without replacement hold a win; the mean over
    tasks. None when a task has fewer than k episodes. (mean@k, the mean success over k samples, is the success
    rate.)"""
    import math

    by_task: dict[tuple[str, str], list[bool]] = {}
    for r in rows:
        by_task.setdefault((r["group"], r["task_id"]), []).append(bool(r["success"]))
    if not by_task or any(len(v) < k for v in by_task.values()):
        return None
    return sum(1 - math.comb(len(v) - sum(v), k) / math.comb(len(v), k) for v in by_task.values()) / len(by_task)


#: What each key of :func:`summarize` means (a stage's metrics name them after a prefix: train/success_rate).
SUMMARY_HELP = {
    "episodes": "episodes played",
    "success_rate": "share of the episodes won",
    "mean_turns": "mean turns of the episodes won (0 when none was)",
    "mean_score": "mean PAPRIKA score of the episodes: turns used, a loss counting as the turn limit (minus the "
                  "reward in games scored by reward); lower is better",
    "invalid_rate": "share of the episodes that ended on a reply out of the answer format",
}


def summary_help(prefix: str, what: str) -> dict[str, str]:
    """:data:`SUMMARY_HELP` as a stage declares it: the keys ``prefix + key``, each said of ``what``."""
    return {prefix + k: f"{what}: {v}" for k, v in SUMMARY_HELP.items()}


def summarize(rows: list[dict]) -> dict[str, float]:
    """Success rate, mean turns (successes), invalid rate, over a list of episode rows (:data:`SUMMARY_HELP`)."""
    n = len(rows)
    if n == 0:
        return {"episodes": 0, "success_rate": 0.0, "mean_turns": 0.0, "invalid_rate": 0.0}
    wins = [r for r in rows if r["success"]]
    return {
        "episodes": n,
        "success_rate": len(wins) / n,
        "mean_turns": sum(r["turns"] for r in wins) / len(wins) if wins else 0.0,
        "mean_score": sum(r["score"] for r in rows) / n,
        "invalid_rate": sum(r["invalid"] for r in rows) / n,
    }
