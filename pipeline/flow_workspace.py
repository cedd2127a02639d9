"""An overridden Prefect ``pipeline`` run's workspace: ``DATA_DIR/prefect/<run>/``, and what it reads from ``data/``.

Overrides never touch params.yaml or DVC's outputs (a DVC experiment is ``dvc exp run -S``): an overridden run
writes its own data and metrics under its own folder. A run of only some stages (``stages=["evaluate-text"]``)
still needs their upstreams' outputs: each one a selected stage reads is linked from ``data/`` into the
workspace when it is the output the overrides would have produced too, i.e. its stage reads none of the
overridden keys and DVC holds it current (``dvc status``). Otherwise the run is refused in one line, before
anything is created, saying which stage to add to ``stages``.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipeline.config import Params
from pipeline.params_check import NAME as PARAMS_CHECK


class Refused(ValueError):
    """A run that cannot be made as asked (one line saying how to make it)."""


@dataclass
class Workspace:
    root: Path
    links: dict[Path, Path] = field(default_factory=dict)  # link in the workspace -> the output in data/

    def create(self) -> None:
        for link, target in self.links.items():
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(target.resolve(), target_is_directory=target.is_dir())


def _owners(dvc_yaml: Path) -> dict[str, str]:
    """dvc.yaml's outputs under data/ -> the stage writing each."""
    stages = yaml.safe_load(dvc_yaml.read_text())["stages"]
    return {(next(iter(o)) if isinstance(o, dict) else o): name for name, spec in stages.items()
            for o in spec.get("outs", []) if str(next(iter(o)) if isinstance(o, dict) else o).startswith("data/")}


def _data_deps(dvc_yaml: Path, name: str) -> list[str]:
    spec = yaml.safe_load(dvc_yaml.read_text())["stages"][name]
    return [d for d in spec.get("deps", []) if str(d).startswith("data/")]


def _current(name: str) -> bool:
    res = subprocess.run(["dvc", "status", name, "--json"], capture_output=True, text=True)
    try:
        return res.returncode == 0 and name not in json.loads(res.stdout or "{}")
    except json.JSONDecodeError:
        return False


def overridden_keys(base: Params, overridden: Params, keys: list[str]) -> list[str]:
    """Those of a stage's declared ``keys`` whose values the overrides change."""
    return [k for k in keys if base.section_hash([k]) != overridden.section_hash([k])]


def plan(base: Params, overridden: Params, selected: list[str], root: Path,
         dvc_yaml: Path = Path("dvc.yaml")) -> Workspace:
    """The workspace of an overridden run of ``selected`` stages; raises :class:`Refused` (nothing created)."""
    from pipeline.stage import declaration

    owners = _owners(dvc_yaml)
    ws = Workspace(root)
    for name in selected:
        for dep in _data_deps(dvc_yaml, name):
            owner = next((o for out, o in owners.items() if dep == out or dep.startswith(out.rstrip("/") + "/")),
                         None)
            if owner is None or owner in selected or owner == PARAMS_CHECK:
                continue
            changed = overridden_keys(base, overridden, declaration(owner).params)
            with_owner = ", ".join(f'"{s}"' for s in [owner, *selected])
            if changed:
                raise Refused(f"{owner} reads overridden {', '.join(changed)}: its outputs in data/ do not hold "
                              f"them; add it: stages=[{with_owner}]")
            source = base.data_path(dep.removeprefix("data/"))
            if not source.exists() or not _current(owner):
                raise Refused(f"{name} reads {dep}, which {owner} has not written for params.yaml "
                              f"(`dvc status {owner}`): run `dvc repro {owner}` first, or add it: "
                              f"stages=[{with_owner}]")
            ws.links[root / "data" / dep.removeprefix("data/")] = source
    return ws


def workspace_overrides(overrides: dict, root: Path) -> dict:
    return {**overrides, "data_dir": str(root / "data"), "metrics_dir": str(root / "metrics")}


def describe(ws: Workspace) -> str:
    reads = ", ".join(sorted(os.path.relpath(t) for t in ws.links.values()))
    return f"outputs go to {ws.root}" + (f"; reads unchanged upstream outputs {reads}" if reads else "")
