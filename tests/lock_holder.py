"""`curio ARGS...` (the real CLI, in this process) whose annotate-text ``run`` pauses inside the stage: it touches
``started`` in the working directory, then waits until ``release`` exists (tests/test_locks.py)."""

import sys
import time
from pathlib import Path

import stages.annotate_text
from pipeline.cli import app

real = stages.annotate_text.run


def paused(params, ctx):
    Path("started").touch()
    while not Path("release").exists():
        time.sleep(0.1)
    return real(params, ctx)


stages.annotate_text.run = paused
sys.argv = ["curio", *sys.argv[1:]]
app()
