"""Where concepts live: pipeline/ in layers, each importing only those below it (pyproject.toml's import-linter
contracts: the LLM layer knows no games, the two tracks never import each other, only entry points import stages/,
NLE and sample-factory stay in pipeline/nethack, the reporting runs no stage, no cycles).

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
import yaml

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
    assert "Contracts: 8 kept, 0 broken." in res.stdout


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
    ("pipeline.reporting.viewer", "from pipeline.text.play import summarize  # noqa: F401",
     ["the reporting imports no stage, no rl-text algorithm, no play, no trainer"]),
    ("pipeline.tools.table", "from pipeline.orchestration.run_dvc import main  # noqa: F401",
     ["entry points > stages > params > tracks > games > LLM > models > machinery"]),
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


def test_every_stage_is_stages_slash_its_name_and_stages_holds_nothing_else():
    """A stage NAME is declared and run in stages/NAME.py (hyphens as underscores), and every module of stages/
    declares a stage: helpers live in pipeline/."""
    from pipeline.generate import declared_stages

    declared = {s.name: s.module for s in declared_stages()}
    assert set(declared) == set(dvc_stages())
    wrong = [f"{name}: {module}" for name, module in declared.items() if module != "stages." + name.replace("-", "_")]
    assert not wrong, "stages not in stages/<stage_name>.py: " + ", ".join(wrong)
    modules = {f"stages.{p.stem}" for p in (ROOT / "stages").rglob("*.py") if p.name != "__init__.py"}
    assert modules == set(declared.values()), f"not stages: {modules - set(declared.values())}"


DAG_PHRASES = {"every other stage", "every stage's metrics"}  # the README DAG's words for "all of them"


def dvc_stages() -> dict[str, set[str]]:
    """dvc.yaml's stages, each with the stages whose outputs it depends on directly."""
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    owner = {next(iter(o)) if isinstance(o, dict) else o: name
             for name, stage in spec.items() for o in [*stage.get("outs", []), *stage.get("metrics", [])]}

    def related(a: str, b: str) -> bool:
        return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")
    return {name: {o for d in stage.get("deps", []) for path, o in owner.items() if o != name and related(d, path)}
            for name, stage in spec.items()}


def readme_dag() -> list[list[list[str]]]:
    """The README's DAG drawing: per line, its segments between arrows, each a list of the names it lists."""
    block = section((ROOT / "README.md").read_text(), "## The DAG").split("```")[1]
    lines = []
    for line in block.strip().splitlines():
        line = re.sub(r"\([^)]*\)", "", line)
        line = re.sub(r"^(params|text|nethack|summary) ", "", line.strip())
        lines.append([[n.strip() for n in seg.split(",") if n.strip()] for seg in line.split("─►")])
    return lines


def test_the_readme_dag_is_dvc_yamls():
    """Every stage of dvc.yaml is in the README's drawing and every name there is a stage; each arrow is a
    dependency of dvc.yaml (the stage on the right reads an output of the stage on the left)."""
    stages, drawn, wrong = dvc_stages(), set(), []
    for segments in readme_dag():
        for seg in segments:
            drawn |= {n for n in seg if n not in DAG_PHRASES}
        for left, right in zip(segments, segments[1:], strict=False):
            wrong += [f"{a} ─► {b}" for a in left for b in right
                      if a in stages and b in stages and a not in stages[b]]
    assert drawn == set(stages), f"not drawn: {sorted(set(stages) - drawn)}; not stages: {sorted(drawn - set(stages))}"
    assert not wrong, "arrows dvc.yaml does not have: " + ", ".join(wrong)
    assert all("check-params" in ups for name, ups in stages.items() if name != "check-params")  # "every other"


def test_the_readme_map_names_only_files_that_exist():
    """Each file and folder in the left column of the README's map exists (what runs write, data/ and metrics/,
    aside): a name at the line's start is a path from the repo root, an indented one a path inside the last folder
    named at a line's start."""
    block = section((ROOT / "README.md").read_text(), "## Map of the tree").split("```")[1]
    base, missing = ROOT, []
    for line in block.strip().splitlines():
        names = []
        for word in line.split():  # the left column: the words that are paths, up to the first that is not
            if not re.fullmatch(r"[\w./-]+", word) or not (word.endswith("/") or re.search(r"\.\w+$", word)):
                break
            names.append(word)
        if not names:
            continue
        if not line.startswith(" "):
            base = ROOT / names[0].rstrip("/") if names[0].endswith("/") else ROOT / Path(names[0]).parent
            missing += [n for n in names if not (ROOT / n).exists() and not NOT_IN_REPO.search(n)]
        else:
            missing += [f"{base.relative_to(ROOT)}/{n}" for n in names if not (base / n).exists()]
    assert not missing, "the README's map names what is not in the tree: " + ", ".join(missing)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a page has: its headings' (GitHub's numbering of repeats included) and its explicit ids."""
    seen: dict[str, int] = {}
    found = set()
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        base = slug(heading)
        found.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return found | set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))


DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: paths in the docs that are not in the repo: outputs, caches, a placeholder or a pattern
NOT_IN_REPO = re.compile(r"^(data|metrics|dvc_plots|mlartifacts|mlruns)/|[A-Z]{3,}|[*<>{}]|\.\.\.|…")


def linked(page: Path, target: str) -> Path:
    """The file a link of ``page`` reaches, as GitHub resolves it: from the page's folder, or from the repository's
    root when it starts with "/" (docs/results/current/claims.md's links, which the README quotes word for word)."""
    return ROOT / target.lstrip("/") if target.startswith("/") else page.parent / target


def test_every_link_of_the_readme_and_docs_reaches_its_page_and_anchor():
    links = [(page, target, anchor) for page in DOC_PAGES
             for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", page.read_text())
             if "://" not in target and not target.startswith("mailto:")]
    assert any(target.startswith("docs/") for _, target, _ in links)
    missing = [f"{page.relative_to(ROOT)} -> {target}" for page, target, _ in links
               if target and not linked(page, target).exists()]
    assert not missing, "links to missing files: " + ", ".join(missing)
    broken = [f"{page.relative_to(ROOT)} -> {target}#{anchor}" for page, target, anchor in links
              if anchor and (linked(page, target) if target else page).suffix == ".md"
              and anchor not in anchors(linked(page, target) if target else page)]
    assert not broken, "links to missing anchors: " + ", ".join(broken)


def test_every_code_path_the_readme_and_docs_name_exists():
    """A path of the repo named in a page (``pipeline/text/play.py``, ``presets/smollm2.yaml``, ``bench/``) is in
    the tree; the results log, which records what was, is left out."""
    pattern = re.compile(r"(?<![\w./-])((?:pipeline|stages|tests|bench|presets|docs)/[\w./@*<>-]*[\w/*>])")
    missing = []
    for page in DOC_PAGES:
        if page.parent.name == "results":
            continue
        for path in pattern.findall(page.read_text()):
            path = path.rstrip(".")
            if not (path.endswith("/") or re.search(r"\.\w+$", path)):
                continue  # a name that is not a file's or a folder's (a Prefect deployment: pipeline/default)
            if not NOT_IN_REPO.search(path) and not (ROOT / path).exists() and not (page.parent / path).exists():
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert not missing, "paths that are not in the tree: " + ", ".join(sorted(set(missing)))


def test_no_function_in_pipeline_or_stages_is_over_80_lines():
    """A function reads on one screen or two; a longer one is split into named steps."""
    import ast

    long = []
    for path in sorted([*PIPELINE.rglob("*.py"), *(ROOT / "stages").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 80:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                            f"({node.end_lineno - node.lineno + 1} lines)")
    assert not long, "functions over 80 lines: " + ", ".join(long)


def test_bench_holds_timings_only():
    """bench/ holds scripts that time something side by side; the tools a user runs are `curio` commands."""
    scripts = sorted(p.name for p in (ROOT / "bench").glob("*.py"))
    assert scripts and all(name.startswith("bench_") for name in scripts), scripts


def test_the_architecture_page_is_one_page_with_one_diagram_linked_from_the_readme():
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert "](docs/architecture.md)" in (ROOT / "README.md").read_text()
    assert page.count("```") == 2 and len(page.splitlines()) <= 120
    diagram = page.split("```")[1]
    for name in ("stages/<stage_name>.py", "curio generate", "dvc.yaml", "execute", "run(params slice, ctx)"):
        assert name in diagram, name
