"""rl-text, ``rl_text.algorithm: grpo``: group-relative policy optimisation over multi-turn play, no critic.

Each round the current policy plays ``tasks_per_round`` train tasks × ``trajectories_per_task`` (K, the group),
token in, token out: each reply's prompt is the ids played so far, and the rows keep every sampled reply's prompt
ids, sampled ids and the sampler's log-probs (pipeline/text/play.py). A step is one sampled reply. Its reward is
``grpo.outcome_coef`` × the game's reward of its turn (turn-scored games: −1 for every turn, 0 for the winning one,
and a failed episode's last step also pays the turns it left unused; reward-scored games: the episode's reward on
its last move) plus ``rl_text.reward``'s dense one (judge, motif, oni, infogain); a reply that did not parse as a
move is a step of its own with reward −``grpo.format_penalty``. Advantages are group-relative by ``grpo.credit``
(trajectory, gigpo or turn) and ``grpo.scale_rewards``; the policy takes ``grpo.epochs`` passes of clipped
policy-gradient steps over the round's replies, each episode's replies packed into one sequence where their prompts
extend one another (pipeline/text/grpo.py: the formulas, what is masked and packed).

π_old, the ratio's denominator: an hf policy that plays in float32 samples from the trainer's own distribution
(temperature, top-k, top-p and min-p applied), so the sampler's log-probs are π_old and the update needs no scoring
pass; the gap between them is measured on the first optimizer step, before any update. Otherwise one scoring pass
gives π_old and ``grpo.rollout_correction`` weighs each token by its sampler / trainer ratio. Each round logs the
gap (``grpo/mismatch/gap_mean``, ``gap_max``, ``corrected``).

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
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import torch

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
from pipeline.llm.base import ChatBackend
from pipeline.llm.hf import load_policy
from pipeline.llm.sampler import sampling_warpers
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
from pipeline.rl_text.serving import PolicyPlayer
from pipeline.text.grpo import Packed, Steps, pack_episode, reply_logps, rollout_weights, round_advantages, token_loss
from pipeline.text.play import EPISODE_SCHEMA, REPLY_FIELDS, play_episodes, summarize
from pipeline.text.policies import game_tasks, make_games, require_policy
from pipeline.text.turn_rewards import make_turn_rewards, outcome_rewards

#: What it writes under data/rl_text besides model/ (stages/rl_text.py removes another algorithm's).
OUTPUTS = frozenset({"rollouts", "rounds"})
GRPO_SCHEMA = pa.schema([*EPISODE_SCHEMA, *REPLY_FIELDS, pa.field("turn_rewards", pa.list_(pa.float64()))])


def step_rewards(row: dict, game, cfg) -> list[float]:
    """Each sampled reply's reward, in play order (pipeline/text/grpo.py's steps): a move gets ``outcome_coef`` ×
    the game's reward of its turn (turn-scored games: −1, 0 on the winning turn; reward-scored games: the episode's
    reward on its last move) plus the dense reward stored with the row; a reply that did not parse gets
    −``format_penalty``. A failed turn-scored episode's last step also pays the turns it left unused, so an
    episode's return is −score and a short failure is never better than a long win."""
    moves = iter(outcome_rewards(row, game.score_by_turns))
    dense = iter(row.get("turn_rewards") or [])
    out = [cfg.outcome_coef * next(moves) + next(dense, 0.0) if parsed else -cfg.format_penalty
           for parsed in row["reply_parsed"]]
    if game.score_by_turns and not row["success"] and out:
        out[-1] -= cfg.outcome_coef * (game.max_turns - row["turns"])
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
    steps = [[Steps(step_rewards(m, games[m["group"]], cfg), step_anchors(m)) for m in g] for g in members]
    out, skipped = [], 0
    for group, adv in zip(members, round_advantages(steps, cfg.credit, cfg.gamma, cfg.omega, cfg.scale_rewards),
                          strict=True):
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


def optimizer_steps(episodes: list[Episode], batch_size: int, rng: random.Random) -> list[list[Episode]]:
    """The episodes in a shuffled order, cut into steps of at least ``batch_size`` replies (whole episodes)."""
    order = list(episodes)
    rng.shuffle(order)
    steps, current, replies = [], [], 0
    for e in order:
        current.append(e)
        replies += e.replies
        if replies >= batch_size:
            steps.append(current)
            current, replies = [], 0
    return steps + ([current] if current else [])


def padded(rows: list[torch.Tensor]) -> torch.Tensor:
    """Per-reply token tensors → ``[replies, longest]``, zero-padded."""
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)


def scored_logps(net, episodes: list[Episode], warpers, max_tokens: int = 16384) -> list[list[torch.Tensor]]:
    """Each episode's per-reply token log-probs under ``net``, without gradients, in passes of at most
    ``max_tokens`` tokens."""
    out, chunk, size = [], [], 0
    with torch.no_grad():
        def flush():
            found = iter(reply_logps(net, [s for e in chunk for s in e.sequences], warpers))
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


def update(model, tokenizer, rows: list[dict], games: dict, params: Params, seed: int, ref=None,
           exact_sampler: bool = True) -> dict:
    """``grpo.epochs`` passes of clipped policy-gradient steps over the round's replies; the stats of the last.

    ``exact_sampler``: the round was played by these weights in float32, sampling from the distribution the trainer
    computes (the sampler's log-probs are π_old: no scoring pass, no correction; the gap is measured on the first
    optimizer step, before any update). Otherwise π_old is one scoring pass before the update, and the rollout
    correction weighs each token by how far the sampler was from it."""
    cfg = params.rl_text.grpo
    scored, skipped = advantages_of(rows, games, cfg)
    episodes = scored_episodes(scored)
    stats: dict = {"grpo/groups_skipped": skipped, "grpo/replies": sum(e.replies for e in episodes)}
    if not episodes:
        return stats
    warpers = trainer_warpers(model, sampling_from_config(params.rollout_text))
    model.eval()  # no dropout: the old log-probs and the ratio see the same function
    index = {id(e): k for k, e in enumerate(episodes)}
    old = [e.sampler for e in episodes]
    weights: list[list[torch.Tensor]] | None = None
    if not exact_sampler:
        old = scored_logps(model, episodes, warpers)
        weights, gap = correction(old, [e.sampler for e in episodes], cfg)
        stats.update(gap)
    refs = scored_logps(ref, episodes, warpers) if ref is not None else None
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    rng = random.Random(seed)
    losses, clipped, kls = [], [], []
    for epoch in range(cfg.epochs):
        for step, batch in enumerate(optimizer_steps(episodes, cfg.batch_size, rng)):
            # a stop drops the update now rather than a step later: the round's update is saved only whole, and
            # its rerun starts from the round's episodes on disk
            interrupt.check()
            ks = [index[id(e)] for e in batch]
            logp = reply_logps(model, [s for e in batch for s in e.sequences], warpers)
            if exact_sampler and epoch == 0 and step == 0:  # the weights that played: the sampler's own gap
                stats.update(correction([[x.detach() for x in logp]], [[x for k in ks for x in old[k]]],
                                        cfg.model_copy(update={"rollout_correction": "none"}))[1])
            def gathered(per_episode, keys=ks):
                return padded([x for k in keys for x in per_episode[k]])

            mask = padded([torch.ones(len(x)) for x in logp])
            adv = torch.tensor([a for k in ks for a in episodes[k].advantages])
            loss, info = token_loss(padded(logp), gathered(old), adv, mask, cfg.clip_eps, cfg.beta,
                                    gathered(refs) if refs is not None else None, cfg.loss_type,
                                    params.rollout_text.max_new_tokens,
                                    gathered(weights) if weights is not None else None)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            losses.append(float(loss.detach()))
            clipped.append(info["clipped"])
            kls.append(info["kl"])
    n = len(losses)
    return {**stats, "grpo/loss": sum(losses) / n, "grpo/clipped": sum(clipped) / n, "grpo/kl": sum(kls) / n}


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


def trainer_warpers(model, sampling) -> list:
    """The logits processors the sampler applied (temperature, top-k, top-p, min-p), for the trainer's log-probs."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    warpers = sampling_warpers(inner.generation_config, sampling) if sampling.temperature > 0 else []
    if warpers is None:
        raise ValueError("grpo: the policy's generation config asks for sampling that only transformers' own "
                         "sampler does (typical-p, epsilon / eta cutoffs, ...): the trainer cannot score the "
                         "distribution it sampled from")
    return warpers


def val_jobs_of(params: Params, games: list) -> list:
    """The (game, task) pairs of GRPO's val rounds: every val task, or ``rl_text.grpo.max_val_tasks`` per group
    (never evaluation's ``games.max_eval_tasks``, which training stages do not watch)."""
    cap = params.rl_text.grpo.max_val_tasks or 0
    return [(g, t) for g in games for t in game_tasks(params, g, "val", cap=cap)]


def val_success(params: Params, policy: ChatBackend, val_jobs) -> float | None:
    """Success rate of the policy on the val tasks (the same seed every round, and for every training seed:
    rounds and runs compare paired)."""
    cfg = params.rl_text.grpo
    if not val_jobs or cfg.val_trajectories == 0:
        return None
    jobs = [(g, t, s) for g, t in val_jobs for s in range(cfg.val_trajectories)]
    sampling = sampling_from_config(params.rollout_text, temperature=params.evaluate_text.temperature)
    rows = play_episodes(policy, jobs, sampling, seed=chunk_seed(params.eval_seed, f"{NAME}/val", 0),
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
    player = PolicyPlayer(params)  # the configured backend; on vLLM, the run's one server
    start = rounds_dir / "round-start"  # the DPO policy's own val result: round 0 of the early stopping
    current, episodes = Path(init), 0
    try:
        if not (start / "val.json").exists():
            model, tokenizer = load_policy(init, params.policy.device)
            start.mkdir(parents=True, exist_ok=True)
            atomic_write_json(start / "val.json", {
                "val_success": val_success(params, player.backend(current, model, tokenizer), val_jobs)})
        candidates = [(json.loads((start / "val.json").read_text())["val_success"], -1, Path(init))]
        for r in range(cfg.rounds):
            round_dir = rounds_dir / f"round-{r:03d}"
            if not ((round_dir / "DONE").exists() and r in rollouts.finished()):
                play_and_update(params, ctx, r, current, round_dir, rollouts, jobs, val_jobs, games, sampling,
                                curriculum, rewarder, player)
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
        player.close()
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
    metrics.update(player.metrics())  # vllm: the server starts of this run (1 for a run not interrupted)
    return StageResult(metrics=metrics, outputs=[str(final)])


def play_and_update(params: Params, ctx: StageContext, r: int, current: Path, round_dir: Path,
                    rollouts: ChunkedDataset, jobs, val_jobs, games: dict, sampling, curriculum, rewarder,
                    player: PolicyPlayer) -> None:
    """Round ``r``: play (unless its rollouts are on disk), update, save the model and its val result."""
    cfg = params.rl_text
    with interrupt.at(f"round {r + 1} of {cfg.rounds}") as point:
        model, tokenizer = load_policy(current, params.policy.device)
        seed = chunk_seed(params.seed, NAME, r)
        if r not in rollouts.finished():
            policy = player.backend(current, model, tokenizer)
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

            # the adapters' random init from the round's seed, not from what torch drew before (a resumed round
            # whose episodes are on disk has drawn nothing)
            torch.manual_seed(chunk_seed(params.seed, f"{NAME}/lora", r))
            model = get_peft_model(model, adapters)
        stats = update(model, tokenizer, read_part(rollouts.path, r), games, params, seed, ref,
                       exact_sampler=player.exact_sampler)
        if adapters is not None:
            model = model.merge_and_unload()
        model.eval()
        tiny.save(model, tokenizer, round_dir)  # before its val pass: a vLLM server loads the round from here
        result = {"val_success": val_success(params, player.backend(round_dir, model, tokenizer), val_jobs),
                  "stats": stats}
        ctx.tracker.log_metrics({k: v for k, v in {**stats, "rl/val_success": result["val_success"]}.items()
                                 if v is not None}, step=r)
        atomic_write_json(round_dir / "val.json", result)
        atomic_write_bytes(round_dir / "DONE", b"ok")  # whole or absent, even on a full disk


def read_rows_all(ds: ChunkedDataset, rounds: int) -> list[dict]:
    return [row for r in range(rounds) if r in ds.finished() for row in read_part(ds.path, r)]
