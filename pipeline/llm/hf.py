"""Local transformers causal LM as a chat backend: batched, left-padded, sampled or greedy."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

# Imported here, not lazily inside functions: transformers' lazy module is not safe when two threads
# (e.g. the eval-sweep's parallel Prefect tasks) resolve the same name at once.
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.llm.base import ChatBackend, Conversation, Generation, Sampling
from pipeline.models.chat import encode_prompt, stop_token_ids
from pipeline.models.gguf import resolve_model

# from_pretrained initialises on the meta device through process-wide state: one load at a time.
_LOAD_LOCK = threading.Lock()


def load_policy(path: str | Path, device: str = "cpu", dtype: torch.dtype | None = None):
    """Load a causal LM + tokenizer saved with ``save_pretrained``, any HF model id, or ``gguf:...`` (imported once,
    see ``pipeline.models.gguf.resolve_model``)."""
    path = resolve_model(str(path))
    with _LOAD_LOCK:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device).eval()
    return model, tokenizer


class HFBackend(ChatBackend):
    """Batched chat generation with a transformers model; conversations of a batch are left-padded."""

    name = "hf"

    def __init__(self, model: str | Path, device: str = "cpu", batch_size: int = 64, model_obj=None,
                 tokenizer=None) -> None:
        super().__init__(str(model))
        if model_obj is None:
            model_obj, tokenizer = load_policy(model, device)
        self.lm = model_obj
        self.tokenizer = tokenizer
        self.device = device
        self.batch_size = batch_size
        self.tokenizer.padding_side = "left"
        # A turn ends at the chat template's own end-of-turn token, or at EOS.
        self.stop_ids = stop_token_ids(self.tokenizer)
        self.max_positions = (getattr(self.lm.config, "n_positions", None)
                              or getattr(self.lm.config, "max_position_embeddings", 0))

    def encode(self, conversations: list[Conversation], max_new_tokens: int = 0) -> list[list[int]]:
        """Prompt ids; a conversation too long for the context drops its oldest turns (logged)."""
        return [encode_prompt(self.tokenizer, c, self.max_positions, max_new_tokens) for c in conversations]

    @torch.no_grad()
    def generate(self, conversations: list[Conversation], sampling: Sampling) -> list[Generation]:
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        encoded = self.encode(conversations, sampling.max_tokens)
        # Sort by length so each batch pads little; results are put back in input order.
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        out: list[Generation | None] = [None] * len(encoded)
        max_pos = self.max_positions
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            batch = [encoded[i] for i in idx]
            max_new = sampling.max_tokens
            if max_pos:
                max_new = max(1, min(max_new, max_pos - max(len(b) for b in batch)))
            width = max(len(b) for b in batch)
            pad = self.tokenizer.pad_token_id
            ids = torch.tensor([[pad] * (width - len(b)) + b for b in batch], device=self.device)
            mask = torch.tensor([[0] * (width - len(b)) + [1] * len(b) for b in batch], device=self.device)
            kwargs = dict(max_new_tokens=max_new, eos_token_id=self.stop_ids, pad_token_id=pad)
            if sampling.temperature > 0:
                kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p)
                if sampling.min_p > 0:
                    kwargs["min_p"] = sampling.min_p
            else:
                kwargs.update(do_sample=False)
            gen = self.lm.generate(
                input_ids=ids, attention_mask=mask, return_dict_in_generate=True,
                output_scores=sampling.logprobs, **kwargs,
            )
            new = gen.sequences[:, width:]
            logps = None
            if sampling.logprobs:
                logps = self.lm.compute_transition_scores(gen.sequences, gen.scores, normalize_logits=True)
            for row, i in enumerate(idx):
                toks = new[row].tolist()
                n = len(toks)
                for j, t in enumerate(toks):
                    if t in self.stop_ids:
                        n = j + 1
                        break
                text = self.tokenizer.decode(toks[:n], skip_special_tokens=True).strip()
                lp = logps[row, :n].tolist() if logps is not None else None
                out[i] = Generation(text=text, token_logprobs=lp, tokens_in=len(batch[row]), tokens_out=n)
        return out  # type: ignore[return-value]
