"""Local transformers causal LM as a chat backend: batched, left-padded, sampled or greedy; each conversation's
KV cache is kept across its turns (the caches themselves: ``pipeline.llm.kv_cache``)."""

from __future__ import annotations

import copy
import math
import threading
from contextlib import nullcontext
from pathlib import Path

import torch

# Imported here, not lazily inside functions: transformers' lazy module is not safe when two threads
# (e.g. the eval-sweep's parallel Prefect tasks) resolve the same name at once.
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)

from pipeline.core.artifacts import verify_model
from pipeline.llm.base import ChatBackend, Conversation, Generation, Sampling
from pipeline.llm.kv_cache import ConversationKV, Entry, RoomyCache
from pipeline.llm.sampler import sampler_for
from pipeline.models.attention import install as install_attention
from pipeline.models.chat import encode_prompt, stop_token_ids
from pipeline.models.gguf import resolve_model
from pipeline.models.linear import OneDNNLinears

install_attention()  # grouped-query heads read in place in CPU inference: the same numbers, no copies

# from_pretrained initialises on the meta device through process-wide state: one load at a time.
_LOAD_LOCK = threading.Lock()


def load_policy(path: str | Path, device: str = "cpu", dtype: torch.dtype | None = None):
    """Load a causal LM + tokenizer saved with ``save_pretrained``, any HF model id, or ``gguf:...`` (imported once,
    see ``pipeline.models.gguf.resolve_model``)."""
    path = resolve_model(str(path))
    verify_model(path)  # a model Curio saved must match its file hashes (one line naming the stage otherwise)
    with _LOAD_LOCK:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device).eval()
    return model, tokenizer


class _Float32Head(torch.nn.Module):
    """An output layer that keeps float32 weights and returns float32 logits from lower-precision hidden states."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight.detach().float().clone(), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(hidden.float(), self.weight)


def in_dtype(model, dtype: torch.dtype, copy_model: bool = True):
    """``model`` with its layers in ``dtype``: a copy (the caller's keeps its weights, e.g. to train them), or the
    model itself with ``copy_model=False``. Its output layer stays float32 (logits rounded to bfloat16 change what
    is sampled). On a CPU, bfloat16 runs eager attention: torch's SDPA kernel there is slow for one query row in
    bfloat16 (the preset's games at batch 64: 25.8 s with SDPA, 21.8 s eager)."""
    head = model.get_output_embeddings()
    head = _Float32Head(head.weight) if head is not None and dtype != torch.float32 else None  # before .to()
    played = (copy.deepcopy(model) if copy_model else model).to(dtype).eval()
    if head is not None:
        played.set_output_embeddings(head)
    if played.device.type == "cpu" and dtype == torch.bfloat16:
        played.set_attn_implementation("eager")
    return played


def fit_context(ids: list[int], max_new: int, max_pos: int) -> tuple[list[int], int]:
    """Fit a prompt and its generation budget into ``max_pos`` positions (0 = no limit). ``encode`` has already
    dropped whole old turns to make room; this only trims what still overflows (a system + task message alone
    longer than the context)."""
    if not max_pos:
        return ids, max_new
    max_new = max(1, min(max_new, max_pos - len(ids)))
    return ids[-(max_pos - max_new):], max_new


# batches of at least this many rows get a RoomyCache; one conversation keeps transformers' DynamicCache (at one
# row the two measured the same: 48.0 / 41.5 / 37.1 against 41.4 / 41.2 / 40.6 turns per CPU second, alternating)
ROOMY_MIN_ROWS = 2


class _SomeFinished(StoppingCriteria):
    """Ends a ``generate`` call (every row reported done) once ``enough`` of its rows have generated a stop token,
    so the caller can drop the finished rows and decode the others in a smaller batch."""

    def __init__(self, stop_ids: list[int], rows: int, enough: int, device) -> None:
        self.stop = torch.tensor(sorted(stop_ids), device=device)
        self.done = torch.zeros(rows, dtype=torch.bool, device=device)
        self.enough = enough

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        self.done |= torch.isin(input_ids[:, -1], self.stop)
        return torch.full_like(self.done, bool(self.done.sum() >= self.enough))


class HFBackend(ChatBackend):
    """Batched chat generation with a transformers model; conversations of a batch are left-padded.

    ``kv_cache_bytes`` > 0 keeps each conversation's KV cache across its turns (``ConversationKV``), so a
    multi-turn game processes every token of its conversation about once instead of once per turn; 0 re-encodes
    the whole conversation every turn (default 4 GiB: ``policy.kv_cache_gib``). Prompt tokens processed and reused
    are counted in ``prompt_tokens`` /
    ``cached_tokens`` (and per generation in ``meta["cached_tokens"]``), generated ones in ``generated_tokens``.
    Kept caches hold the weights' keys / values of the moment: a backend whose model is trained in place (ArCHer)
    drops them when any parameter has changed since (torch's in-place version counters).

    ``drop_finished`` > 0: once that fraction of a batch's rows has generated a stop token, the batch goes on
    without them (``generate`` is called again on the rest, with their cache), so later decode steps run fewer
    rows instead of padding the finished ones up to the batch's longest reply. Each row's reply is drawn from the
    same distribution; the random draws (and float sums of smaller batches) differ, so replies differ. 0 (the
    default) decodes every row until the batch's last one finishes.

    ``dtype`` ("float32" / "bfloat16"; None = as loaded): the weights it plays with (``in_dtype``). A given
    ``model_obj`` of another dtype is copied, so a model being trained keeps its own weights.

    ``cpu_linear`` ("torch" / "onednn"): on a CPU, "onednn" runs the float32 linear layers through oneDNN with
    reordered copies of their weights (``pipeline.models.linear``), reordered again when the weights change.
    """

    name = "hf"

    def __init__(self, model: str | Path, device: str = "cpu", batch_size: int = 64, model_obj=None,
                 tokenizer=None, kv_cache_bytes: int = 4 << 30, drop_finished: float = 0.0,
                 dtype: str | None = None, cpu_linear: str = "torch") -> None:
        super().__init__(str(model))
        weights = getattr(torch, dtype) if dtype else None
        loaded = model_obj is None
        if loaded:
            model_obj, tokenizer = load_policy(model, device)
        if weights is not None and model_obj.dtype != weights:
            model_obj = in_dtype(model_obj, weights, copy_model=not loaded)  # a model of its own: no copy
        self.lm = model_obj
        self.tokenizer = tokenizer
        self.device = self.lm.device  # where the weights are (a given model_obj may sit on a GPU)
        self.linears = OneDNNLinears(self.lm) if cpu_linear == "onednn" and self.device.type == "cpu" else None
        self.batch_size = batch_size
        self.drop_finished = drop_finished
        self.tokenizer.padding_side = "left"
        self.stop_ids = stop_token_ids(self.tokenizer)
        text_config = self.lm.config.get_text_config(decoder=True)
        # Sliding-window / chunked attention drops old keys, so a kept cache would not be the full prefix.
        windowed = getattr(text_config, "sliding_window", None) or getattr(text_config, "attention_chunk_size", None)
        self.kv = ConversationKV(kv_cache_bytes) if kv_cache_bytes > 0 and not windowed else None
        # RoomyCache holds full-attention layers only (sliding windows and others keep transformers' own cache)
        layer_types = set(getattr(text_config, "layer_types", None) or ["full_attention"])
        self.roomy = not windowed and layer_types == {"full_attention"}
        self._seen_version = self._weights_version()
        self.prompt_tokens = 0  # prompt tokens run through the model
        self.cached_tokens = 0  # prompt tokens whose keys / values were reused instead
        self.generated_tokens = 0
        self.n_layers = text_config.num_hidden_layers
        self.max_positions = (getattr(self.lm.config, "n_positions", None)
                              or getattr(self.lm.config, "max_position_embeddings", 0))

    def encode(self, conversations: list[Conversation], max_new_tokens: int = 0) -> list[list[int]]:
        """Prompt ids; a conversation too long for the context drops its oldest turns (logged)."""
        return [encode_prompt(self.tokenizer, c, self.max_positions, max_new_tokens) for c in conversations]

    def _weights_version(self) -> int:
        return sum(p._version for p in self.lm.parameters())

    @torch.no_grad()
    def generate(self, conversations: list[Conversation], sampling: Sampling,
                 prompt_ids: list[list[int]] | None = None) -> list[Generation]:
        """One reply per conversation; ``prompt_ids``: play these ids as the prompts (token in, token out) instead
        of the conversations rendered by the chat template. Each generation's ``meta`` holds the prompt ids it was
        given (``prompt_ids``) and the ids it sampled (``token_ids``)."""
        if self.kv is not None:
            version = self._weights_version()
            if version != self._seen_version:  # trained in place since: kept keys / values are stale
                self.kv = ConversationKV(self.kv.max_bytes)
                self._seen_version = version
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        encoded = (self.encode(conversations, sampling.max_tokens) if prompt_ids is None
                   else [list(p) for p in prompt_ids])
        # Sort by length so each batch pads little; results are put back in input order.
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        out: list[Generation | None] = [None] * len(encoded)
        max_pos = self.max_positions
        if self.kv is not None:
            self.kv.settle(conversations)
        with self.linears.active() if self.linears is not None else nullcontext():
            for start in range(0, len(order), self.batch_size):
                idx = order[start : start + self.batch_size]
                max_new = sampling.max_tokens
                batch = []
                for i in idx:
                    ids, max_new_i = fit_context(encoded[i], sampling.max_tokens, max_pos)
                    batch.append(ids)
                    max_new = min(max_new, max_new_i)
                gens = self._generate_batch([conversations[i] for i in idx], batch, max_new, sampling)
                for i, g in zip(idx, gens, strict=True):
                    out[i] = g
        return out  # type: ignore[return-value]

    def _generate_batch(self, conversations: list[Conversation], batch: list[list[int]], max_new: int,
                        sampling: Sampling) -> list[Generation]:
        """Rows are laid out [pad | reused prefix | pad | new tokens], so the reused keys / values stand in one
        right-aligned block (``past_key_values``) and the new tokens in another; then one ``generate`` call, or
        (``drop_finished``) one per shrinking set of unfinished rows."""
        pad = self.tokenizer.pad_token_id
        hits = [self.kv.lookup(c, b) if self.kv is not None else (0, None) for c, b in zip(conversations, batch,
                                                                                           strict=True)]
        reused = [n for n, _ in hits]
        past_w = max(reused)
        new_w = max(len(b) - n for b, n in zip(batch, reused, strict=True))
        rows, masks = [], []
        for b, n in zip(batch, reused, strict=True):
            fresh = len(b) - n
            rows.append([pad] * (past_w - n) + b[:n] + [pad] * (new_w - fresh) + b[n:])
            masks.append([0] * (past_w - n) + [1] * n + [0] * (new_w - fresh) + [1] * fresh)
        ids = torch.tensor(rows, device=self.device)
        mask = torch.tensor(masks, device=self.device)
        # A batch's cache has room for what this call adds (the new prompt tokens, then up to max_new generated
        # ones), so a decode step writes its keys / values instead of copying the whole cache (torch.cat).
        room = new_w + max_new if self.roomy and len(batch) >= ROOMY_MIN_ROWS else 0
        cache = None
        if past_w:
            cache = self._past(hits, past_w, room)
        elif room:
            cache = RoomyCache(self.n_layers, room)
        width = past_w + new_w
        live = list(range(len(batch)))  # the batch rows still decoding, in the order of the current call's rows
        tokens: list[list[int]] = [[] for _ in batch]
        logps: list[list[float]] = [[] for _ in batch]
        out: list[Generation | None] = [None] * len(batch)
        left = max_new
        while live:
            kwargs, sampler = self._decoding(sampling, pad)
            if self.drop_finished > 0 and len(live) > 1:
                enough = max(1, math.ceil(self.drop_finished * len(live)))
                kwargs["stopping_criteria"] = StoppingCriteriaList(
                    [_SomeFinished(self.stop_ids, len(live), enough, self.device)])
            if cache is not None:
                kwargs["past_key_values"] = cache
            gen = self.lm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=left,
                                   return_dict_in_generate=True, output_scores=sampling.logprobs and sampler is None,
                                   **kwargs)
            steps = gen.sequences.shape[1] - ids.shape[1]
            left -= steps
            new = gen.sequences[:, ids.shape[1]:].tolist()
            lps = None
            if sampling.logprobs:
                lps = (sampler.logprobs if sampler is not None
                       else self.lm.compute_transition_scores(gen.sequences, gen.scores, normalize_logits=True))
                lps = lps.tolist()
            ended = []  # positions in this call's rows of those that are done
            for j, row in enumerate(live):
                tokens[row] += new[j]
                if lps is not None:
                    logps[row] += lps[j]
                if left <= 0 or any(t in self.stop_ids for t in new[j]):
                    ended.append(j)
                    out[row] = self._generation(tokens[row], logps[row] if lps is not None else None, batch[row],
                                                reused[row])
            final = len(ended) == len(live)
            if self.kv is not None:
                self._keep(conversations, batch, hits, width, [(live[j], j) for j in ended], out, tokens,
                           gen.past_key_values, copy_out=not final)
            if final:
                break
            going = [j for j in range(len(live)) if j not in set(ended)]
            pick = torch.tensor(going, device=self.device)
            cache = gen.past_key_values
            cache.batch_select_indices(pick)
            ids = gen.sequences[pick]
            mask = torch.cat([mask, mask.new_ones((len(live), steps))], dim=1)[pick]
            live = [live[j] for j in going]
        self.prompt_tokens += sum(len(b) for b in batch) - sum(reused)
        self.cached_tokens += sum(reused)
        self.generated_tokens += sum(g.tokens_out for g in out)
        return out  # type: ignore[return-value]

    def _decoding(self, sampling: Sampling, pad: int) -> tuple[dict, object]:
        """``generate``'s decoding kwargs for ``sampling``, and the Gumbel sampler among them (None when greedy or
        transformers' own sampler draws)."""
        kwargs = dict(eos_token_id=self.stop_ids, pad_token_id=pad)
        processors = sampler_for(self.lm.generation_config, sampling) if sampling.temperature > 0 else None
        sampler = None
        if sampling.top_k is not None:  # the request says all of its sampling (online RL's rounds): no penalty from
            kwargs["repetition_penalty"] = 1.0  # the generation config, which the trainer would not score
        if processors is not None:  # sampled, drawing noise for the tokens top-k / top-p keep only (llm.sampler)
            sampler = processors[-1]
            kwargs.update(do_sample=False, logits_processor=LogitsProcessorList(processors),
                          temperature=None, top_k=None, top_p=None, min_p=None)
        elif sampling.temperature > 0:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p)
            if sampling.min_p > 0:
                kwargs["min_p"] = sampling.min_p
            if sampling.top_k is not None:
                kwargs["top_k"] = sampling.top_k or None  # 0: no top-k, not the config's
        else:
            kwargs.update(do_sample=False)
        return kwargs, sampler

    def _generation(self, toks: list[int], logps: list[float] | None, prompt: list[int], reused: int) -> Generation:
        """A row's reply: its generated tokens up to and including the first stop token."""
        n = len(toks)
        for j, t in enumerate(toks):
            if t in self.stop_ids:
                n = j + 1
                break
        text = self.tokenizer.decode(toks[:n], skip_special_tokens=True).strip()
        return Generation(text=text, token_logprobs=logps[:n] if logps is not None else None,
                          tokens_in=len(prompt), tokens_out=n,
                          meta={"cached_tokens": reused, "token_ids": [int(t) for t in toks[:n]],
                                "prompt_ids": prompt})

    def _past(self, hits: list[tuple[int, Entry | None]], width: int, room: int) -> DynamicCache:
        """The reused keys / values of a batch, each row's right-aligned in ``width`` positions, in buffers with
        ``room`` positions to spare."""
        ref_entry = next(e for n, e in hits if n)
        # each row's copies, the same in every layer: (row, entry, [(to, from, length), ...])
        plans = []
        for row, (n, e) in enumerate(hits):
            if n:
                at, copies = width - n, []
                for start, m in e.spans(n):
                    copies.append((at, start, m))
                    at += m
                plans.append((row, e, copies))
        layers = []
        for layer in range(ref_entry.n_layers):
            kv = []
            for part in (0, 1):
                ref = ref_entry.held(layer, part)
                t = ref.new_empty((len(hits), ref.shape[0], width + room, ref.shape[2]))
                t[:, :, :width].zero_()
                for row, e, copies in plans:
                    held = e.held(layer, part)
                    for to, start, m in copies:
                        t[row, :, to : to + m] = held[:, start : start + m]
                kv.append(t)
            layers.append((kv[0], kv[1], width))
        if not room:
            return DynamicCache(ddp_cache_data=[(k, v) for k, v, _ in layers])
        return RoomyCache(len(layers), room, layers)

    def _keep(self, conversations: list[Conversation], batch: list[list[int]], hits, width: int,
              rows: list[tuple[int, int]], gens: list[Generation | None], tokens: list[list[int]], cache,
              copy_out: bool) -> None:
        """Keep the keys / values of prompt + generated tokens of the batch ``rows`` (batch row, its row in
        ``cache``) for each conversation's next turn, where they are: in the batch's cache (an ``Entry`` with a
        ``source``; ``ConversationKV.settle`` copies out what the next call does not reuse), or copied out now
        (``copy_out``: rows that finished before the rest of their batch, whose cache goes on without them)."""
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        held = layers[0][0].shape[2]
        past_w = max(n for n, _ in hits)
        per_token = sum(k.shape[1] * k.shape[3] * k.element_size() + v.shape[1] * v.shape[3] * v.element_size()
                        for k, v in layers)
        for row, at in rows:
            b, g = batch[row], gens[row]
            k = min(g.tokens_out, held - width)  # the last generated token was never fed back
            n = hits[row][0]
            # The row's real tokens: its reused prefix (right-aligned in the past block), then its new prompt
            # tokens and the generated ones (right-aligned in the rest), as _generate_batch laid them out.
            spans = [(a, z) for a, z in ((past_w - n, past_w), (width - (len(b) - n), width + k)) if z > a]
            entry = Entry(b + tokens[row][:k], None, per_token * (len(b) + k), source=(layers, at, spans))
            if copy_out:
                entry.materialize()
            self.kv.store(conversations[row], g.text, entry, replaces=hits[row][1])
