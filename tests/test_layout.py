"""Where concepts live: the LLM layer knows no games, and the NetHack track is one package.

Read from the source (every import, lazy ones inside functions included), so a new import that breaks the
layering fails here before anyone notices a circular import or a game dragged into a backend.
"""

import ast
from pathlib import Path

PIPELINE = Path(__file__).resolve().parents[1] / "pipeline"
#: What pipeline/llm may import from the project: itself, params, errors, artifacts and the chat-model helpers.
LLM_MAY_IMPORT = ("pipeline.llm", "pipeline.core.config", "pipeline.core.errors", "pipeline.core.artifacts",
                  "pipeline.models.chat", "pipeline.models.gguf", "pipeline.models.masks")


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def project_imports(path: Path) -> set[str]:
    return {m for m in imports(path) if m.split(".")[0] in ("pipeline", "stages")}


def allowed(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_llm_layer_imports_no_game_code():
    wrong = {
        f"{path.relative_to(PIPELINE.parent)}: {module}"
        for path in sorted((PIPELINE / "llm").rglob("*.py"))
        for module in project_imports(path)
        # ``from pipeline.models import chat`` names pipeline.models itself: judge the imported names only
        if module != "pipeline.models" and not allowed(module, LLM_MAY_IMPORT)
    }
    assert not wrong, "pipeline/llm imports game or stage code:\n" + "\n".join(sorted(wrong))


def test_the_layering_check_sees_lazy_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from pipeline.envs.base import make_game\n    import stages.rollout\n")
    assert {"pipeline.envs.base", "stages.rollout"} <= project_imports(module)
    assert not allowed("pipeline.envs.base", LLM_MAY_IMPORT) and allowed("pipeline.llm.cache", LLM_MAY_IMPORT)


def test_nethack_lives_in_one_package():
    """NLE and sample-factory are imported only inside pipeline/nethack (the stages import that package)."""
    outside = {
        f"{path.relative_to(PIPELINE.parent)}: {module}"
        for path in sorted(PIPELINE.rglob("*.py"))
        if "nethack" not in path.relative_to(PIPELINE).parts
        for module in imports(path)
        if module.split(".")[0] in ("nle", "sample_factory")
    }
    assert not outside, "NetHack code outside pipeline/nethack:\n" + "\n".join(sorted(outside))


def test_the_readme_layout_names_every_module_and_folder():
    """The README's map for newcomers stays whole: every module and folder of pipeline/ and stages/ is named
    (text games are "one module per game" in envs/, so they need not be listed one by one)."""
    readme = (PIPELINE.parent / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    layout = layout[: layout.find("\n## ", 1)] if "\n## " in layout[1:] else layout
    root = PIPELINE.parent
    wanted = [p for p in PIPELINE.iterdir() if p.is_dir() and p.name != "__pycache__"]
    wanted += [p for p in PIPELINE.glob("*.py") if p.name != "__init__.py"]
    for folder in ("llm", "models", "nethack"):
        wanted += [p for p in (PIPELINE / folder).glob("*.py") if p.name != "__init__.py"]
    wanted += [p for p in (root / "stages").rglob("*.py") if p.name != "__init__.py"]
    missing = [str(p.relative_to(root)) for p in wanted
               if (p.name + "/" if p.is_dir() else p.name) not in layout]
    assert not missing, "README.md's Layout does not name: " + ", ".join(sorted(missing))
