"""The NetHack track at its default size, through the real ``curio stage`` commands (slow: ~4-5 min on 2 cores)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import curio, make_project

STAGES = ["rollout-nethack", "annotate-nethack", "pairs-nethack", "train-reward", "rl-nethack", "evaluate-nethack"]


@pytest.mark.slow
def test_default_nethack_track_end_to_end(tmp_path):
    project = make_project(tmp_path, ["tracking.enabled=false"])
    for name in STAGES:
        curio(["stage", name], cwd=project, timeout=900)
    metrics = {n: json.loads((project / "metrics" / "stages" / f"{n}.json").read_text()) for n in STAGES}
    assert metrics["train-reward"]["val_agreement"] >= 0.85
    for policy in ("random", "motif", "extrinsic", "intrinsic"):
        assert metrics["evaluate-nethack"][f"{policy}/episodes"] == 16
    assert (project / "metrics" / "plots" / "evaluate-nethack.png").exists()

    # A second run finds everything done: rollouts and annotations are kept, agents are not retrained (not one of
    # their row files or checkpoints is written again). How long each stage takes is `curio bench fresh-clone`'s.
    kept = ("rollout_nethack", "annotate_nethack", "rl_nethack")
    before = {d: files(project / "data" / d) for d in kept}
    for name in ("rollout-nethack", "annotate-nethack", "rl-nethack"):
        curio(["stage", name], cwd=project, timeout=300)
    assert {d: files(project / "data" / d) for d in kept} == before
    rl = json.loads((project / "metrics" / "stages" / "rl-nethack.json").read_text())
    assert rl["motif/env_steps"] == metrics["rl-nethack"]["motif/env_steps"]


def files(root: Path) -> dict[str, tuple[int, int]]:
    """The row files and checkpoints under ``root``, each with its modification time (ns) and size."""
    found = {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size)
             for p in root.rglob("*") if p.suffix in (".parquet", ".pth")}
    assert found, root
    return found
