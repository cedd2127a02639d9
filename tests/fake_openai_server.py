"""A small OpenAI-compatible chat server on loopback, with deterministic answers and injectable faults.

Run it as a process (``python tests/fake_openai_server.py --port 0`` prints ``PORT <n>`` once it listens) or
use :class:`FakeServer` from a test. Behaviour is set through ``POST /control`` (JSON, see ``Settings``) and
observed through ``GET /stats``. Faults are drawn from a hash of (seed, request content, how many times that
content was seen), so a given sequence of requests gets the same faults whatever the concurrency, and a
retried request gets a fresh draw.

Endpoints: ``POST /v1/chat/completions``, ``GET /v1/models``, ``POST /control``, ``GET /stats``. The HTTP
layer is a bare asyncio protocol (keep-alive, Content-Length or chunked bodies, no pipelining), so the server
costs far less CPU per request than the client under test (see bench/bench_llm.py).
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

try:  # optional: faster JSON
    import orjson

    _dumps, _loads = orjson.dumps, orjson.loads
except ImportError:  # pragma: no cover

    def _dumps(value: object) -> bytes:
        return json.dumps(value).encode()

    _loads = json.loads

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


# A deterministic LLM host for Curio's environment prompt (pipeline/envs/prompts/environment.yaml), on with
# ``host=True``: see host_reply.
HOST_PROMPT = "host of a guessing game"
HOST_RETRY = "That reply is not allowed"
HOST_NEVER = "riddle"  # a question with this word never gets a valid reply (the client ends on its default)
_SECRET_RE = re.compile(r'you know it: "([^"]+)"')
_QUESTION_RE = re.compile(r"New question: (.*)")


def host_reply(text: str, invalid_rate: float = 0.0) -> str:
    """The host's answer to one environment request (the request's messages as one text).

    "Goal reached" when the question names the secret (whole words, any case); otherwise "Yes" or "No" from a
    hash of (secret, question), so it is not the program oracle's answer; "Yes, it is." (not allowed, so
    re-asked) on a first ask with probability ``invalid_rate``; never a valid reply to a question with "riddle".
    """
    secret = _SECRET_RE.search(text)
    question = _QUESTION_RE.search(text)
    if secret is None or question is None:
        return "I do not understand the game."
    name, q = secret.group(1).strip().lower(), question.group(1).strip()
    if HOST_NEVER in q.lower():
        return "Let me think about that riddle."
    if HOST_RETRY not in text and _unit("host-invalid", name, q) < invalid_rate:
        return "Yes, it is."
    if re.search(rf"\b{re.escape(name)}\b", q.lower()):
        return "Goal reached"
    return "Yes" if _unit("host", name, q) < 0.5 else "No"


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
    host: bool = False  # answer Curio's environment prompt with host_reply (before the rules)
    host_invalid_rate: float = 0.0
    record: bool = False  # keep every chat request's text and outcome (``GET /stats`` → "log")


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
        self.log: list[tuple[str, str]] = []  # (request text, outcome) when settings.record
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
            "log": self.log,
        }


def _unit(*parts: object) -> float:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


def _reply_for(settings: Settings, text: str) -> str:
    if settings.host and HOST_PROMPT in text:
        return host_reply(text, settings.host_invalid_rate)
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


def _outcome(s: Settings, u: float) -> str:
    edges = [s.error_rate, s.timeout_rate, s.garbage_rate, s.malformed_rate]
    acc = 0.0
    for name, rate in zip(["error", "timeout", "garbage", "malformed"], edges, strict=True):
        if acc <= u < acc + rate:
            return name
        acc += rate
    return "ok"


Response = tuple[int, bytes, float]  # status, JSON body, seconds to wait before sending it


def chat(state: State, headers: dict[str, str], raw: bytes) -> Response:
    s = state.settings
    state.requests += 1
    state.last_authorization = headers.get("authorization", "")
    if s.reject_auth:
        state.by_outcome["rejected"] = state.by_outcome.get("rejected", 0) + 1
        return 401, _dumps({"error": {"message": f"invalid credentials {state.last_authorization}"}}), 0.0
    body = _loads(raw)
    messages = body.get("messages", [])
    model = body.get("model", "")
    state.max_tokens_seen = max(state.max_tokens_seen, int(body.get("max_tokens") or 0))
    text = "\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages)
    key = hashlib.sha256(text.encode()).hexdigest()
    nth = state.seen.get(key, 0)
    state.seen[key] = nth + 1
    outcome = _outcome(s, _unit(s.seed, key, nth))
    state.by_outcome[outcome] = state.by_outcome.get(outcome, 0) + 1
    if s.record:
        state.log.append((text, outcome))
    words = len(text.split())
    delay = s.latency_s
    if outcome == "error":
        status = [500, 502, 503, 429][int(_unit("status", key, nth) * 4)]
        return status, _dumps({"error": {"message": "injected failure", "type": "server_error"}}), delay
    if outcome == "timeout":
        return 200, _dumps(_completion(model, _reply_for(s, text), words)), delay + s.hang_s
    if outcome == "garbage":
        content = GARBAGE[int(_unit("garbage", key, nth) * len(GARBAGE))]
        return 200, _dumps(_completion(model, content, words)), delay
    if outcome == "malformed":
        if _unit("malformed", key, nth) < 0.5:
            return 200, b'{"choices": [{"message": ', delay
        return 200, _dumps({"id": "x", "object": "chat.completion", "unexpected": True}), delay
    return 200, _dumps(_completion(model, _reply_for(s, text), words)), delay


def route(state: State, method: str, path: str, headers: dict[str, str], raw: bytes) -> Response:
    if method == "POST" and path == "/v1/chat/completions":
        return chat(state, headers, raw)
    if method == "GET" and path == "/v1/models":
        return 200, _dumps({"object": "list", "data": [{"id": "fake-model", "object": "model"}]}), 0.0
    if method == "POST" and path == "/control":
        state.settings = Settings(**_loads(raw))
        state.reset_counters()
        return 200, _dumps(asdict(state.settings)), 0.0
    if method == "GET" and path == "/stats":
        return 200, _dumps(state.stats()), 0.0
    return 404, _dumps({"error": {"message": f"no route {method} {path}"}}), 0.0


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


class HTTPProtocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive, on a bare asyncio protocol: a fraction of a web framework's CPU per request.

    Requests are read by Content-Length (or chunked); a delayed response is a timer, not a task. Clients must
    not pipeline (none of the ones used here do): a delayed answer is sent whenever its timer fires.
    """

    def __init__(self, state: State) -> None:
        self.state = state
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None:
            request = self._next_request()
            if request is None:
                return
            method, path, headers, raw = request
            try:
                status, body, delay = route(self.state, method, path, headers, raw)
            except Exception as e:  # noqa: BLE001 - a bad request is answered, never kills the server
                status, body, delay = 400, _dumps({"error": {"message": f"{type(e).__name__}: {e}"}}), 0.0
            close = headers.get("connection", "").lower() == "close"
            if method == "POST" and path == "/v1/chat/completions":
                self.state.in_flight += 1
                self.state.max_in_flight = max(self.state.max_in_flight, self.state.in_flight)
                if delay > 0:
                    asyncio.get_running_loop().call_later(delay, self._send, status, body, close, True)
                    continue
                self._send(status, body, close, True)
            else:
                self._send(status, body, close, False)

    def _next_request(self) -> tuple[str, str, dict[str, str], bytes] | None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        lines = self.buffer[:end].decode("latin-1").split("\r\n")
        method, target = lines[0].split(" ", 2)[:2]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        start = end + 4
        if headers.get("transfer-encoding", "").lower() == "chunked":
            raw, pos = bytearray(), start
            while True:
                eol = self.buffer.find(b"\r\n", pos)
                if eol < 0:
                    return None
                size = int(self.buffer[pos:eol].split(b";")[0], 16)
                if len(self.buffer) < eol + 2 + size + 2:
                    return None
                raw += self.buffer[eol + 2 : eol + 2 + size]
                pos = eol + 2 + size + 2
                if size == 0:
                    break
            del self.buffer[:pos]
            return method, target.split("?")[0], headers, bytes(raw)
        length = int(headers.get("content-length") or 0)
        if len(self.buffer) < start + length:
            return None
        raw = bytes(self.buffer[start : start + length])
        del self.buffer[: start + length]
        return method, target.split("?")[0], headers, raw

    def _send(self, status: int, body: bytes, close: bool, chat_request: bool) -> None:
        if chat_request:
            self.state.in_flight -= 1
        transport = self.transport
        if transport is None or transport.is_closing():
            return  # the client gave up (its timeout)
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{'Connection: close' if close else 'Connection: keep-alive'}\r\n\r\n"
        )
        transport.write(head.encode() + body)
        if close:
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def _serve(port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(4096)
    state = State()
    server = await asyncio.get_running_loop().create_server(lambda: HTTPProtocol(state), sock=sock, backlog=4096)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


class FakeServer:
    """The server in a child process (its own CPU core and event loop); stops on ``close``.

    ``port`` 0 picks a free one; a given port brings a killed server back at the same address.
    """

    def __init__(self, port: int = 0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--port", str(port)],
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
