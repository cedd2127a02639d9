"""A tiny OpenEnv environment served by openenv-core's own server classes, for the tests of ``openenv:URL`` groups.

    python tests/openenv_server.py PORT [--die-after N] [--malformed] [--never-ends] [--two-fields] [--chat]
                                        [--max-sessions N]

The game: guess a digit 0-9 drawn from the reset's seed in at most 5 moves ("higher" / "lower" after each miss);
reward 1 on the right digit, 0 when the moves run out. ``--die-after N``: the server process exits in the middle of
its N-th step of all sessions (a server that dies mid-episode); ``--malformed``: observations carry no text;
``--never-ends``: the game never ends; ``--two-fields``: its action has two text fields; ``--chat``: observations
say it as chat messages (``messages: [{role, content}]``) beside a text field that is not what the game says;
``--max-sessions N``: at most N concurrent sessions (default 256).
"""

from __future__ import annotations

import argparse
import os
import random
import re

import uvicorn
from openenv.core.env_server import Action, Environment, Observation, State
from openenv.core.env_server.http_server import create_app
from pydantic import Field

ARGS = argparse.Namespace(die_after=0, malformed=False, never_ends=False, chat=False)
STEPS = [0]  # steps served, all sessions together


class MoveAction(Action):
    move: str = Field(description="the player's move")


class TwoFieldAction(Action):
    move: str = ""
    note: str = ""


class TextObservation(Observation):
    text: str = ""


class CountObservation(Observation):
    count: int = 0


class ChatObservation(Observation):
    messages: list[dict[str, str]] = Field(default_factory=list)
    game: str = "digits"


class DigitGame(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        self.target, self.moves = 0, 0

    def observe(self, text: str, reward: float | None = None, done: bool = False) -> Observation:
        if ARGS.malformed:
            return CountObservation(count=self.moves, reward=reward, done=done)
        if ARGS.chat:
            return ChatObservation(messages=[{"role": "user", "content": text}], reward=reward, done=done)
        return TextObservation(text=text, reward=reward, done=done)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> Observation:
        self.target, self.moves = random.Random(seed).randrange(10), 0
        self._state = State(episode_id=episode_id, step_count=0)
        return self.observe("Guess my digit (0-9) in at most 5 moves.")

    def step(self, action: Action, timeout_s: float | None = None, **kwargs) -> Observation:
        STEPS[0] += 1
        if ARGS.die_after and STEPS[0] >= ARGS.die_after:
            os._exit(3)  # mid-episode: the session's socket closes with no answer
        self.moves += 1
        self._state.step_count += 1
        digits = re.findall(r"\d", action.move)
        if digits and int(digits[0]) == self.target and not ARGS.never_ends:
            return self.observe("Right!", reward=1.0, done=True)
        if self.moves >= 5 and not ARGS.never_ends:
            return self.observe(f"Out of moves: it was {self.target}.", reward=0.0, done=True)
        hint = "no digit in that" if not digits else ("higher" if int(digits[0]) < self.target else "lower")
        return self.observe(f"Not {digits[0] if digits else 'that'}: {hint}.")

    @property
    def state(self) -> State:
        return self._state


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--die-after", type=int, default=0)
    parser.add_argument("--malformed", action="store_true")
    parser.add_argument("--never-ends", action="store_true")
    parser.add_argument("--two-fields", action="store_true")
    parser.add_argument("--chat", action="store_true")
    parser.add_argument("--max-sessions", type=int, default=256)
    args = parser.parse_args(namespace=ARGS)
    observation = CountObservation if args.malformed else ChatObservation if args.chat else TextObservation
    app = create_app(DigitGame, TwoFieldAction if args.two_fields else MoveAction, observation,
                     max_concurrent_envs=args.max_sessions)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
