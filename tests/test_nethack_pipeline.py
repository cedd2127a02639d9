"""The NetHack track at its default size, through the real ``curio stage`` commands (slow: ~4-5 min on 2 cores)."""

from __future__ import annotations

import json
import time

import pytest
from conftest import curio, make_project

STAGES = ["rollout-nethack", "annotate-nethack", "pairs-nethack", "train-reward", "rl-nethack", "evaluate-nethack"]


@pytest.mark.slow
def test_default_nethack_track_end_to_end(tmp_path):
    project = make_project(tmp_path, ["tracking.enabled=false"])
    seconds = {}
    for name in STAGES:
        start = time.time()
        curio(["stage", name], cwd=project, timeout=900)
        seconds[name] = time.time() - start
    metrics = {n: json.loads((project / "metrics" / "stages" / f"{n}.json").read_text()) for n in STAGES}
    assert metrics["train-reward"]["val_agreement"] >= 0.85
    for policy in ("random", "motif", "extrinsic", "intrinsic"):
        assert metrics["evaluate-nethack"][f"{policy}/episodes"] == 16
    assert (project / "metrics" / "plots" / "evaluate-nethack.png").exists()
    assert sum(seconds.values()) < 600, seconds

    # A second run finds everything done: rollouts and annotations are kept, agents are not retrained.
    start = time.time()
    for name in ("rollout-nethack", "annotate-nethack", "rl-nethack"):
        curio(["stage", name], cwd=project, timeout=300)
    assert time.time() - start < 60
    rl = json.loads((project / "metrics" / "stages" / "rl-nethack.json").read_text())
    assert rl["motif/env_steps"] == metrics["rl-nethack"]["motif/env_steps"]
