"""Text games (one module per game) and the NetHack wrapper. See ``base.py`` for the game contract."""

from pipeline.envs.base import Game, StepResult, Task, extract_answer, format_answer, make_game, register

__all__ = ["Game", "StepResult", "Task", "extract_answer", "format_answer", "make_game", "register"]
