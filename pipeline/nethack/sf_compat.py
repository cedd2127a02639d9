"""sample-factory 2.1.1 on NumPy >= 2.4: one assignment its rollout workers make, made explicit.

The cause of "rollout workers crash, training hangs at 0 FPS" under NumPy 2: a rollout worker writes each policy
output into its trajectory buffer with ``buffer[step] = value`` (``TensorDict._set_data_func``). For a per-step scalar
(the action, its log-prob, the value estimate, the policy version) ``buffer[step]`` is one element while ``value`` is
a length-1 array. NumPy 1.25 deprecated that implicit size-1-array-to-scalar conversion and NumPy 2.4 made it an
error (``TypeError: only 0-dimensional arrays can be converted to Python scalars`` → ``ValueError: setting an array
element with a sequence``). The worker's event loop dies on it, and the learner waits for rollouts that never come.

:func:`apply` wraps that one method so a value whose size matches the destination is reshaped to it first, the
conversion NumPy < 2.4 made silently. Everything else goes to sample-factory's own code unchanged. It is applied when
:mod:`pipeline.nethack.sf` is imported, which is also how sample-factory's spawned workers start
(``python -m pipeline.nethack`` is their main module).
"""

from __future__ import annotations

import numpy as np
import torch


def _reshaped_like(destination: np.ndarray, value: object) -> object:
    """``value`` as an array of ``destination``'s shape when they hold the same number of elements, else as it was."""
    if torch.is_tensor(value):
        value = value.cpu().numpy()
    if isinstance(value, np.ndarray) and value.shape != destination.shape and value.size == destination.size:
        return value.reshape(destination.shape)
    return value


def apply() -> None:
    """Patch ``TensorDict._set_data_func`` once (idempotent)."""
    from sample_factory.algo.utils.tensor_dict import TensorDict

    original = TensorDict._set_data_func
    if getattr(original, "curio_numpy2", False):
        return

    def set_data(self, x, index, new_data):
        if isinstance(x, np.ndarray) and not isinstance(new_data, dict):
            x[index] = _reshaped_like(x[index], new_data)
            return
        original(self, x, index, new_data)

    set_data.curio_numpy2 = True
    TensorDict._set_data_func = set_data
