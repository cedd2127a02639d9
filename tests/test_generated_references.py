"""The reference pages `curio generate` writes besides docs/params.md: docs/cli.md from the `curio` command's own
parser, so a command or option added to pipeline/cli.py shows there (or `curio generate --check` fails), and
docs/metrics.md from the metrics each stage declares, which must be every metric it writes."""

from __future__ import annotations

import json

from conftest import REPO, TEXT_STAGES, curio

from pipeline.cli import parser
from pipeline.core.stage import COMMON_METRIC_HELP, declaration, undeclared_metrics
from pipeline.generate import declared_stages, generate, render_cli_md, render_metrics_md

CLI_PAGE = REPO / "docs" / "cli.md"


def commands(command, name="curio"):
    """(full name, command) of every runnable command under a Click group."""
    ctx = command.context_class(command, info_name=name)
    if not hasattr(command, "list_commands"):
        return [(name, command, ctx)]
    return [found for sub in command.list_commands(ctx)
            for found in commands(command.get_command(ctx, sub), f"{name} {sub}")]


def test_the_cli_reference_is_current():
    """docs/cli.md is what `curio generate` writes from the parser (the other generated files have their test in
    test_stage_declarations.py)."""
    assert CLI_PAGE not in generate(REPO, check=True, cli=parser()), "docs/cli.md is out of date: run `curio generate`"


def test_the_cli_reference_has_every_command_with_each_option_and_its_help():
    page = CLI_PAGE.read_text()
    found = commands(parser())
    assert {"curio sweep seeds", "curio table", "curio preset", "curio choose hparams", "curio compare runs",
            "curio models import-gguf", "curio serve", "curio llm check"} <= {n for n, _, _ in found}
    for name, command, ctx in found:
        section = page.split(f"\n## `{name}`\n", 1)[1].split("\n## ", 1)[0]
        assert f"| [`{name}`](#{name.replace(' ', '-')}) |" in page, name  # in the index too
        for param in command.get_params(ctx):
            if param.name == "help":
                continue
            assert f"`{param.get_help_record(ctx)[0]}`" in section, (name, param.name)
            if getattr(param, "help", None):
                assert " ".join(param.help.split())[:40] in section, (name, param.name)
    assert "Exit codes: 0 done;" in page


def test_a_changed_option_makes_the_cli_reference_stale_and_generate_rewrites_it(tmp_path):
    for name in ("dvc.yaml", "params.yaml", "pipeline/core/registry.py", "docs/params.md", "docs/cli.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((REPO / name).read_text())
    cli = parser()
    stage = cli.get_command(cli.context_class(cli, info_name="curio"), "stage")
    option = next(p for p in stage.params if p.name == "params")
    option.help = "the params file this stage reads"
    assert tmp_path / "docs" / "cli.md" in generate(tmp_path, check=True, cli=cli)
    generate(tmp_path, cli=cli)
    assert "| `-p, --params <str>` | the params file this stage reads [default: params.yaml] |" in (
        tmp_path / "docs" / "cli.md").read_text()
    assert (tmp_path / "docs" / "cli.md").read_text() == render_cli_md(cli)


def test_curio_generate_check_names_a_stale_cli_reference(tmp_path):
    """The command itself: `curio generate --check` in a checkout whose docs/cli.md lacks a command exits 1 naming
    the page."""
    import shutil

    for name in ("dvc.yaml", "params.yaml", "pipeline", "stages", "docs"):
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    page = tmp_path / "docs" / "cli.md"
    page.write_text(page.read_text().replace("\n## `curio sweep seeds`\n", "\n## `curio sweep`\n"))
    res = curio(["generate", "--check"], tmp_path, check=False, env={"PYTHONPATH": str(tmp_path)})
    assert res.returncode == 1 and "docs/cli.md: out of date" in res.stderr, res.stderr


# -- docs/metrics.md ---------------------------------------------------------------------------------------------
METRICS_PAGE = REPO / "docs" / "metrics.md"


def test_every_metric_the_text_stages_write_is_declared(trained):
    """The shared small run's metrics files (every text stage, as `make run` runs them): each key is one its stage
    declares in metric_help (or `seconds`, every stage's). A stage that starts writing a new metric fails here until
    its declaration says what it means."""
    written = {path.stem: json.loads(path.read_text()) for path in (trained / "metrics" / "stages").glob("*.json")}
    assert set(TEXT_STAGES) <= set(written)
    for name, metrics in written.items():
        assert undeclared_metrics(declaration(name), list(metrics)) == [], name


def test_a_metric_key_matches_its_declaration_and_nothing_else():
    evaluate = declaration("evaluate-text")
    assert undeclared_metrics(evaluate, ["seconds", "rl/success_rate", "dpo/twenty_questions@easy/mean_turns",
                                         "base/pass@4", "environment/requests"]) == []
    assert undeclared_metrics(evaluate, ["rl/win_rate", "rl/a/b/success_rate", "success_rate"]) == [
        "rl/win_rate", "rl/a/b/success_rate", "success_rate"]


def test_the_metrics_reference_lists_each_stage_s_metrics_and_goes_stale_with_a_declaration(tmp_path, monkeypatch):
    page = METRICS_PAGE.read_text()
    for stage in declared_stages():
        if stage.cmd:
            continue
        section = page.split(f"\n## {stage.name}\n", 1)[1].split("\n## ", 1)[0]
        for key, text in {**stage.metric_help, **COMMON_METRIC_HELP}.items():
            assert f"| `{key}` | {text[:30]}" in section, (stage.name, key)
    for name in ("dvc.yaml", "params.yaml", "pipeline/core/registry.py", "docs/params.md", "docs/metrics.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((REPO / name).read_text())
    assert tmp_path / "docs" / "metrics.md" not in generate(tmp_path, check=True)
    monkeypatch.setitem(declaration("reflogprobs").metric_help, "pairs", "pairs the reference policy scored")
    assert tmp_path / "docs" / "metrics.md" in generate(tmp_path, check=True)
    assert "| `pairs` | pairs the reference policy scored |" in render_metrics_md(declared_stages())
