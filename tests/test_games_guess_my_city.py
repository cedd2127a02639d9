import math
import random

import pytest

from pipeline.envs.base import Task, make_game
from pipeline.text.multiturn_reward import exact_information_gain


@pytest.fixture(scope="module")
def game():
    return make_game("guess_my_city")


@pytest.mark.parametrize(
    ("city", "question", "reply"),
    [
        ("Lisbon", "Is it in Europe?", "Yes."),
        ("Lisbon", "Is it in Asia?", "No."),
        ("Lisbon", "Is it a capital city?", "Yes."),
        ("Lisbon", "Is it on the Atlantic Ocean?", "Yes."),
        ("Lisbon", "Is it on the Mediterranean Sea?", "No."),
        ("Lisbon", "Is the climate mediterranean?", "Yes."),
        ("Lisbon", "Do people speak Portuguese there?", "Yes."),
        ("Lisbon", "Does it have more than 5 million people?", "No."),
        ("Lisbon", "Is its population between 2 and 5 million?", "Yes."),
        ("Lisbon", "Is it in the southern hemisphere?", "No."),
        ("Lisbon", "Is it in Portugal?", "Yes."),
        ("Lisbon", "Is it in Spain or Portugal?", "Yes."),
        ("Lisbon", "Is it a coastal capital in Asia?", "No."),
        ("Lisbon", "Is it Madrid?", "No."),
        ("Lisbon", "Is it Nagoya?", "No."),  # a city the knowledge base lacks is still a wrong guess
        ("Lisbon", "What food is it known for?", "Sorry, I can only answer yes/no questions about the city."),
        ("Lisbon", "Is it Lisbon?", "Yes! Goal reached."),
        ("Lisbon", "My guess is Lisboa.", "Yes! Goal reached."),
        ("Lisbon", "Is it Lisbon or Porto?", "Please guess one city at a time."),
        ("Sydney", "Is it in the southern hemisphere?", "Yes."),
        ("Sydney", "Has it hosted the Summer Olympics?", "Yes."),
        ("Sydney", "Is it in Australia?", "Yes."),
        ("Denver", "Is it high above sea level?", "Yes."),
        ("Denver", "Is it at high altitude?", "Yes."),
        ("Denver", "Is it in the USA?", "Yes."),
        ("Cairo", "Is it on a river?", "Yes."),
        ("Cairo", "Is it in the Middle East?", "Yes."),
        ("Cairo", "Is it a megacity?", "Yes."),
        ("Reykjavik", "Is it cold?", "Yes."),
        ("Singapore", "Is it in Singapore?", "Yes! Goal reached."),
    ],
)
def test_oracle_answers(game, city, question, reply):
    state = game.reset(Task("guess_my_city", "t", city, "city"), random.Random(0))
    assert game.step(state, question).reply == reply


def test_replies_never_name_the_city_or_its_country(game):
    for task in game.tasks("eval")[:15]:
        city = game.kb.cities[task.env]
        secrets = [city["name"], city["country"], *city["aliases"]]
        for question in game.question_bank:
            reply = game.prompts(game.kb.answer(task.env, question))
            assert not any(s.lower() in reply.lower() for s in secrets), (question, reply)


def test_knowledge_base_and_splits(game):
    assert len(game.kb.cities) >= 100
    train, held_out = game.tasks("train"), game.tasks("eval")
    assert {t.env for t in train}.isdisjoint(t.env for t in held_out)
    assert {t.difficulty for t in train} == {"easy", "medium", "hard"}
    assert all(game.kb.parse(q).predicates for q in game.question_bank)  # the scripted questions are understood


def test_candidates_and_exact_information_gain(game):
    everything = game.candidates([])
    europe = game.candidates([("Is it in Europe?", "Yes.")])
    assert len(everything) == len(game.kb.cities)
    assert europe and all(game.kb.cities[c]["continent"] == "Europe" for c in europe)
    assert game.candidates([("Is it in Europe?", "Yes")]) == europe  # an LLM host's wording reads the same
    gain = exact_information_gain(game.candidates, [], [("Is it in Europe?", "Yes.")])
    assert gain == pytest.approx(1 - math.log2(len(europe)) / math.log2(len(everything)))
    # A question the oracle cannot answer tells nothing; naming the city tells everything.
    assert exact_information_gain(game.candidates, [], [("Is it pretty?", game.prompts("unknown"))]) == 0.0
    assert exact_information_gain(game.candidates, [], [("Is it Lima?", "Yes! Goal reached.")]) == 1.0
