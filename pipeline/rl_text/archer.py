"""rl-text, ``rl_text.algorithm: archer``: ArCHer (Zhou et al., 2024), a hierarchical actor-critic.

High level, an utterance-level off-policy critic; low level, a token-level policy gradient:

- critic: an encoder of the state (the conversation so far) and of the action (the agent's utterance),
  mean-pooled; Q1, Q2 heads on [h_s; h_a], V1, V2 heads on h_s; a target copy Polyak-averaged with τ.
  Targets: Q_i(s, a) ← r + γ(1−d)·V̄_i(s′) and V_i(s) ← Q̄_i(s, a_π), a_π freshly sampled from the policy.
- actor: A = min(Q1, Q2)(s, a_π) − min(V1, V2)(s); loss −mean(log π(a_π|s)·A), log π summed over the
  utterance's tokens (batched, left-padded with explicit position ids: see ``utterance_logprobs``).
- reward (``rl_text.reward``): ``outcome``, games scored by turns (twenty questions, …) pay −1 per turn and 0 on
  the winning turn, games scored by reward (bandits) pay the episode's reward on its last turn; ``judge``, ``motif``
  and ``oni``, each transition pays its utterance's dense reward (pipeline/text/turn_rewards.py), stored in the
  replay buffer.
- tasks: a uniform sample per round, or the curriculum's picks (``rl_text.curriculum.enabled``) over the policy's
  own episodes of the rounds before (``data/rl_text/episodes``).

A round (the unit of resume): the policy plays ``tasks_per_round × trajectories_per_task`` train episodes; their
transitions (s, a, r, s′, done) become part r of the replay buffer (chunked Parquet, ``data/rl_text/replay``);
``critic.steps`` critic steps on the newest ``critic.buffer_capacity`` transitions; then, after
``archer.warmup_rounds`` critic-only rounds, ``archer.actor_steps`` actor steps. Policy, critic, target critic
and both optimisers are then checkpointed (``data/rl_text/state``), so a SIGKILL loses at most the round in
flight, and a resumed run equals an uninterrupted one (every round re-seeds its RNGs). On SIGTERM the stage stops
once the round's episodes are written (the rerun redoes its gradient steps only) or once the round is checkpointed.
Online CHAI (pipeline/rl_text/chai.py) trains the same critic with ``train_loop(..., actor=False)``.

Several processes (``train_policy.num_processes`` or ``train_policy.accelerate_config``): the stage runs under
``accelerate launch``; each process plays its share of a round's episodes (the bulk of the wall time) and
computes every critic / actor step on its share of the same global batch, through ``accelerate.Accelerator``
(DDP: the averaged gradient is the global batch's, as in one process). The main process holds the replay buffer
and writes the same files one process writes, so a run resumes with any number of processes.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import torch
from torch import nn

from pipeline.core import interrupt
from pipeline.core.artifacts import (
    ChunkedDataset,
    atomic_write_bytes,
    atomic_write_json,
    chunk_seed,
    dir_hash,
    read_rows,
)
from pipeline.core.checkpoints import keyed_dir, run_key
from pipeline.core.config import ConfigError
from pipeline.core.errors import CurioError
from pipeline.core.processes import requested, world_size
from pipeline.core.registry import STAGES
from pipeline.core.stage import StageContext, StageResult
from pipeline.llm import sampling_from_config
from pipeline.llm.base import ChatBackend, Sampling
from pipeline.llm.hf import HFBackend, load_policy
from pipeline.models import tiny
from pipeline.models.launch import launched_stage
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
from pipeline.text.config import RLTextConfig
from pipeline.text.critic import DoubleCritic, load_encoder
from pipeline.text.play import play_episodes, summarize
from pipeline.text.policies import make_games, require_policy
from pipeline.text.turn_rewards import TurnRewards, make_turn_rewards, outcome_rewards

if TYPE_CHECKING:
    from accelerate import Accelerator

    from pipeline.text.curriculum import OnlineCurriculum

T = TypeVar("T")
#: What it writes under data/rl_text besides model/ (stages/rl_text.py removes another algorithm's).
OUTPUTS = frozenset({"replay", "state", "episodes"})
#: What data/rl_text/episodes keeps of each episode: the round's success statistics and the curriculum's scores.
EPISODE_KEYS = ("group", "task_id", "sample", "success", "invalid", "turns", "score")
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
TRANSITION_SCHEMA = pa.schema([
    ("group", pa.string()), ("task_id", pa.string()), ("sample", pa.int32()), ("turn", pa.int32()),
    ("state", pa.list_(MESSAGE)), ("action", pa.string()), ("reward", pa.float64()),
    ("next_state", pa.list_(MESSAGE)), ("done", pa.bool_()), ("round", pa.int32()),
])


# -- the formulas (tested on hand-computed numbers) ---------------------------------------------------------
def q_targets(reward: torch.Tensor, done: torch.Tensor, v1_next: torch.Tensor, v2_next: torch.Tensor,
              gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Q_i(s, a) ← r + γ(1−d)·V̄_i(s′), one target per head, from the target critic's V heads."""
    live = 1.0 - done.float()
    return reward + gamma * live * v1_next, reward + gamma * live * v2_next


def advantage(q1: torch.Tensor, q2: torch.Tensor, v1: torch.Tensor, v2: torch.Tensor) -> torch.Tensor:
    """A = min(Q1, Q2)(s, a) − min(V1, V2)(s): both minima curb over-estimation."""
    return torch.minimum(q1, q2) - torch.minimum(v1, v2)


def actor_loss(logp: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    """−mean(log π(a|s)·A): minimising it raises the probability of utterances with positive advantage."""
    return -(logp * adv.detach()).mean()


@torch.no_grad()
def polyak_(target: nn.Module, online: nn.Module, tau: float) -> None:
    """θ̄ ← (1−τ)·θ̄ + τ·θ, in place."""
    for t, o in zip(target.parameters(), online.parameters(), strict=True):
        t.mul_(1.0 - tau).add_(o, alpha=tau)


def critic_step(critic: DoubleCritic, target: DoubleCritic, opt: torch.optim.Optimizer, batch: list[dict],
                sample_pi: Callable[[list[list[dict]]], list[str]], gamma: float, tau: float,
                grad_clip: float, accelerator: Accelerator | None = None) -> float:
    """One gradient step on MSE to the four targets, then the Polyak update of the target; returns the loss.

    With an ``accelerator`` (several processes), ``batch`` is the global batch, each process computes on its
    share and ``critic`` is the prepared (DDP) model: the averaged gradient is the global batch's.
    """
    mine, share = own_share(batch, accelerator)
    states = [b["state"] for b in mine]
    with torch.no_grad():
        vbar1, vbar2 = target.values([b["next_state"] for b in mine])
        reward = torch.tensor([b["reward"] for b in mine], dtype=torch.float32, device=vbar1.device)
        done = torch.tensor([b["done"] for b in mine], device=vbar1.device)
        qt1, qt2 = q_targets(reward, done, vbar1, vbar2, gamma)
        qbar1, qbar2, _, _ = target(states, sample_pi(states))
    q1, q2, v1, v2 = critic(states, [b["action"] for b in mine])
    mse = nn.functional.mse_loss
    loss = (mse(q1, qt1) + mse(q2, qt2) + mse(v1, qbar1) + mse(v2, qbar2)) * share
    optimizer_step(loss, critic, opt, grad_clip, accelerator)
    polyak_(target, unwrapped(critic), tau)
    return process_mean(loss, accelerator)


# -- the actor ----------------------------------------------------------------------------------------------
def utterance_logprobs(model, tokenizer, states: list[list[dict]], actions: list[str]) -> torch.Tensor:
    """log π(a|s) summed over the utterance's tokens (its end-of-turn token included), batched.

    Rows are left-padded so every utterance ends at the last position, with position ids counted from each
    row's first real token: a padded row scores exactly as it does alone (the ArCHer code's right padding
    shifted positions; tests/test_rl_text.py checks batched == one at a time).
    """
    seqs, lengths = [], []
    config = unwrapped(model).config  # ``model`` may be accelerate's DDP wrapper
    max_pos = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    for s, a in zip(states, actions, strict=True):
        prompt = tokenizer.apply_chat_template(s, add_generation_prompt=True, return_dict=False)
        full = tokenizer.apply_chat_template(s + [{"role": "assistant", "content": a}], return_dict=False)
        if list(full[: len(prompt)]) != list(prompt):
            raise ValueError("the chat template does not extend the generation prompt with the assistant turn")
        n = len(full) - len(prompt)
        full = list(full)[-max_pos:] if max_pos else list(full)  # keep the newest context
        seqs.append(full)
        lengths.append(min(n, len(full) - 1))
    device = next(model.parameters()).device
    width = max(len(x) for x in seqs)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(x)) + x for x in seqs], device=device)
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in seqs], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, :-1]
    token_logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    cols = torch.arange(width - 1, device=device)
    in_action = cols.unsqueeze(0) >= (width - 1 - torch.tensor(lengths, device=device)).unsqueeze(1)
    return (token_logp * in_action).sum(-1)


def actor_step(policy, tokenizer, critic: DoubleCritic, opt: torch.optim.Optimizer, states: list[list[dict]],
               sample_pi: Callable[[list[list[dict]]], list[str]], grad_clip: float,
               accelerator: Accelerator | None = None) -> dict[str, float]:
    """One policy-gradient step on fresh a_π (``states``: the global batch; see ``critic_step``)."""
    mine, share = own_share(states, accelerator)
    actions = sample_pi(mine)
    with torch.no_grad():
        adv = advantage(*critic(mine, actions))
    logp = utterance_logprobs(policy, tokenizer, mine, actions)
    loss = actor_loss(logp, adv) * share
    optimizer_step(loss, policy, opt, grad_clip, accelerator)
    return {"loss": process_mean(loss, accelerator), "advantage": process_mean(adv.mean() * share, accelerator)}


# -- several processes (accelerate) --------------------------------------------------------------------------
def own_share(batch: list, accelerator: Accelerator | None) -> tuple[list, float]:
    """This process's contiguous part of a global batch, and the weight m·N/b that turns its mean loss into its
    part of the global mean: DDP averages the N gradients, so the result is the gradient of the mean over all
    b items even when b (a buffer smaller than the batch) does not split evenly. One process: (batch, 1.0)."""
    if accelerator is None:
        return batch, 1.0
    with accelerator.split_between_processes(batch) as mine:
        if not mine:  # a process without items would skip the collective backward and hang the others
            raise CurioError(f"rl-text: a batch of {len(batch)} cannot be split over {accelerator.num_processes} "
                             "processes (the replay buffer is smaller than the number of processes)")
        return mine, len(mine) * accelerator.num_processes / len(batch)


def optimizer_step(loss: torch.Tensor, model: nn.Module, opt: torch.optim.Optimizer, grad_clip: float,
                   accelerator: Accelerator | None) -> None:
    """Backward (DDP's averaged gradients under accelerate), clip the gradient norm, step."""
    opt.zero_grad()
    if accelerator is None:
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    else:
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()


def process_mean(value: torch.Tensor, accelerator: Accelerator | None) -> float:
    """The mean of a per-process value over the processes (itself in one process)."""
    return (value if accelerator is None else accelerator.reduce(value.detach(), "mean")).item()


def unwrapped(model: nn.Module) -> nn.Module:
    """The model under accelerate's DDP wrapper (itself when not wrapped)."""
    from accelerate.utils import extract_model_from_parallel

    return extract_model_from_parallel(model)


def from_main(value: T, accelerator: Accelerator | None) -> T:
    """The main process's ``value`` in every process (the others pass anything, e.g. None)."""
    if accelerator is None:
        return value
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([value])[0]


def global_batch(rng: random.Random, buffer: list[dict] | None, size: int,
                 accelerator: Accelerator | None) -> list[dict]:
    """A batch the main process samples from its buffer (as one process does), in every process."""
    return from_main(rng.sample(buffer, min(size, len(buffer))) if buffer is not None else None, accelerator)


def process_seed(seed: int, name: str, index: int, accelerator: Accelerator | None) -> int:
    """One process's seed for round ``index``: the one-process seed for the main process, distinct draws for the
    others (their samples must not repeat the main process's)."""
    rank = accelerator.process_index if accelerator is not None else 0
    return chunk_seed(seed, name if rank == 0 else f"{name}/process-{rank}", index)


# -- replay buffer ------------------------------------------------------------------------------------------
def transitions(row: dict, round_index: int, score_by_turns: bool,
                turn_rewards: list[float] | None = None) -> list[dict]:
    """An episode row's utterance-level transitions. The last one is terminal (win, turn limit, or an
    unparseable turn that ended the episode). ``turn_rewards`` (one per utterance) replace the game's reward."""
    conv, start = row["conversation"], 2  # system prompt + first user message open every game
    turns = [i for i in range(start, len(conv)) if conv[i]["role"] == "assistant"]
    if turn_rewards is not None and len(turn_rewards) != len(turns):
        raise ValueError(f"{len(turn_rewards)} utterance rewards for {len(turns)} utterances")
    rewards = turn_rewards if turn_rewards is not None else outcome_rewards(row, score_by_turns)
    out = []
    for k, i in enumerate(turns):
        out.append({"group": row["group"], "task_id": row["task_id"], "sample": row["sample"], "turn": k,
                    "state": conv[:i], "action": conv[i]["content"], "reward": float(rewards[k]),
                    "next_state": conv[: i + 2], "done": k == len(turns) - 1, "round": round_index})
    return out


class ReplayBuffer:
    """Transitions, one Parquet part per round; sampling sees the newest ``capacity`` of them."""

    def __init__(self, path: Path, params_hash: str, upstream: dict[str, str], capacity: int) -> None:
        self.data = ChunkedDataset(path, params_hash=params_hash, upstream=upstream)
        self.capacity = capacity

    def add(self, round_index: int, rows: list[dict]) -> None:
        self.data.write_part(round_index, rows, TRANSITION_SCHEMA)

    def contents(self, upto: int) -> list[dict]:
        """The newest ``capacity`` transitions of rounds ≤ ``upto``."""
        import pyarrow.parquet as pq

        rows: list[dict] = []
        for i in sorted(i for i in self.data.finished() if i <= upto):
            rows.extend(pq.read_table(self.data.path / self.data.parts[i].file).to_pylist())
        return rows[-self.capacity:]


# -- the loop -----------------------------------------------------------------------------------------------
def run(params: Params, ctx: StageContext) -> StageResult:
    return train_loop(params, ctx, actor=True)


def sampler(backend: ChatBackend, sampling: Sampling) -> Callable[[list[list[dict]]], list[str]]:
    return lambda states: [g.text for g in backend.generate(states, sampling)]


def train_loop(params: Params, ctx: StageContext, actor: bool,
               acting: Callable[[HFBackend, DoubleCritic], ChatBackend] | None = None,
               extra_outputs: Callable[[Path, DoubleCritic], None] | None = None) -> StageResult:
    """Rounds of rollouts → critic steps → (``actor``) actor steps, each round checkpointed.

    ``acting`` wraps the policy into the backend that plays and whose samples are a_π (CHAI: the critic's
    re-ranking); ``extra_outputs`` adds files to the final model directory (CHAI: the critic).

    With ``train_policy.num_processes`` > 1 (or an accelerate config file) the stage runs under ``accelerate
    launch``: every process plays its share of each round's episodes and computes each critic / actor step on
    its share of the global batch (DDP averages the gradients), the main process alone holds the replay buffer,
    samples the batches and writes; see ``train_processes``.
    """
    processes, config_file = requested()
    if processes > 1 or config_file:
        check_batches(params.rl_text, processes, actor)
        # the whole stage in each process (stages/rl_text.py runs rl_text.algorithm's module)
        return launched_stage(STAGES[NAME], NAME, params, ctx, num_processes=processes, config_file=config_file)
    return train_processes(params, ctx, actor, acting, extra_outputs)


def check_batches(cfg: RLTextConfig, processes: int, actor: bool) -> None:
    """Each process takes an equal share of every global batch of the ``rl_text`` params section (as in train-sft /
    train-dpo): ConfigError else."""
    sizes = {"rl_text.critic.batch_size": cfg.critic.batch_size}
    if actor:
        sizes["rl_text.archer.batch_size"] = cfg.archer.batch_size
    for key, size in sizes.items():
        if size % processes:
            raise ConfigError(f"train_policy.num_processes: {processes} processes cannot split {key}={size}")


def train_processes(params: Params, ctx: StageContext, actor: bool,
                    acting: Callable[[HFBackend, DoubleCritic], ChatBackend] | None = None,
                    extra_outputs: Callable[[Path, DoubleCritic], None] | None = None) -> StageResult:
    """The loop, in one process or in each of the processes ``accelerate launch`` started.

    Several processes: the policy, critic and their optimisers are prepared by ``accelerate.Accelerator`` (DDP);
    the target critic is updated by the same Polyak step in each. The main process decides where to resume,
    holds the replay buffer and writes everything a process writes alone (replay parts, episodes, round
    checkpoints, model), so the files on disk are the one-process run's: any number of processes resumes them.
    The other processes get what they need from it (``from_main``) and gather their episodes to it.
    """
    cfg = params.rl_text
    loop = start_loop(params, actor, acting)
    for r in range(loop.start, cfg.rounds):
        with interrupt.at(f"round {r + 1} of {cfg.rounds}") as point:
            if not from_main(loop.main and r in loop.replay.data.finished(), loop.accelerator):
                play_round(loop, r)
                point.text += " (its episodes played)"  # kept: the rerun redoes its gradient steps only
                stop_here(loop.accelerator)
            stats = train_round(loop, r)
            if loop.main:
                round_stats = summarize(json.loads((loop.out / "episodes" / f"round-{r:03d}.json").read_text()))
                ctx.tracker.log_metrics({"rl/success_rate": round_stats["success_rate"],
                                         **{f"rl/{k}": v for k, v in stats.items()}}, step=r)
                save_round(loop.state_dir, r, loop.policy, loop.tokenizer, loop.critic, loop.target, loop.critic_opt,
                           loop.actor_opt, stats)
        if r + 1 < cfg.rounds:
            stop_here(loop.accelerator)  # the round is checkpointed: the next one starts the rerun
    return end_loop(loop, extra_outputs)


@dataclass
class Loop:
    """What the rounds of :func:`train_processes` share: where they run, what they play, what they train."""

    params: Params
    actor: bool
    out: Path
    init: str
    accelerator: Accelerator | None
    device: str
    main: bool  # the process that holds the replay buffer and writes
    replay: ReplayBuffer | None = None  # the main process's
    state_dir: Path | None = None  # the main process's
    start: int = 0  # the first round not checkpointed
    games: list = field(default_factory=list)
    jobs: list = field(default_factory=list)
    sampling: Sampling | None = None
    curriculum: OnlineCurriculum | None = None
    rewarder: TurnRewards | None = None
    policy: Any = None
    tokenizer: Any = None
    critic: DoubleCritic | None = None
    target: DoubleCritic | None = None
    critic_opt: Any = None  # the optimisers: prepared by accelerate in several processes
    actor_opt: Any = None
    backend: HFBackend | None = None  # the policy; ``player`` wraps it (CHAI's re-ranking)
    player: ChatBackend | None = None
    trained_critic: Any = None  # what the gradient steps run: DDP-wrapped in several processes
    trained_policy: Any = None


def start_loop(params: Params, actor: bool, acting: Callable[[HFBackend, DoubleCritic], ChatBackend] | None) -> Loop:
    """The processes, the round to resume from, the games, the reward and the models (a round's checkpoint)."""
    accelerator, device = start_processes(params, actor)
    loop = Loop(params, actor, params.data_path("rl_text"), require_policy(params, "dpo"), accelerator, device,
                main=accelerator is None or accelerator.is_main_process)
    if loop.main:
        key, init_hash = params_key(params), dir_hash(loop.init)
        loop.replay = ReplayBuffer(loop.out / "replay", key, {"init": init_hash}, params.rl_text.critic.buffer_capacity)
        # Round checkpoints of other params or another init are stale: never resumed.
        loop.state_dir = keyed_dir(loop.out / "state", run_key(key, init_hash))
        done = sorted(int(p.name.split("-")[1]) for p in loop.state_dir.glob("round-*") if (p / "DONE").exists())
        loop.start = done[-1] + 1 if done else 0
    loop.start = from_main(loop.start, accelerator)  # the others load the checkpoint the main process resumes from
    loop.games = make_games(params, params.rl_text.groups)
    loop.jobs = train_jobs(params.games, params.rl_text.max_train_tasks, loop.games)
    loop.sampling = sampling_from_config(params.rollout_text)
    loop.curriculum = online_curriculum(  # read by the main process only: it holds the episodes
        params.rl_text, params.seed, loop.jobs,
        lambda i: json.loads((loop.out / "episodes" / f"round-{i:03d}.json").read_text()))
    loop.rewarder = make_turn_rewards(params, params_key(params))
    load_models(loop)
    loop.backend = HFBackend(loop.init, batch_size=params.rollout_text.batch_size, model_obj=loop.policy,
                             tokenizer=loop.tokenizer, device=device, drop_finished=params.policy.drop_finished,
                             kv_cache_bytes=int(params.policy.kv_cache_gib * 2**30))
    # plays and samples a_π with the unwrapped models
    loop.player = acting(loop.backend, loop.critic) if acting else loop.backend
    loop.trained_critic, loop.trained_policy = loop.critic, loop.policy
    if accelerator is not None:
        loop.trained_critic, loop.critic_opt = accelerator.prepare(loop.critic, loop.critic_opt)
        if actor:
            loop.trained_policy, loop.actor_opt = accelerator.prepare(loop.policy, loop.actor_opt)
    return loop


def start_processes(params: Params, actor: bool) -> tuple[Accelerator | None, str]:
    """(the ``accelerate.Accelerator`` of this process, its device); (None, ``policy.device``) in one process."""
    if world_size() <= 1:
        return None, params.policy.device
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    # an encoder's unused parts (e.g. a BERT pooler) get no gradient: DDP must not wait for them
    accelerator = Accelerator(cpu=not params.policy.device.startswith("cuda"),
                              kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    check_batches(params.rl_text, accelerator.num_processes, actor)  # an accelerate config file's processes
    return accelerator, str(accelerator.device)


def load_models(loop: Loop) -> None:
    """The policy, critic, target critic and optimisers: the checkpoint of the round before ``loop.start``, or the
    initial policy and a fresh critic."""
    params, ccfg, device = loop.params, loop.params.rl_text.critic, loop.device
    ckpt = loop.out / "state" / f"round-{loop.start - 1:03d}" if loop.start else None
    loop.policy, loop.tokenizer = load_policy(ckpt / "policy" if ckpt else loop.init, device)
    if ckpt:
        loop.critic = DoubleCritic.load(ckpt / "critic", device)
        loop.target = DoubleCritic.load(ckpt / "target", device)
    else:
        torch.manual_seed(chunk_seed(params.seed, NAME + "/critic", 0))
        encoder, enc_tok = load_encoder(loop.init if ccfg.model == "policy" else ccfg.model)
        loop.critic = DoubleCritic(encoder, enc_tok, ccfg.max_state_tokens,
                                   params.rollout_text.max_new_tokens).to(device)
        loop.target = copy.deepcopy(loop.critic)
    loop.critic_opt = torch.optim.Adam(loop.critic.parameters(), lr=ccfg.lr)
    loop.actor_opt = torch.optim.Adam(loop.policy.parameters(), lr=params.rl_text.archer.actor_lr)
    if ckpt:
        opts = torch.load(ckpt / "optimizers.pt", weights_only=True)
        loop.critic_opt.load_state_dict(opts["critic"])
        loop.actor_opt.load_state_dict(opts["actor"])


def play_round(loop: Loop, r: int) -> None:
    """Round ``r``'s episodes, played by every process (its share) with their turn rewards; the main process
    writes them (``episodes/``) and adds their transitions to the replay buffer as part r."""
    params, accelerator, main, curriculum = loop.params, loop.accelerator, loop.main, loop.curriculum
    mine = main or curriculum is None
    keys = round_episodes(params.rl_text, params.seed, loop.jobs, r, curriculum) if mine else None
    episodes = episode_jobs(loop.jobs, keys if curriculum is None else from_main(keys, accelerator))
    if accelerator is not None:  # each process plays a contiguous part; gathered back in order
        with accelerator.split_between_processes(episodes) as part:
            episodes = part
    with torch.no_grad():
        rows = play_episodes(loop.player, episodes, loop.sampling, seed=process_seed(params.seed, NAME, r, accelerator),
                             max_format_retries=params.rollout_text.max_format_retries,
                             policy_name=f"{params.rl_text.algorithm}-round-{r}")
        if loop.rewarder is not None:  # judge: continuations by the policy itself (CHAI: before re-ranking)
            rewards = loop.rewarder(loop.backend, loop.tokenizer, loop.games, rows,
                                    process_seed(params.seed, f"{NAME}/judge", r, accelerator), r)
            rows = [{**row, "turn_rewards": got} for row, got in zip(rows, rewards, strict=True)]
    if accelerator is not None:
        from accelerate.utils import gather_object

        rows = gather_object(rows)
    if main:
        score_by_turns = {g.name: g.score_by_turns for g in loop.games}
        # before the part that marks r played
        atomic_write_json(loop.out / "episodes" / f"round-{r:03d}.json",
                          [{k: row[k] for k in EPISODE_KEYS} for row in rows])
        loop.replay.add(r, [tr for row in rows for tr in transitions(row, r, score_by_turns[row["group"]],
                                                                      row.get("turn_rewards"))])


def train_round(loop: Loop, r: int) -> dict[str, float]:
    """Round ``r``'s critic steps, then (the actor, after the warm-up rounds) its actor steps: their mean losses."""
    params, accelerator = loop.params, loop.accelerator
    ccfg, acfg = params.rl_text.critic, params.rl_text.archer
    # same RNG whether rollouts ran or not
    torch.manual_seed(process_seed(params.seed, NAME + "/train", r, accelerator))
    rng = random.Random(chunk_seed(params.seed, NAME, r))
    buffer = loop.replay.contents(r) if loop.main else None
    stats: dict[str, float] = {}
    if not from_main(bool(buffer), accelerator):
        return stats
    sample_pi = sampler(loop.player, loop.sampling)
    losses = [critic_step(loop.trained_critic, loop.target, loop.critic_opt,
                          global_batch(rng, buffer, ccfg.batch_size, accelerator), sample_pi, ccfg.gamma, ccfg.tau,
                          ccfg.grad_clip, accelerator) for _ in range(ccfg.steps)]
    stats["critic_loss"] = sum(losses) / len(losses)
    if loop.actor and r >= acfg.warmup_rounds and acfg.actor_steps:
        steps = [actor_step(loop.trained_policy, loop.tokenizer, loop.critic, loop.actor_opt,
                            [b["state"] for b in global_batch(rng, buffer, acfg.batch_size, accelerator)],
                            sample_pi, ccfg.grad_clip, accelerator) for _ in range(acfg.actor_steps)]
        stats["actor_loss"] = sum(s["loss"] for s in steps) / len(steps)
        stats["advantage"] = sum(s["advantage"] for s in steps) / len(steps)
    return stats


def end_loop(loop: Loop, extra_outputs: Callable[[Path, DoubleCritic], None] | None) -> StageResult:
    """After the last round: the reward closed; the main process saves the model and gives the stage's result."""
    if loop.rewarder is not None:
        loop.rewarder.close()
    if not loop.main:
        return StageResult()
    final = loop.out / "model"
    if final.exists():
        shutil.rmtree(final)
    tiny.save(loop.policy, loop.tokenizer, final)
    if extra_outputs:
        extra_outputs(final, loop.critic)
    loop.replay.data.mark_complete(loop.params.rl_text.rounds)
    result = finish(loop.params, loop.out)
    result.metrics.update(curriculum_metrics(loop.params.rl_text, loop.curriculum))
    if loop.rewarder is not None:
        result.metrics.update(loop.rewarder.metrics())
    return result


def stop_here(accelerator: Accelerator | None) -> None:
    """``Stopped`` if a stop was asked for (SIGTERM): in several processes, all stop when the main process was
    asked (torchrun passes the signal to each of them, not at the same instant)."""
    if from_main(interrupt.requested() is not None, accelerator):
        raise interrupt.stopped()


def save_round(state_dir: Path, r: int, policy, tokenizer, critic: DoubleCritic, target: DoubleCritic,
               critic_opt: torch.optim.Optimizer, actor_opt: torch.optim.Optimizer, stats: dict) -> None:
    """Write round r's checkpoint beside the previous one, mark it DONE, then drop the older one."""
    tmp = state_dir / f".round-{r:03d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tiny.save(policy, tokenizer, tmp / "policy")
    critic.save(tmp / "critic")
    target.save(tmp / "target")
    torch.save({"critic": critic_opt.state_dict(), "actor": actor_opt.state_dict()}, tmp / "optimizers.pt")
    atomic_write_json(tmp / "stats.json", stats)
    final = state_dir / f"round-{r:03d}"
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    atomic_write_bytes(final / "DONE", b"ok")  # whole or absent, even on a full disk
    for old in state_dir.glob("round-*"):
        if old != final:
            shutil.rmtree(old)


def finish(params: Params, out: Path) -> StageResult:
    """Metrics over all rounds' episodes and the success-vs-episodes history (a dvc plot)."""
    cfg = params.rl_text
    history, rows, episodes = [], [], 0
    for r in range(cfg.rounds):
        part = json.loads((out / "episodes" / f"round-{r:03d}.json").read_text())
        episodes += len(part)
        rows.extend(part)
        history.append({"round": r, **summarize(part), "episodes": episodes, "algorithm": cfg.algorithm})
    atomic_write_json(params.plots_path("rl_rounds.json"), history)
    metrics = {f"rollouts/{k}": v for k, v in summarize(rows).items()}
    if cfg.rounds:
        metrics.update({f"rl/{k}": v for k, v in
                        json.loads(next((out / "state").glob("round-*/stats.json")).read_text()).items()})
    metrics["rl/transitions"] = len(read_rows(out / "replay", ["done"])) if cfg.rounds else 0
    return StageResult(metrics=metrics, outputs=[str(out / "model")])
