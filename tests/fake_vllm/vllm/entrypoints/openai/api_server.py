"""A stand-in for vLLM's OpenAI-compatible server, for the fast tests of Curio's server lifecycle (standard
library only, but for one path). It takes the arguments Curio passes, answers ``/v1/models``,
``/v1/chat/completions`` (the last user message reversed, with ``token_ids``) and ``/v1/completions``:
``prompt_logprobs`` (-0.01 x token id; when ``--model`` is a model directory, those of the weights it serves, scored
in float32 with transformers, imported at the first such request: the path that is not standard library), or, for
a prompt of token ids, a reply of up to 4 ids drawn from the prompt then the request's first stop token, with
``token_ids`` and a log-prob of -0.5 - 0.01 x the count of weight loads for each. In dev mode it answers
``/collective_rpc`` (``reload_weights``: the weights path is appended to ``$FAKE_VLLM_LOADS``, and served from then
on) and ``/reset_prefix_cache``. It writes its pid to ``$FAKE_VLLM_PIDFILE``. ``$FAKE_VLLM_FAIL`` makes it exit 3 at
start; ``$FAKE_VLLM_SEED_CRASH`` makes a request with ``seed`` kill it, as the CPU engine does;
``$FAKE_VLLM_LOAD_FAIL`` = N makes its Nth weight load fail (HTTP 500); ``$FAKE_VLLM_DIE_AFTER`` = N makes it exit
after answering N token-id completions; ``$FAKE_VLLM_SLOW_START`` = S makes it ignore SIGTERM for its first S
seconds before it serves, as vLLM does while it loads its model. ``$FAKE_VLLM_STALE`` makes a weight load answer
as it should and keep the weights served (a known vLLM failure); ``$FAKE_VLLM_BODIES`` is a file each request's
route and body are appended to, one JSON line each."""

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ap = argparse.ArgumentParser()
ap.add_argument("--model")
ap.add_argument("--served-model-name")
ap.add_argument("--host")
ap.add_argument("--port", type=int)
args, _rest = ap.parse_known_args()
if os.environ.get("FAKE_VLLM_SLOW_START"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(os.environ["FAKE_VLLM_PIDFILE"], "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(float(os.environ["FAKE_VLLM_SLOW_START"]))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
if os.environ.get("FAKE_VLLM_FAIL"):
    print("RuntimeError: no CPU backend for this model", flush=True)
    sys.exit(3)


LOADS: list[str] = []
COMPLETIONS = [0]
COUNTING = threading.Lock()
SCORING = threading.Lock()
SERVED: dict = {}  # the weights prompt_logprobs scores: {"path": ..., "model": ...}


def served_path() -> str:
    """The weights served: the last loaded, or --model (only --model when loads leave the weights stale)."""
    return args.model if not LOADS or os.environ.get("FAKE_VLLM_STALE") else LOADS[-1]


def prompt_logprobs(ids: list[int]) -> list[float] | None:
    """log p of each token after the first under the weights served, float32; None without a model directory."""
    path = served_path()
    if not os.path.isfile(os.path.join(path, "config.json")):
        return None
    import torch
    from transformers import AutoModelForCausalLM

    with SCORING:
        if SERVED.get("path") != path:
            SERVED.update(path=path, model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval())
        with torch.no_grad():
            logits = SERVED["model"](torch.tensor([ids])).logits[0, :-1].float()
    logps = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return [float(x) for x in logps]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self.reply({"object": "list", "data": [{"id": args.served_model_name}]})
        else:
            self.send_error(404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if os.environ.get("FAKE_VLLM_BODIES"):
            with COUNTING, open(os.environ["FAKE_VLLM_BODIES"], "a") as f:
                f.write(json.dumps({"route": self.path, "body": body}) + "\n")
        if "seed" in body and os.environ.get("FAKE_VLLM_SEED_CRASH"):
            print("RuntimeError: CPU Generator does not use offset", flush=True)
            os._exit(1)
        if self.path == "/v1/chat/completions":
            text = body["messages"][-1]["content"][::-1]
            ids = [ord(c) for c in text]
            choice = {"message": {"role": "assistant", "content": text}}
            if body.get("return_token_ids"):
                choice["token_ids"] = ids
            self.reply({"choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": len(ids)}})
        elif self.path == "/v1/completions" and body.get("prompt_logprobs") is not None:
            ids = body["prompt"]
            scored = prompt_logprobs(ids) or [-0.01 * t for t in ids[1:]]
            lps = [None] + [{str(t): {"logprob": lp, "rank": 1}} for t, lp in zip(ids[1:], scored, strict=True)]
            self.reply({"choices": [{"text": "", "prompt_logprobs": lps}]})
        elif self.path == "/v1/completions":
            self.complete_ids(body)
        elif self.path == "/collective_rpc" and os.environ.get("VLLM_SERVER_DEV_MODE") == "1":
            LOADS.append(body["kwargs"]["weights_path"])
            if os.environ.get("FAKE_VLLM_LOADS"):
                with open(os.environ["FAKE_VLLM_LOADS"], "a") as f:
                    f.write(LOADS[-1] + "\n")
            if str(len(LOADS)) == os.environ.get("FAKE_VLLM_LOAD_FAIL"):
                self.send_error(500, "no such weights")
                return
            self.reply({"results": [None]})
        elif self.path == "/reset_prefix_cache" and os.environ.get("VLLM_SERVER_DEV_MODE") == "1":
            self.reply({})
        else:
            self.send_error(404)

    def complete_ids(self, body: dict) -> None:
        ids = body["prompt"]
        with COUNTING:  # requests come on threads of their own: each gets its own number
            COMPLETIONS[0] += 1
            number = COMPLETIONS[0]
        rng = random.Random(f"{ids}/{number - 1}")
        reply = [rng.choice(ids) for _ in range(min(4, body["max_tokens"] - 1))] + body["stop_token_ids"][:1]
        lp = -0.5 - 0.01 * len(LOADS)
        choice = {"text": "", "token_ids": reply, "finish_reason": "stop",
                  "logprobs": {"token_logprobs": [lp] * len(reply), "tokens": [], "top_logprobs": []}}
        self.reply({"choices": [choice], "usage": {"prompt_tokens": len(ids), "completion_tokens": len(reply)}})
        if str(number) == os.environ.get("FAKE_VLLM_DIE_AFTER"):
            os._exit(1)


server = ThreadingHTTPServer((args.host, args.port), Handler)
if os.environ.get("FAKE_VLLM_PIDFILE") and not os.environ.get("FAKE_VLLM_SLOW_START"):
    with open(os.environ["FAKE_VLLM_PIDFILE"], "a") as f:
        f.write(f"{os.getpid()}\n")
print(f"serving {args.model} as {args.served_model_name} on {args.port}", flush=True)
server.serve_forever()
