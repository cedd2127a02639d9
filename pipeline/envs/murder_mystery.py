"""Murder mystery: an LLM narrator holds a case file (suspects, clues, culprit); the agent investigates and
accuses one suspect.

Cases (``data/murder_mystery.json``) are written for Curio. The narrator says "Goal reached" when the
culprit is accused; a reply that names the culprit as the killer before that is asked for again.
``is_correct_guess`` checks an accusation by program: it must name the culprit and no other suspect.
"""

from __future__ import annotations

import re

from pipeline.envs.base import Task, register
from pipeline.envs.simulated import GOAL_RE, SimulatedGame

_GIVEAWAY_RE = re.compile(r"\b(killer|murderer|culprit|did it|is guilty|killed)\b", re.IGNORECASE)


def mentions(text: str, name: str) -> bool:
    """Whether ``text`` names a suspect, by full name or by the name without a title ("Dr Lowe" -> "Lowe")."""
    words = [name, name.split()[-1]]
    return any(re.search(rf"\b{re.escape(w)}\b", text, re.IGNORECASE) for w in words)


@register
class MurderMystery(SimulatedGame):
    name = "murder_mystery"

    def agent_brief(self, scenario: dict) -> str:
        suspects = ", ".join(f"{s['name']} ({s['role']})" for s in scenario["suspects"])
        return self.prompts("brief", setting=scenario["setting"], suspects=suspects)

    def scenario_fields(self, scenario: dict) -> dict[str, str]:
        return {
            "setting": scenario["setting"],
            "victim": scenario["victim"],
            "suspect_lines": "\n".join(f"- {s['name']}, {s['role']}: {s['story']}" for s in scenario["suspects"]),
            "clues": "\n".join(f"- {c}" for c in scenario["clues"]),
            "culprit": scenario["culprit"],
            "motive": scenario["motive"],
            "method": scenario["method"],
        }

    def reply_is_valid(self, task: Task, reply: str) -> bool:
        # The narrator must not hand over the answer: the culprit named next to a give-away word.
        giveaway = mentions(reply, task.env["culprit"]) and _GIVEAWAY_RE.search(reply) is not None
        return bool(reply) and (not giveaway or GOAL_RE.search(reply) is not None)

    def is_correct_guess(self, task: Task, action: str) -> bool:
        named = {s["name"] for s in task.env["suspects"] if mentions(action, s["name"])}
        return named == {task.env["culprit"]}
