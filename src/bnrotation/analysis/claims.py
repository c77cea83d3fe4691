"""``make claims``: every quantitative claim of the article, checked against the parquet results (no torch).

    python -m bnrotation.analysis.claims --results results/reference   # writes results/reference/claims.md

Writes ``<out>/claims.md``: each claim of :data:`.registry.CLAIMS` as a named
check with the published figure, the measured figure (mean ± sample standard
deviation over seeds, with n), the tolerance and why, and a verdict: PASS,
FAIL, or NOT RUN when the runs it needs are missing (:mod:`.claim_kinds` states
the tolerance of each kind). Then the article's table cell by cell
(:data:`.registry.TABLE_CELLS`), the rotational-equilibrium prediction beside
the measured rotation (:mod:`.theory`), and findings on the article's open
questions (:mod:`.findings`). The values come from :mod:`.evidence`, the
markdown from :mod:`.report`; this module only ties them together.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import records
from .claim_kinds import Check, withhold_verdicts
from .evidence import Evidence, collect
from .registry import CLAIMS, TABLE_CELLS
from .report import to_markdown
from .results import ALL_TABLES, Run, add_results_arguments, at_protocol_scale, command_inputs, count

TABLES = ALL_TABLES


def weigh(root: Path, runs: list[Run]) -> tuple[Evidence, list[Check], list[tuple[str, str, Check]]]:
    """The evidence of ``runs``, the named checks (:data:`.registry.CLAIMS`) and the article's table cell by
    cell ((row, column title, check) of :data:`.registry.TABLE_CELLS`). Runs not at the article's protocol
    scale (:func:`.results.at_protocol_scale`) get no PASS or FAIL (:func:`.claim_kinds.withhold_verdicts`).
    ``claims.md`` and the write-up page (:mod:`.webpage`) both render these."""
    ev = collect(root, runs)
    checks = [claim.check(ev) for claim in CLAIMS]
    cells = [(claim.row, claim.claim, claim.check(ev)) for claim in TABLE_CELLS]
    if not at_protocol_scale(runs):
        withhold_verdicts(checks + [c for _, _, c in cells])
    return ev, checks, cells


def build_report(root: Path, runs: list[Run]) -> tuple[str, list[Check]]:
    """The markdown of ``claims.md`` and the named checks (:func:`weigh`)."""
    ev, checks, cells = weigh(root, runs)
    return to_markdown(ev, checks, cells), checks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_results_arguments(p)
    p.add_argument("--out", default=None, help="folder for claims.md (default: the results root read)")
    args = p.parse_args(argv)
    found = command_inputs(args, TABLES)
    if found is None:
        return 2
    root, runs, out = found
    md, checks = build_report(root, runs)
    records.atomic_write_text(out / "claims.md", md)
    for c in checks:
        print(f"{c.verdict:8s} {c.name}", file=sys.stderr)
    print(f"wrote {out / 'claims.md'} from {count(len(runs), 'run')} under {root}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
