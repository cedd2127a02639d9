"""One episode at a time of a Curio game over a fixed list of tasks, played by the rules of Curio's own play
(``pipeline/text/play.py``): the move is the ``<Answer>`` of the agent's reply (the game's ``parse_action``); a reply
without one is asked again, up to ``max_format_retries`` times, and then the episode ends invalid; the game replies;
the episode ends on success, on a losing move or at the turn limit.

Rewards are the DAG's outcome reward (``pipeline/text/turn_rewards.py``), paid turn by turn: a game scored by turns
pays -1 for each move and 0 for the winning one; a game scored by reward pays each move's reward (their sum is the
episode's reward, which the DAG pays on the last turn). An episode that ends invalid, or is left unfinished, counts as
lost at the turn limit, as PAPRIKA's score counts it: the turns it did not play cost -1 each.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from pipeline.envs.base import FORMAT_RULE, Game, Task

#: What the agent is told when its reply holds no move (it is asked again; the turn is not counted).
NO_MOVE_REPLY = f"Your reply has no move. {FORMAT_RULE}"


@dataclass
class Turn:
    """The game's answer to one reply: the message the agent sees next, the turn's reward, and where the episode
    stands."""

    message: str
    reward: float
    done: bool
    success: bool = False
    invalid: bool = False
    turn: int = 0  # moves made so far
    move: str | None = None  # the move read from the reply (None: the reply had none)
    info: dict = field(default_factory=dict)


class GameSession:
    """Episodes of ``game`` over ``tasks`` (a split as the DAG plays it), one at a time."""

    def __init__(self, game: Game, tasks: list[Task], max_format_retries: int = 3) -> None:
        if not tasks:
            raise ValueError(f"{game.name}: no tasks to serve")
        self.game = game
        self.tasks = tasks
        self.max_format_retries = max_format_retries
        self.task: Task | None = None
        self.task_index: int | None = None
        self.state: Any = None
        self.turns = 0
        self.retries = 0
        self.total_reward = 0.0
        self.done = False
        self.success = False
        self.invalid = False
        self.episodes = 0

    def pick(self, seed: int | None = None, task_index: int | None = None) -> int:
        """The place in ``tasks`` of the task an episode plays: ``task_index``; else ``seed`` modulo the number of
        tasks; else the next one in order. (Tasks are named by place, not by id: a twenty questions task's id is its
        secret.)"""
        if task_index is not None:
            if not 0 <= task_index < len(self.tasks):
                raise ValueError(f"{self.game.name}: task_index {task_index} is not in 0..{len(self.tasks) - 1} "
                                 "(the served split's tasks)")
            return task_index
        return (self.episodes if seed is None else seed) % len(self.tasks)

    def reset(self, seed: int | None = None, task_index: int | None = None) -> list[dict]:
        """Start an episode; returns its opening messages (system, then user), as the DAG's policy sees them."""
        self.task_index = self.pick(seed, task_index)
        task = self.task = self.tasks[self.task_index]
        # the game's own draws (a bandit's pulls): seeded by the seed given, else by the task
        self.state = self.game.reset(task, random.Random(seed if seed is not None else task.task_id))
        self.turns, self.retries, self.total_reward = 0, 0, 0.0
        self.done = self.success = self.invalid = False
        self.episodes += 1
        return self.game.conversation_start(task)

    def step(self, reply: str) -> Turn:
        """The agent's reply (its move inside ``<Answer>``), answered."""
        self._check_playing()
        move = self.game.parse_action(reply)
        if move is None:
            self.retries += 1
            if self.retries <= self.max_format_retries:
                return Turn(NO_MOVE_REPLY, 0.0, False, turn=self.turns,
                            info={"format_retries_left": self.max_format_retries - self.retries + 1})
            cost = self._unplayed_cost()
            self.done = self.invalid = True
            self.total_reward += cost
            return Turn(f"Your reply had no move {self.retries} times in a row: the game is over.", cost, True,
                        invalid=True, turn=self.turns)
        return self.play(move)

    def play(self, move: str) -> Turn:
        """A move, already read from the agent's reply, answered."""
        self._check_playing()
        self.retries = 0
        result = self.game.step(self.state, move)
        self.turns += 1
        self.done = bool(result.done) or self.turns >= self.game.max_turns
        self.success = bool(result.success) if self.done else False
        reward = (0.0 if self.success else -1.0) if self.game.score_by_turns else float(result.reward)
        self.total_reward += reward
        return Turn(result.reply, reward, self.done, success=self.success, turn=self.turns, move=move,
                    info=dict(result.info))

    def episode_return(self) -> float:
        """The episode's return so far; one left unfinished counts as lost at the turn limit."""
        return self.total_reward + (0.0 if self.done else self._unplayed_cost())

    def _unplayed_cost(self) -> float:
        return -float(self.game.max_turns - self.turns) if self.game.score_by_turns else 0.0

    def _check_playing(self) -> None:
        if self.task is None:
            raise ValueError("no episode: reset first")
        if self.done:
            raise ValueError("the episode is over: reset to play another")
