"""rl-text, ``rl_text.algorithm: grpo``: group-relative policy optimisation over multi-turn play, no critic.

Each round the current policy plays ``tasks_per_round`` train tasks × ``trajectories_per_task`` (K, the group);
each episode's replies keep the token ids the policy sampled. The per-turn rewards are the game's outcome
(``grpo.outcome_coef``) plus ``rl_text.reward``'s dense one (judge, motif, oni, infogain). Advantages are
group-relative, per episode (``grpo.credit: trajectory``) or per reply (``turn``), and the policy takes
``grpo.epochs`` passes of clipped policy-gradient steps over the round's replies, with the log-probs of the
weights that played as the ratio's denominator (pipeline/text/grpo.py: formulas and what is masked).

After each round the policy plays the val tasks (``games.val_fraction`` of the train tasks,
``grpo.val_trajectories`` each, the evaluation temperature, the same seed every round); ``metrics/plots/
rl_rounds.json`` gets the round's val success, and the model kept is the best round on val, the DPO policy
counting as round 0 (early stopping: the number of rounds is chosen on val, never on held-out tasks).

Rollouts are one Parquet part per round and each round's model and val result are saved, so a killed run resumes
at the first unfinished round (a round killed mid-update redoes its update from the round's start, on the
rollouts already played). On SIGTERM it stops once the round's rollouts are written, or after the round.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pyarrow as pa

from pipeline.core import interrupt
from pipeline.core.artifacts import (
    ChunkedDataset,
    atomic_write_bytes,
    atomic_write_json,
    chunk_seed,
    dir_hash,
    read_part,
)
from pipeline.core.checkpoints import keyed_dir, run_key
from pipeline.core.stage import StageContext, StageResult
from pipeline.llm import sampling_from_config
from pipeline.llm.hf import HFBackend, load_policy
from pipeline.models import tiny
from pipeline.params import Params
from pipeline.rl_text.rounds import (
    NAME,
    curriculum_metrics,
    episode_jobs,
    online_curriculum,
    params_key,
    round_episodes,
    train_jobs,
)
from pipeline.text.grpo import group_advantages, reply_logps, reply_sequences, token_loss, turn_advantages
from pipeline.text.play import EPISODE_SCHEMA, play_episodes, summarize
from pipeline.text.policies import game_tasks, make_games, require_policy
from pipeline.text.turn_rewards import make_turn_rewards, outcome_rewards

#: What it writes under data/rl_text besides model/ (stages/rl_text.py removes another algorithm's).
OUTPUTS = frozenset({"rollouts", "rounds"})
GRPO_SCHEMA = EPISODE_SCHEMA.append(pa.field("turn_token_ids", pa.list_(pa.list_(pa.int32())))).append(
    pa.field("turn_rewards", pa.list_(pa.float64())))


def turn_rewards_of(row: dict, max_turns: int, score_by_turns: bool, outcome_coef: float) -> list[float]:
    """Per agent reply: ``outcome_coef`` × the game's reward (−1 per turn, 0 on the winning one; a failed episode's
    last reply also pays the turns it left unused, so the sum is −score and a short failure is never better than a
    long win) plus the dense reward stored with the row."""
    outcome = outcome_rewards(row, score_by_turns)
    if outcome and score_by_turns and not row["success"]:
        outcome[-1] -= max_turns - len(outcome)
    dense = row.get("turn_rewards") or [0.0] * len(outcome)
    return [outcome_coef * o + d for o, d in zip(outcome, dense, strict=True)]


def advantages_of(rows: list[dict], games: dict, cfg) -> tuple[list[tuple[dict, list[float]]], int]:
    """(row, per-reply advantage) of every episode in a group with signal; and the groups skipped (all equal)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["group"], row["task_id"]), []).append(row)
    out, skipped = [], 0
    for members in groups.values():
        game = games[members[0]["group"]]
        rewards = [turn_rewards_of(m, game.max_turns, game.score_by_turns, cfg.outcome_coef) for m in members]
        if cfg.credit == "turn":
            per_turn = turn_advantages(rewards, cfg.gamma)
        else:
            episode = group_advantages([sum(r) if r else -float(game.max_turns) for r in rewards])
            per_turn = None if episode is None else [[a] * len(r) for a, r in zip(episode, rewards, strict=True)]
        if per_turn is None:
            skipped += 1
            continue
        out.extend((m, adv) for m, adv in zip(members, per_turn, strict=True) if adv)
    return out, skipped


def update(model, tokenizer, rows: list[dict], games: dict, params: Params, seed: int, ref=None) -> dict:
    """``grpo.epochs`` passes of clipped policy-gradient steps over the round's replies; the stats of the last."""
    import torch

    cfg = params.rl_text.grpo
    scored, skipped = advantages_of(rows, games, cfg)
    max_positions = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", 0)
    replies = []
    for row, adv in scored:
        sequences = reply_sequences(tokenizer, row["conversation"], row["turn_token_ids"], max_positions,
                                    params.rollout_text.max_new_tokens)
        replies.extend((seq, a) for seq, a in zip(sequences, adv, strict=True) if seq[1])
    stats = {"grpo/groups_skipped": skipped, "grpo/replies": len(replies)}
    if not replies:
        return stats
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    model.eval()  # no dropout: the old log-probs and the ratio see the same function
    def logps_of(net) -> list:
        """Each reply's token log-probs under ``net``, batched, without gradients."""
        found = []
        with torch.no_grad():
            for start in range(0, len(replies), cfg.batch_size):
                seqs = [seq for seq, _ in replies[start:start + cfg.batch_size]]
                logp, _ = reply_logps(net, seqs, pad)
                found.extend(logp[k, :len(s[1])] for k, s in enumerate(seqs))
        return found

    old = logps_of(model)  # the log-probs of the weights that played (float32), once before the update
    refs = logps_of(ref) if ref is not None else None
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    rng = random.Random(seed)
    losses, clipped, kls = [], [], []
    for _ in range(cfg.epochs):
        order = list(range(len(replies)))
        rng.shuffle(order)
        for start in range(0, len(order), cfg.batch_size):
            batch = order[start:start + cfg.batch_size]
            logp, mask = reply_logps(model, [replies[k][0] for k in batch], pad)
            width = logp.shape[1]

            def padded(rows_, k_batch=batch, w=width):
                return torch.stack([torch.nn.functional.pad(rows_[k], (0, w - len(rows_[k]))) for k in k_batch])

            loss, info = token_loss(logp, padded(old), torch.tensor([replies[k][1] for k in batch]), mask,
                                    cfg.clip_eps, cfg.beta, padded(refs) if refs is not None else None)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            losses.append(float(loss.detach()))
            clipped.append(info["clipped"])
            kls.append(info["kl"])
    n = len(losses)
    return {**stats, "grpo/loss": sum(losses) / n, "grpo/clipped": sum(clipped) / n, "grpo/kl": sum(kls) / n}


def val_jobs_of(params: Params, games: list) -> list:
    """The (game, task) pairs of GRPO's val rounds: every val task, or ``rl_text.grpo.max_val_tasks`` per group
    (never evaluation's ``games.max_eval_tasks``, which training stages do not watch)."""
    cap = params.rl_text.grpo.max_val_tasks or 0
    return [(g, t) for g in games for t in game_tasks(params, g, "val", cap=cap)]


def val_success(params: Params, model, tokenizer, path: Path, val_jobs) -> float | None:
    """Success rate of the policy on the val tasks (the same seed every round: rounds compare paired)."""
    cfg = params.rl_text.grpo
    if not val_jobs or cfg.val_trajectories == 0:
        return None
    policy = HFBackend(path, batch_size=params.rollout_text.batch_size, model_obj=model, tokenizer=tokenizer,
                       drop_finished=params.policy.drop_finished, dtype=params.policy.dtype)
    jobs = [(g, t, s) for g, t in val_jobs for s in range(cfg.val_trajectories)]
    sampling = sampling_from_config(params.rollout_text, temperature=params.evaluate_text.temperature)
    rows = play_episodes(policy, jobs, sampling, seed=chunk_seed(params.seed, f"{NAME}/val", 0),
                         max_format_retries=params.rollout_text.max_format_retries, policy_name="val")
    return summarize(rows)["success_rate"]


def run(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.rl_text
    out = params.data_path("rl_text")
    init = require_policy(params, "dpo")
    key, init_hash = params_key(params), dir_hash(init)
    rollouts = ChunkedDataset(out / "rollouts", params_hash=key, upstream={"init": init_hash})
    rounds_dir = keyed_dir(out / "rounds", run_key(key, init_hash))
    game_list = make_games(params)
    games = {g.name: g for g in game_list}
    jobs = train_jobs(params, game_list)
    val_jobs = val_jobs_of(params, game_list)
    sampling = sampling_from_config(params.rollout_text)
    curriculum = online_curriculum(params, jobs, lambda i: read_part(rollouts.path, i))
    rewarder = make_turn_rewards(params, key)
    history: list[dict] = []
    start = rounds_dir / "round-start"  # the DPO policy's own val result: round 0 of the early stopping
    if not (start / "val.json").exists():
        model, tokenizer = load_policy(init, params.policy.device)
        start.mkdir(parents=True, exist_ok=True)
        atomic_write_json(start / "val.json", {"val_success": val_success(params, model, tokenizer, Path(init),
                                                                          val_jobs)})
    candidates = [(json.loads((start / "val.json").read_text())["val_success"], -1, Path(init))]
    current, episodes = Path(init), 0
    try:
        for r in range(cfg.rounds):
            round_dir = rounds_dir / f"round-{r:03d}"
            if not ((round_dir / "DONE").exists() and r in rollouts.finished()):
                play_and_update(params, ctx, r, current, round_dir, rollouts, jobs, val_jobs, games, sampling,
                                curriculum, rewarder)
            current = round_dir
            result = json.loads((round_dir / "val.json").read_text())
            part = read_part(rollouts.path, r)
            episodes += len(part)
            history.append({"round": r, **summarize(part), "episodes": episodes, "algorithm": "grpo",
                            "val_success": result["val_success"], **result["stats"]})
            candidates.append((result["val_success"], r, round_dir))
            if r + 1 < cfg.rounds:
                interrupt.check()  # the round is saved: the next one starts the rerun
    finally:
        if rewarder is not None:
            rewarder.close()
    rollouts.mark_complete(cfg.rounds)
    # early stopping on val: the best round (ties: the earliest), or the last one without val
    if any(v is not None for v, _, _ in candidates):
        best = max(candidates, key=lambda c: (c[0] if c[0] is not None else -1.0, -c[1]))
    else:
        best = candidates[-1]
    final = out / "model"
    if final.exists():
        shutil.rmtree(final)
    shutil.copytree(best[2], final, ignore=shutil.ignore_patterns("DONE", "val.json"))
    atomic_write_json(params.plots_path("rl_rounds.json"), history)
    rows = read_rows_all(rollouts, cfg.rounds)
    metrics = {f"rollouts/{k}": v for k, v in summarize(rows).items()} if rows else {}
    metrics.update(curriculum_metrics(params, curriculum))
    metrics.update({"grpo/chosen_round": best[1] + 1, "grpo/val_success_start": candidates[0][0] or 0.0})
    if best[0] is not None:
        metrics["grpo/val_success_chosen"] = best[0]
    if rewarder is not None:
        metrics.update(rewarder.metrics())
    return StageResult(metrics=metrics, outputs=[str(final)])


def play_and_update(params: Params, ctx: StageContext, r: int, current: Path, round_dir: Path,
                    rollouts: ChunkedDataset, jobs, val_jobs, games: dict, sampling, curriculum, rewarder) -> None:
    """Round ``r``: play (unless its rollouts are on disk), update, save the model and its val result."""
    cfg = params.rl_text
    with interrupt.at(f"round {r + 1} of {cfg.rounds}") as point:
        model, tokenizer = load_policy(current, params.policy.device)
        seed = chunk_seed(params.seed, NAME, r)
        if r not in rollouts.finished():
            policy = HFBackend(current, batch_size=params.rollout_text.batch_size, model_obj=model,
                               tokenizer=tokenizer, drop_finished=params.policy.drop_finished,
                               dtype=params.policy.dtype)  # plays a copy in that dtype; ``model`` trains
            played = episode_jobs(jobs, round_episodes(params, jobs, r, curriculum))
            rows = play_episodes(policy, played, sampling, seed=seed, policy_name=f"rl-round-{r}",
                                 max_format_retries=params.rollout_text.max_format_retries, token_ids=True)
            dense = (rewarder(policy, tokenizer, list(games.values()), rows,
                              chunk_seed(params.seed, f"{NAME}/judge", r), r) if rewarder is not None
                     else [[] for _ in rows])
            rows = [{**row, "turn_rewards": d} for row, d in zip(rows, dense, strict=True)]
            rollouts.write_part(r, rows, GRPO_SCHEMA)
            point.text += " (its episodes played)"
            interrupt.check()
        ref = load_policy(require_policy(params, "dpo"), params.policy.device)[0] if cfg.grpo.beta > 0 else None
        from pipeline.models.training import peft_config

        adapters = peft_config(params.train_policy.lora, model) if cfg.lora else None
        if adapters is not None:  # train_policy.lora's adapters, merged after the update, as filtered_bc clones
            from peft import get_peft_model

            model = get_peft_model(model, adapters)
        stats = update(model, tokenizer, read_part(rollouts.path, r), games, params, seed, ref)
        if adapters is not None:
            model = model.merge_and_unload()
        model.eval()
        result = {"val_success": val_success(params, model, tokenizer, current, val_jobs), "stats": stats}
        ctx.tracker.log_metrics({k: v for k, v in {**stats, "rl/val_success": result["val_success"]}.items()
                                 if v is not None}, step=r)
        tiny.save(model, tokenizer, round_dir)
        atomic_write_json(round_dir / "val.json", result)
        atomic_write_bytes(round_dir / "DONE", b"ok")  # whole or absent, even on a full disk



def read_rows_all(ds: ChunkedDataset, rounds: int) -> list[dict]:
    return [row for r in range(rounds) if r in ds.finished() for row in read_part(ds.path, r)]
