"""Yes/no guessing games whose host is either the game's program or an LLM (twenty questions, guess my city).

With ``game.environment`` None the game's own program oracle answers (``play``). With a chat backend there
(``rollout_text.environment`` in params: ``pipeline.policies.make_games``), the host is PAPRIKA's LLM
environment: each turn, the questions of every live episode go out in one batch through
:func:`pipeline.llm.environment.answer_yes_no_batch` (the ``environment.yaml`` prompt with the secret, its
category and the (question, reply) history; strict Yes / No / Goal reached validation; re-asks with a
correction; then the fixed default reply, counted as UNKNOWN in the backend's ledger). "Goal reached" ends the
episode as a success, as in PAPRIKA (an LLM judge can audit claimed wins downstream).

The host's label is shown to the agent in the game's own wording ("Yes." / "No." / its goal and "cannot
answer" lines), so a policy sees the same replies whichever host answers.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pipeline.envs.base import StepResult, Task
from pipeline.envs.gamekit import Episode, TextGame

HOST_HISTORY = "host_history"  # state attribute: the LLM host's (question, label) pairs so far


def host_history(state: Episode) -> list[tuple[str, str]]:
    """The (question, host label) pairs an LLM host has answered in this episode (kept on the state)."""
    history = getattr(state, HOST_HISTORY, None)
    if history is None:
        history = []
        setattr(state, HOST_HISTORY, history)
    return history


class YesNoHostGame(TextGame):
    """A TextGame answered by its program, or by ``self.environment`` (an LLM) when one is set.

    Subclasses name the prompt keys of their replies (``host_reply_keys``: host label -> prompt key, plus
    ``host_unknown_key`` for a defaulted answer) and may override ``host_secret`` / ``host_category``.
    """

    host_reply_keys: ClassVar[dict[str, str]] = {"Yes": "yes", "No": "no", "Goal reached": "goal"}
    host_unknown_key: ClassVar[str] = "unknown"
    #: re-asks after a reply that is not exactly Yes / No / Goal reached (PAPRIKA: 5)
    host_max_retries: ClassVar[int] = 5

    def host_secret(self, task: Task) -> str:
        """What the LLM host is told the secret is."""
        return str(task.env)

    def host_category(self, task: Task) -> str:
        return task.agent

    def step(self, state: Any, action: str) -> StepResult:
        if self.environment is None:
            return super().step(state, action)
        return self.step_batch([state], [action])[0]

    def step_batch(self, states: list[Any], actions: list[str]) -> list[StepResult]:
        if self.environment is None:
            return super().step_batch(states, actions)
        from pipeline.llm.environment import answer_yes_no_batch
        from pipeline.llm.prompts import ENVIRONMENT_REPLIES

        results = [self.game_over(s) for s in states]
        live = [i for i, s in enumerate(states) if not s.done]
        if not live:
            return results
        questions = [actions[i].strip() for i in live]
        histories = [host_history(states[i]) for i in live]
        replies = answer_yes_no_batch(
            self.environment,
            [self.host_secret(states[i].task) for i in live],
            [self.host_category(states[i].task) for i in live],
            [list(h) for h in histories],
            questions,
            max_retries=self.host_max_retries,
        )
        for i, question, history, reply in zip(live, questions, histories, replies, strict=True):
            state = states[i]
            state.turns += 1
            history.append((question, reply))
            label = reply if reply in ENVIRONMENT_REPLIES else None
            key = self.host_reply_keys[label] if label is not None else self.host_unknown_key
            success = label == "Goal reached"
            result = StepResult(
                self.prompts(key),
                done=success,
                success=success,
                info={"host": "llm", "host_reply": label or "UNKNOWN", "unanswerable": label is None},
            )
            results[i] = self.finish_turn(state, result)
        return results
