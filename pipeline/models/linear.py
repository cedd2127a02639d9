"""Linear layers through oneDNN with their weights reordered once, for playing a float32 model on a CPU.

torch runs a float32 ``nn.Linear`` on a CPU through its default GEMM (MKL on x86), which re-packs the weight
matrix on every call. A decode step multiplies a few dozen rows by every weight of the model, so it is bound by
how fast the weights stream from memory: SmolLM2's layers at 16 rows streamed 6.7 GB/s through that GEMM, 11.5
GB/s through oneDNN with the weights reordered once into its blocked layout (``bench/bench_real_speed.py``
measures both; this machine reads memory at ~30 GB/s). oneDNN sums in another order, so outputs differ in the
last bits (~1e-5 of a logit); ``docs/real-models.md`` measures what that does to sampled replies.

``OneDNNLinears(model)`` holds the reordered weights of the model's float32 ``nn.Linear`` layers (an extra copy
of them) and, inside ``active()``, runs those layers through them. It reorders again when a weight has changed
since (torch's in-place version counters: a policy trained between rounds of play), and only while active does
the model run differently: training outside it is untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch


def onednn_available() -> bool:
    """Whether this torch build runs linear layers through oneDNN with reordered weights."""
    ops = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise"))


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    out = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", [], "")
    return out.view(*x.shape[:-1], out.shape[-1])


class OneDNNLinears:
    """The float32 CPU ``nn.Linear`` layers of ``model``, run through oneDNN with reordered weights while
    ``active()``."""

    def __init__(self, model: torch.nn.Module) -> None:
        if not onednn_available():
            raise ValueError("policy.cpu_linear: onednn needs a torch build with oneDNN (mkldnn); this one has none")
        self.layers = [m for m in model.modules() if type(m) is torch.nn.Linear
                       and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32]
        self.weights: list[torch.Tensor] = []
        self.version: int | None = None

    def _reorder(self) -> None:
        version = sum(m.weight._version for m in self.layers)
        if version != self.version:
            self.weights = [torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), None) for m in self.layers]
            self.version = version

    @contextmanager
    def active(self) -> Iterator[None]:
        self._reorder()
        for layer, weight in zip(self.layers, self.weights, strict=True):
            layer.forward = partial(_linear, weight=weight, bias=layer.bias)
        try:
            yield
        finally:
            for layer in self.layers:
                del layer.forward  # the class's forward again
