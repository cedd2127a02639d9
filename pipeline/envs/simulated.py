"""Games whose environment is an LLM playing a role from a written scenario, confirmed by an LLM judge.

The environment model sees its role prompt (``environment`` template, filled from the task's scenario) and
the conversation so far, with the agent's moves as ``user`` turns and its own replies as ``assistant`` turns.
It signals success by saying "Goal reached". A reply that is empty, failed, or breaks the scenario's
``reply_is_valid`` check is asked for again with a short correction (a new prompt, so a response cache does
not hand back the same text; the loop is :func:`pipeline.llm.environment.valid_replies`, shared with the
yes/no hosts); after ``max_env_retries`` the fixed ``fallback`` reply is used. The judge's answer to
:meth:`SimulatedGame.judge_conversation` is read by :func:`pipeline.text.judge.parse_verdict`.
"""

from __future__ import annotations

import random
import re
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any

from pipeline.envs.base import Split, StepResult, Task
from pipeline.envs.gamekit import Episode, TextGame, seeded, task_id
from pipeline.llm.base import Conversation, Sampling
from pipeline.llm.environment import valid_replies

GOAL_RE = re.compile(r"goal\s+reached", re.IGNORECASE)


@dataclass
class DialogueState(Episode):
    history: list[tuple[str, str]] = field(default_factory=list)  # (agent move, environment reply)


class SimulatedGame(TextGame):
    """A scenario game played against ``self.environment`` (a ``ChatBackend``)."""

    env_kind = "llm"
    max_turns = 20
    env_sampling = Sampling(temperature=0.0, max_tokens=96)
    max_env_retries = 2

    # -- tasks: one per written scenario, a fixed held-out share --------------------------------------------
    def make_tasks(self, split: Split) -> list[Task]:
        scenarios = sorted(self.config["scenarios"], key=lambda s: s["id"])
        seeded(self.name, "split").shuffle(scenarios)
        n_eval = self.config["eval_tasks"]
        chosen = scenarios[:n_eval] if split == "eval" else scenarios[n_eval:]
        return [Task(self.name, task_id(self.name, split, i), s, self.agent_brief(s), s["difficulty"], split)
                for i, s in enumerate(chosen)]

    @abstractmethod
    def agent_brief(self, scenario: dict) -> str:
        """What the agent is told about a scenario (its ``target`` prompt field)."""

    @abstractmethod
    def scenario_fields(self, scenario: dict) -> dict[str, Any]:
        """Fields of the ``environment`` and ``judge`` templates."""

    def reply_is_valid(self, task: Task, reply: str) -> bool:
        return bool(reply)

    def reset(self, task: Task, rng: random.Random) -> DialogueState:
        return DialogueState(task=task)

    # -- the environment model -----------------------------------------------------------------------------
    def environment_conversation(self, state: DialogueState, action: str) -> Conversation:
        fields = {"opening": self.first_message(state.task), **self.scenario_fields(state.task.env)}
        conversation: Conversation = [{"role": "system", "content": self.prompts("environment", **fields)}]
        for move, reply in state.history:
            conversation += [{"role": "user", "content": move}, {"role": "assistant", "content": reply}]
        conversation.append({"role": "user", "content": action})
        return conversation

    def step(self, state: DialogueState, action: str) -> StepResult:
        # Through step_batch, so a missing backend is reported before the turn is counted.
        return self.step_batch([state], [action])[0]

    def play(self, state: DialogueState, action: str) -> StepResult:
        return self._respond([state], [action])[0]

    def step_batch(self, states: list[DialogueState], actions: list[str]) -> list[StepResult]:
        self._require_environment()
        results = [self.game_over(s) for s in states]
        live = [i for i, s in enumerate(states) if not s.done]
        for i in live:
            states[i].turns += 1
        replies = self._respond([states[i] for i in live], [actions[i].strip() for i in live])
        for i, result in zip(live, replies, strict=True):
            results[i] = self.finish_turn(states[i], result)
        return results

    def _require_environment(self) -> None:
        if self.environment is None:
            raise RuntimeError(
                f"{self.name} is an LLM-simulated game: an environment backend must be configured "
                "(make_game(name, environment=<ChatBackend>), e.g. rollout_text.environment in params.yaml)"
            )

    def _respond(self, states: list[DialogueState], actions: list[str]) -> list[StepResult]:
        if not states:
            return []
        self._require_environment()
        conversations = [self.environment_conversation(s, a) for s, a in zip(states, actions, strict=True)]

        def parse(i: int, text: str) -> str | None:
            text = self.clean_reply(text)
            return text if GOAL_RE.search(text) or self.reply_is_valid(states[i].task, text) else None

        replies, attempts = valid_replies(self.environment, conversations, self.env_sampling, parse,
                                          self.prompts("retry"), self.max_env_retries)
        results = []
        for state, action, reply, tries in zip(states, actions, replies, attempts, strict=True):
            success = reply is not None and bool(GOAL_RE.search(reply))
            text = self.prompts("solved") if success else reply if reply is not None else self.prompts("fallback")
            state.history.append((action, text))
            results.append(StepResult(text, done=success, success=success,
                                      info={"env_retries": tries, "env_fallback": reply is None}))
        return results

    @staticmethod
    def clean_reply(text: str) -> str:
        """First paragraph of a reply, without a leading role label ("Customer: ...")."""
        text = text.strip().split("\n\n")[0].strip()
        return re.sub(r"^\s*(customer|narrator|assistant|environment)\s*:\s*", "", text, flags=re.IGNORECASE)

    # -- the judge -----------------------------------------------------------------------------------------
    def judge_conversation(self, task: Task, history: list[tuple[str, str]]) -> Conversation:
        """The judge request for a finished episode: does the transcript really reach the goal?"""
        transcript = "\n".join(
            f"{self.prompts('agent_label')}: {move}\n{self.prompts('environment_label')}: {reply}"
            for move, reply in history
        )
        fields = {**self.scenario_fields(task.env), "transcript": transcript}
        return [
            {"role": "system", "content": self.prompts("judge_system")},
            {"role": "user", "content": self.prompts("judge", **fields)},
        ]
