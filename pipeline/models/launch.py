"""Multi-process training: ``sft_train`` / ``dpo_train`` under ``accelerate launch``.

With ``train_policy.num_processes`` > 1 (or ``train_policy.accelerate_config``, an accelerate config file: GPUs,
machines, mixed precision), the stage's process saves the starting model and the training data to a directory
beside the checkpoints and runs ``accelerate launch -m pipeline.models.launch DIR``: N processes train the same
TRL trainer data-parallel (DDP: NCCL on GPUs, gloo on CPUs), each on ``batch_size / N`` examples of every global
batch, so the optimizer sees the same global batch as one process does. Rank 0 writes the checkpoints (the
resume point, as in one process) and the trained model; the stage's process loads it and goes on as before
(saving, tracking), so stages are unchanged. A process launched this way runs the trainer directly.

A stage whose training loop is its own (rl-text's ArCHer and CHAI: pipeline/rl_text/archer.py) is launched whole with
``launched_stage``: every process runs the stage's ``run`` on the same params and trains through
``accelerate.Accelerator``; the main process's result and the metrics it logged come back to the stage's process.
Both kinds of launch stop with the stage's process (a SIGKILLed stage leaves no orphan training on). A SIGTERM to the
stage's process is passed on to the launcher, whose processes save their work as one process does (the trainer's
checkpoint at the step they agree on, ArCHer's round) and stop; the stage then stops with the same line.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.core import interrupt
from pipeline.core.errors import CurioError
from pipeline.core.stage import StageContext, StageResult, declaration
from pipeline.core.tracking import Tracker

_TRAINERS = ("sft_train", "dpo_train")


class LaunchError(CurioError):
    """``accelerate launch`` failed: its last lines say why."""


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


def _stop_with_parent() -> None:
    """In the launcher's child: SIGTERM when the stage's process dies, however it dies (even SIGKILL). torchrun
    then stops its processes, so a killed stage leaves no training on to race its rerun."""
    interrupt.signal_on_parent_death(signal.SIGTERM)


def run_launch(job: Path, num_processes: int, config_file: str | None, what: str,
               module: str = "pipeline.models.launch") -> None:
    """``accelerate launch -m MODULE JOB`` (a stage: this module; a trainer: :mod:`pipeline.models.training`);
    LaunchError with its last lines when it fails."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *launch_args(num_processes, config_file),
           "-m", module, str(job)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=_stop_with_parent) as proc, \
            interrupt.on_stop(lambda signum: proc.send_signal(signal.SIGTERM)):  # torchrun passes it on
        stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        interrupt.check()  # stopped by a signal: the processes saved their work (their traceback is torchrun's)
        tail = "\n".join((stdout + stderr).strip().splitlines()[-15:])
        raise LaunchError(f"accelerate launch ({what}, {num_processes} processes) failed:\n{tail}")


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
        with interrupt.at() as point:
            try:
                run_launch(job, num_processes, config_file, trainer, module="pipeline.models.training")
            except interrupt.Stopped:
                point.text = f"step {_saved_step(Path(checkpoint_dir))}"
                raise interrupt.stopped() from None
        result = json.loads((job / "result.json").read_text())
        trained = AutoModelForCausalLM.from_pretrained(job / "out")
    finally:
        shutil.rmtree(job, ignore_errors=True)
    if tracker is not None:  # the launched processes have no MLflow run: their losses are logged here
        for h in result["history"]:
            tracker.log_metrics({f"{prefix}/loss": h["loss"]}, step=h["step"])
    return trained, result["history"], result["resumed"]


def _saved_step(checkpoint_dir: Path) -> int:
    """The step of the newest complete Trainer checkpoint (``trainer_state.json`` written last), 0 without one."""
    steps = [int(p.name.split("-")[-1]) for p in checkpoint_dir.glob("checkpoint-*")
             if (p / "trainer_state.json").exists()]
    return max(steps, default=0)


class _LoggedMetrics(Tracker):
    """The tracker of a launched stage's processes (they have no MLflow run): what the main process logs is kept,
    for the stage's process to log into its run."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[dict, int | None]] = []

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append(({k: v for k, v in metrics.items() if isinstance(v, int | float)}, step))


def launched_stage(module: str, stage: str, params, ctx, *, num_processes: int, config_file: str | None):
    """``<module>.run(params, ctx)`` run by every process of ``accelerate launch``; returns the main process's
    StageResult, after logging the metrics it logged (per round, per step) to ``ctx``'s tracker.

    The processes read and write ``data_dir`` as the stage does (a filesystem they share); the params travel as
    the stage's declared slice.
    """
    job = params.data_path(f".{stage}.launch")
    shutil.rmtree(job, ignore_errors=True)
    job.mkdir(parents=True)
    try:
        view = declaration(stage).slice(params)
        (job / "stage.json").write_text(json.dumps({"module": module, "stage": stage,
                                                    "params": view.model_dump(mode="json")}))
        run_launch(job, num_processes, config_file, stage)
        result = json.loads((job / "result.json").read_text())
    finally:
        shutil.rmtree(job, ignore_errors=True)
    for metrics, step in result["logged"]:
        ctx.tracker.log_metrics(metrics, step=step)
    return StageResult(metrics=result["metrics"], outputs=result["outputs"])


def _run_stage(job: Path) -> None:
    """One launched process of a stage: its ``run``; the main process writes the result and logged metrics."""
    from accelerate import PartialState

    spec = json.loads((job / "stage.json").read_text())
    params = declaration(spec["stage"]).params_model.model_validate(spec["params"])
    tracker = _LoggedMetrics()
    with stopped_quietly(spec["stage"]):
        result = importlib.import_module(spec["module"]).run(params, StageContext(tracker=tracker))
    state = PartialState()  # set up by the stage's Accelerator
    if state.is_main_process:
        (job / "result.json").write_text(json.dumps({"metrics": result.metrics, "outputs": result.outputs,
                                                     "logged": tracker.logged}))
    state.wait_for_everyone()
    state.destroy_process_group()


@contextlib.contextmanager
def stopped_quietly(what: str) -> Iterator[None]:
    """In a launched process: torchrun's SIGTERM asks for a stop (the work saves itself, as in one process); the
    process then exits 143 without a traceback (the stage's process says where it resumes)."""
    try:
        with interrupt.stopping(what, grace_s=None):  # torchrun kills what has not stopped 30 s later
            yield
    except interrupt.Stopped as e:
        raise SystemExit(e.exit_code) from None


def main(job: Path) -> None:
    """One launched process of a stage (a trainer's job runs ``pipeline.models.training`` instead)."""
    _run_stage(job)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
