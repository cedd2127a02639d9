"""Tools a user runs beside the DAG, each a ``curio`` subcommand (pipeline/cli.py parses their options):

    curio table                      the held-out table of a text-track run (table.py)
    curio choose hparams|tiers|format-prompt   choices made on the validation split (choose_*.py)
    curio compare runs|rollouts|rl-text|rounds two runs, two rollout datasets, rl-text's algorithms, GRPO's rounds
                                     on held-out (compare_*.py)
    curio check-imports              the import graph's cycles and upward imports (import_graph.py)
    curio params-hashes              every stage's params hash, per preset (params_hashes.py)
    curio bench fresh-clone          the default DAG from a fresh clone: each stage's seconds, the headline
                                     (fresh_clone.py)
    curio soak                       the DAG under random interruptions, against an uninterrupted run (soak.py)
    curio profile STAGE              where a stage's CPU seconds go (profile_stage.py)
    curio env serve GROUP[@TIER]     a text game as an OpenEnv server; TRL's environment_factory (game_envs.py)

They sit in the top layer, beside the other entry points: the ones that play or train import ``stages/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core.errors import CurioError

#: The checkout these modules live in: its params.yaml, dvc.yaml and data/ are the tools' defaults.
REPO = Path(__file__).resolve().parents[2]


class ToolError(CurioError):
    """Bad input to a tool (an option, a dataset, a checkout): one line, exit 2."""


def require_val_split(params: Any) -> None:
    """A choice is made on the val split: refuse, in one line, params without one (``games.val_fraction`` 0,
    params.yaml's default)."""
    if params.games.val_fraction <= 0:
        raise ToolError("set games.val_fraction > 0 (preset or -S): the choice is made on the val split")
