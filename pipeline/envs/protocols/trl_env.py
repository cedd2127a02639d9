"""A Curio game as an environment of TRL's ``GRPOTrainer(environment_factory=...)`` (TRL 1.16).

TRL makes one instance per rollout and calls ``reset`` with the dataset row's fields; the string it returns is
appended to the row's last user message. Every public method is a tool the model may call (its docstring and type
hints are the tool's schema, so the model's chat template must support tools): here one, ``move``. ``get_reward`` makes
the environment own the reward: the episode's return under the DAG's outcome reward, an episode the model left
unfinished counting as lost at the turn limit (:mod:`pipeline.envs.protocols.session`). No TRL import: the class
only has to look the way TRL reads it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from pipeline.envs.base import Game, Task
from pipeline.envs.protocols.session import GameSession

#: Appended to the game's opening: moves go through the tool instead of the ``<Answer>`` tags.
TOOL_NOTE = "Make each move by calling the move tool with it (the text you would put inside <Answer></Answer>)."


class GameToolEnv:
    """Episodes of a Curio game whose moves are calls of the ``move`` tool. Build one with :meth:`factory`."""

    def __init__(self, game: Game, tasks: list[Task]) -> None:
        self._session = GameSession(game, tasks)

    @classmethod
    def factory(cls, game: Game, tasks: list[Task]) -> Callable[[], GameToolEnv]:
        """What ``environment_factory`` takes: a callable making one environment per rollout, over ``tasks``."""
        return functools.partial(cls, game, tasks)

    def reset(self, task_index: int | None = None, seed: int | None = None, **row: Any) -> str:
        """Start an episode on the row's ``task_index`` (else task ``seed``, else the next in order); returns the
        game's opening (rules and first message) for the prompt."""
        opening = self._session.reset(seed=seed, task_index=task_index)
        return "\n\n".join([*(m["content"] for m in opening), TOOL_NOTE])

    def move(self, answer: str) -> str:
        """Make your next move in the game: a question, a guess or an action, as the rules say.

        Args:
            answer: The move: the text the rules ask you to put inside <Answer></Answer>.

        Returns:
            The game's reply to the move.
        """
        if not answer.strip():
            raise ValueError("empty move: give a question, a guess or an action")
        return self._session.play(answer.strip()).message

    def get_reward(self) -> float:
        return self._session.episode_return()

    @property
    def success(self) -> bool:
        """The episode ended won."""
        return self._session.success

    @property
    def turns(self) -> int:
        """Moves made in the episode."""
        return self._session.turns

    @property
    def task(self) -> Task | None:
        """The episode's task."""
        return self._session.task
