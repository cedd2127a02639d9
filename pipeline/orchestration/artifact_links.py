"""Links to a run's files in Prefect artifacts that a browser can follow.

A ``file://`` link in the Prefect UI does nothing (browsers do not open local files from an http page), so an
artifact names each file by its path in the checkout the run used and links it under a local web server of that
checkout's data directory: ``python -m http.server --bind 127.0.0.1 --directory DATA_DIR PORT`` serves every
file below it, the report's page included.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

PORT = 8765


def serve_command(data_dir: Path, port: int = PORT) -> str:
    return f"python -m http.server --bind 127.0.0.1 --directory {data_dir.resolve()} {port}"


def served_url(path: Path, data_dir: Path, port: int = PORT) -> str | None:
    """``path``'s address under :func:`serve_command` (None when it is not below ``data_dir``)."""
    try:
        rel = path.resolve().relative_to(data_dir.resolve())
    except ValueError:
        return None
    return f"http://127.0.0.1:{port}/{quote(rel.as_posix())}"


def files_markdown(paths: list[Path], data_dir: Path, port: int = PORT) -> str:
    """A markdown list of files: each one's path (relative to the working directory) and its served link, then the
    command that serves them."""
    lines = []
    for p in paths:
        url = served_url(p, data_dir, port)
        shown = os.path.relpath(p.resolve())
        lines.append(f"- `{shown}`" + (f": [{p.name}]({url})" if url else ""))
    return "\n".join([*lines, "", f"Links open once the run's data directory is served (`{os.getcwd()}`):", "",
                      f"    {serve_command(data_dir, port)}", ""])
