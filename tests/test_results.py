"""One source for every current figure: each headline table lives in one file of docs/results/current/, the pages
quote it word for word or link it (and a figure beside the link is in it), no reference page names a commit or a
date, and the results log keeps the history in date order."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CURRENT = DOCS / "results" / "current"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]  # the reference pages (the results log aside)
QUOTE = re.compile(r"<!-- quoted from (results/current/[\w.-]+\.md) -->\n(.*?)\n<!-- end of quote -->", re.S)
LINK = re.compile(r"\]\((?:docs/)?(results/current/[\w.-]+\.md)(?:#[^)]*)?\)")
FIGURE = re.compile(r"(?<![\w.])[+−-]?\d+\.\d+")  # a number with decimals: a measured figure, not a count
HISTORY = re.compile(r"\b[0-9a-f]{7,12}\b|20[0-9]{2}-[0-9]{2}-[0-9]{2}")  # a commit or a date


def quotes(page: Path) -> list[tuple[str, str]]:
    return QUOTE.findall(page.read_text())


def test_every_quote_of_a_current_result_is_that_file_word_for_word():
    found = [(page, source, text) for page in PAGES for source, text in quotes(page)]
    assert {source for _, source, _ in found} >= {"results/current/nethack-learning.md",
                                                  "results/current/smollm2-learn.md"}
    wrong = [f"{page.name} quotes {source}" for page, source, text in found
             if text.strip() not in (DOCS / source).read_text()]
    assert not wrong, "quotes that differ from the file they quote: " + ", ".join(wrong)


def sentences(text: str) -> list[str]:
    """The text's sentences, with quoted blocks, code blocks and table rows left out."""
    text = QUOTE.sub("", re.sub(r"```.*?```", "", text, flags=re.S))
    prose = " ".join(line for line in text.splitlines() if not line.lstrip().startswith(("|", "    ")))
    return re.split(r"(?<=[.:;])\s+(?=[A-Z(`*\[])", prose)


def test_a_figure_beside_a_link_to_a_current_result_is_in_that_result():
    wrong = []
    for page in PAGES:
        for sentence in sentences(page.read_text()):
            for source in set(LINK.findall(sentence)):
                result = (DOCS / source).read_text()
                wrong += [f"{page.name}: {figure} (not in {source})" for figure in FIGURE.findall(sentence)
                          if figure.lstrip("+−-") not in result]
    assert not wrong, "figures that their linked result does not hold: " + ", ".join(wrong)


def test_every_current_result_is_quoted_or_linked_and_lists_its_command():
    linked = {source for page in PAGES for source in LINK.findall(page.read_text())}
    linked |= {source for page in PAGES for source, _ in quotes(page)}
    files = {f"results/current/{p.name}" for p in CURRENT.glob("*.md") if p.name != "README.md"}
    assert files and files <= linked, f"not quoted or linked from a page: {sorted(files - linked)}"
    index = (CURRENT / "README.md").read_text()
    for name in files:
        text = (DOCS / name).read_text()
        assert f"]({Path(name).name})" in index, f"results/current/README.md does not list {name}"
        assert "`" in text.split("\n\n", 2)[1] + text, name  # the command that measured it is named


def test_no_reference_page_names_a_commit_or_a_date():
    """What a page says is what is true now; when it was measured, and on which commit, is the results' and the
    log's. The one date a page may hold is a value: docs/params.md's default of nethack.clock, the date every NetHack
    game sees."""
    found = [f"{page.relative_to(ROOT)}:{n}: {line.strip()[:80]}" for page in PAGES
             for n, line in enumerate(page.read_text().splitlines(), 1) if HISTORY.search(line)
             and not (page.name == "params.md" and line.startswith("| `nethack.clock` |"))]
    assert not found, "history on a reference page: " + "; ".join(found)


def test_the_results_log_is_dated_and_in_date_order():
    log = (DOCS / "results" / "log.md").read_text()
    headings = re.findall(r"^## (.+)$", log, flags=re.M)
    dates = [re.match(r"(20\d\d-\d\d-\d\d)", h) for h in headings]
    assert headings and all(dates), [h for h, d in zip(headings, dates, strict=True) if not d]
    days = [d[1] for d in dates]
    assert days == sorted(days), "the results log's sections are not in date order"
