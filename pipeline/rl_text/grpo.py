"""rl-text, ``rl_text.algorithm: grpo``: group-relative policy optimisation over multi-turn play, no critic.

The rounds (play, reward, write, keep the val-best round) are pipeline/rl_text/rounds.py's; this file is GRPO's
update. Each round the current policy plays ``tasks_per_round`` train tasks × ``trajectories_per_task`` (K, the
group), token in, token out, sampling as ``rl_text.sampling`` says (by default the untruncated softmax at
temperature 1): the rows keep every sampled reply's prompt ids, sampled ids and the sampler's log-probs
(pipeline/text/play.py). A step is one sampled reply. Its reward is ``grpo.outcome_coef`` × the game's reward of its
turn (turn-scored games: −1 for every turn, 0 for the winning one, and a failed episode's last step also pays the
turns it left unused; reward-scored games: the episode's reward on its last move) plus ``rl_text.reward``'s dense one
(judge, motif without its outcome term, oni, infogain: exactly one per move); a reply that did not parse as a move is
a step of its own with reward −``grpo.format_penalty``. Advantages are group-relative by ``grpo.credit`` (trajectory,
gigpo or turn) and ``grpo.scale_rewards``; the policy takes ``grpo.epochs`` passes of clipped policy-gradient steps
over the round's replies, each episode's replies packed into one sequence where their prompts extend one another
(pipeline/text/grpo.py: the formulas, what is masked and packed).

π_old, the ratio's denominator, is one no-grad scoring pass at the weights that played, on every backend; π_θ,
π_old and the reference are scored under the temperature-scaled, untruncated softmax. The sampler's own log-probs
(what the engine reports, after any truncation ``rl_text.sampling`` keeps) enter only through
``grpo.rollout_correction``, which weighs each token by its trainer / sampler ratio. Each round logs the gap
(``grpo/mismatch/gap_mean``, ``gap_max``, ``corrected``, ``floored``), the share of reply tokens whose log-prob gets
a gradient (``grpo/moving``) and the scoring pass's seconds beside the update's (``grpo/old_pass_s``,
``grpo/update_s``).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import pyarrow as pa
import torch

from pipeline.core import interrupt
from pipeline.core.artifacts import chunk_seed
from pipeline.core.stage import StageContext, StageResult
from pipeline.params import Params
from pipeline.rl_text.rounds import NAME, Round, run_rounds
from pipeline.text.config import RLTextConfig
from pipeline.text.grpo import Packed, Steps, pack_episode, reply_logps, rollout_weights, round_advantages, token_loss
from pipeline.text.play import EPISODE_SCHEMA, REPLY_FIELDS
from pipeline.text.policies import require_policy
from pipeline.text.turn_rewards import outcome_rewards

#: What it writes under data/rl_text besides model/ (stages/rl_text.py removes another algorithm's).
OUTPUTS = frozenset({"rollouts", "rounds"})
GRPO_SCHEMA = pa.schema([*EPISODE_SCHEMA, *REPLY_FIELDS, pa.field("turn_rewards", pa.list_(pa.float64()))])


def step_rewards(row: dict, game, cfg) -> list[float]:
    """Each sampled reply's reward, in play order (pipeline/text/grpo.py's steps): a move gets ``outcome_coef`` ×
    the game's reward of its turn (turn-scored games: −1, 0 on the winning turn; reward-scored games: the episode's
    reward on its last move) plus the dense reward stored with the row; a reply that did not parse gets
    −``format_penalty``. A failed turn-scored episode's last step also pays the turns it left unused, so an
    episode's return is −score and a short failure is never better than a long win."""
    outcome = outcome_rewards(row, game.score_by_turns)
    dense = list(row.get("turn_rewards") or [])
    if dense and len(dense) != len(outcome):
        raise ValueError(f"grpo: an episode of {row['group']} / {row['task_id']} has {len(outcome)} moves but "
                         f"{len(dense)} dense rewards (rl_text.reward): each move needs exactly one")
    moves, extra = iter(outcome), iter(dense or [0.0] * len(outcome))
    out = [cfg.outcome_coef * next(moves) + next(extra) if parsed else -cfg.format_penalty
           for parsed in row["reply_parsed"]]
    if game.score_by_turns and not row["success"] and out:
        out[-1] -= cfg.outcome_coef * (game.max_turns - row["turns"])
    return out


def step_turns(row: dict) -> list[int]:
    """Each sampled reply's game turn: the moves made before it (a re-sampled reply shares its move's turn)."""
    out, turn = [], 0
    for parsed in row["reply_parsed"]:
        out.append(turn)
        turn += bool(parsed)
    return out


def step_anchors(row: dict) -> list[tuple]:
    """Each sampled reply's state: the conversation before it (GiGPO's anchor; a re-sampled reply shares its
    turn's)."""
    conversation = [(m["role"], m["content"]) for m in row["conversation"]]
    return [tuple(conversation[:n]) for n in row["reply_context"]]


def advantages_of(rows: list[dict], games: dict, cfg) -> tuple[list[tuple[dict, list[float]]], int]:
    """(row, per-step advantage) of every episode in a group with signal; and the groups skipped (no signal)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["group"], row["task_id"]), []).append(row)
    members = list(groups.values())
    steps = [[Steps(step_rewards(m, games[m["group"]], cfg), step_anchors(m), step_turns(m)) for m in g]
             for g in members]
    out, skipped = [], 0
    for group, adv in zip(members, round_advantages(steps, cfg.credit, cfg.gamma, cfg.omega, cfg.scale_rewards,
                                                    cfg.step_scale), strict=True):
        if adv is None:
            skipped += 1
            continue
        out.extend(zip(group, adv, strict=True))
    return out, skipped


@dataclass
class Episode:
    """One scored episode of the update: its sequences (``pack_episode``) and, per reply in order, its advantage
    and the sampler's log-probs of its tokens."""

    sequences: list[Packed]
    advantages: list[float]
    sampler: list[torch.Tensor]

    @property
    def replies(self) -> int:
        return len(self.advantages)


def scored_episodes(scored: list[tuple[dict, list[float]]]) -> list[Episode]:
    out = []
    for row, adv in scored:
        replies = list(zip(row["reply_prompt_ids"], row["reply_token_ids"], strict=True))
        out.append(Episode(pack_episode(replies), list(adv),
                           [torch.tensor(lp, dtype=torch.float32) for lp in row["reply_logprobs"]]))
    return out


def optimizer_steps(episodes: list[Episode], batch_size: int, rng: random.Random) -> list[list[int]]:
    """The episodes' indices in a shuffled order, cut into steps of at least ``batch_size`` replies (whole
    episodes)."""
    order = list(range(len(episodes)))
    rng.shuffle(order)
    steps, current, replies = [], [], 0
    for k in order:
        current.append(k)
        replies += episodes[k].replies
        if replies >= batch_size:
            steps.append(current)
            current, replies = [], 0
    return steps + ([current] if current else [])


def gathered(per_episode: list[list[torch.Tensor]], keys: list[int]) -> torch.Tensor:
    """The per-reply tensors of the episodes ``keys``, in order, as ``[replies, longest]``."""
    return padded([x for k in keys for x in per_episode[k]])


def padded(rows: list[torch.Tensor]) -> torch.Tensor:
    """Per-reply token tensors → ``[replies, longest]``, zero-padded."""
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)


def scored_logps(net, episodes: list[Episode], temperature: float, max_tokens: int = 16384
                 ) -> list[list[torch.Tensor]]:
    """Each episode's per-reply token log-probs under ``net``, without gradients, in passes of at most
    ``max_tokens`` tokens."""
    out, chunk, size = [], [], 0
    with torch.no_grad():
        def flush():
            found = iter(reply_logps(net, [s for e in chunk for s in e.sequences], temperature))
            out.extend([next(found) for _ in range(e.replies)] for e in chunk)

        for e in episodes:
            n = sum(len(s.ids) for s in e.sequences)
            if chunk and size + n > max_tokens:
                flush()
                chunk, size = [], 0
            chunk.append(e)
            size += n
        if chunk:
            flush()
    return out


def update(model, tokenizer, rows: list[dict], games: dict, rl: RLTextConfig, max_new_tokens: int, seed: int,
           ref=None) -> dict:
    """``grpo.epochs`` passes of clipped policy-gradient steps over the round's replies; the stats of the last. ``rl``:
    the ``rl_text`` params section; ``max_new_tokens``: a reply's budget (``rollout_text.max_new_tokens``, dr_grpo's
    constant).

    π_old is one no-grad scoring pass at the weights that played (this ``model``, before any step), and each token's
    rollout-correction weight is taken against the sampler's log-prob of it."""
    cfg = rl.grpo
    scored, skipped = advantages_of(rows, games, cfg)
    episodes = scored_episodes(scored)
    stats: dict = {"grpo/groups_skipped": skipped, "grpo/replies": sum(e.replies for e in episodes)}
    if not episodes:
        return stats
    temperature = rl.sampling.temperature
    model.eval()  # no dropout: the old log-probs and the ratio see the same function
    clock = time.perf_counter()
    old = scored_logps(model, episodes, temperature)
    stats["grpo/old_pass_s"] = time.perf_counter() - clock
    weights, gap = correction(old, [e.sampler for e in episodes], cfg)
    stats.update(gap)
    refs = scored_logps(ref, episodes, temperature) if ref is not None else None
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                                  weight_decay=cfg.weight_decay)
    budget = cfg.batch_size * max_new_tokens  # dr_grpo's constant
    rng = random.Random(seed)
    losses, clipped, kls, moving = [], [], [], []
    clock = time.perf_counter()
    for _ in range(cfg.epochs):
        for ks in optimizer_steps(episodes, cfg.batch_size, rng):
            # a stop drops the update now rather than a step later: the round's update is saved only whole, and
            # its rerun starts from the round's episodes on disk
            interrupt.check()
            logp = reply_logps(model, [s for k in ks for s in episodes[k].sequences], temperature)
            mask = padded([torch.ones(len(x)) for x in logp])
            adv = torch.tensor([a for k in ks for a in episodes[k].advantages])
            loss, info = token_loss(padded(logp), gathered(old, ks), adv, mask, cfg.clip_eps, cfg.beta,
                                    gathered(refs, ks) if refs is not None else None, cfg.loss_type, budget,
                                    gathered(weights, ks) if weights is not None else None)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            losses.append(float(loss.detach()))
            clipped.append(info["clipped"])
            kls.append(info["kl"])
            moving.append(info["moving"])
    n = len(losses)
    return {**stats, "grpo/update_s": time.perf_counter() - clock, "grpo/loss": sum(losses) / n,
            "grpo/clipped": sum(clipped) / n, "grpo/kl": sum(kls) / n, "grpo/moving": sum(moving) / n}


def correction(old: list[list[torch.Tensor]], sampler: list[list[torch.Tensor]], cfg
               ) -> tuple[list[list[torch.Tensor]] | None, dict]:
    """The rollout correction's per-token weights of each episode's replies (None: ``none``) and the round's
    sampler / trainer gap: mean and max |Δ log p| per token, the share of tokens corrected."""
    flat_old = [x for e in old for x in e]
    mask = padded([torch.ones(len(x)) for x in flat_old])
    w, gap = rollout_weights(padded(flat_old), padded([x for e in sampler for x in e]), mask,
                             cfg.rollout_correction, cfg.rollout_correction_level, cfg.rollout_correction_cap)
    stats = {f"grpo/mismatch/{k}": v for k, v in gap.items()}
    if w is None:
        return None, stats
    rows = iter(w)
    return [[next(rows)[: len(x)] for x in e] for e in old], stats


class GRPO:
    """GRPO's step of rl-text's rounds (pipeline/rl_text/rounds.py)."""

    outputs = OUTPUTS
    token_ids = True

    def schema(self, dense: bool) -> pa.Schema:
        return GRPO_SCHEMA

    def learn(self, state: Round, model, tokenizer):
        params = state.params
        from pipeline.llm.hf import load_policy
        from pipeline.models.training import peft_config

        ref = load_policy(require_policy(params, "dpo"), params.policy.device)[0] if params.rl_text.grpo.beta > 0 \
            else None
        adapters = peft_config(params.train_policy.lora, model) if params.rl_text.lora else None
        if adapters is not None:  # train_policy.lora's adapters, merged after the update, as filtered_bc clones
            from peft import get_peft_model

            # the adapters' random init from the round's seed, not from what torch drew before (a resumed round
            # whose episodes are on disk has drawn nothing)
            torch.manual_seed(chunk_seed(params.seed, f"{NAME}/lora", state.index))
            model = get_peft_model(model, adapters)
        stats = update(model, tokenizer, state.rows(), state.games, params.rl_text, params.rollout_text.max_new_tokens,
                       state.seed, ref)
        if adapters is not None:
            model = model.merge_and_unload()
        return model, stats


def run(params: Params, ctx: StageContext) -> StageResult:
    return run_rounds(params, ctx, GRPO(), "grpo")
