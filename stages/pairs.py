"""pairs-text: preference pairs and the SFT set, from the annotated rollouts.

``strategy: paprika`` (default) pairs whole trajectories. Per task, trajectories are ranked by (failed, turns).
Chosen: a success within ``turn_threshold`` turns of the task's best success; rejected: a failure or a success
more than ``turn_threshold`` turns worse than the best. Judge-invalid "successes" count as successes, as
failures, or are dropped (``judge_label_strategy``); format-invalid episodes are dropped.

``strategy: multiturn`` pairs single turns (CollabLLM-style multi-turn-aware reward). Per task, a seeded sample
of ``states_per_task`` conversation prefixes of the rollouts (each ending where the agent is to move); per
prefix, ``num_candidates`` next turns sampled from the base policy; per candidate, ``num_samples``
continuations played on for ``window_size`` more agent turns (``pipeline.play.resume_episodes``), each scored
R = w_llm·mean(interactivity, information gain) + w_task·accuracy − min(w_cost·tokens, 1) and averaged.
Chosen = the best candidate, rejected = the worst; ties (within ``min_margin``) give no pair. The scores come
from ``pairs_text.judge``: rules ``exact`` computes them from the game's knowledge base (twenty questions,
guess my city: accuracy = the continuation found the secret; interactivity = mean binary entropy of each
question's yes/no answer over the secrets still possible; information gain = the share of the entropy removed
by the continuation); any chat backend answers the ``multiturn_judge`` prompt. A candidate without a parseable
``<Answer>`` never reaches the environment: it gets R's floor, −1, below every playable turn. Computed in
chunks of ``tasks_per_chunk`` tasks, each with its own seed, so a killed run resumes where it stopped.

Outputs (TRL conversational format: ``prompt``, ``chosen``, ``rejected`` as lists of {role, content}; for
multiturn, prompt = the conversation prefix and chosen / rejected = one assistant turn):
``data/pairs_text/preferences`` and ``data/pairs_text/sft`` (with either strategy, every success within the
threshold of its task's best — the SFT data).
"""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from pipeline.artifacts import chunk_seed, dataset_hash, dir_hash, read_rows, run_chunked
from pipeline.config import ConfigError, LLMConfig, PairsTextConfig, Params
from pipeline.envs.base import Game, Task, extract_answer
from pipeline.llm.base import ChatBackend, Sampling
from pipeline.llm.ledger import Ledger
from pipeline.multiturn_reward import (
    ConsistentCandidates,
    History,
    RewardWeights,
    TurnPreference,
    exact_information_gain,
    multiturn_aware_reward,
    prefer_turn,
)
from pipeline.stage import StageContext, StageResult

NAME = "pairs-text"
PARAMS = [
    "seed", "policy", "pairs_text", "rollout_text.temperature", "rollout_text.top_p", "rollout_text.min_p",
    "rollout_text.max_new_tokens", "rollout_text.max_format_retries", "rollout_text.batch_size",
    "rollout_text.environment",
]
PROMPT_MESSAGES = 2  # system + opening user message


def effective_success(row: dict, strategy: str) -> bool | None:
    """Success after applying the judge-label strategy; None = drop the trajectory."""
    if row["invalid"]:
        return None
    if row["success"] and row.get("judge_label") == "NOTVALID":
        return {"as_success": True, "as_failure": False, "drop": None}[strategy]
    return bool(row["success"])


def split_task(rows: list[dict], threshold: int, strategy: str) -> tuple[list[dict], list[dict]]:
    """(chosen candidates, rejected candidates) of one task's trajectories."""
    scored = [(effective_success(r, strategy), r) for r in rows]
    scored = [(s, r) for s, r in scored if s is not None]
    wins = [r for s, r in scored if s]
    if not wins:
        return [], [r for _, r in scored]
    best = min(r["turns"] for r in wins)
    chosen = [r for r in wins if r["turns"] <= best + threshold]
    rejected = [r for s, r in scored if not s or r["turns"] > best + threshold]
    return chosen, rejected


def make_pair(chosen: dict, rejected: dict) -> dict:
    conv_c, conv_r = chosen["conversation"], rejected["conversation"]
    return {
        "group": chosen["group"],
        "task_id": chosen["task_id"],
        "prompt": conv_c[:PROMPT_MESSAGES],
        "chosen": conv_c[PROMPT_MESSAGES:],
        "rejected": conv_r[PROMPT_MESSAGES:],
        "chosen_turns": chosen["turns"],
        "rejected_turns": rejected["turns"],
        "rejected_success": bool(rejected["success"]),
    }


def build(rows: list[dict], threshold: int, strategy: str, pairs_per_task: int,
          rng: random.Random) -> tuple[list[dict], list[dict]]:
    by_task: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        by_task[(r["group"], r["task_id"])].append(r)
    pairs, sft = [], []
    for key in sorted(by_task):
        task_rows = sorted(by_task[key], key=lambda r: r["sample"])
        chosen, rejected = split_task(task_rows, threshold, strategy)
        sft.extend({"group": r["group"], "task_id": r["task_id"], "messages": r["conversation"],
                    "turns": r["turns"]} for r in chosen)
        if chosen and rejected:
            for _ in range(pairs_per_task):
                pairs.append(make_pair(rng.choice(chosen), rng.choice(rejected)))
    return pairs, sft


# -- strategy: multiturn ----------------------------------------------------------------------------------------
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
#: Groups whose knowledge base gives the exact scores (the rules ``exact`` judge).
EXACT_GROUPS = ("twenty_questions", "guess_my_city")
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
    """Which secrets of ``task``'s knowledge base agree with a (question, reply) history."""
    if game.name == "twenty_questions":
        from pipeline.envs.twenty_questions import knowledge_base

        kb = knowledge_base()
        return lambda history: kb.consistent(task.agent, list(history))
    if game.name == "guess_my_city":
        return lambda history: game.candidates(list(history))  # type: ignore[attr-defined]
    raise ValueError(f"the rules 'exact' judge needs a knowledge base ({', '.join(EXACT_GROUPS)}), not {game.name}")


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
        from pipeline.llm import make_backend, sampling_from_config

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
        from pipeline.llm.annotation import ask
        from pipeline.llm.prompts import multiturn_judge_messages, parse_multiturn_scores

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
        from pipeline.play import history_of

        moves = history_of(row["conversation"])
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

    from pipeline.play import resume_episodes

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
    starts, owners = [], []
    for (game, task, prefix, _), cands in zip(states, per_state, strict=True):
        if len(cands) < 2:
            continue
        for c in cands:
            if extract_answer(c.text) is None:
                stats["unparseable_candidates"] += 1
                c.rewards.append(UNPARSEABLE_REWARD)
                continue
            for s in range(cfg.num_samples):
                starts.append((game, task, s, [*prefix, {"role": "assistant", "content": c.text}]))
                owners.append((game, task, prefix, c))
    rows = resume_episodes(policy, starts, sampling, seed=seed ^ 0x5EED, max_format_retries=max_format_retries,
                           max_new_turns=cfg.window_size) if starts else []
    stats["continuations"] += len(rows)
    scores = judge.score([(game, task, prefix, row) for (game, task, prefix, _), row in zip(owners, rows,
                                                                                               strict=True)])
    for (_, _, _, cand), row, sc in zip(owners, rows, scores, strict=True):
        if sc is None:
            stats["unscored_continuations"] += 1
            continue
        cand.rewards.append(candidate_reward(sc, cand.tokens + row["tokens_out"], weights(cfg)))
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


def weights(cfg: PairsTextConfig) -> RewardWeights:
    w = cfg.reward_weights
    return RewardWeights(llm=w.llm, task=w.task, cost=w.cost)


def multiturn_sampling(params: Params) -> Sampling:
    """The base policy's rollout sampling (no seed: candidates of one prefix must be distinct draws)."""
    r = params.rollout_text
    return Sampling(temperature=r.temperature, top_p=r.top_p, min_p=r.min_p, max_tokens=r.max_new_tokens)


def build_multiturn(params: Params, rows: list[dict], out: Path, upstream: dict[str, str], h: str,
                    stats: dict[str, int]) -> dict[str, float | int]:
    """Write the per-turn pairs of every task to ``out`` (chunked, resumable); returns the LLM judge's ledger."""
    from pipeline.envs.base import make_game
    from pipeline.llm import make_environment
    from pipeline.play import task_from_row
    from pipeline.policies import load_policy_backend, policy_path

    cfg = params.pairs_text
    by_task: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        by_task[(r["group"], r["task_id"])].append(r)
    keys = sorted(by_task)
    env = make_environment(params.rollout_text.environment)
    games = {g: make_game(g, environment=env) for g in sorted({g for g, _ in keys})}
    inexact = [g for g in games if g not in EXACT_GROUPS]
    if cfg.judge.backend == "rules" and inexact:
        raise ConfigError(f"params: pairs_text.judge: the rules 'exact' judge needs a knowledge base "
                          f"({', '.join(EXACT_GROUPS)}); the rollouts also hold {', '.join(inexact)}: use an "
                          f"LLM judge (hf, vllm, openai)")
    chunks = [keys[i : i + cfg.tasks_per_chunk] for i in range(0, len(keys), cfg.tasks_per_chunk)]
    policy = load_policy_backend(params, "base")
    judge = ContinuationJudge(cfg.judge)
    upstream = {**upstream, "policy": dir_hash(policy_path(params, "base"))}

    def make_chunk(index: int) -> list[dict]:
        tasks = [(games[g], task_from_row(by_task[(g, t)][0]), by_task[(g, t)]) for g, t in chunks[index]]
        return multiturn_chunk(policy, judge, tasks, cfg, multiturn_sampling(params),
                               chunk_seed(params.seed, NAME, index), params.rollout_text.max_format_retries, stats)

    try:
        run_chunked(out, num_chunks=len(chunks), make_chunk=make_chunk, params_hash=h, upstream=upstream,
                    schema=MULTITURN_PAIR_SCHEMA, desc="per-turn pairs")
    finally:
        judge.close()
    return {} if judge.rules else judge.ledger.metrics("judge")


def run(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.pairs_text
    src = params.data_path("annotate_text")
    rows = read_rows(src)
    rng = random.Random(chunk_seed(params.seed, NAME, 0))
    pairs, sft = build(rows, cfg.turn_threshold, cfg.judge_label_strategy, cfg.pairs_per_task, rng)
    upstream = {"annotate_text": dataset_hash(src)}
    h = params.section_hash(PARAMS)
    out = params.data_path("pairs_text")
    tasks = len({(r["group"], r["task_id"]) for r in rows})
    stats: dict[str, int] = defaultdict(int)
    if cfg.strategy == "multiturn":
        judge_metrics = build_multiturn(params, rows, out / "preferences", upstream, h, stats)
        pairs = read_rows(out / "preferences")
        if not pairs:
            raise RuntimeError("pairs-text: no state gave two candidates with different rewards; raise "
                               "pairs_text.states_per_task / num_candidates or rollout_text.temperature")
        metrics: dict[str, float | int | str] = {
            "tasks": tasks,
            "pairs": len(pairs),
            "tasks_with_pairs": len({(p["group"], p["task_id"]) for p in pairs}),
            "mean_chosen_reward": sum(p["chosen_reward"] for p in pairs) / len(pairs),
            "mean_rejected_reward": sum(p["rejected_reward"] for p in pairs) / len(pairs),
            "mean_state_turn": sum(p["state_turn"] for p in pairs) / len(pairs),
            # counted over the chunks computed by this run (a resumed run skips finished ones)
            **{f"computed/{k}": v for k, v in sorted(stats.items())},
            **judge_metrics,
        }
    else:
        if not pairs:
            raise RuntimeError("pairs-text: no task has both a chosen and a rejected trajectory; "
                               "raise rollout_text.trajectories_per_task or the temperature")
        run_chunked(out / "preferences", num_chunks=1, make_chunk=lambda _: pairs, params_hash=h,
                    upstream=upstream, desc="pairs")
        metrics = {
            "tasks": tasks,
            "pairs": len(pairs),
            "pairs_with_failed_rejected": sum(not p["rejected_success"] for p in pairs),
            "mean_chosen_turns": sum(p["chosen_turns"] for p in pairs) / len(pairs),
        }
    run_chunked(out / "sft", num_chunks=1, make_chunk=lambda _: sft, params_hash=h, upstream=upstream,
                desc="sft set")
    metrics["sft_trajectories"] = len(sft)
    metrics["strategy"] = cfg.strategy
    return StageResult(metrics=metrics, outputs=[str(out)])
