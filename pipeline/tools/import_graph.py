"""The project's import graph, lazy imports inside functions included: its cycles and its imports that run up the
layers of pyproject.toml's import-linter ``layers`` contracts (what the README's map of the tree draws).

    curio check-imports             # counts, then every cycle and upward import found; exit 1 if any
    curio check-imports --dot FILE  # also the graph of packages (Graphviz), one node per package of pipeline/

grimp (import-linter's graph library) reads every ``import`` statement of the ``pipeline`` and ``stages``
packages found on the Python path; a cycle is a strongly connected set of modules (more than one, or a module
importing itself); an upward import goes from a module of a lower layer to one of a higher layer (or between two
siblings of a layer marked independent, ``|``).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from pipeline.tools import ToolError


def layer_contracts(pyproject: Path) -> list[dict]:
    contracts = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    return [c for c in contracts if c["type"] == "layers"]


def expand(contract: dict) -> list[tuple[list[str], bool]]:
    """Each layer (highest first) as its modules and whether they are independent siblings (``|``)."""
    containers = contract.get("containers") or [""]
    layers = []
    for text in contract["layers"]:
        independent = "|" in text
        names = [n.strip() for n in text.replace("|", ":").split(":")]
        layers.append(([f"{c}.{n}" if c else n for c in containers for n in names], independent))
    return layers


def owner(module: str, names: list[str]) -> str | None:
    """The longest layer member that is ``module`` or a package above it."""
    hits = [n for n in names if module == n or module.startswith(n + ".")]
    return max(hits, key=len) if hits else None


def upward_imports(graph, contract: dict) -> list[tuple[str, str]]:
    layers = expand(contract)
    level = {name: i for i, (names, _) in enumerate(layers) for name in names}
    independent = {name for names, ind in layers if ind for name in names}
    members = list(level)
    found = []
    for importer in sorted(graph.modules):
        a = owner(importer, members)
        if a is None:
            continue
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            b = owner(imported, members)
            if b is None or a == b:
                continue
            if level[b] < level[a] or (level[a] == level[b] and a in independent):
                found.append((importer, imported))
    return found


def cycles(graph) -> list[list[str]]:
    """Strongly connected components of the module graph with more than one module (Tarjan), and self-imports."""
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges[v]:
                found.append(sorted(component))

    for m in modules:
        if m not in index:
            visit(m)
    return found


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "pipeline" and len(parts) > 1 else parts[0]


def check_imports(config: Path, dot: Path | None = None) -> bool:
    """Print the graph's counts, cycles and upward imports (and write ``dot``); True when there are none."""
    try:
        import grimp  # import-linter's graph library: a dev dependency (make dev)
    except ImportError:
        raise ToolError("check-imports needs grimp (import-linter's graph library): make dev") from None
    if not config.is_file():
        raise ToolError(f"--config {config}: no such file (the pyproject.toml holding the import contracts)")
    contracts = layer_contracts(config)
    graph = grimp.build_graph("pipeline", "stages", include_external_packages=False, cache_dir=None)
    edges = sum(len(graph.find_modules_directly_imported_by(m)) for m in graph.modules)
    found_cycles = cycles(graph)
    up = [(c["name"], imp) for c in contracts for imp in upward_imports(graph, c)]
    print(f"modules {len(graph.modules)}  imports {edges}  (pipeline, stages; lazy imports included)")
    print(f"import cycles: {len(found_cycles)}")
    for component in found_cycles:
        print("  cycle:", " <-> ".join(component))
    print(f"upward imports (against the layers contracts of pyproject.toml): {len(up)}")
    for name, (a, b) in up:
        print(f"  {a} -> {b}   [{name}]")
    if dot:
        pairs = sorted({(package_of(a), package_of(b)) for a in graph.modules
                        for b in graph.find_modules_directly_imported_by(a) if package_of(a) != package_of(b)})
        lines = ["digraph curio {", "  rankdir=TB;", *(f'  "{a}" -> "{b}";' for a, b in pairs), "}"]
        dot.write_text("\n".join(lines) + "\n")
        print(f"package graph: {dot}")
    return not (found_cycles or up)
