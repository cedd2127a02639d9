"""Text games (one module per game; LLM-hosted ones in ``llm_host`` and ``simulated``). See ``base.py`` for the game
contract; NetHack lives in ``pipeline.nethack``."""

from pipeline.envs.base import Game, StepResult, Task, extract_answer, format_answer, make_game, register

__all__ = ["Game", "StepResult", "Task", "extract_answer", "format_answer", "make_game", "register"]
