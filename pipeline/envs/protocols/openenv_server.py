"""A Curio game as an OpenEnv environment, through openenv-core's own server classes (``curio env serve``).

Reset opens an episode: its observation holds the game's opening messages (system prompt, first user message). Step
takes the agent's reply, whose move is the ``<Answer>`` in it (:mod:`pipeline.envs.protocols.session`), and returns
the game's reply as one user message, the turn's reward and done; ``success``, ``invalid`` and the turn count ride in
the observation too, since OpenEnv's wire format drops an observation's metadata. Every WebSocket session (``/ws``,
what OpenEnv's clients use) gets its own environment; the stateless HTTP ``/reset`` and ``/step`` build a fresh one
per request, so a game of several turns is played over a session.

openenv-core is the ``envs`` extra: this module imports it, and only ``curio env serve`` imports this module.
"""

from __future__ import annotations

import functools
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State, create_app
from openenv.core.env_server.types import EnvironmentMetadata
from pydantic import Field

from pipeline.envs.base import Game, Task
from pipeline.envs.protocols.session import GameSession, Turn


class GameAction(Action):
    """The agent's reply; its move is the text inside ``<Answer>...</Answer>``."""

    reply: str = Field(..., description="the agent's message; its move inside <Answer>...</Answer>")


class GameObservation(Observation):
    """What the agent sees next: the new messages, and where the episode stands."""

    messages: list[dict[str, str]] = Field(default_factory=list, description="on reset the system prompt and the "
                                           "first user message; on step the game's reply, as a user message")
    group: str = Field("", description="the task group (GAME or GAME@TIER)")
    task_index: int = Field(-1, description="the place of the episode's task in the served split (never its id: a "
                            "twenty questions task's id is its secret)")
    turn: int = Field(0, description="moves made so far")
    success: bool = Field(False, description="the episode ended won")
    invalid: bool = Field(False, description="the episode ended because replies held no move")


class GameState(State):
    """The episode's task and progress (never the secret)."""

    group: str = ""
    split: str = ""
    task_index: int | None = None
    turn: int = 0
    done: bool = False
    success: bool = False
    invalid: bool = False
    total_reward: float = 0.0


class GameEnvironment(Environment[GameAction, GameObservation, GameState]):
    """One session's episodes of a Curio game (:class:`GameSession`)."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own episode state; the game itself holds none

    def __init__(self, game: Game, tasks: list[Task], split: str, max_format_retries: int = 3) -> None:
        super().__init__()
        self.session = GameSession(game, tasks, max_format_retries)
        self.split = split
        self.episode_id: str | None = None
        self.steps = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_index: int | None = None,
              split: str | None = None, **kwargs: Any) -> GameObservation:
        """A new episode: the served split's task ``task_index``, else task ``seed`` (modulo their number), else
        the next one in order. A ``split`` other than the served one is refused: a server serves one split, and the
        held-out one only when it was started for it."""
        if split is not None and split != self.split:
            raise ValueError(f"this server serves the {self.split} split, not {split!r}: start one with "
                             f"`curio env serve {self.session.game.name} --split {split}`")
        messages = self.session.reset(seed=seed, task_index=task_index)
        self.episode_id, self.steps = episode_id, 0
        return self._observation(messages, reward=None)

    def step(self, action: GameAction, timeout_s: float | None = None, **kwargs: Any) -> GameObservation:
        turn: Turn = self.session.step(action.reply)
        self.steps += 1
        return self._observation([{"role": "user", "content": turn.message}], reward=turn.reward, turn=turn)

    @property
    def state(self) -> GameState:
        s = self.session
        return GameState(episode_id=self.episode_id, step_count=self.steps, group=s.game.name, split=self.split,
                         task_index=s.task_index, turn=s.turns, done=s.done, success=s.success,
                         invalid=s.invalid, total_reward=s.total_reward)

    def get_metadata(self) -> EnvironmentMetadata:
        game = self.session.game
        return EnvironmentMetadata(name=f"curio/{game.name}", version="1",
                                   description=f"Curio's {game.name}, {self.split} split ({len(self.session.tasks)} "
                                               f"tasks, at most {game.max_turns} turns); reply with the move inside "
                                               "<Answer>...</Answer>")

    def _observation(self, messages: list[dict], reward: float | None, turn: Turn | None = None) -> GameObservation:
        s = self.session
        return GameObservation(messages=messages, reward=reward, done=s.done, group=s.game.name,
                               task_index=-1 if s.task_index is None else s.task_index, turn=s.turns, success=s.success,
                               invalid=s.invalid, metadata=dict(turn.info) if turn else {})


def make_app(game: Game, tasks: list[Task], split: str, max_format_retries: int = 3, max_sessions: int = 16):
    """The FastAPI app serving ``game`` over ``tasks`` (openenv-core's ``create_app``)."""
    factory = functools.partial(GameEnvironment, game, tasks, split, max_format_retries)
    return create_app(factory, GameAction, GameObservation, env_name=f"curio-{game.name}",
                      max_concurrent_envs=max_sessions)
