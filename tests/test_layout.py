"""Where concepts live: pipeline/ in layers, each importing only those below it (pyproject.toml's import-linter
contracts: the LLM layer knows no games, the two tracks never import each other, only entry points import stages/,
NLE and sample-factory stay in pipeline/nethack, no cycles).

import-linter reads every import, lazy ones inside functions included, so a new import that breaks the layering
fails here (and in `make test`'s `lint-imports`) before anyone notices a circular import or a game dragged into a
backend.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PIPELINE = Path(__file__).resolve().parents[1] / "pipeline"
ROOT = PIPELINE.parent


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` over the packages under ``root`` with the repo's contracts."""
    env = {"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(root)}
    return subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache",
                           "--config", str(ROOT / "pyproject.toml")], cwd=root, env=env, capture_output=True,
                          text=True)


def copy_tree(dest: Path) -> Path:
    for package in ("pipeline", "stages"):
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__", "data"))
    return dest


def test_the_import_contracts_hold():
    res = lint_imports(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Contracts: 7 kept, 0 broken." in res.stdout


def lazy_import(tree: Path, module: str, statement: str) -> None:
    """Append to ``module`` (under ``tree``) a function whose body imports ``statement``'s module."""
    path = tree / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n\ndef _lazy():\n    {statement}\n")


@pytest.mark.parametrize("module, statement, broken", [
    ("pipeline.llm.base", "from pipeline.envs.base import make_game  # noqa: F401",
     ["the LLM layer imports no game", "entry points > stages > params > tracks > games > LLM > models > machinery"]),
    ("pipeline.core.artifacts", "from pipeline.text.play import summarize  # noqa: F401",
     ["no import cycles between the packages of pipeline/ and stages/",
      "entry points > stages > params > tracks > games > LLM > models > machinery"]),
    ("pipeline.core.artifacts", "from pipeline.core.runners import ChunkJob  # noqa: F401",
     ["machinery: stage contract > runners > signals > params > storage"]),
    ("pipeline.text.policies", "import stages.rl_text  # noqa: F401", ["nothing below the stages imports stages/"]),
    ("pipeline.nethack.oni", "from pipeline.text.play import summarize  # noqa: F401",
     ["the text track and the NetHack track never import each other"]),
    ("pipeline.text.play", "import nle  # noqa: F401",
     ["NLE and sample-factory are imported only in pipeline.nethack"]),
])
def test_a_lazy_import_that_breaks_the_layering_is_caught(tmp_path, module, statement, broken):
    tree = copy_tree(tmp_path)
    lazy_import(tree, module, statement)
    res = lint_imports(tree)
    assert res.returncode == 1, res.stdout
    for name in broken:
        assert f"{name} BROKEN" in res.stdout
    assert f"{module} -> " in res.stdout


def check_imports(cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``curio check-imports`` with the repo's contracts, over the ``pipeline`` and ``stages`` packages found first
    on the path (those under ``cwd``)."""
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "check-imports", "--config",
                           str(ROOT / "pyproject.toml")], cwd=cwd, env=env, capture_output=True, text=True)


def test_the_import_graph_has_no_cycle_and_no_upward_import(tmp_path):
    res = check_imports(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "import cycles: 0\n" in res.stdout
    assert "upward imports (against the layers contracts of pyproject.toml): 0\n" in res.stdout
    # the same count over a tree with a cycle through stages/ (storage importing a stage) finds it
    tree = copy_tree(tmp_path)
    lazy_import(tree, "pipeline.core.artifacts", "import stages.rollout_text  # noqa: F401")
    res = check_imports(tree, env={"PYTHONPATH": str(tree), "PATH": str(Path(sys.executable).parent)})
    assert res.returncode == 1
    assert "import cycles: 1\n" in res.stdout and "pipeline.core.artifacts -> stages.rollout_text" in res.stdout


def section(text: str, heading: str) -> str:
    """The body of a markdown section, up to the next heading of the same level."""
    body = text[text.index(heading):]
    end = body.find("\n## ", 1)
    return body if end == -1 else body[:end]


def packages() -> list[Path]:
    return sorted(p.parent for p in [*PIPELINE.rglob("__init__.py"), *(ROOT / "stages").rglob("__init__.py")]
                  if p.parent != PIPELINE and "__pycache__" not in p.parts)


def test_the_readme_map_names_every_package_and_entry_point():
    """The README's map for newcomers stays whole: every package of pipeline/ and stages/ and every entry point
    (the modules at the top of pipeline/)."""
    readme = (ROOT / "README.md").read_text()
    layout = section(readme, "## Map of the tree")
    wanted = [str(p.relative_to(ROOT)) + "/" for p in packages()]
    missing = [w for w in wanted if w not in layout and w.removeprefix("stages/") not in layout]
    missing += [p.name for p in PIPELINE.glob("*.py") if p.name != "__init__.py" and p.name not in layout]
    assert not missing, "README.md's Map of the tree does not name: " + ", ".join(sorted(missing))
    assert len(readme.splitlines()) <= 150


def test_docs_layout_names_every_module_and_folder():
    """docs/layout.md names every module and folder of pipeline/ and stages/ (text games are "one module per game"
    in envs/, so they need not be listed one by one)."""
    layout = (ROOT / "docs" / "layout.md").read_text()
    wanted = [p for p in PIPELINE.iterdir() if p.is_dir() and p.name != "__pycache__"]
    wanted += [p for p in PIPELINE.glob("*.py") if p.name != "__init__.py"]
    for package in packages():
        if package.name != "envs":
            wanted += [p for p in package.glob("*.py") if p.name != "__init__.py"]
            wanted += [p for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"]
    missing = [str(p.relative_to(ROOT)) for p in wanted if (p.name + "/" if p.is_dir() else p.name) not in layout]
    assert not missing, "docs/layout.md does not name: " + ", ".join(sorted(missing))


def test_every_page_the_readme_and_docs_link_to_exists():
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    links = [(page, target) for page in pages
             for target in re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", page.read_text())
             if "://" not in target]
    assert any(target.startswith("docs/") for _, target in links)
    missing = [f"{page.name} -> {target}" for page, target in links if not (page.parent / target).is_file()]
    assert not missing, "links to missing pages: " + ", ".join(missing)
