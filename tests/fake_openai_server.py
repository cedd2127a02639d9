"""A small OpenAI-compatible chat server on loopback, with deterministic answers and injectable faults.

Run it as a process (``python tests/fake_openai_server.py --port 0`` prints ``PORT <n>`` once it listens) or
use :class:`FakeServer` from a test. Behaviour is set through ``POST /control`` (JSON, see ``Settings``) and
observed through ``GET /stats``. Faults are drawn from a hash of (seed, request content, how many times that
content was seen), so a given sequence of requests gets the same faults whatever the concurrency, and a
retried request gets a fresh draw.

Endpoints: ``POST /v1/chat/completions``, ``GET /v1/models``, ``POST /control``, ``GET /stats``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from aiohttp import web

GARBAGE = [
    "qzx ~~ 0xDEADBEEF ]]] lorem ipsum",
    "",
    "I am not sure what you mean. Could you rephrase?",
    "{{{{ ))) ??? ",
]


# Replies to Curio's own prompts (matched on a phrase of each template); some are deliberately unparseable.
CURIO_RULES = [
    [r"host of a guessing game", ["Yes", "No", "Goal reached", "Yes, it is."]],
    [
        r"audit finished guessing games",
        ["The final guess names the secret.\n<VALID>", "Only a related object.\n<NOTVALID>", "Hard to say."],
    ],
    [
        r"best_description",
        [
            'Description 1 shows a kill.\n("best_description": 1)',
            'The second one descends.\n("best_description": 2)',
            'Neither is better.\n("best_description": None)',
            "Both look alike to me.",
        ],
    ],
    [
        r"<label>helpful</label>",
        [
            "Picking up gold helps.\n<label>helpful</label>",
            "A neutral message.\n<label>unhelpful</label>",
            "This seems helpful to me.",
        ],
    ],
]


@dataclass
class Settings:
    """What the server does; every field can be changed through ``POST /control``."""

    latency_s: float = 0.0  # added to every request
    error_rate: float = 0.0  # 5xx (and some 429) responses
    timeout_rate: float = 0.0  # requests that hang for ``hang_s`` before answering
    garbage_rate: float = 0.0  # 200 responses whose text is nonsense
    malformed_rate: float = 0.0  # 200 responses whose body is not a valid completion
    hang_s: float = 5.0
    reject_auth: bool = False  # answer 401 with the received Authorization header echoed in the message
    seed: int = 0
    # [regex, reply] pairs matched against the whole request text; reply may be a list (picked by hash).
    rules: list = field(default_factory=list)


class State:
    def __init__(self) -> None:
        self.settings = Settings()
        self.reset_counters()

    def reset_counters(self) -> None:
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.by_outcome: dict[str, int] = {}
        self.seen: dict[str, int] = {}
        self.max_tokens_seen = 0
        self.last_authorization = ""
        self.started = time.monotonic()

    def stats(self) -> dict:
        return {
            "requests": self.requests,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "by_outcome": dict(self.by_outcome),
            "unique_contents": len(self.seen),
            "max_tokens_seen": self.max_tokens_seen,
            "last_authorization": self.last_authorization,
        }


def _unit(*parts: object) -> float:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


def _reply_for(settings: Settings, text: str) -> str:
    for pattern, reply in settings.rules:
        if re.search(pattern, text, re.DOTALL):
            if isinstance(reply, list):
                return reply[int(_unit("pick", text) * len(reply))]
            return reply
    return "echo " + hashlib.sha256(text.encode()).hexdigest()[:12]


def _completion(model: str, content: str, prompt_words: int) -> dict:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": prompt_words,
            "completion_tokens": len(content.split()),
            "total_tokens": prompt_words + len(content.split()),
        },
    }


async def chat(request: web.Request) -> web.Response:
    state: State = request.app["state"]
    s = state.settings
    state.requests += 1
    state.in_flight += 1
    state.max_in_flight = max(state.max_in_flight, state.in_flight)
    state.last_authorization = request.headers.get("Authorization", "")
    try:
        if s.reject_auth:
            state.by_outcome["rejected"] = state.by_outcome.get("rejected", 0) + 1
            auth = request.headers.get("Authorization", "")
            return web.json_response({"error": {"message": f"invalid credentials {auth}"}}, status=401)
        body = await request.json()
        messages = body.get("messages", [])
        state.max_tokens_seen = max(state.max_tokens_seen, int(body.get("max_tokens") or 0))
        text = "\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages)
        key = hashlib.sha256(text.encode()).hexdigest()
        nth = state.seen.get(key, 0)
        state.seen[key] = nth + 1
        u = _unit(s.seed, key, nth)
        if s.latency_s:
            await asyncio.sleep(s.latency_s)
        edges = [s.error_rate, s.timeout_rate, s.garbage_rate, s.malformed_rate]
        outcome, acc = "ok", 0.0
        for name, rate in zip(["error", "timeout", "garbage", "malformed"], edges, strict=True):
            if acc <= u < acc + rate:
                outcome = name
                break
            acc += rate
        state.by_outcome[outcome] = state.by_outcome.get(outcome, 0) + 1
        words = len(text.split())
        if outcome == "error":
            status = [500, 502, 503, 429][int(_unit("status", key, nth) * 4)]
            error = {"error": {"message": "injected failure", "type": "server_error"}}
            return web.json_response(error, status=status)
        if outcome == "timeout":
            await asyncio.sleep(s.hang_s)
            return web.json_response(_completion(body.get("model", ""), _reply_for(s, text), words))
        if outcome == "garbage":
            content = GARBAGE[int(_unit("garbage", key, nth) * len(GARBAGE))]
            return web.json_response(_completion(body.get("model", ""), content, words))
        if outcome == "malformed":
            if _unit("malformed", key, nth) < 0.5:
                return web.Response(text='{"choices": [{"message": ', content_type="application/json")
            return web.json_response({"id": "x", "object": "chat.completion", "unexpected": True})
        return web.json_response(_completion(body.get("model", ""), _reply_for(s, text), words))
    finally:
        state.in_flight -= 1


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})


async def control(request: web.Request) -> web.Response:
    state: State = request.app["state"]
    body = await request.json()
    state.settings = Settings(**body)
    state.reset_counters()
    return web.json_response(asdict(state.settings))


async def stats(request: web.Request) -> web.Response:
    return web.json_response(request.app["state"].stats())


def make_app() -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app["state"] = State()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/control", control)
    app.router.add_get("/stats", stats)
    return app


async def _serve(port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(4096)
    runner = web.AppRunner(make_app(), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock, backlog=4096).start()
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


class FakeServer:
    """The server in a child process (its own CPU core and event loop); stops on ``close``."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"fake server did not start: {line!r}")
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = self.url + "/v1"

    def configure(self, **settings: object) -> dict:
        """Replace the settings (unset fields get defaults) and zero the counters."""
        return self._call("/control", settings)

    def stats(self) -> dict:
        return self._call("/stats")

    def _call(self, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    try:
        import uvloop  # noqa: F401 - optional speed-up

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_serve(args.port))
