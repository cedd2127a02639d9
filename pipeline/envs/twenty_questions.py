"""Twenty questions against a knowledge-base oracle (a program engine).

The secret is an object of ``data/twenty_questions.json``; the agent is told only its category. The oracle
reads each question as an attribute of the knowledge base (its canonical wording or a paraphrase, compared
after dropping openings such as "Is it" / "Does it"; failing that, the longest keyword it contains) or, for a
guess, as an object name or synonym, and answers from the table. A question it cannot read costs a turn and
gets a fixed "cannot answer" reply. Naming the secret or one of its synonyms ends the episode: "Goal reached".

Rewards stay 0: like the other turn-scored games, the score is the number of turns (ArCHer's -1 per turn is
derived from that downstream).
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
import re
from typing import Literal

from pipeline.envs.base import Split, StepResult, Task, register
from pipeline.envs.gamekit import Episode, ShownCandidates, check_shown_tier, load_json, shown_candidates
from pipeline.envs.llm_host import YesNoHostGame

KB_FILE = "twenty_questions.json"
EVAL_FRACTION = 0.25
# Questions no yes/no table can answer: the noisy scripted player's off-script moves.
UNREADABLE_QUESTIONS = (
    "Can you give me a hint?", "Is it something I would like?", "What is it?", "Is it nice?",
    "Is it a thing?", "Is it something?", "Tell me more.", "Is it good?", "Is it one or the other?",
)

# Openings dropped before a question is compared with the knowledge base's wording, so that "Does it fly?",
# "Can it fly?" and "fly?" read the same. Tried longest first, so "i think it is" goes whole, not as "i".
_LEADS = sorted(
    (
        "is it", "is this", "is that", "is the object", "is the thing", "is your object", "is the secret",
        "is it maybe", "has it got", "has it", "does it", "does this", "does that", "does the object",
        "does the thing", "can it", "can this", "could it", "would it", "will it", "do you", "do people",
        "can you", "can people", "it is", "its", "i think it is", "i think its", "my guess is", "i guess",
        "the answer is", "could it be", "might it be", "it must be", "are you thinking of",
        "okay", "ok", "so", "then", "well", "hmm", "alright", "great",
    ),
    key=len,
    reverse=True,
)
_TRAILERS = ("or not",)
_ARTICLES = ("a", "an", "the", "some")

AttributeOrObject = tuple[Literal["attribute", "object"], str]


def normalise(text: str) -> str:
    """Lower case, apostrophes dropped, every other non-alphanumeric run turned into one space."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower().replace("'", "").replace("\u2019", "")))


def question_core(text: str) -> str:
    """``text`` normalised, without leading openings ("is it", "ok so does it") and a trailing "or not"."""
    core = normalise(text)
    stripped = True
    while stripped:
        stripped = False
        for lead in _LEADS:
            if core.startswith(lead + " "):
                core, stripped = core[len(lead) + 1:], True
                break
    for trailer in _TRAILERS:
        if core.endswith(" " + trailer):
            core = core[: -len(trailer) - 1]
    return core


def article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def parse_reply(reply: str) -> bool | None:
    """A host reply as a yes/no answer: "Yes." -> True, "No." -> False, "Goal reached" -> True; else None."""
    words = normalise(reply).split()
    if not words:
        return None
    if words[0] == "yes" or words[:2] == ["goal", "reached"]:
        return True
    if words[0] == "no":
        return False
    return None


class KnowledgeBase:
    """Objects by category, yes/no attributes, and the readers that map free text onto them."""

    def __init__(self, data: dict) -> None:
        self.prompts: dict[str, str] = data["prompts"]
        self.categories: tuple[str, ...] = tuple(data["categories"])
        self.attributes: tuple[str, ...] = tuple(a["id"] for a in data["attributes"])
        self.objects: tuple[str, ...] = tuple(o["name"] for o in data["objects"])
        self.category_of: dict[str, str] = {o["name"]: o["category"] for o in data["objects"]}
        self.synonyms: dict[str, tuple[str, ...]] = {o["name"]: tuple(o["synonyms"]) for o in data["objects"]}
        self._values: dict[str, dict[str, bool]] = {o["name"]: dict(o["attributes"]) for o in data["objects"]}
        self._questions: dict[str, str] = {a["id"]: a["question"] for a in data["attributes"]}
        self._expected_turns: dict[str, dict[str, float]] = {}  # per category, filled on first use
        self._members: dict[str, tuple[str, ...]] = {
            c: tuple(o for o in self.objects if self.category_of[o] == c) for c in self.categories
        }
        for name, values in self._values.items():
            if set(values) != set(self.attributes):
                raise ValueError(f"{name!r} lacks a value for: {sorted(set(self.attributes) - set(values))}")
        self._phrases: dict[str, str] = {}
        for a in data["attributes"]:
            for phrase in [a["question"], *a["paraphrases"]]:
                core = question_core(phrase)
                if self._phrases.setdefault(core, a["id"]) != a["id"]:
                    raise ValueError(f"{phrase!r} reads as both {self._phrases[core]!r} and {a['id']!r}")
        # Keywords longest first, so "bigger than a car" wins over "car"-free shorter ones like "big".
        self._keywords: list[tuple[str, str]] = sorted(
            ((normalise(k), a["id"]) for a in data["attributes"] for k in a["keywords"]),
            key=lambda item: len(item[0]),
            reverse=True,
        )
        self._names: dict[str, str] = {}
        for name in self.objects:
            for alias in (name, *self.synonyms[name]):
                if self._names.setdefault(normalise(alias), name) != name:
                    raise ValueError(f"{alias!r} names both {self._names[normalise(alias)]!r} and {name!r}")
            guess = question_core(self.guess(name))
            if guess in self._phrases:
                raise ValueError(f"the guess {self.guess(name)!r} reads as the question {self._phrases[guess]!r}")

    # -- the table -----------------------------------------------------------------------------------------------
    def members(self, category: str) -> tuple[str, ...]:
        """The objects of ``category``, in knowledge-base order."""
        return self._members[category]

    def value(self, obj: str, attr: str) -> bool:
        return self._values[obj][attr]

    def question(self, attr: str) -> str:
        """The canonical wording of ``attr`` (what the scripted player asks)."""
        return self._questions[attr]

    def guess(self, name: str) -> str:
        """The guess naming ``name`` ("Is it an apple?")."""
        return self.prompts["guess"].format(article=article(name), name=name)

    # -- reading free text ---------------------------------------------------------------------------------------
    def interpret(self, text: str) -> AttributeOrObject | None:
        """What ``text`` asks: ``("attribute", id)``, ``("object", name)`` for a guess, or None.

        Order: an exact canonical / paraphrase wording, then an object name or synonym (with or without an
        article), then the longest keyword found. So "Is it orange?" asks the colour, "Is it an orange?" guesses
        the fruit, and "Is it bigger than a car?" is a size question, not a guess.
        """
        core = question_core(text)
        if not core:
            return None
        if core in self._phrases:
            return "attribute", self._phrases[core]
        name = self._object_name(core)
        if name is not None:
            return "object", name
        padded = f" {normalise(text)} "
        for keyword, attr in self._keywords:
            if f" {keyword} " in padded:
                return "attribute", attr
        return None

    def _object_name(self, core: str) -> str | None:
        words = core.split()
        if words and words[0] in _ARTICLES:
            words = words[1:]
        phrase = " ".join(words)
        for candidate in (phrase, phrase.removesuffix("es"), phrase.removesuffix("s")):
            if candidate in self._names:
                return self._names[candidate]
        return None

    def match_question(self, text: str) -> str | None:
        """The attribute a free-form question asks about; None for a guess or an unreadable question."""
        found = self.interpret(text)
        return found[1] if found and found[0] == "attribute" else None

    def match_object(self, text: str) -> str | None:
        """The object a guess names ("Is it a dog?", "dog", "Is it an automobile?"); None otherwise."""
        found = self.interpret(text)
        return found[1] if found and found[0] == "object" else None

    # -- reasoning over answers ----------------------------------------------------------------------------------
    def consistent(self, category: str, history: list[tuple[str, str]]) -> list[str]:
        """Objects of ``category`` that agree with every (question, reply) pair of ``history``.

        A "No." to a guess removes that object; replies that are neither yes nor no teach nothing.
        """
        candidates = list(self.members(category))
        for question, reply in history:
            verdict = parse_reply(reply)
            found = self.interpret(question)
            if verdict is None or found is None:
                continue
            kind, what = found
            if kind == "attribute":
                candidates = [o for o in candidates if self.value(o, what) == verdict]
            elif verdict:
                candidates = [o for o in candidates if o == what]
            else:
                candidates = [o for o in candidates if o != what]
        return candidates

    def split_quality(self, candidates: list[str] | tuple[str, ...], attr: str) -> float:
        """Bits of information the answer to ``attr`` gives about ``candidates`` (1.0 = an even split)."""
        if not candidates:
            return 0.0
        p = sum(self.value(o, attr) for o in candidates) / len(candidates)
        return 0.0 if p in (0.0, 1.0) else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))

    def best_attributes(self, candidates: list[str] | tuple[str, ...]) -> list[str]:
        """The attributes that split ``candidates`` best, in knowledge-base order; empty if none splits them."""
        scores = {a: self.split_quality(candidates, a) for a in self.attributes}
        top = max(scores.values())
        return [a for a, s in scores.items() if s == top] if top > 0 else []

    def expected_turns(self, category: str) -> dict[str, float]:
        """Expected turns (final guess included) of the noise-free scripted player, per secret of ``category``.

        Mirrors ``TwentyQuestions.scripted_action``: ask the first best-splitting attribute; with two candidates
        left, half the time guess one of them instead; with one left, guess it.
        """
        if category in self._expected_turns:
            return self._expected_turns[category]

        @functools.cache
        def turns(candidates: tuple[str, ...], secret: str) -> float:
            if len(candidates) == 1:
                return 1.0
            a = self.best_attributes(candidates)[0]
            ask = 1 + turns(tuple(o for o in candidates if self.value(o, a) == self.value(secret, a)), secret)
            return 0.5 * ask + 0.5 * 1.5 if len(candidates) == 2 else ask

        members = self.members(category)
        self._expected_turns[category] = {secret: turns(members, secret) for secret in members}
        return self._expected_turns[category]


@functools.cache
def knowledge_base() -> KnowledgeBase:
    """The game's knowledge base (loaded once)."""
    return KnowledgeBase(load_json(KB_FILE))


def oracle_reply(secret: str, question: str) -> str:
    """The program host's reply to ``question`` when the secret object is ``secret``."""
    kb = knowledge_base()
    found = kb.interpret(question)
    if found is None:
        return kb.prompts["unknown"]
    kind, what = found
    if kind == "object":
        return kb.prompts["goal"] if what == secret else kb.prompts["no"]
    return kb.prompts["yes"] if kb.value(secret, what) else kb.prompts["no"]


@functools.cache
def _eval_objects() -> frozenset[str]:
    """In each category, the quarter of the objects with the smallest name hashes (at least one)."""
    kb = knowledge_base()
    chosen: set[str] = set()
    for category in kb.categories:
        members = kb.members(category)
        ranked = sorted(members, key=lambda o: hashlib.sha256(f"twenty_questions:{o}".encode()).hexdigest())
        chosen.update(ranked[: max(1, round(len(members) * EVAL_FRACTION))])
    return frozenset(chosen)


def split_of(name: str) -> Split:
    """The fixed split of an object: a pure function of the knowledge base, so it never moves between runs."""
    return "eval" if name in _eval_objects() else "train"


@functools.cache
def _difficulty_of() -> dict[str, str]:
    """Every object's third by the turns the noise-free scripted player expects (ties broken by name)."""
    kb = knowledge_base()
    ranked = sorted((kb.expected_turns(kb.category_of[o])[o], o) for o in kb.objects)
    n = len(ranked)
    return {o: ("easy", "medium", "hard")[min(2, 3 * i // n)] for i, (_, o) in enumerate(ranked)}


def difficulty(name: str) -> str:
    """easy / medium / hard: the third of all objects by the turns the noise-free scripted player expects."""
    return _difficulty_of()[name]


@register
class TwentyQuestions(ShownCandidates, YesNoHostGame):
    """Find the secret object of a known category with yes/no questions; the host is the knowledge base
    (or an LLM when ``environment`` is set: see ``pipeline.envs.llm_host``)."""

    name = "twenty_questions"
    max_turns = 20
    env_kind = "program"
    # Difficulty tiers (``twenty_questions@shown4``): the opening lists ``candidates`` objects of the category, the
    # secret among them (as ArCHer's 10-word subset does), and the game ends after ``max_turns`` < candidates turns.
    tiers = {"shown4": {"candidates": 4, "max_turns": 3}, "shown6": {"candidates": 6, "max_turns": 4},
             "shown10": {"candidates": 10, "max_turns": 5}}
    SYSTEM_SHOWN = ("We are playing a guessing game. I am thinking of one of the objects I list. Each turn, name "
                    "one of them or ask a yes/no question about it. Write every reply as <Answer>your guess or "
                    "question</Answer>.")
    FIRST_SHOWN = ("The secret {category} is one of these {n}: {candidates}. You have {max_turns} turns. "
                   "Which one is it?")

    @classmethod
    def check_tier(cls, tier: dict) -> dict:
        smallest = min(len(knowledge_base().members(c)) for c in knowledge_base().categories)
        return check_shown_tier(cls.name, tier, smallest)

    def shown(self, task: Task) -> list[str]:
        """The candidates a tiered task lists (the secret among them); every object of the category untiered."""
        members = knowledge_base().members(knowledge_base().category_of[task.env])
        if not self.tier:
            return list(members)
        return shown_candidates(task.env, members, self.tier["candidates"], type(self).name)

    def make_tasks(self, split: Split) -> list[Task]:
        kb = knowledge_base()
        return [
            Task(self.name, obj, obj, kb.category_of[obj], difficulty(obj), split)
            for obj in kb.objects
            if split_of(obj) == split
        ]

    def prompt_fields(self, task: Task) -> dict:
        return {"max_turns": self.max_turns, "article": article(task.agent), "category": task.agent}

    def reset(self, task: Task, rng: random.Random) -> Episode:
        return Episode(task=task)

    def play(self, state: Episode, action: str) -> StepResult:
        reply = oracle_reply(state.task.env, action)
        success = reply == self.prompts("goal")
        unanswerable = reply == self.prompts("unknown")
        return StepResult(reply, done=success, success=success, info={"unanswerable": unanswerable})

    def is_correct_guess(self, task: Task, action: str) -> bool:
        return knowledge_base().match_object(action) == task.env

    def scripted_action(self, task: Task, history: list[tuple[str, str]], rng: random.Random, noise: float) -> str:
        """Ask the best-splitting canonical question (the first in knowledge-base order, so the noise-free player
        is one fixed decision tree per category); guess when one candidate is left (or, half the time, two).

        With probability ``noise`` a poor move instead: a random question (perhaps useless or already asked), a
        question the host cannot read (so the data shows play going on after "Sorry, I cannot answer"), or a
        guess of an object the answers so far have already ruled out (never one already guessed).
        """
        kb = knowledge_base()
        # An LLM host can contradict itself and rule everything out; then start over from the whole category.
        shown = self.shown(task)
        candidates = [o for o in kb.consistent(task.agent, history) if o in shown] or shown
        if rng.random() < noise:
            guessed = {kb.match_object(q) for q, _ in history}
            ruled_out = [o for o in shown if o not in candidates and o not in guessed]
            kind = rng.random()
            if ruled_out and kind < 0.35:
                return kb.guess(rng.choice(ruled_out))
            if kind < 0.5:
                return rng.choice(UNREADABLE_QUESTIONS)
            return kb.question(rng.choice(kb.attributes))
        best = kb.best_attributes(candidates)
        if len(candidates) == 1 or not best or (len(candidates) == 2 and rng.random() < 0.5):
            return kb.guess(rng.choice(candidates))
        return kb.question(best[0])
