"""Other people's games, played as Curio's own: ``textarena:ENV_ID`` and ``openenv:URL`` in ``games.groups``.

- ``textarena:ENV_ID``: a single-player game of TextArena (``textarena`` on PyPI), played in this process. Games that
  fetch an nltk corpus when they load (Wordle, Hangman, WordLadder, ...) are refused: nothing can be downloaded here.
- ``openenv:URL``: a running OpenEnv server (``openenv-core``), one WebSocket session per episode. The agent's move
  goes out as the one text field of the server's action (``GET /schema``); the reply is the contents of the
  observation's chat-like messages, or else its text field(s).

A task is a seed of the environment: train tasks are seeds 0, 1, ...; held-out tasks are seeds from
``EVAL_SEED_BASE`` on, so no held-out seed is a train seed, and ``games.val_fraction`` carves val tasks out of train
as for every game. Whether two seeds deal the same secret is the environment's business (a guess-the-number game
has few numbers), so the held-out tasks are fresh seeds, not unseen secrets.

An episode wins when the environment ends it with a reward of at least ``success`` (1 by default: TextArena's win)
on its last step; the rows keep the environment's summed reward in ``reward``. The episode ends after ``max_turns``
agent moves whatever the environment says (a game that never ends): the last reply then says so (``TURN_LIMIT``)
and rollout-text / evaluate-text count those episodes (``turn_limit_metrics``). The group takes these as a tier:
``textarena:GuessTheNumber-v0@max_turns=12,success=1,train=200,eval=50``.

A fault is one line (``ExternalEnvError``, exit 2): an unknown id, a corpus game, an unreachable server, a server
that goes away mid-episode, an observation without text. The chunks already written are kept; the rerun resumes.
Neither protocol package is needed unless such a group is played: both are imported here, lazily (``.[envs]``).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import functools
import inspect
import json
import random
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, ClassVar

from pipeline.core.errors import CurioError
from pipeline.envs.base import Game, Split, StepResult, Task, register_scheme
from pipeline.envs.gamekit import task_id

SCHEMES = ("textarena", "openenv")
#: train tasks are seeds 0..train-1, held-out tasks seeds EVAL_SEED_BASE..EVAL_SEED_BASE+eval-1
EVAL_SEED_BASE = 1_000_000
DEFAULTS = {"max_turns": 30, "success": 1.0, "train": 1000, "eval": 200}
TURN_LIMIT = "[Curio: the turn limit ({n} moves) is reached; the environment had not ended the episode.]"
TURN_LIMIT_RE = re.compile(r"\[Curio: the turn limit \(\d+ moves\) is reached; the environment had not ended the "
                           r"episode\.\]$")
SYSTEM = ("You are playing {title}, a game from {source}. The game's messages come to you as user messages. "
          "Write your move inside the tags, like this: <Answer>your move</Answer>.")
INSTALL = "pip install -e '.[envs]'"


class ExternalEnvError(CurioError):
    """An external environment cannot be played: its one-line reason (exit 2; finished chunks are kept)."""


def is_external(group: str) -> bool:
    """Whether a ``games.groups`` entry names another project's environment (``SCHEME:TARGET``)."""
    return group.partition(":")[0] in SCHEMES and ":" in group


@functools.cache
def external_class(spec: str) -> type[ExternalGame]:
    """The game class of ``SCHEME:TARGET`` (its tier, if any, is parsed by the caller: ``base.game_class``)."""
    scheme, _, target = spec.partition(":")
    base = {"textarena": TextArenaGame, "openenv": OpenEnvGame}.get(scheme)
    if base is None or not target:
        raise KeyError(f"unknown game {spec!r}")
    base.check_target(target)
    return type(base.__name__, (base,), {"name": spec, "target": target, "__module__": __name__})


@dataclass
class ExternalEpisode:
    task: Task
    handle: Any  # the environment's session (a TextArena env, an OpenEnv client); None once released
    opening: str
    turns: int = 0
    done: bool = False
    success: bool = False
    random_state: Any = None  # TextArena: the episode's own state of Python's global generator


class ExternalGame(Game):
    """Another project's environment behind Curio's game contract. Subclasses give ``_open`` (reset a fresh
    session with a seed: its handle and first message) and ``_steps`` (step sessions: (text, reward, done) each)."""

    env_kind = "external"
    held_out_fresh_draws = True
    max_turns = DEFAULTS["max_turns"]
    source: ClassVar[str] = ""
    target: ClassVar[str] = ""

    def __init__(self, environment: Any = None) -> None:
        super().__init__(environment)
        self.success_reward = DEFAULTS["success"]
        self.counts = {"train": DEFAULTS["train"], "eval": DEFAULTS["eval"]}
        self._openings: dict[str, str] = {}

    @classmethod
    def check_target(cls, target: str) -> None:
        """Cheap checks of ``target`` when params load (no import of the protocol package, no network)."""

    @classmethod
    def check_tier(cls, tier: dict[str, Any]) -> dict[str, Any]:
        unknown = set(tier) - set(DEFAULTS)
        if unknown:
            raise ValueError(f"{cls.name}: unknown key(s) {sorted(unknown)} ({', '.join(DEFAULTS)})")
        for key in ("max_turns", "train", "eval"):
            if key in tier and (not isinstance(tier[key], int) or tier[key] < 1):
                raise ValueError(f"{cls.name}: {key} must be a positive integer, got {tier[key]!r}")
        if "success" in tier and not isinstance(tier["success"], int | float):
            raise ValueError(f"{cls.name}: success must be a number (the reward that wins), got {tier['success']!r}")
        return {**DEFAULTS, **tier}

    def set_tier(self, spec: str) -> None:
        super().set_tier(spec)
        self.max_turns = self.tier["max_turns"]
        self.success_reward = float(self.tier["success"])
        self.counts = {"train": self.tier["train"], "eval": self.tier["eval"]}

    def tasks(self, split: Split) -> list[Task]:
        if split not in ("train", "eval"):
            raise ValueError(f"unknown split {split!r} (train or eval)")
        base = 0 if split == "train" else EVAL_SEED_BASE
        return [Task(self.name, task_id(self.name, split, i), {"seed": base + i}, self.target, "medium", split)
                for i in range(self.counts[split])]

    def system_prompt(self, task: Task) -> str:
        return SYSTEM.format(title=self.target, source=self.source)

    def first_message(self, task: Task) -> str:
        """The environment's first observation of the task's seed: the one its last ``reset`` got (play resets an
        episode, then opens its conversation), else a reset of a session of its own."""
        if task.task_id not in self._openings:
            self.release(self.reset(task, random.Random(0)))
        return self._openings[task.task_id]

    def reset(self, task: Task, rng: random.Random) -> ExternalEpisode:
        episode = self._open(task)
        self._openings[task.task_id] = episode.opening
        return episode

    def step(self, state: ExternalEpisode, action: str) -> StepResult:
        return self.step_batch([state], [action])[0]

    def step_batch(self, states: list[ExternalEpisode], actions: list[str]) -> list[StepResult]:
        results: list[StepResult | None] = [None] * len(states)
        live = [i for i, s in enumerate(states) if not s.done]
        for i, s in enumerate(states):
            if s.done:
                results[i] = StepResult("The game is over.", done=True, success=s.success)
        for i, (text, reward, done) in zip(live, self._steps([states[i] for i in live], [actions[i] for i in live]),
                                           strict=True):
            state = states[i]
            state.turns += 1
            truncated = not done and state.turns >= self.max_turns
            if truncated:
                text = f"{text}\n\n{TURN_LIMIT.format(n=self.max_turns)}".strip()
            state.done = done or truncated
            state.success = done and reward >= self.success_reward
            results[i] = StepResult(text, done=state.done, success=state.success, reward=reward,
                                    info={"turn": state.turns, "turn_limit": truncated})
            if state.done:
                self.release(state)
        return [r for r in results if r is not None]

    def release(self, state: ExternalEpisode) -> None:
        """Close the episode's session (a finished, abandoned or replayed episode)."""
        state.handle = None

    def _open(self, task: Task) -> ExternalEpisode:
        raise NotImplementedError

    def _steps(self, states: list[ExternalEpisode], actions: list[str]) -> list[tuple[str, float, bool]]:
        raise NotImplementedError

    def where(self, state: ExternalEpisode, opening: bool = False) -> str:
        """The episode and the call a fault hit: its reset, or the turn being stepped."""
        call = "reset" if opening else f"turn {state.turns + 1}"
        return f"{state.task.task_id} (seed {state.task.env['seed']}), {call}"


def hit_turn_limit(conversation: list[dict]) -> bool:
    """Whether Curio's turn limit ended this episode (its last reply says so; the environment had not ended it)."""
    return bool(conversation) and TURN_LIMIT_RE.search(conversation[-1]["content"]) is not None


def turn_limit_metrics(rows: list[dict], prefix: str = "") -> dict[str, float]:
    """``{prefix}GROUP/turn_limit``: the share of each external group's episodes that Curio's turn limit ended (the
    environment had not); empty when no external group was played."""
    out: dict[str, float] = {}
    for g in sorted({r["group"] for r in rows if is_external(r["group"])}):
        mine = [r for r in rows if r["group"] == g]
        out[f"{prefix}{g}/turn_limit"] = sum(hit_turn_limit(r["conversation"]) for r in mine) / len(mine)
    return out


# -- TextArena ---------------------------------------------------------------------------------------------------
class _CorpusNeeded(Exception):
    pass


@contextlib.contextmanager
def _own_random(state: ExternalEpisode | None):
    """TextArena draws from Python's global generator (its reset seeds it): each episode plays on a state of its
    own, so episodes stepped in turns never draw from each other's, nor change Curio's."""
    outer = random.getstate()
    if state is not None and state.random_state is not None:
        random.setstate(state.random_state)
    try:
        yield
    finally:
        if state is not None:
            state.random_state = random.getstate()
        random.setstate(outer)


@functools.cache
def _textarena() -> Any:
    try:
        import textarena  # the optional envs extra: only when a textarena game is played
    except ImportError:
        raise ExternalEnvError(f"textarena games need the textarena package: {INSTALL}") from None
    return textarena


@functools.cache
def _probe_textarena(env_id: str) -> None:
    """Refuse, in one line, an id TextArena does not know, a game that needs an nltk corpus (it would download it
    when it loads) and a game for more than one player: a seed-0 reset, with nltk's downloads turned into errors."""
    ta = _textarena()
    from textarena.envs.registration import ENV_REGISTRY

    if env_id not in ENV_REGISTRY:
        near = difflib.get_close_matches(env_id, list(ENV_REGISTRY), n=3)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise ExternalEnvError(f"textarena:{env_id}: TextArena has no environment {env_id!r}{hint}")
    import nltk

    def refuse(info_or_id: Any = None, *args: Any, **kwargs: Any) -> None:
        raise _CorpusNeeded(", ".join(info_or_id) if isinstance(info_or_id, list | tuple) else str(info_or_id))

    try:
        with _own_random(None), _patched(nltk, "download", refuse):
            env = ta.make(env_id)
            env.reset(num_players=1, seed=0)
    except _CorpusNeeded as e:
        raise ExternalEnvError(f"textarena:{env_id}: the game downloads nltk's {e} corpus when it loads, and Curio "
                               "plays offline: choose a game without a word list (GuessTheNumber-v0, Mastermind-v0, "
                               "Minesweeper-v0, FrozenLake-v0, TowerOfHanoi-v0, ...)") from None
    except LookupError as e:  # an nltk resource that is not on this machine
        raise ExternalEnvError(f"textarena:{env_id}: the game needs an nltk corpus this machine does not have "
                               f"({str(e).strip().splitlines()[0] if str(e).strip() else e!r}), and Curio plays "
                               "offline") from None
    except (AssertionError, ValueError, TypeError) as e:
        raise ExternalEnvError(f"textarena:{env_id}: not a single-player game (its reset with one player failed: "
                               f"{str(e) or type(e).__name__}); Curio plays single-player TextArena games") from None
    except Exception as e:  # noqa: BLE001 - a game module that does not load here (e.g. syntax of a newer Python)
        raise ExternalEnvError(f"textarena:{env_id}: the game does not load here ({type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''})") from None


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _unwrapped(env: Any) -> Any:
    """The game under TextArena's wrappers: its raw messages, new since the last ask (each turn is a chat message
    of its own in Curio, so the wrappers' whole-history rendering would repeat every turn)."""
    while isinstance(env, _textarena().Wrapper):
        env = env.env
    return env


class TextArenaGame(ExternalGame):
    """A single-player TextArena game, played in this process: ``ta.make(ENV_ID)``, ``reset(num_players=1,
    seed=SEED)``, the player's new messages as each reply (its own move's echo left out), ``step(move)`` through the
    id's wrappers (e.g. the brackets TextArena's moves take), and the reward of ``close()`` when it is done."""

    source = "TextArena"

    @classmethod
    def check_target(cls, target: str) -> None:
        if not target.strip() or any(c.isspace() for c in target):
            raise KeyError(f"unknown game {'textarena:' + target!r}")

    def __init__(self, environment: Any = None) -> None:
        super().__init__(environment)
        _probe_textarena(self.target)

    def _messages(self, env: Any) -> str:
        ta = _textarena()
        _, messages = _unwrapped(env).get_observation()
        return "\n".join(str(m[1]).strip() for m in messages
                         if m[2] != ta.ObservationType.PLAYER_ACTION and str(m[1]).strip())

    def _open(self, task: Task) -> ExternalEpisode:
        ta = _textarena()
        episode = ExternalEpisode(task, None, "")
        with _own_random(episode):
            env = ta.make(self.target)
            env.reset(num_players=1, seed=int(task.env["seed"]))
            episode.handle, episode.opening = env, self._messages(env)
        return episode

    def _steps(self, states: list[ExternalEpisode], actions: list[str]) -> list[tuple[str, float, bool]]:
        out = []
        for state, action in zip(states, actions, strict=True):
            if state.handle is None:  # a replayed or abandoned episode's session was released: start it again
                raise ExternalEnvError(f"{self.name}: episode {self.where(state)} was released before it ended")
            with _own_random(state):
                done, _info = state.handle.step(action)
                text, reward = self._messages(state.handle), 0.0
                if done:
                    rewards, game_info = state.handle.close()
                    raw = (rewards or {}).get(0, 0.0)
                    if isinstance(raw, bool) or not isinstance(raw, int | float):
                        raise ExternalEnvError(f"{self.name}: the game ended episode {self.where(state)} with a "
                                               f"reward of {raw!r}, not a number (a fault of the game's code); "
                                               "choose another game")
                    reward = float(raw)
                    reason = (game_info or {}).get(0, {}).get("reason")
                    text = f"{text}\n{reason}".strip() if reason else text
            out.append((text, reward, bool(done)))
        return out


# -- OpenEnv -----------------------------------------------------------------------------------------------------
@functools.cache
def _openenv_client() -> type:
    try:
        from openenv.core import GenericEnvClient  # the optional envs extra: only when an openenv game is played
    except ImportError:
        raise ExternalEnvError(f"openenv games need the openenv-core package: {INSTALL}") from None
    return GenericEnvClient


class _Driver:
    """Runs calls on the sessions of one game: openenv-core 0.3's clients are async (one event loop, on a thread of
    its own, drives every session, and a turn's steps go out together); 0.2's are synchronous (one after another)."""

    def __init__(self, client_cls: type) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        if inspect.iscoroutinefunction(client_cls.reset):
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, name="curio-openenv", daemon=True).start()

    def all(self, calls: list) -> list:
        """Each call's result, or the exception it raised (a synchronous run stops at the first)."""
        if self.loop is None:
            out: list = []
            for call in calls:
                try:
                    out.append(call())
                except Exception as e:  # noqa: BLE001 - reported by the caller, with the episode it hit
                    out.append(e)
                    break
            return out

        async def gather() -> list:
            return await asyncio.gather(*(call() for call in calls), return_exceptions=True)

        return asyncio.run_coroutine_threadsafe(gather(), self.loop).result()


def observation_text(observation: dict) -> str | None:
    """What an OpenEnv observation says, as one user message: the contents of its chat-like messages (a list of
    objects with a text ``content``, e.g. OpenEnv's TextArena environment and Curio's served games) when it has any,
    else its text fields (one: itself; several: a ``name: text`` line each); None when it has neither."""
    said = [m["content"] for v in observation.values() if isinstance(v, list) and v
            and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in v) for m in v]
    if said:
        return "\n\n".join(c.strip() for c in said if c.strip())
    texts = {k: v for k, v in observation.items() if isinstance(v, str)}
    if not texts:
        return None
    return next(iter(texts.values())) if len(texts) == 1 else "\n".join(f"{k}: {v}" for k, v in texts.items())


class OpenEnvGame(ExternalGame):
    """A running OpenEnv server: one WebSocket session (openenv-core's ``GenericEnvClient``) per episode, opened by
    ``reset(seed=SEED)`` and closed when the episode ends. The move is sent as ``{FIELD: move}``, FIELD the one text
    field of the server's action schema; the reply is what the observation says (``observation_text``). A chunk's
    episodes play at once: the server needs as many concurrent sessions (``max_concurrent_envs``) as
    ``rollout_text.tasks_per_chunk`` x ``trajectories_per_task``."""

    source = "an OpenEnv server"

    @classmethod
    def check_target(cls, target: str) -> None:
        url = urllib.parse.urlsplit(target)
        if url.scheme not in ("http", "https", "ws", "wss") or not url.netloc:
            raise ValueError(f"openenv:{target}: the server's URL must be http://, https://, ws:// or wss://HOST[:PORT]")

    def __init__(self, environment: Any = None) -> None:
        super().__init__(environment)
        self.url = self.target.rstrip("/")
        self._action_field: str | None = None
        self._driver: _Driver | None = None

    def _http_url(self) -> str:
        return self.url.replace("ws://", "http://", 1).replace("wss://", "https://", 1)

    def _schema(self) -> dict:
        try:
            with urllib.request.urlopen(f"{self._http_url()}/schema", timeout=10) as response:
                return json.loads(response.read().decode())
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            reason = getattr(e, "reason", None) or e
            raise ExternalEnvError(f"{self.name}: cannot reach the OpenEnv server at {self.url} ({reason}): start it "
                                   "or fix the URL, then rerun (finished chunks are kept)") from None
        except ValueError as e:
            raise ExternalEnvError(f"{self.name}: GET /schema did not answer JSON ({e}): is {self.url} an OpenEnv "
                                   "server?") from None

    def _connect(self) -> None:
        """Once per game: the server's action field (``GET /schema``) and the session driver."""
        if self._driver is not None:
            return
        action = self._schema().get("action") or {}
        props = action.get("properties", {}) if isinstance(action, dict) else {}
        text = [k for k, v in props.items() if k != "metadata" and isinstance(v, dict) and v.get("type") == "string"]
        if len(text) != 1:
            raise ExternalEnvError(f"{self.name}: the server's action has {len(text)} text fields "
                                   f"({', '.join(text) or 'none'}; all fields: {', '.join(props) or 'none'}): Curio "
                                   "sends the agent's move as the action's one text field")
        self._action_field = text[0]
        self._driver = _Driver(_openenv_client())

    def _client(self) -> Any:
        return _openenv_client()(base_url=self.url)  # connects on its first call (the reset)

    def _text(self, result: Any, state: ExternalEpisode, opening: bool = False) -> tuple[str, float, bool]:
        """(text, reward, done) of a step result, or a malformed-observation error naming what is wrong."""
        observation, reward, done = (getattr(result, k, None) for k in ("observation", "reward", "done"))
        why, text = None, None
        if not isinstance(observation, dict):
            why = f"the observation is {type(observation).__name__}, not an object"
        elif not isinstance(done, bool):
            why = f"done is {done!r}, not true or false"
        elif reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
            why = f"reward is {reward!r}, not a number"
        else:
            text = observation_text(observation)
            if text is None:
                why = f"no text field (fields: {', '.join(observation) or 'none'})"
        if why is not None or text is None:
            raise ExternalEnvError(f"{self.name}: malformed observation at {self.where(state, opening)}: {why}; Curio "
                                   "reads the observation's messages or text field(s), a numeric reward and a boolean "
                                   "done")
        return text, float(reward or 0.0), done

    def _fault(self, e: BaseException, state: ExternalEpisode, opening: bool) -> ExternalEnvError:
        """The one line for a call that failed: unreachable, refused, gone mid-episode, or a server error."""
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        if isinstance(e, ExternalEnvError):
            return e
        if "CAPACITY_REACHED" in message:
            return ExternalEnvError(f"{self.name}: the server refused a session ({message}): Curio plays a chunk's "
                                    "episodes at once; start it with max_concurrent_envs >= tasks_per_chunk x "
                                    "trajectories_per_task, or lower those")
        if isinstance(e, RuntimeError) and message.startswith("Server error"):
            return ExternalEnvError(f"{self.name}: the server failed at {self.where(state, opening)}: {message}")
        if opening and isinstance(e, ConnectionError):
            return ExternalEnvError(f"{self.name}: cannot reach the OpenEnv server at {self.url} ({message}): start "
                                    "it or fix the URL, then rerun (finished chunks are kept)")
        if opening and type(e).__name__.startswith("ConnectionClosed"):  # closed before the reset was answered
            return ExternalEnvError(f"{self.name}: the server closed a new session at {self.where(state, opening)} "
                                    f"({type(e).__name__}: {message}): a server closes the sessions beyond its "
                                    "max_concurrent_envs; Curio plays a chunk's episodes at once (tasks_per_chunk x "
                                    "trajectories_per_task; evaluation and rl-text's val: every task's), so start it "
                                    "with more or lower those, then rerun (finished chunks are kept)")
        return ExternalEnvError(f"{self.name}: the server went away at {self.where(state, opening)} "
                                f"({type(e).__name__}: {message}); the chunks already written are kept: restart it "
                                "and rerun to resume")

    def _open(self, task: Task) -> ExternalEpisode:
        self._connect()
        assert self._driver is not None
        episode = ExternalEpisode(task, self._client(), "")
        (result,) = self._driver.all([functools.partial(episode.handle.reset, seed=int(task.env["seed"]))])
        if isinstance(result, BaseException):
            self.release(episode)
            raise self._fault(result, episode, opening=True)
        episode.opening = self._text(result, episode, opening=True)[0]
        return episode

    def _steps(self, states: list[ExternalEpisode], actions: list[str]) -> list[tuple[str, float, bool]]:
        assert self._driver is not None and self._action_field is not None
        for s in states:
            if s.handle is None:
                raise ExternalEnvError(f"{self.name}: episode {self.where(s)} was released before it ended")
        field = self._action_field
        results = self._driver.all([functools.partial(s.handle.step, {field: a}) for s, a in zip(states, actions,
                                                                                                   strict=True)])
        out = []
        for s, result in zip(states, results, strict=False):
            if isinstance(result, BaseException):
                raise self._fault(result, s, opening=False)
            out.append(self._text(result, s))
        if len(out) < len(states):  # a synchronous run stopped at its first failure
            raise self._fault(RuntimeError("no answer"), states[len(out)], opening=False)
        return out

    def release(self, state: ExternalEpisode) -> None:
        client, state.handle = state.handle, None
        if client is None or self._driver is None:
            return
        with contextlib.suppress(Exception):  # a server that went away has nothing left to close
            self._driver.all([client.close])


for _scheme in SCHEMES:
    register_scheme(_scheme, external_class)
