"""Guess my city: find a secret city with yes/no questions; 20 turns.

The environment is a program oracle over a knowledge base written for Curio (``data/cities.json``: continent,
regions, country, capital, coast and sea, population, climate, languages, latitude / longitude, river,
altitude, Olympic host). A question is read by matching known phrases (``keywords`` in
``data/guess_my_city.json`` plus every city, country, region, sea and language name in the knowledge base);
several attributes in one question must all hold ("or" asks for any). Replies are only yes / no / "cannot
answer" / "Goal reached", so the oracle never names the city or its country. Naming the city (or an alias)
wins.

``candidates(history)`` gives the cities still consistent with a conversation: what the exact information
gain of a question is computed from (see ``pipeline.text.multiturn_reward``).
"""

from __future__ import annotations

import functools
import math
import random
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from pipeline.envs.base import Split, StepResult, Task, register
from pipeline.envs.gamekit import (
    Episode,
    ShownCandidates,
    check_shown_tier,
    load_json,
    seeded,
    shown_candidates,
    task_id,
)
from pipeline.envs.llm_host import YesNoHostGame

Predicate = tuple[str, Any]  # (kind, argument), e.g. ("continent", ("Europe",)) or ("capital", None)

_NUMBER_WORDS = {
    "a": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
    "ten": 10, "eleven": 11, "twelve": 12, "fifteen": 15, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50,
}
_NUMBER = r"(\d+(?:\.\d+)?|" + "|".join(_NUMBER_WORDS) + r")"
_ABOVE = r"more than|over|above|greater than|bigger than|larger than|at least|exceeds?|exceeding"
_BELOW = r"less than|under|below|fewer than|smaller than|at most"
_POPULATION_RE = re.compile(
    rf"\b(?:between {_NUMBER} and {_NUMBER}|(?:({_ABOVE}|{_BELOW}) )?{_NUMBER}) (million|thousand)\b"
)
# "Is it Nagoya?": a capitalised name the knowledge base does not know is a wrong guess, not a question.
_NAME_GUESS_RE = re.compile(
    r"^\s*(?i:is it|could it be|is the city|is the secret city|my guess is|i guess|the city is)\s+"
    r"([A-Z][\w'.-]*(?:\s+(?:[A-Z][\w'.-]*|de|la|of|el))*)\s*[?.!]?\s*$"
)


def normalise(text: str) -> str:
    """Lower case ASCII words and numbers: accents and apostrophes dropped, other punctuation to spaces."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower().replace("'", "")
    text = re.sub(r"[^a-z0-9.]+", " ", text)
    text = re.sub(r"(?<!\d)\.|\.(?!\d)", " ", text)  # keep decimal points only
    return " ".join(text.split())


def _number(word: str) -> float:
    return _NUMBER_WORDS[word] if word in _NUMBER_WORDS else float(word)


@dataclass(frozen=True)
class ParsedQuestion:
    cities: frozenset[str]
    predicates: tuple[Predicate, ...]
    any_of: bool  # "... or ...": one predicate holding is enough
    name_guess: bool  # shaped like a guess of a city the knowledge base does not hold


class CityKnowledgeBase:
    """The cities, the phrases the oracle understands, and its answers."""

    def __init__(self, cities_file: str = "cities.json", game_file: str = "guess_my_city.json") -> None:
        kb, config = load_json(cities_file), load_json(game_file)
        self.countries: dict[str, dict] = kb["countries"]
        self.cities: dict[str, dict] = {}
        for raw in kb["cities"]:
            country = self.countries[raw["country"]]
            self.cities[raw["name"]] = {
                "continent": country["continent"], "regions": country["regions"],
                "languages": country["languages"], **raw,
            }
        phrases: dict[str, Predicate] = {}
        for city in self.cities.values():
            for alias in [city["name"], *city["aliases"]]:
                phrases[normalise(alias)] = ("city", city["name"])
        for name, country in self.countries.items():
            for alias in [name, *country["aliases"]]:
                phrases.setdefault(normalise(alias), ("country", name))
        for city in self.cities.values():
            for region in city["regions"]:
                phrases.setdefault(normalise(region), ("region", region))
            for language in city["languages"]:
                phrases.setdefault(normalise(language), ("language", language))
            if city["water"]:
                phrases.setdefault(normalise(city["water"]), ("water", city["water"]))
        phrases.setdefault("sea level", ("ignore", None))
        for phrase, kind, arg in config["keywords"]:
            phrases.setdefault(normalise(phrase), (kind, tuple(arg) if isinstance(arg, list) else arg))
        self.phrases = phrases
        alternatives = "|".join(re.escape(p) for p in sorted(phrases, key=len, reverse=True))
        self._phrase_re = re.compile(rf"\b(?:{alternatives})\b")
        self.parse = functools.lru_cache(maxsize=50_000)(self._parse)

    def _parse(self, question: str) -> ParsedQuestion:
        text = normalise(question)
        predicates: list[Predicate] = []
        for m in _POPULATION_RE.finditer(text):
            low, high, comparator, value, unit = m.groups()
            scale = 1.0 if unit == "million" else 0.001
            if low is not None:
                predicates.append(("population_between", (_number(low) * scale, _number(high) * scale)))
            elif comparator and re.fullmatch(_BELOW, comparator):
                predicates.append(("population_below", _number(value) * scale))
            else:
                predicates.append(("population_above", _number(value) * scale))
        text = _POPULATION_RE.sub(" ", text)
        cities: set[str] = set()
        for m in self._phrase_re.finditer(text):
            kind, arg = self.phrases[m.group(0)]
            if kind == "city":
                cities.add(arg)
            elif kind != "ignore":
                predicates.append((kind, arg))
        return ParsedQuestion(
            cities=frozenset(cities),
            predicates=tuple(dict.fromkeys(predicates)),
            any_of=" or " in f" {text} ",
            name_guess=bool(_NAME_GUESS_RE.match(question)),
        )

    def holds(self, city: dict, predicate: Predicate) -> bool:
        kind, arg = predicate
        checks = {
            "continent": lambda: city["continent"] in arg,
            "region": lambda: arg in city["regions"],
            "country": lambda: city["country"] == arg,
            "language": lambda: arg in city["languages"],
            "water": lambda: city["water"] == arg,
            "climate": lambda: city["climate"] in arg,
            "capital": lambda: city["capital"],
            "coastal": lambda: city["coastal"],
            "inland": lambda: not city["coastal"],
            "river": lambda: city["river"],
            "highland": lambda: city["highland"],
            "olympics": lambda: city["olympics"],
            "north": lambda: city["lat"] > 0,
            "south": lambda: city["lat"] < 0,
            "east": lambda: city["lon"] > 0,
            "west": lambda: city["lon"] < 0,
            "near_equator": lambda: abs(city["lat"]) < arg,
            "population_above": lambda: city["population"] > arg,
            "population_at_least": lambda: city["population"] >= arg,
            "population_below": lambda: city["population"] < arg,
            "population_between": lambda: arg[0] <= city["population"] <= arg[1],
        }
        return bool(checks[kind]())

    def answer(self, city_name: str, question: str) -> str:
        """The oracle's reply key for ``question`` about ``city_name``: yes, no, unknown, one_city or solved."""
        parsed = self.parse(question)
        if parsed.cities:
            if len(parsed.cities) > 1:
                return "one_city"
            return "solved" if city_name in parsed.cities else "no"
        if not parsed.predicates:
            return "no" if parsed.name_guess else "unknown"
        city = self.cities[city_name]
        results = [self.holds(city, p) for p in parsed.predicates]
        return "yes" if (any(results) if parsed.any_of else all(results)) else "no"

    def names_city(self, city_name: str, text: str) -> bool:
        return self.parse(text).cities == {city_name}

    def question_bank(self, templates: dict, with_article: set[str]) -> list[str]:
        """The scripted player's questions: one per continent, region, country, sea, language, climate and
        population threshold, plus the fixed ones; questions that would name a city are left out."""
        cities = list(self.cities.values())
        values = {
            "continent": sorted({c["continent"] for c in cities}),
            "region": sorted({r for c in cities for r in c["regions"]}),
            "country": sorted({c["country"] for c in cities}),
            "water": sorted({c["water"] for c in cities if c["water"]}),
            "language": sorted({lang for c in cities for lang in c["languages"]}),
            "climate": sorted({c["climate"] for c in cities}),
            "population": templates["population_thresholds"],
        }
        questions = [
            templates[kind].format(name=f"the {v}" if v in with_article else v)
            for kind, vs in values.items()
            for v in vs
        ]
        # "Is it in Singapore?" names a city, so it is a guess rather than a country question.
        return [q for q in questions if not self.parse(q).cities] + list(templates["fixed"])


@functools.cache
def knowledge_base() -> CityKnowledgeBase:
    """The knowledge base, built once per process (treat it as read-only)."""
    return CityKnowledgeBase()


@functools.cache
def scripted_questions() -> dict[str, frozenset[str]]:
    """Each question of the scripted player's bank -> the cities the oracle says "Yes." to."""
    kb, config = knowledge_base(), load_json("guess_my_city.json")
    bank = kb.question_bank(config["question_bank"], set(config["with_article"]))
    return {q: frozenset(c for c in kb.cities if kb.answer(c, q) == "yes") for q in bank}


@dataclass
class CityState(Episode):
    pass


@register
class GuessMyCity(ShownCandidates, YesNoHostGame):
    name = "guess_my_city"
    max_turns = 20
    # An LLM host (``environment`` set, see pipeline.envs.llm_host) replies in the oracle's words.
    host_reply_keys = {"Yes": "yes", "No": "no", "Goal reached": "solved"}

    # Difficulty tiers (``guess_my_city@shown4``): the opening lists ``candidates`` cities, the secret among them,
    # and the game ends after ``max_turns`` < candidates turns.
    tiers = {"shown4": {"candidates": 4, "max_turns": 3}, "shown6": {"candidates": 6, "max_turns": 4},
             "shown10": {"candidates": 10, "max_turns": 5}}
    SYSTEM_SHOWN = ("We are playing a guessing game. I am thinking of one of the cities I list. Each turn, name "
                    "one of them or ask a yes/no question about it. Write every reply as <Answer>your guess or "
                    "question</Answer>.")
    FIRST_SHOWN = ("The secret {target} is one of these {n}: {candidates}. You have {max_turns} turns. "
                   "Which one is it?")

    def __init__(self, environment=None) -> None:
        super().__init__(environment)
        self.kb = knowledge_base()

    @classmethod
    def check_tier(cls, tier: dict) -> dict:
        return check_shown_tier(cls.name, tier, 20)

    def shown(self, task: Task) -> list[str]:
        """The cities a tiered task lists (the secret among them); every city untiered."""
        if not self.tier:
            return list(self.kb.cities)
        return shown_candidates(task.env, list(self.kb.cities), self.tier["candidates"], type(self).name)

    @property
    def question_bank(self) -> list[str]:
        return list(scripted_questions())

    def make_tasks(self, split: Split) -> list[Task]:
        names = sorted(self.kb.cities)
        seeded(type(self).name, "split").shuffle(names)  # a tier keeps the game's split of secrets
        n_eval = self.config["eval_tasks"]
        chosen = names[:n_eval] if split == "eval" else names[n_eval:]
        bands = self.config["difficulty_population"]

        def level(name: str) -> str:
            population = self.kb.cities[name]["population"]
            return "easy" if population >= bands["easy"] else "medium" if population >= bands["medium"] else "hard"

        return [Task(self.name, task_id(self.name, split, i), name, self.config["agent"], level(name), split)
                for i, name in enumerate(chosen)]

    def reset(self, task: Task, rng: random.Random) -> CityState:
        return CityState(task=task)

    def play(self, state: CityState, action: str) -> StepResult:
        key = self.kb.answer(state.task.env, action)
        return StepResult(self.prompts(key), done=key == "solved", success=key == "solved",
                          info={"unanswerable": key == "unknown"})

    def is_correct_guess(self, task: Task, action: str) -> bool:
        return self.kb.names_city(task.env, action)

    def reply_key(self, reply: str) -> str | None:
        """What a reply says: solved / yes / no, read leniently so that an LLM host's "Yes" counts too;
        None for replies that carry no answer (cannot answer, one city at a time)."""
        text = reply.strip().lower()
        if "goal reached" in text:
            return "solved"
        if re.match(r"(yes|yeah|yep)\b", text):
            return "yes"
        if re.match(r"(no|nope)\b", text):
            return "no"
        return None

    def candidates(self, history: list[tuple[str, str]]) -> list[str]:
        """Cities of the knowledge base whose oracle answers agree with every (question, reply) in ``history``."""
        answered = [(q, key) for q, reply in history if (key := self.reply_key(reply)) is not None]
        return [c for c in self.kb.cities if all(self.kb.answer(c, q) == key for q, key in answered)]

    # -- scripted player: the bank question that splits the remaining cities most evenly ---------------------
    def scripted_action(self, task: Task, history: list[tuple[str, str]], rng: random.Random, noise: float) -> str:
        guess = self.config["question_bank"]["guess"]
        if rng.random() < noise:
            if rng.random() < 0.5:
                return rng.choice(self.question_bank)
            return guess.format(name=rng.choice(list(self.kb.cities)))
        shown = set(self.shown(task))
        left = set(self.candidates(history)) & shown or shown
        asked = {q for q, _ in history}
        yes_sets = scripted_questions()

        def split_entropy(question: str) -> float:
            p = len(left & yes_sets[question]) / len(left)
            return 0.0 if p in (0.0, 1.0) else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))

        scored = [(split_entropy(q), rng.random(), q) for q in yes_sets if q not in asked]
        best = max(scored, default=(0.0, 0.0, ""))
        if len(left) <= 2 or best[0] == 0.0:
            return guess.format(name=rng.choice(sorted(left)))
        return best[2]
