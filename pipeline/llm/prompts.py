"""Prompts as data: YAML templates loaded by the module that owns them, and filled with ``render``.

Each concept keeps its prompts beside its code, with the builders that fill them and the strict parsers of the
answers (``pipeline/envs/prompts/``: the yes/no games' LLM host; ``pipeline/text/prompts/``: the text track's
judges; ``pipeline/nethack/prompts/``: Motif and ONI annotation); this module only loads and renders.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml


@functools.cache
def load_prompt(directory: Path, name: str) -> dict[str, Any]:
    """The parsed ``<name>.yaml`` of ``directory``."""
    path = Path(directory) / f"{name}.yaml"
    if not path.exists():
        raise KeyError(f"llm: no prompt file {path}")
    return yaml.safe_load(path.read_text())


def render(template: str, **fields: Any) -> str:
    """Fill ``{name}`` slots; trailing spaces left by empty slots are trimmed."""
    text = template.format_map(fields)
    return "\n".join(line.rstrip() for line in text.strip().splitlines())
