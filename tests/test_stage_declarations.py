"""Each stage declares itself once (``STAGE`` in its module): what it reads, depends on and writes. dvc.yaml, the
stage registry and params.yaml are generated from the declarations and the params schema, and a stage reads
only the params it declares."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import READS_LOG, REPO, judge_sources
from pydantic import BaseModel

from pipeline.core.config import UndeclaredParamError
from pipeline.core.kernels import KERNEL_KEYS
from pipeline.core.registry import STAGES
from pipeline.core.stage import Stage, declaration, execute
from pipeline.generate import declared_stages, generate, render_dvc_yaml
from pipeline.params import Params, load_params


def covered(key: str, declared: list[str]) -> bool:
    """``key`` is a declared key or inside one (``rollout_text.top_p`` is covered by ``rollout_text``)."""
    return any(key == d or key.startswith(d + ".") for d in declared)


def test_generated_files_are_current():
    """dvc.yaml, pipeline/core/registry.py, params.yaml, docs/params.md and docs/metrics.md are what `curio generate`
    writes from the declarations and the params schema (docs/cli.md: tests/test_generated_references.py)."""
    stale = generate(REPO, check=True)
    assert not stale, f"out of date: {', '.join(map(str, stale))}; run `curio generate`"


GENERATED = ("dvc.yaml", "params.yaml", "pipeline/core/registry.py", "docs/params.md", "docs/metrics.md")


def copy_generated(root, names=GENERATED) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text((REPO / name).read_text())


def test_check_names_a_stale_dvc_yaml_and_generate_rewrites_it(tmp_path):
    copy_generated(tmp_path)
    stale = (REPO / "dvc.yaml").read_text().replace("      - stages/annotate_text.py\n", "", 1)  # a dep removed by hand
    (tmp_path / "dvc.yaml").write_text(stale)
    assert generate(tmp_path, check=True) == [tmp_path / "dvc.yaml"]
    assert generate(tmp_path) == [tmp_path / "dvc.yaml"]
    assert (tmp_path / "dvc.yaml").read_text() == (REPO / "dvc.yaml").read_text()
    assert generate(tmp_path, check=True) == []


def test_generate_keeps_the_values_of_params_yaml_unless_asked_for_the_defaults(tmp_path):
    """params.yaml's shape and help come from the schema; its values are the user's baseline until --defaults."""
    from pipeline.params import kept_values

    copy_generated(tmp_path, ("dvc.yaml", "pipeline/core/registry.py", "docs/params.md", "docs/metrics.md"))
    (tmp_path / "params.yaml").write_text("seed: 3\nrollout_text:\n  top_p: 0.9\n")  # hand-written, partial
    assert generate(tmp_path) == [tmp_path / "params.yaml"]
    params = load_params(tmp_path / "params.yaml")
    assert (params.seed, params.rollout_text.top_p) == (3, 0.9)
    assert "min_p: 0.0" in (tmp_path / "params.yaml").read_text()  # every key is listed, with its help
    assert kept_values(params) == ["seed=3 (default 0)", "rollout_text.top_p=0.9 (default 1.0)"]
    generate(tmp_path, defaults=True)
    assert (tmp_path / "params.yaml").read_text() == (REPO / "params.yaml").read_text()


def test_the_params_reference_lists_every_key_with_its_help_and_goes_stale_with_the_schema(tmp_path, monkeypatch):
    """docs/params.md has a row per key of the schema (an LLM role is one row: its fields have their own table),
    with the key's help string; a help string changed in the schema makes `curio generate --check` name the page."""
    from pipeline.generate import render_params_md
    from pipeline.llm.config import LLMConfig
    from pipeline.params import Params

    page = (REPO / "docs" / "params.md").read_text()
    params_part = page[:page.index("\n## An LLM role\n")]  # the LLM role's own table comes last
    rows = dict(re.findall(r"^\| `([\w.]+)` \|[^|]*\| (.*) \|$", params_part, flags=re.M))

    def keys(model, prefix=""):
        for name, field in type(model).model_fields.items():
            value = getattr(model, name)
            section = hasattr(type(value), "model_fields") and not isinstance(value, LLMConfig)
            if not (section and not prefix):  # a top-level section is a heading of its own
                yield f"{prefix}{name}", field
            if section:
                yield from keys(value, f"{prefix}{name}.")
    missing = [k for k, _ in keys(Params()) if k not in rows]
    missing += [name for name in Params.model_fields if f"`{name}." in page and f"\n## {name}\n" not in page]
    assert not missing, f"docs/params.md lacks {missing}"
    assert all(field.description.split(" (")[0].replace("<", "&lt;").replace(">", "&gt;")[:40] in rows[k]
               for k, field in keys(Params()) if field.description and "|" not in field.description)
    copy_generated(tmp_path)
    assert generate(tmp_path, check=True) == []
    monkeypatch.setattr(Params.model_fields["seed"], "description", "the one seed of a run")
    assert tmp_path / "docs" / "params.md" in generate(tmp_path, check=True)
    assert "| `seed` | `0` | the one seed of a run |" in render_params_md(declared_stages())


def test_dvc_yaml_says_what_each_declaration_says():
    stages = declared_stages()
    assert [s.name for s in stages if not s.cmd] == list(STAGES)
    spec = yaml.safe_load(render_dvc_yaml(stages))["stages"]
    for stage in stages:
        entry = spec[stage.name]
        assert entry["cmd"] == stage.command
        assert entry.get("params", []) == stage.params
        deps = entry["deps"]
        assert set(stage.code + stage.data) <= set(deps) and len(deps) == len(set(deps)), stage.name
        outs = [next(iter(o)) if isinstance(o, dict) else o for o in entry["outs"]]
        assert [o.path for o in stage.outs] == outs[: len(stage.outs)], stage.name
        if not stage.cmd:
            assert stage.module.replace(".", "/") + ".py" in deps
            assert f"metrics/stages/{stage.name}.json" in outs  # execute() writes it
    # every declared plot with a title is a plot definition; its file is an out of the stage that declares it
    definitions = {next(iter(next(iter(d.values()))["y"])) for d in yaml.safe_load(render_dvc_yaml(stages))["plots"]
                   if isinstance(d, dict)}
    assert definitions == {p.path for s in stages for p in s.plots if p.title}


def test_every_param_has_a_help_string():
    """As TRL's configs do: every key of params.yaml says what it is (and params.yaml shows it as a comment)."""
    def missing(cls: type[BaseModel], prefix: str = "") -> list[str]:
        out = []
        for name, info in cls.model_fields.items():
            out += [] if info.description else [prefix + name]
            sub = info.annotation
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                out += missing(sub, f"{prefix}{name}.")
        return out

    assert missing(Params) == []


# -- the slice a stage receives ---------------------------------------------------------------------------------
def test_a_stage_gets_only_its_declared_params(tmp_path):
    params = load_params(REPO / "params.yaml", ["rollout_text.min_p=0.1", f"data_dir={tmp_path}"])
    view = declaration("evaluate-text").slice(params)
    assert view.rollout_text.min_p == 0.1 and view.rollout_text.top_p == params.rollout_text.top_p
    assert view.games == params.games and view.data_path("x") == tmp_path / "x"  # shared: where outputs go
    with pytest.raises(UndeclaredParamError, match="evaluate-text reads params key 'rollout_text.temperature'"):
        view.rollout_text.temperature  # noqa: B018 - the read is the test
    with pytest.raises(UndeclaredParamError, match="'bootstrap'"):
        view.bootstrap  # noqa: B018
    # the slice's fields keep the schema's types and help strings
    assert type(view).model_fields["rollout_text"].annotation.model_fields["min_p"].description == (
        Params.model_fields["rollout_text"].annotation.model_fields["min_p"].description)


def test_a_slice_hashes_like_the_whole_params():
    """A stage's params hash (its resume key) is unchanged by running it on its slice: finished parts stay valid."""
    params = load_params(REPO / "params.yaml")
    for stage in declared_stages():
        assert stage.slice(params).section_hash(stage.params) == params.section_hash(stage.params), stage.name


def test_a_declaration_naming_an_unknown_key_fails():
    with pytest.raises(KeyError, match="rollout_text.top_k"):
        Stage("x", params=["rollout_text.top_k"]).params_model  # noqa: B018
    with pytest.raises(KeyError, match="given to every stage"):
        Stage("x", params=["data_dir"]).params_model  # noqa: B018


def test_an_undeclared_read_fails_the_stage_loudly(tmp_path, monkeypatch):
    """Through execute (what DVC and Prefect call), a stage reading a key it does not declare fails with a line
    naming the key, instead of running with a key DVC does not watch."""
    import stages.pairs_nethack as module

    declared = module.STAGE
    monkeypatch.setattr(module, "STAGE", Stage(declared.name, params=["seed"], data=declared.data,
                                               outs=declared.outs, track=declared.track,
                                               needs=lambda view: []))  # its inputs are absent: reads come first
    params = load_params(REPO / "params.yaml", ["tracking.enabled=false", f"data_dir={tmp_path / 'data'}"])
    with pytest.raises(UndeclaredParamError, match="pairs-nethack reads params key 'pairs_nethack'"):
        execute("pairs-nethack", params)


# -- the four bugs of #10 ----------------------------------------------------------------------------------------
def test_evaluate_text_reruns_when_the_sampling_it_uses_changes():
    """evaluate-text samples with rollout_text.top_p / min_p: a change reaches its params hash (its chunks are
    redone) and dvc.yaml (dvc repro reruns it)."""
    stage = declaration("evaluate-text")
    base = load_params(REPO / "params.yaml")
    for override in ("rollout_text.top_p=0.9", "rollout_text.min_p=0.1"):
        changed = load_params(REPO / "params.yaml", [override])
        assert changed.section_hash(stage.params) != base.section_hash(stage.params), override
        assert covered(override.split("=")[0], yaml.safe_load((REPO / "dvc.yaml").read_text())
                       ["stages"]["evaluate-text"]["params"])


def test_annotate_text_depends_on_the_judge_code_and_prompt():
    """Editing the judge's code or its prompt reruns annotate-text under dvc repro (the DAG test edits them)."""
    deps = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["annotate-text"]["deps"]
    sources = judge_sources()
    assert any(s.endswith(".yaml") for s in sources)  # the prompt was read
    assert all(covered(source, deps) for source in sources), (sources, deps)


# -- reads ⊆ declared, on every stage of both tracks ----------------------------------------------------------------
def test_every_stage_reads_what_it_declares_and_nothing_else(trained, chain, nethack_track):
    """Each stage ran on a tiny budget with the whole params wrapped in a recorder (pipeline.core.stage.READS_ENV):
    the text track in `trained`, the NetHack track in `chain` and `nethack_track`. Every key read is declared
    (a key DVC does not watch would not rerun the stage), and every declared key is read."""
    logs = [trained / READS_LOG, *(Path(p.data_dir).parent / READS_LOG for p in (chain, nethack_track))]
    records = [json.loads(line) for path in logs for line in path.read_text().splitlines()]
    assert {r["stage"] for r in records} == set(STAGES)
    for r in records:
        assert r["declared"] == declaration(r["stage"]).params
        undeclared = [k for k in r["reads"] if not covered(k, r["declared"])]
        assert not undeclared, f"{r['stage']} reads {undeclared} but does not declare them"
        unread = [d for d in r["declared"] if not any(covered(k, [d]) or covered(d, [k]) for k in r["reads"])
                  and OTHER_BRANCH.get((r["stage"], d)) is None and d not in KERNEL_KEYS]  # read by execute
        assert not unread, f"{r['stage']} declares {unread} but never reads them"


# Declared keys that only a branch the tiny runs do not take reads (they take the defaults), and that branch.
OTHER_BRANCH = {("pairs-text", key): "pairs_text.strategy=multiturn (samples candidate turns from the policy)"
                for key in ("policy", "rollout_text.temperature", "rollout_text.top_p", "rollout_text.min_p",
                            "rollout_text.max_new_tokens", "rollout_text.max_format_retries",
                            "rollout_text.batch_size", "rollout_text.environment")}
OTHER_BRANCH[("rl-text", "train_policy.lora")] = "rl_text.lora=true (filtered BC clones into LoRA adapters)"
OTHER_BRANCH[("rl-text", "evaluate_text.temperature")] = ("rl_text.algorithm=grpo with games.val_fraction > 0 (its "
                                                          "val rounds; tests/test_grpo.py runs them on the slice)")
OTHER_BRANCH[("rl-text", "eval_seed")] = OTHER_BRANCH[("rl-text", "evaluate_text.temperature")]
OTHER_BRANCH.update({(stage, key): "rl_text.reward=motif (the stage is idle for the other rewards)" for stage, key in [
    ("annotate-utterances", "seed"), ("annotate-utterances", "annotate_utterances"),
    ("annotate-utterances", "policy.free_answers"), ("train-reward-text", "seed"),
    ("train-reward-text", "annotate_utterances.context_messages"), ("train-reward-text", "train_reward_text")]})


def test_the_report_reads_each_stages_params_from_dvc_yaml_without_importing_it(monkeypatch):
    """The report's MLflow links match runs by each stage's params hash. It reads the stage's params from dvc.yaml
    (the same list as the declaration) instead of importing every stage module and its libraries."""
    import subprocess
    import sys

    from pipeline.reporting import report_meta

    monkeypatch.chdir(REPO)
    report_meta._dvc_yaml_stages.cache_clear()
    report_meta.declared_params.cache_clear()
    try:
        for name in STAGES:
            assert report_meta.declared_params(name) == list(declaration(name).params), name
    finally:
        report_meta._dvc_yaml_stages.cache_clear()
        report_meta.declared_params.cache_clear()
    probe = ("import sys; from pipeline.reporting.report_meta import declared_params as d; "
             "print(d('bootstrap'), 'stages.bootstrap' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.split("]")[1].split() == ["False", "False"]
    assert "'bootstrap'" in out
