"""Track summaries (``metrics/TRACK_SECTION.json``, what ``dvc metrics show`` prints) and the one-page HTML report.

The layout every stage follows (a new stage fits by doing the same):

- ``metrics/stages/NAME.json``: every number the stage reports (written by ``pipeline.core.stage.execute``),
  git-tracked (``cache: false`` in dvc.yaml), so ``dvc exp show`` / ``dvc exp diff`` of any commit or
  experiment can read it;
- ``metrics/plots/…``: the stage's plot data, git-tracked too, drawn by the top-level ``plots:`` of dvc.yaml
  (``dvc plots show`` / ``dvc plots diff``), which this report reads as well;
- ``HEADLINES`` below: the few numbers of a stage that belong in its track's summary
  ``metrics/TRACK_SECTION.json`` (e.g. ``text_success.json``: ``{"text": {policy: held-out success}}``, read
  by ``dvc exp show`` as columns ``text.base``, ``text.sft``, …), the only files
  dvc.yaml declares as ``metrics``.

``curio report`` (the last stage of dvc.yaml) writes the summaries and ``data/report.html``: headline tables,
learning curves, evaluation bars with standard errors, success by difficulty / category / group and each policy's
paired difference from base (pipeline/reporting/breakdown.py), the NetHack comparison and the LLM ledger, with every
image inlined (no network needed to view it); and beside it ``report_pages/STAGE.html``, one offline page per dataset to
read the rows themselves (pipeline/reporting/viewer.py), linked from the report's dataset table.
"""

from __future__ import annotations

import html
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.artifacts import atomic_write_bytes, atomic_write_json
from pipeline.reporting.report_meta import LEDGER_NOTE, run_section
from pipeline.text.config import POLICIES

# track -> [(stage, metric key pattern with a `name` group, summary section)]; a new stage adds a line here.
HEADLINES: dict[str, list[tuple[str, str, str]]] = {
    "text": [("evaluate-text", r"(?P<name>[\w-]+)/success_rate", "success")],
    "nethack": [("evaluate-nethack", r"(?P<name>[\w-]+)/return", "return")],
}


def stage_metrics(metrics_root: Path) -> dict[str, dict[str, Any]]:
    """Every ``metrics/stages/NAME.json`` present, by stage name."""
    return {f.stem: json.loads(f.read_text()) for f in sorted((metrics_root / "stages").glob("*.json"))}


def in_pipeline_order(names: list[str]) -> list[str]:
    """Policies in the order the pipeline makes them (base, sft, dpo, rl; NetHack's random agent first), any other
    after them in its own order: the metrics files list their keys alphabetically."""
    order = ("random", *POLICIES)
    return sorted(names, key=lambda name: order.index(name) if name in order else len(order))


def summaries(stages: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """``{track: {section: {name: value}}}`` from ``HEADLINES``, names in pipeline order; a track none of whose
    stages ran is left out."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for track, rules in HEADLINES.items():
        for stage, pattern, section in rules:
            for key, value in stages.get(stage, {}).items():
                m = re.fullmatch(pattern, key)
                if m and isinstance(value, int | float):
                    out.setdefault(track, {}).setdefault(section, {})[m["name"]] = round(float(value), 4)
    return {track: {section: {name: values[name] for name in in_pipeline_order(list(values))}
                    for section, values in sections.items()} for track, sections in out.items()}


def write_summaries(metrics_root: Path, stages: dict[str, dict[str, Any]]) -> list[Path]:
    """``metrics/TRACK_SECTION.json`` = ``{track: {policy: value}}`` for every HEADLINES line (``{track: {}}`` for
    one that has not run yet, so the files DVC declares always exist). Small files whose rows share policy-named
    columns keep ``dvc metrics show`` narrow: the file name says what the number is, the column its track."""
    found = summaries(stages)
    written = []
    for track, rules in HEADLINES.items():
        for _, _, section in rules:
            path = metrics_root / f"{track}_{section}.json"
            # nested under the track, so `dvc exp show` / `dvc metrics show` name the column `text.sft`, not `sft`
            atomic_write_json(path, {track: found.get(track, {}).get(section, {})})
            written.append(path)
    return written


# -- plots -------------------------------------------------------------------------------------------------
def plot_definitions(dvc_yaml: Path) -> list[dict[str, Any]]:
    """The top-level ``plots:`` of dvc.yaml as ``{title, file, x, y, template}`` (one per y file), images as
    ``{title, file, image: True}``."""
    spec = yaml.safe_load(dvc_yaml.read_text()).get("plots", []) if dvc_yaml.exists() else []
    out = []
    for item in spec:
        if isinstance(item, str):
            out.append({"title": Path(item).stem, "file": item, "image": True})
            continue
        (title, props), = item.items()
        props = props or {}
        ys = props.get("y") or {}
        for file, field in (ys.items() if isinstance(ys, dict) else [(title, ys)]):
            out.append({"title": props.get("title", title), "file": file, "x": props.get("x"), "y": field,
                        "template": props.get("template", "linear"),
                        # .dvc/plots/variants.json draws one line per `variant` (a NetHack reward variant)
                        "color": "variant" if props.get("template") == "variants" else None})
    return out


def read_plot_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".csv":
        import csv

        with open(path, newline="") as f:
            return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]
    data = json.loads(path.read_text())
    return data if isinstance(data, list) else next(iter(data.values()), [])


def _number(v: str) -> Any:
    try:
        return float(v)
    except (TypeError, ValueError):
        return v


def _svg(fig: Any) -> str:
    """The figure as inline SVG, the same bytes for the same figure: no date in its metadata, and a fixed salt
    for the ids matplotlib derives (clip paths, glyphs), which are otherwise random per process."""
    import matplotlib
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "curio-report"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})

    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog: inline SVG in HTML


def _figure(width: float = 5.2, height: float = 3.2) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height))
    ax.grid(alpha=0.3)
    return fig, ax


def curve_svg(rows: list[dict], x: str, y: str, title: str, color: str | None = None) -> str:
    """A learning curve; one line per value of ``color`` (e.g. the NetHack reward variant) when given."""
    fig, ax = _figure()
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(str(r.get(color, "")) if color else "", []).append(r)
    for name, rs in groups.items():
        pts = [(r[x], r[y]) for r in rs if isinstance(r.get(x), int | float) and isinstance(r.get(y), int | float)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 30 else None, label=name or None)
    if color:
        ax.legend(fontsize=8)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title, fontsize=10)
    return _svg(fig)


def bars_svg(names: list[str], means: list[float], errors: list[float], ylabel: str, title: str) -> str:
    """Bars with ±1 standard error."""
    fig, ax = _figure(max(3.5, 0.9 * len(names) + 1.5))
    ax.bar(names, means, yerr=errors, capsize=4, color="#4c78a8")
    if sum(map(len, names)) > 6 * len(names):  # long names (ONI's variants) would overlap level
        for label in ax.get_xticklabels():
            label.set(rotation=30, horizontalalignment="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    return _svg(fig)


def binomial_se(p: float, n: float) -> float:
    return math.sqrt(p * (1 - p) / n) if n > 0 else 0.0


# -- the page ----------------------------------------------------------------------------------------------
def _table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else html.escape(str(v))

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def ledger_rows(stages: dict[str, dict[str, Any]]) -> list[list[Any]]:
    """One row per LLM role a stage called (its ledger: ``PREFIX_requests``, ``PREFIX_tokens_in`` …)."""
    cols = ("requests", "cache_hits", "sent", "tokens_in", "tokens_out", "latency_p50_s", "failures")
    rows = []
    for stage, metrics in stages.items():
        for key in metrics:
            if key.endswith("requests") and not key.endswith("unique_requests"):
                prefix = key[: -len("requests")]
                if all(f"{prefix}{c}" in metrics for c in ("tokens_in", "tokens_out")):
                    rows.append([stage, prefix.rstrip("_/.-") or "llm", *(metrics.get(prefix + c, "") for c in cols)])
    return rows


def section(title: str, body: str) -> str:
    return f"<section><h2>{html.escape(title)}</h2>{body}</section>"


def render(metrics_root: Path, dvc_yaml: Path, stages: dict[str, dict[str, Any]], title: str,
           episodes: list[dict] | None = None, datasets: list[list[Any]] | None = None, run: str = "",
           sweeps: dict[str, dict[str, Any]] | None = None) -> str:
    """``episodes``: evaluate-text's rows (the deeper tables); ``datasets``: [stage, dataset, rows, page href];
    ``run``: the "Run" section's HTML (:func:`pipeline.reporting.report_meta.run_section`), first; ``sweeps``: the seed
    sweeps' tables (``seeds.json`` of ``curio sweep seeds``, by sweep name), after the headline."""
    parts = [run] if run else []
    heads = summaries(stages)
    for track, sections in heads.items():
        names = list(dict.fromkeys(n for values in sections.values() for n in values))
        parts.append(section(f"Headline: {track} track", _table(
            ["policy", *sections], [[n, *(sections[s].get(n, "") for s in sections)] for n in names])))
    parts += [section(f"Across seeds: the {name} sweep", _seed_tables(summary)) for name, summary in
              (sweeps or {}).items()]
    if datasets:
        parts.append(section("Datasets: read the rows", _dataset_table(datasets)))

    parts += _text_sections(stages, episodes)
    parts += _nethack_sections(stages, metrics_root)
    parts += _curves_section(dvc_yaml)
    ledger = ledger_rows(stages)
    parts.append(section("LLM ledger", _table(
        ["stage", "role", "requests", "cache hits", "sent", "tokens in", "tokens out", "p50 latency (s)", "failures"],
        ledger) + LEDGER_NOTE if ledger else
        "<p>No LLM backend was called (rule-based judge, oracle environment, embedding annotator).</p>"))

    details = "".join(f"<details><summary>{html.escape(s)}</summary>"
                      + _table(["metric", "value"], [[k, v] for k, v in m.items()]) + "</details>"
                      for s, m in stages.items())
    parts.append(section("Every stage's metrics", details or "<p>No stage has run yet.</p>"))
    style = ("body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}"
             "table{border-collapse:collapse;margin:.8em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
             "text-align:right}td:first-child,th:first-child{text-align:left}th{background:#f0f3f7}"
             ".grid{display:flex;flex-wrap:wrap;gap:12px}figure{margin:0}img{max-width:100%}"
             "svg{max-width:100%;height:auto}h2{border-bottom:1px solid #ddd;padding-bottom:4px}"
             ".note{max-width:60em;color:#555;font-size:90%}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>{''.join(parts)}</body></html>\n")


def _text_sections(stages: dict[str, dict[str, Any]], episodes: list[dict] | None) -> list[str]:
    """The text track's sections: held-out evaluation, one level deeper, the DPO policy on its pairs."""
    parts: list[str] = []
    text = stages.get("evaluate-text", {})
    policies = in_pipeline_order([m["name"] for k in text if (m := re.fullmatch(r"(?P<name>[\w-]+)/success_rate", k))])
    if policies:
        means = [float(text[f"{p}/success_rate"]) for p in policies]
        errs = [binomial_se(m, text.get(f"{p}/episodes", 0)) for p, m in zip(policies, means, strict=True)]
        rows = [[p, m, e, text.get(f"{p}/episodes", ""), text.get(f"{p}/mean_turns", "")]
                for p, m, e in zip(policies, means, errs, strict=True)]
        parts.append(section("Text track: held-out evaluation", bars_svg(
            policies, means, errs, "success rate", "held-out success (±1 binomial standard error)")
            + _table(["policy", "success rate", "standard error", "episodes", "mean turns"], rows)))
    if deeper := _deeper_tables(episodes or []):
        parts.append(section("Text track: held-out success, one level deeper", deeper))
    dpo = stages.get("train-dpo", {})
    if "dpo/mean_implicit_margin" in dpo:
        parts.append(section("Text track: the DPO policy on its pairs", _table(
            ["pairs", "mean implicit reward margin", "implicit reward prefers chosen"],
            [[dpo.get("dpo/pairs_scored", ""), dpo["dpo/mean_implicit_margin"], dpo["dpo/implicit_accuracy"]]])
            + "<p class='note'>β·[(log π − log π<sub>ref</sub>)(chosen) − (log π − log π<sub>ref</sub>)(rejected)] of "
              "the trained policy on every pair it trained on (log-probs summed over the assistant tokens, as "
              "reflogprobs sums them; data/train_policy/dpo_margins); the second column is the share of pairs whose "
              "margin is > 0. The pairs page shows each pair's.</p>"))
    return parts


def _nethack_sections(stages: dict[str, dict[str, Any]], metrics_root: Path) -> list[str]:
    """The NetHack track's sections: the agents compared, training return at matched steps, the labeller's cost."""
    parts: list[str] = []
    nh = stages.get("evaluate-nethack", {})
    agents = in_pipeline_order([m["name"] for k in nh if (m := re.fullmatch(r"(?P<name>[\w-]+)/return", k))])
    if agents:
        cols = ["return", "score", "score_median", "depth", "xlvl", "progression", "length", "success"]
        svg = bars_svg(agents, [nh[f"{a}/return"] for a in agents], [nh.get(f"{a}/return_sem", 0.0) for a in agents],
                       "episode return", "NetHack evaluation (±1 standard error)")
        bases = [b for b in ("random", "extrinsic", "motif") if b in agents]
        rows = [[a, *(f"{nh.get(f'{a}/{c}', float('nan')):.3g} ± {nh.get(f'{a}/{c}_sem', 0.0):.2g}" for c in cols),
                 *((f"{nh[f'{a}/return_vs_{b}']:+.3g} ± {nh.get(f'{a}/return_vs_{b}_sem', 0.0):.2g}"
                    if f"{a}/return_vs_{b}" in nh else "—") for b in bases),
                 nh.get(f"{a}/episodes", "")] for a in agents]
        header = ["agent", "return", "score", "median score", "depth", "experience level",
                  "progression (BALROG, 0-100)", "length", "success"]
        parts.append(section("NetHack track: agents compared", svg + _table(
            [*header, *(f"return − {b} (same seeds)" for b in bases), "episodes"], rows)
            + "<p class='note'>Progression: BALROG's measure (Paglieri et al. 2024), the share of human games that "
              "reached the episode's deepest dungeon level or highest experience level and went on to ascend, in "
              "percent (pipeline/nethack/progression.py).</p>"))

    curve = metrics_root / "plots" / "rl-nethack.json"
    if matched := matched_steps(read_plot_rows(curve) if curve.exists() else []):
        steps, table = matched
        parts.append(section("NetHack track: training return at matched env steps", _table(
            ["agent", *(f"{s:,} steps" for s in steps)], table)
            + "<p class='note'>Each agent's mean training return (task reward, its recent episodes) at the same env "
              "steps, read off its learning curve (metrics/plots/rl-nethack.json) by linear interpolation between "
              "the nearest points; blank outside its curve (a curve starts once episodes have finished and gets a "
              "point every summary interval, so a short run's may end before its last env steps).</p>"))
    if oni := labeller_rows(stages.get("rl-nethack", {})):
        parts.append(section("NetHack track: the online labeller's cost", _table(
            ["agent", "messages labelled", "still queued", "labels / s", "helpful share", "held-out accuracy",
             "LLM requests sent", "LLM failures", "labeller CPU s", "training s"], oni)
            + "<p class='note'>ONI's annotator over the whole training run of each online agent (rl-nethack's "
              "metrics; its progress over env steps is in metrics/plots/rl-nethack-oni/). Still queued: messages "
              "the agent had seen and the labeller had not labelled when training ended. Labeller CPU s: the "
              "annotator process's CPU time (labelling, the reward model's updates), summed over its restarts; "
              "training s: the agent's wall time since its last start.</p>"))
    return parts


def _curves_section(dvc_yaml: Path) -> list[str]:
    """Every learning curve dvc.yaml's plots declare, drawn from the files present."""
    curves = []
    for d in plot_definitions(dvc_yaml):
        path = dvc_yaml.parent / d["file"]
        if d.get("image") or not path.exists() or d.get("template", "linear").startswith("bar"):
            continue
        rows = read_plot_rows(path)
        if rows:
            curves.append(f"<figure>{curve_svg(rows, d['x'], d['y'], d['title'], d.get('color'))}</figure>")
    if curves:
        return [section("Learning curves", "<div class='grid'>" + "".join(curves) + "</div>")]
    return []


def matched_steps(rows: list[dict], points: int = 4) -> tuple[list[int], list[list[Any]]] | None:
    """Each variant's training return at ``points`` env-step marks shared by all (¼, ½, ¾ and all of the longest
    curve), linearly interpolated along its curve; None without a curve."""
    curves: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if isinstance(r.get("env_steps"), int | float) and isinstance(r.get("return"), int | float):
            curves.setdefault(str(r.get("variant", "")), []).append((float(r["env_steps"]), float(r["return"])))
    if not curves:
        return None
    end = max(x for pts in curves.values() for x, _ in pts)
    def nice(x: float) -> int:  # three significant digits
        return int(round(x, 2 - int(math.floor(math.log10(x))))) if x >= 1 else int(x)

    marks = [nice(end * (i + 1) / points) or int(end) for i in range(points)]

    def at(pts: list[tuple[float, float]], x: float) -> str:
        pts = sorted(pts)
        if x > pts[-1][0] * 1.01 or x < pts[0][0]:  # not reached (1 %: the last point of a finished run)
            return ""
        for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
            if x0 <= x <= x1:
                return f"{y0 + (y1 - y0) * ((x - x0) / (x1 - x0) if x1 > x0 else 0):.3g}"
        return f"{pts[-1][1]:.3g}"

    return marks, [[name, *(at(pts, m) for m in marks)] for name, pts in curves.items()]


def labeller_rows(metrics: dict[str, Any]) -> list[list[Any]]:
    """[agent, labels, still queued, labels/s, helpful share, held-out accuracy, LLM sent, LLM failures,
    labeller CPU s, training s] of each online agent."""
    agents = [m["name"] for k in metrics if (m := re.fullmatch(r"(?P<name>[\w-]+)/oni_labels", k))]
    keys = ("labels", "pending", "labels_per_s", "helpful_share", "heldout_accuracy", "llm_sent", "llm_failures",
            "cpu_s", "seconds")
    return [[a, *(metrics.get(f"{a}/oni_{k}", "") for k in keys)] for a in agents]


def _dataset_table(datasets: list[list[Any]]) -> str:
    """[stage, dataset, rows, href] rows, the page's link beside each dataset."""
    body = "".join(f"<tr><td>{html.escape(s)}</td><td><code>{html.escape(d)}</code></td><td>{n}</td>"
                   f"<td><a href='{html.escape(href)}'>open the rows</a></td></tr>" for s, d, n, href in datasets)
    return ("<p>One offline page per dataset (no server, nothing fetched): filter, read transcripts, pairs, "
            "annotations, replay NetHack episodes.</p><table><thead><tr><th>stage</th><th>dataset</th><th>rows</th>"
            f"<th>page</th></tr></thead><tbody>{body}</tbody></table>")


def _deeper_tables(episodes: list[dict]) -> str:
    from pipeline.reporting.breakdown import held_out, paired_rows, success_by

    rows = held_out(episodes)
    out = []
    for column in ("difficulty", "category", "group"):
        values, policies, cells = success_by(rows, column)
        if not values:
            continue
        table = [[v, *(f"{cells[(v, p)][0]:.3f} ± {cells[(v, p)][1]:.3f} (n={cells[(v, p)][2]})"
                       if (v, p) in cells else "" for p in policies)] for v in values]
        out.append(f"<h3>Success by {column}</h3>" + _table([column, *policies], table))
    paired = paired_rows(rows)
    if paired:
        out.append("<h3>Each policy against base on the same tasks</h3><p>d̄ = mean over the T held-out tasks both "
                   "played of (policy's mean success − base's) on that task; SE = sqrt(Σ(d<sub>t</sub> − d̄)² / "
                   "(T(T−1))) (pipeline/reporting/breakdown.py).</p>"
                   + _table(["policy", "paired difference d̄", "standard error", "tasks T", "d̄ / SE"], paired))
    return "".join(out)


def _seed_tables(summary: dict[str, Any]) -> str:
    """A sweep's tables from its ``seeds.json`` (pipeline/reporting/seeds.py's ``seed_summary``), as the text tables lay
    them out (``table_cells``)."""
    from pipeline.reporting.seeds import Lag, Line, lag_cells, table_cells

    seeds = [r["seed"] for r in summary["runs"]]
    body = ""
    for title, lines, scale, paired in (
            ("held-out success, %", summary["text"]["policies"], 100, False),
            ("paired over the same tasks, points", summary["text"]["comparisons"], 100, True),
            ("NetHack mean return", summary["nethack"]["agents"], 1, False),
            ("NetHack, paired over the same games", summary["nethack"]["comparisons"], 1, True)):
        if lines:
            body += _table(*table_cells(title, [Line(x["label"], x["values"], x["eval_se"]) for x in lines], seeds,
                                        scale, paired))
    if lags := summary["nethack"].get("labellers"):
        body += _table(*lag_cells([Lag(x["agent"], x["pending"], x["seen"]) for x in lags], seeds))
    spent = summary["cost"]
    ledger = spent["ledger"]
    body += (f"<p class='note'>Cost: {spent['total_seconds'] / 60:.1f} min of stages in all; the LLM ledger over "
             f"every stage and seed: {ledger['requests']} requests, {ledger['sent']} sent, {ledger['tokens_in']} "
             f"tokens in, {ledger['tokens_out']} tokens out. Written by <code>curio sweep seeds</code> / "
             "<code>curio table --seeds</code>.</p>")
    return body


def seed_sweeps(root: Path) -> dict[str, dict[str, Any]]:
    """The seed sweeps' tables written under ``root`` (``data/seeds/NAME/seeds.json``), by name."""
    found = {}
    for path in sorted(root.glob("*/seeds.json")):
        try:
            found[path.parent.name] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
    return found


def _evaluation_rows(params: Any) -> list[dict]:
    from pipeline.core.artifacts import read_manifest, read_table

    path = params.data_path("evaluate_text")
    if not (read_manifest(path) or {}).get("complete"):
        return []
    cols = ["group", "task_id", "category", "difficulty", "split", "policy", "success"]
    return read_table(path, cols).to_pylist()


def write_report(params: Any, dvc_yaml: Path = Path("dvc.yaml"), out: Path | None = None) -> Path:
    """Write the track summaries, the HTML report and its dataset pages (``report_pages/`` beside it); returns the
    report's path."""
    from pipeline.reporting.viewer import PAGES_DIR, write_pages

    root = params.metrics_path()
    stages = stage_metrics(root)
    write_summaries(root, stages)
    out = out or params.data_path("report.html")
    pages = write_pages(params.data_path(), out.parent / PAGES_DIR, params, report=out.name)
    datasets = [[stage, str(ds.relative_to(params.data_path())), rows, f"{PAGES_DIR}/{page.name}"]
                for stage, (page, ds, rows) in pages.items()]
    atomic_write_bytes(out, render(root, dvc_yaml, stages, f"Curio run report ({params.tracking.experiment})",
                                   episodes=_evaluation_rows(params), datasets=datasets,
                                   run=run_section(params),
                                   sweeps=seed_sweeps(params.data_path("seeds"))).encode())
    return out
