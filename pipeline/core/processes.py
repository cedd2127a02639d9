"""How many processes train: ``train_policy.num_processes`` (or an accelerate config file) set around a stage by
:func:`pipeline.core.stage.execute`, read by the trainers (:mod:`pipeline.models.launch` launches them)."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

_PROCESSES: contextvars.ContextVar[tuple[int, str | None]] = contextvars.ContextVar("curio_train_processes",
                                                                                   default=(1, None))


@contextlib.contextmanager
def use_processes(num_processes: int, config_file: str | None = None) -> Iterator[None]:
    """Train inside the block with ``num_processes`` (or the accelerate config file's) processes."""
    token = _PROCESSES.set((num_processes, config_file))
    try:
        yield
    finally:
        _PROCESSES.reset(token)


def requested() -> tuple[int, str | None]:
    """(processes, accelerate config file) to launch, or (1, None) inside a launched process / by default."""
    return (1, None) if world_size() > 1 else _PROCESSES.get()


def world_size() -> int:
    """Processes training together (``accelerate launch`` / torchrun set WORLD_SIZE); 1 otherwise."""
    return int(os.environ.get("WORLD_SIZE", "1"))
