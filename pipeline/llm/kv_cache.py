"""The keys / values a chat backend keeps and reuses (``pipeline.llm.hf``): each conversation's KV cache kept across
its turns (:class:`ConversationKV`), and a batch's cache with room for the tokens a call adds (:class:`RoomyCache`)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from pipeline.llm.base import Conversation


def _conversation_key(conversation: Conversation) -> tuple:
    """Where a conversation's cache is kept: its messages' roles and texts (a lookup still checks every reused
    token, so a key only has to find the entry; the strings are shared with the conversation, not copied)."""
    return tuple((m["role"], m["content"]) for m in conversation)


@dataclass
class Entry:
    """A conversation's kept keys / values: copied out (``kv``), or still in the cache of the batch that computed
    them (``source``: that cache's per-layer (keys, values), the row, and the (start, stop) position spans holding
    the row's tokens in order). A batch's next turn copies them from there straight into its own cache, so the
    common case copies each kept position once per turn instead of twice."""

    tokens: list[int]  # the token ids whose keys / values are held
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None  # per layer: (heads, len(tokens), head_dim) keys and values
    nbytes: int
    keys: list[tuple] = field(default_factory=list)
    source: tuple[list[tuple[torch.Tensor, torch.Tensor]], int, list[tuple[int, int]]] | None = None

    @property
    def n_layers(self) -> int:
        return len(self.kv if self.kv is not None else self.source[0])

    def spans(self, n: int) -> list[tuple[int, int]]:
        """(start, length) of the positions holding the first ``n`` tokens, in order, in ``kv`` or ``source``."""
        if self.kv is not None:
            return [(0, n)]
        out = []
        for start, stop in self.source[2]:
            take = min(stop - start, n)
            if take <= 0:
                break
            out.append((start, take))
            n -= take
        return out

    def held(self, layer: int, part: int) -> torch.Tensor:
        """The keys (``part`` 0) or values (1) of ``layer`` holding the entry's tokens: (heads, positions, dim)."""
        if self.kv is not None:
            return self.kv[layer][part]
        layers, row, _ = self.source
        return layers[layer][part][row]

    def pieces(self, layer: int, part: int, n: int) -> list[torch.Tensor]:
        """Views of the keys (``part`` 0) or values (1) of the first ``n`` tokens in ``layer``, in order."""
        held = self.held(layer, part)
        return [held[:, start : start + m] for start, m in self.spans(n)]

    def materialize(self) -> None:
        """Copy the keys / values out of the batch's cache (which then no longer has to be kept)."""
        if self.kv is None:
            n = len(self.tokens)
            self.kv = [tuple(torch.cat(self.pieces(layer, part, n), dim=1) for part in (0, 1))
                       for layer in range(self.n_layers)]
            self.source = None


class ConversationKV:
    """Each conversation's KV cache kept across its turns, so a turn processes only its new tokens.

    After a turn, the keys / values of prompt + generated tokens are kept under the conversation with the
    generated reply appended; the next turn (that conversation plus the environment's reply) finds them under its
    own conversation minus the last message, and so does a re-sampled turn (a format retry). Reuse stops at the
    first token where the kept tokens and the new prompt's tokens differ (a re-tokenized reply, a truncated
    context), so what is reused is always exactly what a full re-encode would compute, up to floating point.
    Beyond ``max_bytes`` (which counts each entry's own positions) the least recently used entry that the current
    call will not read is dropped (a finished episode's, another set's). When every kept entry is one the current
    call reads or has just written for the next, a new entry is not kept instead: play steps all its episodes in
    turn, so evicting the least recent would drop each conversation before its next turn (no reuse at all), while
    keeping the older entries reuses ``max_bytes``' worth every turn. A turn's entries stay in that batch's cache
    until the next call, which reads the ones it reuses from there and copies the others out (``settle``), so the
    last call's batch caches stay referenced in between.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._keys: OrderedDict[tuple, Entry] = OrderedDict()
        self._in_batch: dict[int, Entry] = {}  # entries still held in a batch's cache (``Entry.source``)
        self._busy: set[int] = set()  # entries the current call reads, or has written for the next (never evicted)
        self.refused = 0  # entries not kept: the budget was full of entries in use

    def __len__(self) -> int:
        return len(self._keys)

    def lookup(self, conversation: Conversation, ids: list[int]) -> tuple[int, Entry | None]:
        """(tokens of ``ids`` whose keys / values are held, the entry holding them); at least one token is left
        to process, so the model has a position to predict from."""
        if len(conversation) < 2:
            return 0, None
        key = _conversation_key(conversation[:-1])
        entry = self._keys.get(key)
        if entry is None:
            return 0, None
        self._keys.move_to_end(key)
        n = 0
        for a, b in zip(entry.tokens, ids[:-1], strict=False):
            if a != b:
                break
            n += 1
        return n, entry

    def store(self, conversation: Conversation, reply: str, entry: Entry, replaces: Entry | None = None) -> None:
        """Keep ``entry`` (keys / values of its ``tokens``: the prompt of ``conversation`` + the generated
        ``reply``) in place of the entry the turn started from, under the keys the conversation's next turn and a
        re-sampled turn look up."""
        if replaces is not None:
            for key in list(replaces.keys):
                self._drop(key)
        keys = [_conversation_key([*conversation, {"role": "assistant", "content": reply}])]
        if len(conversation) > 2:  # past the opening messages, which other conversations may share
            keys.append(_conversation_key(conversation[:-1]))
        for key in keys:
            self._drop(key)
        if not self._make_room(entry.nbytes):
            self.refused += 1
            return
        if entry.source is not None:
            self._in_batch[id(entry)] = entry
        self.nbytes += entry.nbytes
        self._busy.add(id(entry))
        for key in keys:
            self._keys[key] = entry
            entry.keys.append(key)

    def _make_room(self, nbytes: int) -> bool:
        """Drop least recently used entries not in use until ``nbytes`` more fit; False if they cannot."""
        if nbytes > self.max_bytes:
            return False
        while self.nbytes + nbytes > self.max_bytes:
            idle = next((k for k, e in self._keys.items() if id(e) not in self._busy), None)
            if idle is None:
                return False
            self._drop(idle)
        return True

    def _drop(self, key: tuple) -> None:
        entry = self._keys.pop(key, None)
        if entry is not None:
            entry.keys.remove(key)
            if not entry.keys:
                self.nbytes -= entry.nbytes
                self._in_batch.pop(id(entry), None)
                self._busy.discard(id(entry))

    def settle(self, conversations: list[Conversation]) -> None:
        """Before a call generating for ``conversations``: mark the entries it reads as in use (not evicted while it
        runs), and copy out the entries still held in a batch's cache that
        none of them looks up, so no batch cache stays referenced past the call after the one that made it."""
        wanted = {id(self._keys.get(_conversation_key(c[:-1]))) for c in conversations if len(c) >= 2}
        self._busy = wanted & {id(e) for e in self._keys.values()}
        if not self._in_batch:
            return
        for key, entry in list(self._in_batch.items()):
            if key not in wanted:
                entry.materialize()
                del self._in_batch[key]


class _RoomyLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys / values live in a buffer with room for the tokens still to come: a decode
    step writes its token into place instead of concatenating (copying) the whole cache. ``keys`` / ``values``
    are views of the filled part, the same numbers a ``DynamicLayer`` holds; the buffer doubles when full."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room
        self.filled = 0

    def _adopt(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
        n = keys.shape[-2]
        self._k = keys.new_empty((*keys.shape[:-2], n + room, keys.shape[-1]))
        self._v = values.new_empty((*values.shape[:-2], n + room, values.shape[-1]))
        self._k[..., :n, :] = keys
        self._v[..., :n, :] = values
        self.filled = n
        self.keys, self.values = self._k[..., :n, :], self._v[..., :n, :]

    def preset(self, keys: torch.Tensor, values: torch.Tensor, filled: int) -> None:
        """Start from buffers whose first ``filled`` positions hold keys / values."""
        self.lazy_initialization(keys, values)
        self._k, self._v, self.filled = keys, values, filled
        self.keys, self.values = keys[..., :filled, :], values[..., :filled, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, cache_kwargs=None):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._adopt(key_states[..., :0, :], value_states[..., :0, :], key_states.shape[-2] + self.room)
        n, m = self.filled, key_states.shape[-2]
        if n + m > self._k.shape[-2]:
            self._adopt(self.keys, self.values, max(n, m + self.room))
        self._k[..., n : n + m, :] = key_states
        self._v[..., n : n + m, :] = value_states
        self.filled = n + m
        self.keys, self.values = self._k[..., : n + m, :], self._v[..., : n + m, :]
        return self.keys, self.values

    def _reshaped(self, method: str, *args) -> None:
        getattr(super(), method)(*args)  # replaces keys / values: the buffer follows
        if self.is_initialized:
            self._adopt(self.keys, self.values, self.room)

    def crop(self, tokens_to_remove: int) -> None:
        self._reshaped("crop", tokens_to_remove)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._reshaped("batch_repeat_interleave", repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:  # one copy of the buffer's rows, room included
            self._k, self._v = self._k[indices], self._v[indices]
            self.keys, self.values = self._k[..., : self.filled, :], self._v[..., : self.filled, :]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._reshaped("reorder_cache", beam_idx)


class RoomyCache(DynamicCache):
    """A ``DynamicCache`` of ``_RoomyLayer``s, optionally starting from reused keys / values that already sit in
    buffers with ``room`` positions to spare (``HFBackend._past``)."""

    def __init__(self, n_layers: int, room: int, past: list[tuple[torch.Tensor, torch.Tensor, int]] | None = None):
        Cache.__init__(self, layers=[_RoomyLayer(room) for _ in range(n_layers)])
        for layer, (k, v, n) in zip(self.layers, past or [], strict=False):
            layer.preset(k, v, n)
