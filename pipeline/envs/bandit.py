"""Best-arm identification with a fixed budget: 20 pulls of Bernoulli arms, then name the best arm (turn 21).

Scored by reward, not turns (PAPRIKA ranks these trajectories by the reward collected); success is naming
the arm with the highest hidden mean. Pull outcomes come from the episode's own generator, seeded by the
generator passed to ``reset``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from pipeline.envs.base import Split, StepResult, Task, register
from pipeline.envs.gamekit import DIFFICULTIES, Episode, TextGame, per_difficulty, seeded, task_id

ARM_NAMES = "ABCDEFGH"
_PULL_RE = re.compile(r"^([A-H]): ([01])\b")


def parse_arm(action: str, n_arms: int) -> str | None:
    """The arm letter an action names (``B``, ``arm B``, ``b``), if it is one of the first ``n_arms``."""
    found = re.findall(r"\b([A-Ha-h])\b", action.replace("arm", " ").replace("Arm", " "))
    if len(found) != 1:
        return None
    arm = found[0].upper()
    return arm if arm in ARM_NAMES[:n_arms] else None


@dataclass
class BanditState(Episode):
    rng: random.Random = field(default_factory=random.Random)
    pulls: int = 0
    total_reward: float = 0.0


@register
class Bandit(TextGame):
    name = "bandit"
    budget = 20
    max_turns = budget + 1
    score_by_turns = False

    # Difficulty tiers (``bandit@easy3``): every task has the arm means ``means`` (shuffled over the arm letters)
    # and ``budget`` pulls; ``easy3`` is PAPRIKA's easy config (3 arms, 0.6 / 0.4 / 0.4: a third by chance).
    tiers = {"easy3": {"means": [0.6, 0.4, 0.4], "budget": 4}, "easy2": {"means": [0.7, 0.3], "budget": 4}}

    @classmethod
    def check_tier(cls, tier: dict) -> dict:
        unknown = set(tier) - {"means", "budget"}
        if unknown:
            raise ValueError(f"bandit tier: unknown key(s) {sorted(unknown)} (means, budget)")
        means, budget = tier.get("means"), tier.get("budget")
        if (not isinstance(means, list) or not 2 <= len(means) <= len(ARM_NAMES)
                or not all(0 <= m <= 1 for m in means) or sorted(means)[-1] == sorted(means)[-2]):
            raise ValueError(f"bandit tier: means must be 2..{len(ARM_NAMES)} chances in [0, 1] (/-separated) "
                             f"with one best arm, got {means!r}")
        if not isinstance(budget, int) or budget < 1:
            raise ValueError(f"bandit tier: budget must be a positive integer, got {budget!r}")
        return {"means": [float(m) for m in means], "budget": budget}

    def set_tier(self, spec: str) -> None:
        super().set_tier(spec)
        self.held_out_fresh_draws = True  # every task shuffles the tier's arm means: held-out repeats train's
        self.budget = self.tier["budget"]
        self.max_turns = self.budget + 1

    def first_message(self, task: Task) -> str:
        if not self.tier:
            return super().first_message(task)
        arms = task.agent.split(", ")
        return f"Which arm do you pull first? Reply with one letter: {', '.join(arms[:-1])} or {arms[-1]}."

    def make_tasks(self, split: Split) -> list[Task]:
        rng = seeded(self.name, split)
        if self.tier:
            n_tasks = self.config["tasks"][split]
            tiered = []
            for i in range(n_tasks):
                means = list(self.tier["means"])
                rng.shuffle(means)
                tiered.append(Task(self.name, task_id(self.name, split, i), {"means": means},
                                   ", ".join(ARM_NAMES[: len(means)]), "easy", split))
            return tiered
        tasks = []
        for level in DIFFICULTIES:
            n_arms, gap = self.config["levels"][level]["arms"], self.config["levels"][level]["gap"]
            for _ in range(per_difficulty(self.config["tasks"][split])[level]):
                best = rng.uniform(0.55 + gap / 2, 0.95)
                others = [round(rng.uniform(0.05, best - gap), 2) for _ in range(n_arms - 1)]
                means = others + [round(best, 2)]
                rng.shuffle(means)
                tasks.append(({"means": means}, ", ".join(ARM_NAMES[:n_arms]), level))
        rng.shuffle(tasks)
        return [Task(self.name, task_id(self.name, split, i), env, agent, level, split)
                for i, (env, agent, level) in enumerate(tasks)]

    def prompt_fields(self, task: Task) -> dict:
        return {**super().prompt_fields(task), "arms": task.agent, "n_arms": len(task.env["means"]),
                "budget": self.budget}

    def best_arm(self, task: Task) -> str:
        means = task.env["means"]
        return ARM_NAMES[means.index(max(means))]

    def reset(self, task: Task, rng: random.Random) -> BanditState:
        return BanditState(task=task, rng=random.Random(rng.getrandbits(64)))

    def play(self, state: BanditState, action: str) -> StepResult:
        means = state.task.env["means"]
        arm = parse_arm(action, len(means))
        if state.pulls >= self.budget:  # the answer turn
            success = arm == self.best_arm(state.task)
            reply = self.prompts("right" if success else "wrong", arm=arm or action[:20])
            return StepResult(reply, done=True, success=success)
        state.pulls += 1
        last = state.pulls == self.budget
        if arm is None:
            key = "invalid_last" if last else "invalid"
            return StepResult(self.prompts(key, arm=action[:20], arms=state.task.agent), done=False,
                              info={"invalid": True})
        reward = int(state.rng.random() < means[ARM_NAMES.index(arm)])
        state.total_reward += reward
        reply = self.prompts("last_pull" if last else "pull", arm=arm, reward=reward)
        return StepResult(reply, done=False, reward=float(reward))

    def is_correct_guess(self, task: Task, action: str) -> bool:
        return parse_arm(action, len(task.env["means"])) == self.best_arm(task)

    # -- scripted player: successive halving over the pull budget, then the best empirical mean -----------
    def scripted_action(self, task: Task, history: list[tuple[str, str]], rng: random.Random, noise: float) -> str:
        arms = ARM_NAMES[: len(task.env["means"])]
        if rng.random() < noise:
            return rng.choice(arms)
        pulls = {a: 0 for a in arms}
        wins = {a: 0 for a in arms}
        for _, reply in history:
            if match := _PULL_RE.match(reply):
                pulls[match.group(1)] += 1
                wins[match.group(1)] += int(match.group(2))

        def ranked(pool: list[str]) -> list[str]:
            return sorted(pool, key=lambda a: (-(wins[a] + 1) / (pulls[a] + 2), rng.random()))

        if len(history) >= self.budget:
            return ranked(list(arms))[0]
        # Halve the field once the first half of the budget has been spread evenly.
        pool = list(arms)
        if len(history) >= self.budget // 2:
            pool = ranked(pool)[: max(1, (len(arms) + 1) // 2)]
        fewest = min(pulls[a] for a in pool)
        return rng.choice([a for a in pool if pulls[a] == fewest])
