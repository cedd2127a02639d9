"""The README opens with the headline claims across training seeds (docs/results/current/claims.md, quoted word for
word), and no figure of that table can drift from the results page its row links: each figure is on that page, and
each row's verdict follows from its figures."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = ROOT / "docs" / "results" / "current" / "claims.md"
LINK = re.compile(r"\]\((/docs/results/current/[\w.-]+\.md)\)")
FIGURE = re.compile(r"([+−-]?\d+\.\d+) ± (\d+\.\d+)")
AGREEING = re.compile(r"^(\d+)/(\d+) [<>] 0$")


def rows(text: str) -> list[list[str]]:
    """The claims table's rows (header and rule left out), each as its cells."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[2:]]


def plain(text: str) -> str:
    """Text with one minus sign (the pages write both − and -) and no bold."""
    return text.replace("−", "-").replace("**", "")


def on_page(figure: str, page: str) -> bool:
    """``figure`` ("+5.4 ± 2.3", "-0.7 ± 0.8") is on ``page`` as written, its sign included (a + may be left out)."""
    value, sem = FIGURE.fullmatch(plain(figure)).groups()
    sign = "-" if value.startswith("-") else r"\+?"
    pattern = rf"(?<![\d.+-]){sign}{re.escape(value.lstrip('+-'))} ± {re.escape(sem)}(?!\d)"
    return re.search(pattern, plain(page)) is not None


def test_the_readme_opens_with_the_claims_table_word_for_word():
    readme = (ROOT / "README.md").read_text()
    sections = re.findall(r"^## (.+)$", readme, flags=re.M)
    assert sections[0] == "What Curio shows"
    first = readme.split("\n## ")[1]
    table = "\n".join(line for line in CLAIMS.read_text().splitlines() if line.startswith("|"))
    assert f"<!-- quoted from results/current/claims.md -->\n{table}\n<!-- end of quote -->" in first


def test_every_figure_of_the_claims_table_is_on_the_page_its_row_links():
    table = rows(CLAIMS.read_text())
    assert len(table) >= 8
    wrong = []
    for claim, figure, agreeing, _holds, measured in table:
        [link] = LINK.findall(measured)
        page = (ROOT / link.lstrip("/")).read_text()
        assert FIGURE.fullmatch(plain(figure)), figure
        if not on_page(figure, page):
            wrong.append(f"{claim}: {figure} (not in {link})")
        if agreeing not in plain(page):
            wrong.append(f"{claim}: {agreeing} (not in {link})")
    assert not wrong, "claims whose figures their results page does not hold: " + "; ".join(wrong)


def test_each_claims_verdict_follows_from_its_figures():
    """A claim holds when its mean lies two standard errors across seeds from zero and every seed agrees in sign."""
    for claim, figure, agreeing, holds, _ in rows(CLAIMS.read_text()):
        value, sem = (float(x) for x in FIGURE.fullmatch(plain(figure)).groups())
        agree, seeds = (int(x) for x in AGREEING.fullmatch(agreeing).groups())
        beyond = abs(value) >= 2 * sem and agree == seeds and (">" in agreeing) == (value > 0)
        assert holds.startswith("yes") == beyond, (claim, figure, agreeing, holds)
        assert holds.startswith(("yes", "no")), holds


def test_what_does_not_hold_is_in_the_table():
    """The claims that do not hold across seeds stay beside those that do: the default run's RL after DPO, and both
    NetHack claims at 1M env steps."""
    verdicts = {claim: holds for claim, _, _, holds, _ in rows(CLAIMS.read_text())}
    failing = [claim for claim, holds in verdicts.items() if holds.startswith("no")]
    assert any("RL" in c and "default run" in c for c in failing)
    assert any("Motif − extrinsic" in c for c in failing) and any("ONI classification − Motif" in c for c in failing)


@pytest.mark.parametrize(("figure", "page", "found"), [
    ("+5.4 ± 2.3", "RL − DPO **+5.4 ± 2.3 points**", True),
    ("-0.7 ± 0.8", "RL − DPO is -0.7 ± 0.8", True),
    ("-4.1 ± 8.8", "Motif − extrinsic **−4.1 ± 8.8**", True),
    ("+4.1 ± 8.8", "Motif − extrinsic −4.1 ± 8.8", False),  # the sign counts
    ("+5.4 ± 2.3", "+15.4 ± 2.34", False),  # so do the digits either side
])
def test_a_figure_is_found_as_written(figure, page, found):
    assert on_page(figure, page) is found
