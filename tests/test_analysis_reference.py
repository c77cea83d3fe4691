"""The committed outputs are what the analysis gives: ``make table`` and ``make claims`` rerun on the committed
reference runs (``results/reference/runs``) write exactly the committed ``results/reference/`` files.

One regeneration for every assertion (the runs are read and weighed once, about 15 s of CPU): the README's
generated blocks and the claims report's reasons are checked here too, from the same weighing.
Exact text equality: the same parquet files through the same code on this machine; no number from another
machine is compared. The figures are left out: drawing them takes minutes of CPU, even without writing them.
``claims.json`` holds every verdict by id, apart from the wording: a change that only rewords ``claims.md``
leaves it as it is, and a verdict that moves shows as one line of it.
After a deliberate change to the runs or the analysis: ``make table claims RESULTS=results/reference``.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from bnrotation.study.analysis import claims
from bnrotation.study.analysis.results import ALL_TABLES, load_runs
from bnrotation.study.analysis.tables import table

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = Path("results/reference")  # as make names it: the root's name is part of each report's header
TABLE_OUTPUTS = ("table.md", "table.csv", "lag.md", "averaging.md", "averaging.csv", "monitor.md")
CLAIMS_OUTPUTS = ("claims.md", "claims.json")


@dataclass
class Regenerated:
    """What ``make table`` and ``make claims`` write from the reference runs (``out``), and the claims' weighing
    (:func:`bnrotation.study.analysis.claims.weigh`: evidence, checks, table cells)."""

    out: Path
    weighed: tuple


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Regenerated:
    out = tmp_path_factory.mktemp("reference_outputs")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)  # the root's name is part of the reports' header, as make writes it
        runs = load_runs(REFERENCE, tables=ALL_TABLES)
        table.write_tables(REFERENCE, runs, out)
        return Regenerated(out, claims.write_claims(REFERENCE, runs, out))


def diff(name: str, got: str, want: str) -> str:
    return "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), f"committed {name}",
                                        f"regenerated {name}", n=1))[:4000]


@pytest.mark.parametrize("name", [*TABLE_OUTPUTS, *CLAIMS_OUTPUTS])
def test_a_committed_output_is_what_the_analysis_writes_from_the_committed_runs(regenerated, name):
    got, want = (regenerated.out / name).read_text(), (ROOT / REFERENCE / name).read_text()
    assert got == want, diff(name, got, want)


def test_the_committed_verdicts_name_every_check_once(regenerated):
    """``claims.json`` lists every named check and every table cell, each with a verdict ``claims.md`` uses."""
    committed = json.loads((ROOT / REFERENCE / "claims.json").read_text())
    from bnrotation.study.analysis.claims.registry import CLAIMS, TABLE_CELLS
    assert list(committed["checks"]) == [c.name for c in CLAIMS]
    assert list(committed["table_cells"]) == [c.name for c in TABLE_CELLS]
    md = (ROOT / REFERENCE / "claims.md").read_text()
    for name, verdict in committed["checks"].items():
        assert f"### `{name}`" in md and (f"`{name}`: {verdict}" in md or f"*(exploratory)*: {verdict}" in md), name



def test_the_readme_blocks_are_what_make_claims_writes_from_the_reference_runs(regenerated):
    readme = (ROOT / "README.md").read_text()
    blocks = claims.readme_blocks(*regenerated.weighed)
    found = {m["name"]: m["text"] for m in claims.BLOCK.finditer(readme)}
    assert found == blocks  # rerun `make claims RESULTS=results/reference` after a change to the runs or the code
    assert claims.fill_readme(readme, blocks) == readme


def test_every_failing_claim_says_why(regenerated):
    _, checks, _ = regenerated.weighed
    failing = [c for c in checks if c.verdict == "FAIL" and c.section == "article"]
    assert failing and all(c.note.startswith("Why it fails: ") for c in failing)
