"""An overridden Prefect ``pipeline`` run's workspace: ``DATA_DIR/prefect/<run>/``, and what it reads from ``data/``.

Overrides never touch params.yaml or DVC's outputs (a DVC experiment is ``dvc exp run -S``): an overridden run
writes its own data and metrics under its own folder. A run of only some stages (``stages=["evaluate-text"]``)
still needs their upstreams' outputs: each one a selected stage reads is linked from ``data/`` into the
workspace when it is the output the overrides would have produced too, i.e. its stage reads none of the
overridden keys and DVC holds it current (``dvc status``). The others are named in one warning line that says
which stages to add to ``stages`` (a selected stage may not read them: a scripted policy reads no model).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipeline.core import dvcrepo
from pipeline.params import Params
from pipeline.params_check import NAME as PARAMS_CHECK


class Refused(ValueError):
    """A run that cannot be made as asked (one line saying how to make it)."""


@dataclass
class Workspace:
    root: Path
    links: dict[Path, Path] = field(default_factory=dict)  # link in the workspace -> the output in data/
    missing: dict[str, str] = field(default_factory=dict)  # an upstream output it cannot read -> why

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


def overridden_keys(base: Params, overridden: Params, keys: list[str]) -> list[str]:
    """Those of a stage's declared ``keys`` whose values the overrides change."""
    return [k for k in keys if base.section_hash([k]) != overridden.section_hash([k])]


def plan(base: Params, overridden: Params, selected: list[str], root: Path,
         dvc_yaml: Path = Path("dvc.yaml")) -> Workspace:
    """The workspace of an overridden run of ``selected`` stages: the upstream outputs it can read from data/
    (linked), and those it cannot (``missing``: an upstream the overrides change, or one DVC does not hold
    current); raises :class:`Refused` when there is nothing to run."""
    from pipeline.core.stage import declaration

    if not selected:
        raise Refused("no stage to run")
    owners = _owners(dvc_yaml)
    ws = Workspace(root)
    for name in selected:
        for dep in _data_deps(dvc_yaml, name):
            owner = next((o for out, o in owners.items() if dep == out or dep.startswith(out.rstrip("/") + "/")),
                         None)
            if owner is None or owner in selected or owner == PARAMS_CHECK:
                continue
            changed = overridden_keys(base, overridden, declaration(owner).params)
            source = base.data_path(dep.removeprefix("data/"))
            if changed:
                ws.missing[dep] = f"{owner} reads overridden {', '.join(changed)}"
            elif not source.exists() or not dvcrepo.current(owner):
                ws.missing[dep] = f"{owner} is not current for params.yaml (`dvc status {owner}`)"
            else:
                ws.links[root / "data" / dep.removeprefix("data/")] = source
    return ws


def workspace_overrides(overrides: dict, root: Path) -> dict:
    return {**overrides, "data_dir": str(root / "data"), "metrics_dir": str(root / "metrics")}


def describe(ws: Workspace) -> str:
    reads = ", ".join(sorted(os.path.relpath(t) for t in ws.links.values()))
    return f"outputs go to {ws.root}" + (f"; reads unchanged upstream outputs {reads}" if reads else "")


def warning(ws: Workspace, selected: list[str]) -> str | None:
    """One line on the upstream outputs the run cannot read, and how to include their stages."""
    if not ws.missing:
        return None
    why = "; ".join(f"{dep} ({reason})" for dep, reason in ws.missing.items())
    return (f"not available to this run: {why}. A stage that reads one fails; to run its stage too: "
            f"stages={json.dumps([*sorted({r.split(' ')[0] for r in ws.missing.values()}), *selected])}")
