"""The life of a sample-factory trainer process (``python -m pipeline.nethack``, started by the rl-nethack stage):
how it stops, and how it never outlives the stage that started it.

SIGTERM (or a first SIGINT) ends training after the current iteration through sample-factory's own end of training,
which saves a checkpoint; the process then exits :data:`STOPPED_EXIT`. With :data:`GRACE_ENV` set (the stage sets
half its grace period), a trainer that has not ended by then (still starting, or in a long iteration) exits
:data:`STOPPED_EXIT` there, its last checkpoint kept. A trainer whose parent died stops by itself
(:func:`watch_parent`), and an exit that skips sample-factory's shutdown kills the trainer's own children first
(:func:`kill_children`).
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch

#: The exit status of a training stopped by SIGTERM (or a first SIGINT) after saving its checkpoint.
STOPPED_EXIT = 143


#: The environment variable that gives a trainer its grace period, in seconds (the stage sets it from
#: ``runner.grace_s``); without it a stop waits for the end of the training iteration, however long.
GRACE_ENV = "CURIO_TRAINER_GRACE_S"


def grace_from_env() -> float | None:
    text = os.environ.get(GRACE_ENV)
    return float(text) if text else None


class StopRequest:
    """SIGTERM, or a first SIGINT, asks training to stop: at the end of the current training iteration the runner
    finds its env-step budget reached and ends training its own way, saving a checkpoint. A second SIGINT interrupts at
    once (sample-factory's KeyboardInterrupt), as before.

    ``grace_s``: a trainer still running that long after the first request (still starting, or in a long iteration)
    exits :data:`STOPPED_EXIT` there and then, its own children killed; its last checkpoint stays (sample-factory
    writes one to a temporary file and renames it), so its rerun resumes from it as after a kill."""

    def __init__(self, grace_s: float | None = None) -> None:
        self.signum: int | None = None
        self.grace_s = grace_s

    def install(self) -> None:
        import signal

        signal.signal(signal.SIGTERM, self.ask)
        signal.signal(signal.SIGINT, self.ask)

    def ask(self, signum: int, _frame: object) -> None:
        import signal

        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signum is None:
            self.signum = signum
            if self.grace_s is not None:
                self.exit_at(self.grace_s)

    @staticmethod
    def exit_at(grace_s: float) -> None:
        """Exit :data:`STOPPED_EXIT` in ``grace_s`` seconds unless the process has ended by then."""
        import threading
        import time

        def deadline() -> None:
            time.sleep(grace_s)
            print(f"curio: training still running {grace_s:g} s after the stop request: exiting; it resumes from "
                  "its last checkpoint", file=sys.stderr, flush=True)
            kill_children()
            os._exit(STOPPED_EXIT)

        threading.Thread(target=deadline, name="curio-trainer-grace", daemon=True).start()

    def observer(self):
        from sample_factory.algo.runners.runner import AlgoObserver

        request = self

        class StopOnSignal(AlgoObserver):
            def on_training_step(self, runner, training_iteration_since_resume: int) -> None:
                if request.signum is not None:  # the env-step budget reached: checked right after this call
                    runner.cfg.train_for_env_steps = 0

        return StopOnSignal()


def kill_children() -> None:
    """SIGKILL this process's descendants (sample-factory's workers, the online annotator): an exit that skips
    their shutdown must not leave them running."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()


def watch_parent(grace_s: float = 45.0) -> None:
    """Stop when the process that started this trainer dies (a SIGKILLed stage), even if PR_SET_PDEATHSIG's
    SIGINT was lost: SIGINT every few seconds (the first asks for a stop at the end of the training iteration, with
    its checkpoint; the next interrupts at once), then exit hard."""
    import signal
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        deadline = time.time() + grace_s
        while time.time() < deadline:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(min(5.0, grace_s))
        kill_children()
        os._exit(1)

    threading.Thread(target=watch, name="curio-parent-watch", daemon=True).start()


def start_shm_manager() -> None:
    """Start torch's shared-memory manager now, with SIGTERM and SIGINT blocked in this thread.

    sample-factory shares its tensors with torch's ``file_system`` strategy, so the first tensor shared (the
    learner's model, at start) launches a ``torch_shm_manager`` process and reads its handshake from a pipe. If a
    signal with a Python handler (:class:`StopRequest`'s) interrupts that read, torch (libshm's ``start_manager``,
    as of torch 2.13) retries the check of the read's result without reading again, for ever: the main thread spins
    in native code holding the GIL, so no signal handler and no thread (:func:`watch_parent`) can stop it, and the
    trainer outlives its stage. The 100-interruption soak found it once (a SIGTERM in that ~0.3 s window). Blocked,
    the signal waits and is handled as soon as the manager is up; torch starts it once per process."""
    import signal

    torch.multiprocessing.set_sharing_strategy("file_system")  # sample-factory's (init_torch_runtime)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        torch.zeros(1).share_memory_()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
