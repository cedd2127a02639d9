"""``curio llm check ROLE``: send one request with a role's configured backend, report answer and timing."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from pipeline.llm import make_backend, sampling_from_config
from pipeline.llm.config import LLMConfig, llm_roles
from pipeline.llm.embedding import EmbeddingBackend

# Short names for the roles the stages use (README: policy, environment, judge, annotator); any dotted params key
# naming an LLMConfig works too.
ROLE_KEYS = {
    "judge": "annotate_text.judge",
    "environment": "rollout_text.environment",
    "annotator": "annotate_nethack.annotator",
}
POLICY = "policy"  # not an LLMConfig: the trained policy, served by its backend (policy.backend)
CHECK_PROMPT = "Reply with the single word: ready"
CHECK_TIMEOUT_S = 10.0  # a check fails fast: one attempt, a short timeout


class CheckFailed(RuntimeError):
    """The request failed; the message is the full report."""


#: Where the named policy lives (``pipeline.text.policies.policy_path``: the LLM layer knows no stages or games).
PolicyPath = Callable[[BaseModel, str], str]


def resolve_role(params: BaseModel, role: str, policy_path: PolicyPath | None = None) -> tuple[str, LLMConfig]:
    """(dotted key, config) of a role name or dotted key; ValueError listing the known ones otherwise."""
    roles = llm_roles(params)
    if role == POLICY:
        if policy_path is None:
            raise ValueError("llm: checking the policy needs where it lives (policy_path)")
        path = policy_path(params, "base")
        if params.policy.backend == "hf" and not Path(path).exists():
            raise ValueError(f"llm: policy: no model at {path} (run the bootstrap stage, or set policy.model)")
        return "policy", LLMConfig(backend=params.policy.backend, model=path, device=params.policy.device)
    key = ROLE_KEYS.get(role, role)
    if key not in roles:
        known = sorted({*ROLE_KEYS, POLICY, *roles})
        raise ValueError(f"llm: no LLM role {role!r} in params (known: {', '.join(known)})")
    return key, roles[key]


def check_role(params: BaseModel, role: str, policy_path: PolicyPath | None = None) -> str:
    """Send one request (bypassing the cache) with ``role``'s backend; a printable report.

    Raises CheckFailed (message = the report) when the request fails, ValueError for an unknown role.
    """
    if role == POLICY and params.policy.backend == "scripted":
        return f"role: policy\nbackend: scripted ({params.policy.model}): the games' scripted players; no LLM request"
    key, cfg = resolve_role(params, role, policy_path)
    lines = [f"role: {role} ({key})", f"backend: {cfg.backend}  model: {cfg.model or '(default)'}"]
    if cfg.backend == "openai":
        lines.append(f"base_url: {cfg.base_url or '(SDK default)'}")
        if cfg.api_key_env:
            state = "set" if os.environ.get(cfg.api_key_env) else "NOT SET"
            lines.append(f"api key: from ${cfg.api_key_env} ({state})")
    if cfg.backend == "rules" and cfg.model in {"oracle", "exact_match"}:
        lines.append(f"rules program {cfg.model!r}: answered by the game engine in code; no LLM request to send")
        return "\n".join(lines)

    start = time.monotonic()
    try:
        backend = make_backend(cfg.model_copy(update={
            "cache": False, "max_retries": 0, "timeout_s": min(cfg.timeout_s, CHECK_TIMEOUT_S)}), role=role)
    except Exception as e:  # noqa: BLE001 - reported, not raised raw: the CLI prints one clear line
        raise CheckFailed(f"llm check {role}: error: could not create the {cfg.backend} backend: "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    lines.append(f"backend ready in {time.monotonic() - start:.3f} s")
    start = time.monotonic()
    try:
        if isinstance(backend, EmbeddingBackend):
            sims = backend.similarity(["You kill the newt!", "You see here a scroll."], "kill monsters")
            elapsed = time.monotonic() - start
            lines += [
                f"embedded 3 texts in {elapsed:.3f} s (model load included; dim {backend.dim})",
                f"similarity to 'kill monsters': {sims[0]:.3f}, {sims[1]:.3f}",
            ]
            return "\n".join(lines)
        sampling = sampling_from_config(cfg, max_tokens=min(cfg.max_tokens, 32))
        quiet = logging.getLogger("pipeline.llm.openai_backend")  # its failure warning would repeat our one line
        level, quiet.level = quiet.level, logging.ERROR
        try:
            [g] = backend.generate([[{"role": "user", "content": CHECK_PROMPT}]], sampling)
        finally:
            quiet.setLevel(level)
        elapsed = time.monotonic() - start
        lines.append(f"1 request in {elapsed:.3f} s (retries: {g.meta.get('retries', 0)})")
        if g.error is not None:
            where = f" at {cfg.base_url}" if cfg.base_url else ""
            raise CheckFailed(f"llm check {role}: error: {g.error} ({cfg.backend}{where}; 1 attempt, "
                              f"{elapsed:.2f} s, timeout {min(cfg.timeout_s, CHECK_TIMEOUT_S):g} s)")
        lines += [f"reply: {g.text!r}", f"tokens in/out: {g.tokens_in}/{g.tokens_out}"]
        return "\n".join(lines)
    finally:
        backend.close()
