"""Customer service: an LLM plays a customer with a problem; the agent asks questions and gives the fix.

Scenarios (``data/customer_service.json``) are written for Curio: what the customer says first, the facts
they can share when asked, the cause they do not know and the fix that works. The customer model says
"Goal reached" when the agent tells them the fix; an LLM judge can confirm it against the scenario.
"""

from __future__ import annotations

from pipeline.envs.base import register
from pipeline.envs.simulated import SimulatedGame


@register
class CustomerService(SimulatedGame):
    name = "customer_service"

    def agent_brief(self, scenario: dict) -> str:
        return scenario["opening"]

    def scenario_fields(self, scenario: dict) -> dict[str, str]:
        return {
            "product": scenario["product"],
            "opening": scenario["opening"],
            "facts": "; ".join(scenario["facts"]),
            "cause": scenario["cause"],
            "fix": scenario["fix"],
        }
