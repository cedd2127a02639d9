"""Reference and explanation pages hold no results of their own (Diátaxis: a measurement is a results page's).

A results table lives in one file of docs/results/current/; a reference page (README.md, docs/*.md, docs/howto/)
quotes it word for word between `<!-- quoted from results/current/FILE.md -->` and `<!-- end of quote -->` (which
tests/test_results.py checks against the file) or links it. So:

- a table row outside such a quote whose cells hold a measured figure is refused;
- a measured figure in a page's prose must appear, as written, on a page of docs/results/current/.

A measured figure is what a measurement prints: a value with its standard error (``41.9 ± 2.2``), or a number with
decimals and a unit (``34.7 min``, ``1.42×``, ``45.4 %``, ``6.4 s``, ``2.5 GiB``, ``3.0e-05 nats``). Counts, params'
values and versions (``lr 5e-4``, ``4 GiB``, ``transformers 5.22``) are not measurements and pass; commands in code
blocks are commands, not claims.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CURRENT = DOCS / "results" / "current"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted((DOCS / "howto").glob("*.md"))]
QUOTE = re.compile(r"<!-- quoted from results/current/[\w.-]+\.md -->\n.*?\n<!-- end of quote -->", re.S)
CODE = re.compile(r"```.*?```", re.S)
NUMBER = r"(?<![\w.,])[+−-]?\d[\d,]*"
UNIT = (r"(?:s\.e\.|%|×|x\b|s\b|min\b|ms\b|µs\b|h\b|GB/s|GFLOP/s|MB\b|GB\b|GiB\b|KiB\b|MiB\b|nats\b|turns/s|tokens/s"
        r"|points\b)")
MEASURED = re.compile(rf"{NUMBER}(?:\.\d+)?\s?±\s?\d+(?:\.\d+)?|{NUMBER}\.\d+(?:e[+−-]?\d+)?\s?{UNIT}")


def page_text(page: Path) -> str:
    """A page without its quotes of current results and its fenced code blocks."""
    return CODE.sub("", QUOTE.sub("", page.read_text()))


def table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.lstrip().startswith("|")]


def prose(text: str) -> list[str]:
    """The page's paragraphs, each on one line, without table rows and indented code (commands)."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("|")
             and not (line.startswith("    ") and not line.lstrip().startswith("- "))]
    return [" ".join(block.split()) for block in "\n".join(lines).split("\n\n")]


def name(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def results_tables(page: Path) -> list[str]:
    return [f"{name(page)}: {row.strip()[:90]}" for row in table_rows(page_text(page))
            if MEASURED.search(row)]


def unsourced_figures(page: Path, results: str) -> list[str]:
    return [f"{name(page)}: {figure}" for line in prose(page_text(page))
            for figure in MEASURED.findall(line) if figure.strip() not in results]


def current_results() -> str:
    return "\n".join(p.read_text() for p in sorted(CURRENT.glob("*.md")))


def test_the_measured_figure_pattern_tells_measurements_from_values():
    found = MEASURED.findall("RL 41.9 ± 2.2, the preset 34.7 min (1.42×), 45.4 % held-out, a gap of 3.0e-05 nats; "
                             "lr 5e-4, 4 GiB, transformers 5.22, 16 envs, 0.6 / 0.4 arms")
    assert found == ["41.9 ± 2.2", "34.7 min", "1.42×", "45.4 %", "3.0e-05 nats"]


def test_no_reference_page_carries_a_results_table(tmp_path):
    found = [row for page in PAGES for row in results_tables(page)]
    assert not found, ("results tables outside docs/results/current/ (move the table to a results page and quote or "
                       "link it): " + "; ".join(found))
    # a quoted table passes; the same table unquoted is refused
    table = "| policy | all |\n|---|---|\n| RL | 41.9 ± 2.2 |"
    page = tmp_path / "page.md"
    page.write_text(f"<!-- quoted from results/current/x.md -->\n{table}\n<!-- end of quote -->\n")
    assert results_tables(page) == []
    page.write_text(table + "\n")
    assert len(results_tables(page)) == 1


def test_every_figure_a_reference_page_states_is_on_a_results_page(tmp_path):
    results = current_results()
    found = [figure for page in PAGES for figure in unsourced_figures(page, results)]
    assert not found, ("measured figures on reference pages that no page of docs/results/current/ holds: "
                       + "; ".join(found))
    page = tmp_path / "page.md"
    page.write_text("The preset took 34.7 min, and its RL 99.9 ± 0.1.\n\n    curio table   # 12.5 s\n")
    assert [f.split(": ")[1] for f in unsourced_figures(page, "34.7 min")] == ["99.9 ± 0.1"]


def test_the_trimmed_explanation_pages_stay_under_200_lines():
    """real-models.md, speed.md, vllm.md and recipes.md explain and show how; their measurements are results pages'.
    A page that grows past 200 lines has taken up results or history again."""
    long = {name: n for name in ("real-models.md", "speed.md", "vllm.md", "recipes.md")
            if (n := len((DOCS / name).read_text().splitlines())) >= 200}
    assert not long, f"over 200 lines: {long}"
