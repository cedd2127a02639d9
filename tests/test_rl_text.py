"""ArCHer and Online CHAI (pipeline/rl_text/archer.py, pipeline/rl_text/chai.py): the formulas on hand-computed
numbers, the critic on a toy MDP, batched log-probs under padding, transitions, CHAI's re-ranking and the val split."""

import pytest
import torch
from torch import nn

from pipeline.llm.base import ChatBackend, Generation
from pipeline.params import Params
from pipeline.rl_text.archer import (
    actor_loss,
    advantage,
    critic_step,
    polyak_,
    q_targets,
    transitions,
    utterance_logprobs,
)
from pipeline.text.critic import CriticRerank, DoubleCritic, state_text
from pipeline.text.policies import game_tasks, make_games


def test_q_targets_bootstrap_from_the_target_v_heads_and_stop_at_terminals():
    # r = -1, γ = 0.9; V̄1(s') = -2, V̄2(s') = -3: targets -1 + 0.9·(-2) = -2.8 and -1 + 0.9·(-3) = -3.7.
    # A terminal transition (d = 1) is just its reward, 0 for the winning turn.
    t1, t2 = q_targets(torch.tensor([-1.0, 0.0]), torch.tensor([False, True]), torch.tensor([-2.0, -5.0]),
                       torch.tensor([-3.0, -5.0]), gamma=0.9)
    assert t1.tolist() == pytest.approx([-2.8, 0.0])
    assert t2.tolist() == pytest.approx([-3.7, 0.0])


def test_polyak_moves_the_target_a_tau_fraction_towards_the_online_weights():
    target, online = nn.Linear(1, 1), nn.Linear(1, 1)
    with torch.no_grad():
        target.weight.fill_(1.0), target.bias.fill_(-2.0)
        online.weight.fill_(3.0), online.bias.fill_(2.0)
    polyak_(target, online, tau=0.1)
    assert target.weight.item() == pytest.approx(0.9 * 1 + 0.1 * 3)  # 1.2
    assert target.bias.item() == pytest.approx(0.9 * -2 + 0.1 * 2)  # -1.6
    assert online.weight.item() == 3.0


def test_advantage_takes_both_minima():
    # min(Q1, Q2) = -3, min(V1, V2) = -4: A = 1. Second row: min Q = -2, min V = -1.5: A = -0.5.
    a = advantage(torch.tensor([-2.0, -2.0]), torch.tensor([-3.0, -1.0]), torch.tensor([-4.0, -1.5]),
                  torch.tensor([-2.5, -1.0]))
    assert a.tolist() == pytest.approx([1.0, -0.5])


def test_actor_loss_sign_raises_the_probability_of_a_positive_advantage_utterance():
    logits = torch.zeros(2, requires_grad=True)  # a two-utterance policy, uniform
    logp = torch.log_softmax(logits, 0)
    loss = actor_loss(logp[[0, 1]], torch.tensor([2.0, -1.0]))
    assert loss.item() == pytest.approx(-(2.0 * -0.6931 + -1.0 * -0.6931) / 2, abs=1e-3)  # -mean(logπ·A)
    loss.backward()
    with torch.no_grad():
        after = torch.softmax(logits - 0.5 * logits.grad, 0)
    assert after[0] > 0.5 > after[1]
    # The advantage is a constant: no gradient reaches the critic through the actor loss.
    adv = torch.tensor([1.0], requires_grad=True)
    actor_loss(torch.tensor([-1.0], requires_grad=True), adv).backward()
    assert adv.grad is None


class OneHotEncoder(nn.Module):
    """A text encoder for toy MDPs: each known text is its own one-hot vector."""

    def __init__(self, texts):
        super().__init__()
        self.index = {t: i for i, t in enumerate(texts)}
        self.config = type("Cfg", (), {"hidden_size": len(texts)})()
        self.dummy = nn.Parameter(torch.zeros(1))


class ToyCritic(DoubleCritic):
    def embed(self, texts, max_tokens, keep_end):
        idx = torch.tensor([self.encoder.index[t] for t in texts])
        return nn.functional.one_hot(idx, len(self.encoder.index)).float() + 0 * self.encoder.dummy


def test_critic_learns_the_values_of_a_two_step_chain():
    """s0 --ask--> s1 --ask--> end, reward -1 per turn, γ = 0.9: Q(s1, ask) = V(s1) = -1 and
    Q(s0, ask) = V(s0) = -1 + 0.9·(-1) = -1.9, learnt only through the target critic's bootstrapping."""
    s0 = [{"role": "user", "content": "start"}]
    s1 = s0 + [{"role": "assistant", "content": "ask"}, {"role": "user", "content": "no"}]
    s2 = s1 + [{"role": "assistant", "content": "ask"}, {"role": "user", "content": "end"}]
    enc = OneHotEncoder([state_text(s) for s in (s0, s1, s2)] + ["ask"])
    torch.manual_seed(0)
    critic = ToyCritic(enc, tokenizer=None)
    import copy

    target = copy.deepcopy(critic)
    opt = torch.optim.Adam(critic.parameters(), lr=3e-2)
    batch = [{"state": s0, "action": "ask", "reward": -1.0, "next_state": s1, "done": False},
             {"state": s1, "action": "ask", "reward": -1.0, "next_state": s2, "done": True}]
    for _ in range(150):
        critic_step(critic, target, opt, batch, lambda states: ["ask"] * len(states), gamma=0.9, tau=0.1,
                    grad_clip=1.0)
    q1, q2, v1, v2 = critic([s0, s1], ["ask", "ask"])
    for head in (q1, q2, v1, v2):
        assert head.tolist() == pytest.approx([-1.9, -1.0], abs=0.05)


def test_transitions_of_a_twenty_questions_episode():
    conv = [{"role": "system", "content": "rules"}, {"role": "user", "content": "go"},
            {"role": "assistant", "content": "<Answer>Is it alive?</Answer>"}, {"role": "user", "content": "Yes"},
            {"role": "assistant", "content": "<Answer>cat</Answer>"}, {"role": "user", "content": "Correct"}]
    row = {"group": "twenty_questions", "task_id": "t", "sample": 0, "conversation": conv, "success": True,
           "reward": 1.0}
    t = transitions(row, 3, score_by_turns=True)
    assert [x["reward"] for x in t] == [-1.0, 0.0]  # -1 per turn, 0 on the winning turn
    assert [x["done"] for x in t] == [False, True]
    assert t[0]["state"] == conv[:2] and t[0]["next_state"] == conv[:4] == t[1]["state"]
    assert t[1]["action"] == "<Answer>cat</Answer>" and t[1]["round"] == 3
    lost = transitions({**row, "success": False}, 0, score_by_turns=True)
    assert [x["reward"] for x in lost] == [-1.0, -1.0]
    bandit = transitions({**row, "reward": 7.0}, 0, score_by_turns=False)
    assert [x["reward"] for x in bandit] == [0.0, 7.0]


@pytest.fixture(scope="module")
def tiny_lm():
    from pipeline.models import tiny

    texts = ["Is it an animal?", "Yes", "No", "<Answer>cat</Answer>", "rules of the game", "a much longer message "
             "that makes this conversation longer than the others in the batch"]
    tok = tiny.train_tokenizer(texts * 3, vocab_size=300)
    model = tiny.build_model(tok, n_layer=2, n_embd=32, n_head=2, n_positions=128, seed=0).eval()
    return model, tok


def test_batched_utterance_logprobs_equal_one_at_a_time_under_padding(tiny_lm):
    """Regression for the ArCHer code's right-padding bug: rows of very different lengths score in one padded
    batch exactly as alone, and the sum covers the utterance and its end-of-turn token only."""
    model, tok = tiny_lm
    short = [{"role": "user", "content": "Yes"}]
    long = [{"role": "system", "content": "rules of the game"}, {"role": "user", "content": "a much longer "
            "message that makes this conversation longer than the others in the batch"},
            {"role": "assistant", "content": "<Answer>Is it an animal?</Answer>"}, {"role": "user", "content": "No"}]
    states, actions = [short, long, short], ["<Answer>cat</Answer>", "<Answer>Is it an animal?</Answer>", "No"]
    with torch.no_grad():
        batched = utterance_logprobs(model, tok, states, actions)
        alone = torch.cat([utterance_logprobs(model, tok, [s], [a]) for s, a in zip(states, actions, strict=True)])
        # By hand for the first row: the full sequence's next-token log-probs over the action's positions.
        full = tok.apply_chat_template(short + [{"role": "assistant", "content": actions[0]}], return_dict=False)
        n = len(full) - len(tok.apply_chat_template(short, add_generation_prompt=True, return_dict=False))
        logp = torch.log_softmax(model(torch.tensor([full])).logits[0, :-1], -1)
        by_hand = sum(logp[i - 1, full[i]] for i in range(len(full) - n, len(full)))
    assert batched.tolist() == pytest.approx(alone.tolist(), abs=1e-4)
    assert batched[0].item() == pytest.approx(by_hand.item(), abs=1e-4)
    assert (batched < 0).all()


class FixedPolicy(ChatBackend):
    def __init__(self, texts):
        super().__init__("fixed")
        self.texts = texts

    def generate(self, conversations, sampling):
        return [Generation(text=self.texts[i % len(self.texts)], tokens_out=1) for i in range(len(conversations))]


class QByAction(nn.Module):
    """A stand-in critic: Q is a fixed number per action text."""

    def __init__(self, q):
        super().__init__()
        self.q = q

    def forward(self, states, actions):
        q = torch.tensor([self.q[a] for a in actions])
        return q, q + 1.0, q, q


def test_chai_plays_the_argmax_of_min_q_among_parseable_samples():
    cands = ["<Answer>bad</Answer>", "<Answer>good</Answer>", "no answer tag", "<Answer>ok</Answer>"]
    q = {cands[0]: -5.0, cands[1]: -1.0, cands[2]: 10.0, cands[3]: -3.0}
    chai = CriticRerank(FixedPolicy(cands), QByAction(q), num_samples=4)
    out = chai.generate([[{"role": "user", "content": "go"}]] * 2, sampling=None)
    assert [g.text for g in out] == ["<Answer>good</Answer>"] * 2  # not the unparseable one, despite its Q
    assert out[0].tokens_out == 4  # every sample counts as generated


def test_val_split_is_carved_from_train_deterministically_and_none_leaves_train_unchanged(tmp_path):
    default = Params()
    base = default.model_copy(update={"games": default.games.model_copy(update={"val_fraction": 0.0})})
    game = make_games(base)[0]
    assert game_tasks(base.games, game, "train") == game.tasks("train")
    with pytest.raises(ValueError, match="val_fraction"):
        game_tasks(base.games, game, "val")
    carved = base.model_copy(update={"games": base.games.model_copy(update={"val_fraction": 0.2})})
    train, val = game_tasks(carved.games, game, "train"), game_tasks(carved.games, game, "val")
    assert len(val) == round(0.2 * len(game.tasks("train"))) and not {t.task_id for t in train} & {
        t.task_id for t in val}
    assert sorted(t.task_id for t in train + val) == sorted(t.task_id for t in game.tasks("train"))
    assert val == game_tasks(carved.games, make_games(carved)[0], "val")  # the same tasks every run
    assert not {t.task_id for t in val} & {t.task_id for t in game_tasks(carved.games, game, "eval")}


def test_rl_text_dispatches_on_algorithm_and_drops_the_other_algorithms_outputs(tmp_path, monkeypatch):
    import pipeline.rl_text.archer
    from pipeline.core.stage import StageContext, StageResult, stage_module
    from pipeline.params import load_params

    params = load_params("params.yaml", [f"data_dir={tmp_path}", "rl_text.algorithm=archer"])
    out = params.data_path("rl_text")
    for name in ("rollouts", "rounds", "replay", "state"):
        (out / name).mkdir(parents=True)
    monkeypatch.setattr(pipeline.rl_text.archer, "run",
                        lambda p, ctx: StageResult(metrics={"ran": p.rl_text.algorithm}))
    assert stage_module("rl-text").run(params, StageContext()).metrics == {"ran": "archer"}
    assert sorted(p.name for p in out.iterdir()) == ["replay", "state"]  # filtered_bc's are gone
