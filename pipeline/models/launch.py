"""Multi-process training: ``sft_train`` / ``dpo_train`` under ``accelerate launch``.

With ``train_policy.num_processes`` > 1 (or ``train_policy.accelerate_config``, an accelerate config file: GPUs,
machines, mixed precision), the stage's process saves the starting model and the training data to a directory
beside the checkpoints and runs ``accelerate launch -m pipeline.models.launch DIR``: N processes train the same
TRL trainer data-parallel (DDP: NCCL on GPUs, gloo on CPUs), each on ``batch_size / N`` examples of every global
batch, so the optimizer sees the same global batch as one process does. Rank 0 writes the checkpoints (the
resume point, as in one process) and the trained model; the stage's process loads it and goes on as before
(saving, tracking), so stages are unchanged. A process launched this way runs the trainer directly.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.errors import CurioError

_TRAINERS = ("sft_train", "dpo_train")
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


class LaunchError(CurioError):
    """``accelerate launch`` failed: its last lines say why."""


def world_size() -> int:
    """Processes training together (``accelerate launch`` / torchrun set WORLD_SIZE); 1 otherwise."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launch_args(num_processes: int, config_file: str | None) -> list[str]:
    """The ``accelerate launch`` options: the config file when given, else N processes on this machine. Its
    ``--multi_gpu`` launcher is torchrun: without CUDA the processes train on the CPU over gloo (``--cpu`` would
    start one process only)."""
    import socket

    if config_file:  # machines, GPUs, rendezvous address and port: as the file says
        return ["--config_file", config_file]
    with socket.socket() as s:  # a free rendezvous port: several launches may share the machine
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return ["--multi_gpu", "--num_processes", str(num_processes), "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no", "--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]


def launched(trainer: str, model, tokenizer, data: list, checkpoint_dir: Path, kwargs: dict[str, Any], *,
             num_processes: int, config_file: str | None, tracker=None, prefix: str = "sft"):
    """``pipeline.models.training.<trainer>(model, tokenizer, data, checkpoint_dir, **kwargs)`` run by
    ``accelerate launch``; returns what it returns (model, loss history, step resumed from)."""
    import torch
    from transformers import AutoModelForCausalLM

    assert trainer in _TRAINERS
    if not kwargs.get("merge", True):
        raise LaunchError("multi-process training returns merged models only (merge=False needs one process)")
    job = Path(checkpoint_dir).with_name(f".{Path(checkpoint_dir).name}.launch")
    shutil.rmtree(job, ignore_errors=True)
    job.mkdir(parents=True)
    try:
        model.save_pretrained(job / "init")
        tokenizer.save_pretrained(job / "init")
        torch.save({"trainer": trainer, "data": data, "checkpoint_dir": str(checkpoint_dir), "kwargs": kwargs},
                   job / "job.pt")
        cmd = [sys.executable, "-m", "accelerate.commands.launch", *launch_args(num_processes, config_file),
               "-m", "pipeline.models.launch", str(job)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-15:])
            raise LaunchError(f"accelerate launch ({trainer}, {num_processes} processes) failed:\n{tail}")
        result = json.loads((job / "result.json").read_text())
        trained = AutoModelForCausalLM.from_pretrained(job / "out")
    finally:
        shutil.rmtree(job, ignore_errors=True)
    if tracker is not None:  # the launched processes have no MLflow run: their losses are logged here
        for h in result["history"]:
            tracker.log_metrics({f"{prefix}/loss": h["loss"]}, step=h["step"])
    return trained, result["history"], result["resumed"]


def main(job: Path) -> None:
    """One launched process: train with the job's data; rank 0 saves the model and the loss history."""
    import torch
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.models import training

    spec = torch.load(job / "job.pt", weights_only=False)
    model = AutoModelForCausalLM.from_pretrained(job / "init")
    tokenizer = AutoTokenizer.from_pretrained(job / "init")
    fn = getattr(training, spec["trainer"])
    trained, history, resumed = fn(model, tokenizer, spec["data"], Path(spec["checkpoint_dir"]), **spec["kwargs"])
    if PartialState().is_main_process:
        trained.save_pretrained(job / "out")
        (job / "result.json").write_text(json.dumps({"history": history, "resumed": resumed}))
    PartialState().wait_for_everyone()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
