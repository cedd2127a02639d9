"""The contract every text game implements, and the agent's answer format.

A game owns its tasks (with a fixed train / eval split), its prompts and its rules. The rollout stage only
ever talks to this interface, so adding a game is one module in ``pipeline/envs/`` plus a params entry.
"""

from __future__ import annotations

import importlib
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Literal

Split = Literal["train", "eval"]

ANSWER_RE = re.compile(r"<Answer>(.*?)</Answer>", re.IGNORECASE | re.DOTALL)


def extract_answer(text: str) -> str | None:
    """The content of the last ``<Answer>…</Answer>`` in an agent message, stripped; None when absent/empty."""
    found = ANSWER_RE.findall(text)
    if not found:
        return None
    answer = found[-1].strip()
    return answer or None


def format_answer(action: str) -> str:
    return f"<Answer>{action}</Answer>"


@dataclass(frozen=True)
class Task:
    """One task: ``env`` is what the environment knows (the secret), ``agent`` what the agent is told."""

    group: str
    task_id: str
    env: Any
    agent: str
    difficulty: str = "medium"
    split: Split = "train"

    def to_row(self) -> dict:
        return asdict(self)


@dataclass
class StepResult:
    reply: str
    done: bool
    success: bool = False
    reward: float = 0.0
    info: dict = field(default_factory=dict)


class Game(ABC):
    """A multi-turn text game. State objects are opaque to the caller and must be deep-copyable."""

    name: ClassVar[str]
    max_turns: ClassVar[int]
    #: "program" engines answer by code; "llm" engines need an environment backend (see ``set_environment``);
    #: "external": another project's environment, reached through its protocol (``pipeline.envs.external``)
    env_kind: ClassVar[Literal["program", "llm", "external"]] = "program"
    #: True when the score is turns used (lower is better); bandits score by reward instead.
    score_by_turns: ClassVar[bool] = True
    #: more teaching of the answer format, appended to the system prompt (``policy.format_prompt``, set by
    #: ``pipeline.text.policies.make_games``); empty = the game's own prompt
    format_note: str = ""
    #: ``policy.free_answers``: a reply without the tags is read as a move (its first line) instead of unparseable
    free_answers: bool = False
    #: held-out tasks are fresh draws of the train tasks' configurations, not unseen secrets (a bandit tier: every
    #: task shuffles the tier's arm means, so held-out episodes differ only in the draws of their pulls); False:
    #: no held-out task is a train task (``TextGame.tasks`` leaves out any that a random generator repeated)
    held_out_fresh_draws: bool = False

    #: difficulty tiers: name -> game params that change the task (``games.groups`` entry ``GAME@TIER``; see
    #: ``parse_tier``); a game without tiers takes none
    tiers: ClassVar[dict[str, dict[str, Any]]] = {}

    def __init__(self, environment: Any = None) -> None:
        self.environment = environment  # an LLM backend for LLM-simulated environments; None = the program
        self.tier: dict[str, Any] = {}  # the tier's params ({} = the game as it always was)

    @classmethod
    def check_tier(cls, tier: dict[str, Any]) -> dict[str, Any]:
        """``tier`` checked (a ValueError in one line if the game cannot take it) and completed with defaults."""
        raise ValueError(f"{cls.name} has no difficulty tiers")

    def set_tier(self, spec: str) -> None:
        """Play the tier ``spec`` (a name of ``tiers`` or ``key=value,...``): the task group is renamed
        ``GAME@SPEC``, so its rows, task ids and metrics never mix with the untiered game's. Call before ``tasks``."""
        self.tier = parse_tier(type(self), spec)
        self.name = f"{type(self).name}@{spec}"

    @abstractmethod
    def tasks(self, split: Split) -> list[Task]:
        """All tasks of a split, in a fixed order."""

    @abstractmethod
    def system_prompt(self, task: Task) -> str:
        """Rules of the game and the answer format, shown to the agent once."""

    @abstractmethod
    def first_message(self, task: Task) -> str:
        """The opening user message (e.g. "You are trying to guess a {category}. Ask your first question!")."""

    @abstractmethod
    def reset(self, task: Task, rng: random.Random) -> Any:
        """A fresh episode state for ``task``."""

    @abstractmethod
    def step(self, state: Any, action: str) -> StepResult:
        """Apply the agent's action (the text inside <Answer>) and return the environment's reply."""

    def step_batch(self, states: list[Any], actions: list[str]) -> list[StepResult]:
        """Step many episodes at once; LLM-simulated environments override this to batch their calls."""
        return [self.step(s, a) for s, a in zip(states, actions, strict=True)]

    def release(self, state: Any) -> None:  # noqa: B027 - optional hook: Curio's own games hold nothing
        """Play is done with an episode (finished or not): an external environment closes its session."""

    def is_correct_guess(self, task: Task, action: str) -> bool:
        """Program check used by the exact-match judge: does ``action`` achieve the task's goal?"""
        raise NotImplementedError(f"{self.name} has no program check")

    def scripted_action(self, task: Task, history: list[tuple[str, str]], rng: random.Random, noise: float) -> str:
        """A scripted player's next action given (action, reply) history; with probability ~``noise`` a poor
        move. Used by ``bootstrap`` to pre-train the built-in model. LLM-only games may leave it out."""
        raise NotImplementedError(f"{self.name} has no scripted player")

    def parse_action(self, text: str) -> str | None:
        """The move in an agent message: the ``<Answer>`` content; with ``free_answers``, else its first
        non-empty line (small chat models that never write the tags still play, unformatted)."""
        action = extract_answer(text)
        if action is None and self.free_answers:
            action = next((line.strip() for line in text.splitlines() if line.strip()), None)
        return action

    def timeout_reply(self) -> str:
        return "You have run out of turns."

    def conversation_start(self, task: Task) -> list[dict]:
        system = self.system_prompt(task)
        return [
            {"role": "system", "content": f"{system}\n\n{self.format_note}" if self.format_note else system},
            {"role": "user", "content": self.first_message(task)},
        ]


#: ``policy.format_prompt: rule``: the answer format spelled out for chat models that ignore the games' own line.
FORMAT_RULE = ("Reply with one move only, inside the tags, exactly like this: <Answer>your move</Answer>. "
               "Write nothing else.")


def format_note(game: Game, style: str, example_task: Task) -> str:
    """What ``policy.format_prompt`` adds to ``game``'s system prompt: nothing (``game``), ``FORMAT_RULE``
    (``rule``), or the rule and an example exchange (``example``): the opening of ``example_task`` and the first
    two moves of the game's noise-free scripted player, with the program host's reply in between."""
    if style == "game":
        return ""
    if style == "rule":
        return FORMAT_RULE
    if style != "example":
        raise ValueError(f"unknown format_prompt {style!r} (game, rule or example)")
    host = make_game(game.name)  # the program host: an example never costs (or varies with) an LLM environment
    if host.env_kind != "program":
        raise ValueError(f"format_prompt 'example' needs a program host; {game.name} has none (use 'rule')")
    rng = random.Random(0)
    state = host.reset(example_task, rng)
    lines, history = [f"User: {host.first_message(example_task)}"], []
    for turn in range(2):
        try:
            action = host.scripted_action(example_task, history, rng, noise=0.0)
        except NotImplementedError:
            raise ValueError(f"format_prompt 'example' needs a scripted player; {game.name} has none "
                             "(use 'rule')") from None
        lines.append(f"Assistant: {format_answer(action)}")
        if turn == 1:
            break
        result = host.step(state, action)
        if result.done:
            break
        lines.append(f"User: {result.reply}")
        history.append((action, result.reply))
    return f"{FORMAT_RULE}\nAn example of the start of a game:\n" + "\n".join(lines)


_REGISTRY: dict[str, type[Game]] = {}
#: ``SCHEME:TARGET`` groups: scheme -> the game class of a whole ``SCHEME:TARGET`` (``pipeline.envs.external``)
_SCHEMES: dict[str, Callable[[str], type[Game]]] = {}


def register(cls: type[Game]) -> type[Game]:
    _REGISTRY[cls.name] = cls
    return cls


def register_scheme(scheme: str, game_class_of: Callable[[str], type[Game]]) -> None:
    """Let ``games.groups`` name games as ``SCHEME:TARGET`` (another project's environment, by protocol)."""
    _SCHEMES[scheme] = game_class_of


def parse_tier(cls: type[Game], spec: str) -> dict[str, Any]:
    """The params of tier ``spec`` of game ``cls``: a named tier (``cls.tiers``) or ``key=value,...`` (integers,
    floats, ``/``-separated float lists), checked by the game (ValueError in one line when it cannot be played)."""
    if cls.check_tier.__func__ is Game.check_tier.__func__:
        raise ValueError(f"{cls.name} has no difficulty tiers")
    if spec in cls.tiers:
        return cls.check_tier(dict(cls.tiers[spec]))
    if "=" not in spec:
        named = ", ".join(cls.tiers) or "none"
        raise ValueError(f"{cls.name} has no tier {spec!r} (named tiers: {named}; or key=value,...)")
    tier: dict[str, Any] = {}
    for item in spec.split(","):
        key, _, value = item.partition("=")
        try:
            parsed = [float(v) for v in value.split("/")] if "/" in value else (
                int(value) if value.lstrip("-").isdigit() else float(value))
        except ValueError:
            raise ValueError(f"{cls.name} tier {spec!r}: {key}={value!r} is not a number") from None
        tier[key.strip()] = parsed
    return cls.check_tier(tier)


def game_class(name: str) -> type[Game]:
    """The game class named ``name``; imports ``pipeline.envs.<name>`` on first use. A tiered group
    (``GAME@TIER``) names its game's class, and its tier is checked (ValueError when the game cannot play it).
    ``textarena:ENV_ID`` and ``openenv:URL`` name other projects' environments (``pipeline.envs.external``)."""
    name, _, tier = name.partition("@")
    if tier:
        cls = game_class(name)
        parse_tier(cls, tier)
        return cls
    scheme, colon, _ = name.partition(":")
    if colon:  # SCHEME:TARGET: the module of other projects' environments registers its schemes when loaded
        if not _SCHEMES:
            importlib.import_module("pipeline.envs.external")
        if scheme in _SCHEMES:
            return _SCHEMES[scheme](name)
    if name not in _REGISTRY:
        try:
            importlib.import_module(f"pipeline.envs.{name}")
        except ModuleNotFoundError:
            pass
    if name not in _REGISTRY:
        raise KeyError(f"unknown game {name!r}")
    return _REGISTRY[name]


def make_game(name: str, environment: Any = None) -> Game:
    """The game of task group ``name``: ``GAME`` or ``GAME@TIER`` (a difficulty tier, see ``Game.set_tier``)."""
    game = game_class(name)(environment=environment)
    if "@" in name:
        game.set_tier(name.partition("@")[2])
    return game
