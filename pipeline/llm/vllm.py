"""In-process vLLM: one ``LLM.chat`` call over the whole batch, where vLLM imports beside Curio (docs/stack.md)."""

from __future__ import annotations

from typing import Any

from pipeline.llm.base import ChatBackend, Conversation, Generation, Sampling

INSTALL_HINT = ("the vllm backend needs vLLM in this environment, and vLLM pins its own torch and transformers: "
                "serve the model from vLLM's own environment and use backend: openai with its base_url "
                "(docs/stack.md, \"vLLM in its own environment\")")


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    return vllm


class VLLMBackend(ChatBackend):
    """Batched chat on a vLLM engine held in this process.

    Args:
        model: HF model id or local path.
        max_tokens: hard cap on generated tokens, whatever the sampling asks for.
        engine_kwargs: passed to ``vllm.LLM`` (e.g. ``tensor_parallel_size``, ``gpu_memory_utilization``);
            ``enable_prefix_caching`` is on unless set to False here.
    """

    name = "vllm"

    def __init__(self, model: str, *, max_tokens: int = 128, **engine_kwargs: Any) -> None:
        super().__init__(model)
        self._vllm = import_vllm()
        self.max_tokens = max_tokens
        # A multi-turn game sends each conversation again every turn: prefix caching computes only the new tokens.
        engine_kwargs.setdefault("enable_prefix_caching", True)
        self._llm = self._vllm.LLM(model=model, **engine_kwargs)

    def generate(self, conversations: list[Conversation], sampling: Sampling) -> list[Generation]:
        if not conversations:
            return []
        params = self._vllm.SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            min_p=sampling.min_p,
            max_tokens=min(sampling.max_tokens, self.max_tokens),
            seed=sampling.seed,
            stop=list(sampling.stop) or None,
            logprobs=0 if sampling.logprobs else None,  # 0 = only the sampled token's log-prob
        )
        outputs = self._llm.chat(conversations, sampling_params=params, use_tqdm=False)
        generations = []
        for out in outputs:
            completion = out.outputs[0]
            logprobs = None
            if sampling.logprobs and completion.logprobs is not None:
                steps = zip(completion.token_ids, completion.logprobs, strict=False)
                logprobs = [float(step[token].logprob) for token, step in steps]
            generations.append(
                Generation(
                    text=completion.text,
                    token_logprobs=logprobs,
                    tokens_in=len(out.prompt_token_ids or ()),
                    tokens_out=len(completion.token_ids),
                )
            )
        return generations

    def close(self) -> None:
        self._llm = None
