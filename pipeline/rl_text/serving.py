"""Where an online algorithm's policy plays (GRPO, filtered BC): the configured policy backend, one per run.

- ``hf``: the policy's model itself, in the stage's process (a float32 policy samples from the trainer's own
  distribution: its log-probs are the trainer's, to float rounding: :attr:`PolicyPlayer.exact_sampler`).
- ``vllm``: one vLLM server for the whole run, started on the first weights played and following the policy: each
  round's weights are loaded into it in place (``reload_weights``, pipeline.llm.vllm), so rounds, val passes and a
  resumed run all play on the server started once (:attr:`PolicyPlayer.starts` counts its starts). vLLM 0.32's
  in-place reload leaves a tied output layer on the weights it started with (measured on SmolLM2: docs/vllm.md), so
  weights whose input or output embeddings changed (a full fine-tune) start the server again on them, counted and
  logged; LoRA training (``rl_text.lora``) changes neither, and its run starts one server.

Other backends have no weights the stage can update; check-params refuses them for online RL.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from pipeline.core.config import ConfigError
from pipeline.llm.base import ChatBackend
from pipeline.params import Params

log = logging.getLogger(__name__)

#: The vLLM server's arguments for online RL: the sampler's log-probs after temperature, min-p, top-k and top-p.
SERVER_ARGS = ("--logprobs-mode", "processed_logprobs")


def embeddings_digest(model) -> str:
    """A digest of the model's input and output embeddings (the weights an in-place reload cannot follow)."""
    digest = hashlib.sha256()
    for layer in (model.get_input_embeddings(), model.get_output_embeddings()):
        if layer is not None:
            digest.update(layer.weight.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


class PolicyPlayer:
    """The backend an online algorithm plays its policy with, round after round (``backend``), and the one server
    of a vLLM run; ``close`` stops it."""

    def __init__(self, params: Params) -> None:
        self.params = params
        self.server = None  # pipeline.llm.vllm.VLLMBackend of a vllm policy, once started
        self.serving: Path | None = None
        self.digest: str | None = None
        self.starts = 0

    @property
    def exact_sampler(self) -> bool:
        """Whether the sampler's log-probs are the trainer's (to float rounding): an hf policy in float32."""
        return self.params.policy.backend == "hf" and self.params.policy.dtype == "float32"

    def backend(self, weights: Path, model, tokenizer) -> ChatBackend:
        """A backend playing the policy whose weights are saved in ``weights`` (``model`` holds them in memory)."""
        policy = self.params.policy
        if policy.backend == "hf":
            from pipeline.llm.hf import HFBackend

            return HFBackend(weights, batch_size=self.params.rollout_text.batch_size, model_obj=model,
                             tokenizer=tokenizer, drop_finished=policy.drop_finished, dtype=policy.dtype,
                             cpu_linear=policy.cpu_linear, kv_cache_bytes=int(policy.kv_cache_gib * 2**30))
        if policy.backend != "vllm":
            raise ConfigError(f"params: policy.backend: {policy.backend}: online RL trains the policy's weights, and "
                              "this backend has none Curio can update: set policy.backend to hf or vllm")
        digest = embeddings_digest(model)
        if self.server is not None and Path(weights) != self.serving:
            if digest == self.digest:
                self.server.load_weights(weights)
            else:
                log.warning("rl-text: the policy's embeddings changed (not a LoRA update): vLLM cannot reload them in "
                            "place, so its server starts again on %s", weights)
                self.close()
        if self.server is None:
            self.server = self._start(weights)
            self.starts += 1
        self.serving, self.digest = Path(weights), digest
        return self.server

    def _start(self, weights: Path):
        from pipeline.llm.vllm import VLLMBackend

        policy, batch = self.params.policy, self.params.rollout_text.batch_size
        return VLLMBackend(str(weights), device=policy.device, dtype=policy.dtype, server_args=SERVER_ARGS,
                           weight_updates=True, max_concurrency=batch, max_tokens=8192, timeout_s=900.0)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
            self.serving = None

    def metrics(self) -> dict[str, float]:
        return {"rl/server_starts": self.starts} if self.params.policy.backend == "vllm" else {}
