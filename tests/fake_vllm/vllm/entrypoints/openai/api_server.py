"""A stand-in for vLLM's OpenAI-compatible server, for the fast tests of Curio's server lifecycle (standard
library only). It takes the arguments Curio passes, answers ``/v1/models``, ``/v1/chat/completions`` (the last
user message reversed, with ``token_ids``) and ``/v1/completions`` (``prompt_logprobs``: -0.01 x token id), and
writes its pid to ``$FAKE_VLLM_PIDFILE``. ``$FAKE_VLLM_FAIL`` makes it exit 3 at start; ``$FAKE_VLLM_SEED_CRASH``
makes a request with ``seed`` kill it, as the CPU engine does."""

import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ap = argparse.ArgumentParser()
ap.add_argument("--model")
ap.add_argument("--served-model-name")
ap.add_argument("--host")
ap.add_argument("--port", type=int)
args, _rest = ap.parse_known_args()
if os.environ.get("FAKE_VLLM_FAIL"):
    print("RuntimeError: no CPU backend for this model", flush=True)
    sys.exit(3)


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
        elif self.path == "/v1/completions":
            ids = body["prompt"]
            lps = [None] + [{str(t): {"logprob": -0.01 * t, "rank": 1}} for t in ids[1:]]
            self.reply({"choices": [{"text": "", "prompt_logprobs": lps}]})
        else:
            self.send_error(404)


server = ThreadingHTTPServer((args.host, args.port), Handler)
if os.environ.get("FAKE_VLLM_PIDFILE"):
    with open(os.environ["FAKE_VLLM_PIDFILE"], "a") as f:
        f.write(f"{os.getpid()}\n")
print(f"serving {args.model} as {args.served_model_name} on {args.port}", flush=True)
server.serve_forever()
