"""make_backend picks and wires the configured backend; rules, embedding (the real model), vllm's missing environment
(its server: tests/test_vllm_server.py)."""


import numpy as np
import pytest

from pipeline.llm import CachedBackend, EmbeddingBackend, make_backend, make_environment, sampling_from_config
from pipeline.llm.base import Sampling
from pipeline.llm.check import check_role, llm_roles
from pipeline.llm.config import LLMConfig
from pipeline.llm.ledger import Usage
from pipeline.llm.rules import RulesBackend
from pipeline.nethack.annotation import annotate_preferences, label_messages
from pipeline.params import Params


@pytest.fixture(autouse=True)
def _cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("CURIO_CACHE_DIR", str(tmp_path / "cache"))


def test_sampling_from_config():
    cfg = LLMConfig(backend="openai", temperature=0.1, top_p=0.95, max_tokens=300, seed=4)
    assert sampling_from_config(cfg) == Sampling(temperature=0.1, top_p=0.95, max_tokens=300, seed=4)
    assert sampling_from_config(cfg, max_tokens=8).max_tokens == 8


def test_rules_backend_runs_a_registered_program(tmp_path):
    backend = make_backend(LLMConfig(backend="rules", model="echo"), role="environment")
    assert isinstance(backend, CachedBackend) and isinstance(backend.inner, RulesBackend)
    out = backend.generate([[{"role": "user", "content": "ping"}]] * 2, Sampling())
    assert [g.text for g in out] == ["ping", "ping"] and backend.ledger.sent == 1
    assert not (tmp_path / "cache").exists()  # programs are never written to the response cache
    with pytest.raises(KeyError, match="unknown rules program 'oracle2'.*echo"):
        make_backend(LLMConfig(backend="rules", model="oracle2"), role="environment")


def test_environment_rules_means_the_game_program():
    assert make_environment(LLMConfig(backend="rules", model="oracle")) is None


def test_vllm_without_its_environment_is_one_clear_line(monkeypatch, tmp_path):
    from pipeline.core.errors import CurioError

    monkeypatch.setenv("CURIO_VLLM_PYTHON", str(tmp_path / "no-venv" / "bin" / "python"))
    with pytest.raises(CurioError, match=r"no vLLM environment at .*run `make vllm`") as err:
        make_backend(LLMConfig(backend="vllm", model="some/model"), role="judge")
    assert "\n" not in str(err.value) and err.value.exit_code == 2


def test_hf_backend_is_built_from_params(monkeypatch):
    import pipeline.llm.hf as hf

    seen = {}

    class FakeHF(RulesBackend):
        name = "hf"

        def __init__(self, model, device="cpu", batch_size=64):
            super().__init__(lambda c: "ok", model)
            seen.update(model=model, device=device, batch_size=batch_size)

    monkeypatch.setattr(hf, "HFBackend", FakeHF)
    backend = make_backend(LLMConfig(backend="hf", model="data/x", device="cpu", batch_size=8), role="judge")
    assert seen == {"model": "data/x", "device": "cpu", "batch_size": 8}
    assert backend.generate([[{"role": "user", "content": "a"}]], Sampling())[0].text == "ok"


def test_llm_roles_and_rules_check():
    params = Params()
    roles = llm_roles(params)
    assert {"annotate_text.judge", "rollout_text.environment"} <= set(roles)
    assert "game engine" in check_role(params, "judge") and "game engine" in check_role(params, "environment")


# -- embedding (the packaged all-MiniLM-L6-v2, offline) --------------------------------------------------------
@pytest.fixture(scope="module")
def embedder():
    backend = make_backend(LLMConfig(backend="embedding", model=""), role="annotator")
    assert isinstance(backend, EmbeddingBackend)
    return backend


def test_embedding_unit_vectors_and_text_cache(embedder):
    texts = ["You kill the newt!", "You see here a fountain.", "You kill the newt!"]
    before = embedder.ledger.cache_hits
    vectors = embedder.embed(texts)
    assert vectors.shape == (3, 384) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert np.array_equal(vectors[0], vectors[2])
    embedder.embed(texts)
    assert embedder.ledger.cache_hits - before >= 2  # the second call encodes nothing
    sims = embedder.similarity(["You kill the jackal!", "You see here a fountain."], "kill monsters")
    assert sims.shape == (2,) and sims[0] > sims[1]


def test_embedding_annotators(embedder):
    pairs = [("You see here a fountain.", "You kill the jackal!"), ("x", "x")]
    out = annotate_preferences(embedder, pairs, "combat", "default", None)
    assert out[0][0] == "SECOND" and out[0][1].startswith("similarity") and out[1][:2] == ("TIE", "")
    assert out[0].usage == Usage()  # the embedding model: no LLM request
    labels = label_messages(embedder, ["You see here 12 gold pieces.", ""], goal="gold", threshold=0.3)
    assert labels[0][0] == "helpful" and labels[1][:2] == ("unhelpful", "")
    with pytest.raises(ValueError, match="unknown goal"):
        annotate_preferences(embedder, pairs, "speed", "default", None)


def test_embedding_check_role(embedder):
    params = Params.model_validate({"annotate_text": {"judge": {"backend": "embedding"}}})
    assert "dim 384" in check_role(params, "judge")
