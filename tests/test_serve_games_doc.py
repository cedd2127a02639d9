"""docs/serve-games.md: its command serves the game it names and prints the line the page quotes, and its OpenEnv
client, run as the page gives it (only the port changed), prints what the page quotes."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO
from test_env_serve import served

PAGE = (REPO / "docs" / "serve-games.md").read_text()


def fenced(kind: str) -> list[str]:
    """The page's fenced blocks of ``kind`` ("bash", "python", "" for what they print), in order."""
    return [body for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", PAGE, flags=re.M | re.S) if lang == kind]


def test_the_pages_command_and_client_print_what_it_quotes():
    command = fenced("bash")[0].strip()
    assert command == "curio env serve twenty_questions --port 8000"
    banner, client_output = fenced("")[0].strip(), fenced("")[1]
    client = fenced("python")[0]
    assert "GenericEnvClient" in client and "pipeline" not in client  # an outside client: no Curio import
    with served(*command.split()[3:-2]) as (url, line):
        port = url.rsplit(":", 1)[1]
        assert line == banner.replace(":8000", f":{port}")
        out = subprocess.run([sys.executable, "-c", client.replace(":8000", f":{port}")], capture_output=True,
                             text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == client_output
