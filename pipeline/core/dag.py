"""The stage graph of dvc.yaml: dependency order, and the branches that share no stage (run side by side)."""

from __future__ import annotations

from pathlib import Path

import yaml


def _stages(dvc_yaml: str | Path) -> dict:
    return yaml.safe_load(Path(dvc_yaml).read_text())["stages"]


def commands(dvc_yaml: str | Path = "dvc.yaml") -> dict[str, str]:
    """Each stage's ``cmd``."""
    return {name: spec["cmd"] for name, spec in _stages(dvc_yaml).items()}


def _outputs(spec: dict) -> dict[str, dict]:
    found: dict[str, dict] = {}
    for o in spec.get("outs", []) + spec.get("metrics", []) + spec.get("plots", []):
        if isinstance(o, dict):
            found.update({path: opts or {} for path, opts in o.items()})
        else:
            found[o] = {}
    return found


def stage_outputs(dvc_yaml: str | Path = "dvc.yaml") -> dict[str, dict[str, dict]]:
    """Each stage's outs, metrics and plots, each path with its options (``persist``, ``cache``; {} when none)."""
    return {name: _outputs(spec) for name, spec in _stages(dvc_yaml).items()}


def stage_parents(dvc_yaml: str | Path = "dvc.yaml") -> dict[str, set[str]]:
    """Each stage's direct parents: the stages owning an out that is one of its deps."""
    stages = _stages(dvc_yaml)
    outs = {path: name for name, spec in stages.items() for path in _outputs(spec)}

    def parents(name: str) -> set[str]:
        found = set()
        for d in stages[name].get("deps", []):
            for out, owner in outs.items():
                # a dep inside an out (data/x/model in data/x), or a directory holding outs (metrics/stages)
                if owner != name and (d == out or d.startswith(out.rstrip("/") + "/")
                                      or out.startswith(d.rstrip("/") + "/")):
                    found.add(owner)
        return found

    return {name: parents(name) for name in stages}


def dag_order(dvc_yaml: str | Path = "dvc.yaml") -> list[str]:
    """Stage names of dvc.yaml in dependency order (an out of one stage that is a dep of another = an edge)."""
    return _order(stage_parents(dvc_yaml))


def _order(parents: dict[str, set[str]]) -> list[str]:
    order: list[str] = []
    pending = list(parents)
    while pending:
        ready = [n for n in pending if parents[n] <= set(order)]
        if not ready:
            raise ValueError("dvc.yaml has a dependency cycle")
        order.extend(ready)
        pending = [n for n in pending if n not in ready]
    return order


def ancestors(parents: dict[str, set[str]], name: str) -> set[str]:
    seen: set[str] = set()
    todo = list(parents[name])
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(parents[n])
    return seen


def branches(dvc_yaml: str | Path = "dvc.yaml") -> tuple[list[list[str]], list[str]]:
    """Independent branches of the DAG and the tail that joins them.

    The tail is the run of last stages (in dependency order) each of which depends on every other stage not in
    the tail (the report). The head, stages every other stage depends on (the params check), belongs to no
    branch: `dvc repro` of any branch runs it first. What is left splits into connected components: the
    branches, which share no stage, so each can run while another does. Each list is in dependency order;
    branches longest first.
    """
    parents = stage_parents(dvc_yaml)
    order = _order(parents)
    head = {n for n in order if len(order) > 1 and all(n in ancestors(parents, m) for m in order if m != n)}
    order = [n for n in order if n not in head]
    parents = {n: ps - head for n, ps in parents.items() if n not in head}
    tail: list[str] = []
    for name in reversed(order):
        rest = set(order) - set(tail) - {name}
        if not rest or not rest <= ancestors(parents, name):
            break
        tail.insert(0, name)
    body = [n for n in order if n not in tail]
    component = {n: n for n in body}

    def root(n: str) -> str:
        while component[n] != n:
            n = component[n]
        return n

    for n in body:
        for p in parents[n]:
            if p in component:
                component[root(p)] = root(n)
    groups: dict[str, list[str]] = {}
    for n in body:
        groups.setdefault(root(n), []).append(n)
    return sorted(groups.values(), key=len, reverse=True), tail
