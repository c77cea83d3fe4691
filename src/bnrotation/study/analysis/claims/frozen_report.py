"""``frozen.md``: the frozen-backbone runs' table (:func:`.tables.frozen.table_markdown`) with the claim's verdict
under it (:func:`.frozen.judge`; no torch).

    python -m bnrotation.study.analysis.claims.frozen_report --results results/reference/frozen   # writes <results>/frozen.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .... import records
from ....helptext import plain
from ...rows import FROZEN_ROOT, FROZEN_ROWS, FROZEN_SEEDS
from ..results import Run, say_refused
from ..tables.frozen import load_frozen_runs, table_markdown
from .frozen import judge

__all__ = ["report", "main"]


def report(runs: list[Run], root: str | Path) -> str:
    """``frozen.md``: the runs' table (:func:`.tables.frozen.table_markdown`), then the claim's verdict."""
    v = judge(runs)
    verdict = {True: "PASS", False: "FAIL", None: "NOT RUN"}[v.passed]
    return (table_markdown(runs, root) + f"\nClaim `frozen_backbone_batchnorm_follows_new_data`: **{verdict}**. "
            f"{v.measured}. Tolerance: {v.tolerance}." + (f" {v.note}" if v.note else "") + "\n")


def main(argv: list[str] | None = None) -> int:
    """Write ``<results>/frozen.md`` (or ``--out``) from the frozen-backbone runs and print it; exit status 2 with
    one line when the root holds no ``runs/`` or no finished run, 1 when a run was refused (named on stderr)."""
    p = argparse.ArgumentParser(description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=f"results/reference/{FROZEN_ROOT}",
                   help="the frozen-backbone results root, holding runs/<row>/seed=<s>/")
    p.add_argument("--out", default=None, help="where to write frozen.md (default: the results root)")
    args = p.parse_args(argv)
    root = Path(args.results)
    if not (root / "runs").is_dir():
        print(f"error: --results {root}: no runs/ folder (expected <root>/runs/<row>/seed=<s>/ of "
              f"{', '.join(FROZEN_ROWS)})", file=sys.stderr)
        return 2
    runs, problems = load_frozen_runs(root)
    if say_refused(problems, runs, f"{root}: no finished frozen-backbone run"):
        return 2
    text = report(runs, root)
    out = Path(args.out) if args.out else root
    records.atomic_write_text(out / "frozen.md", text)
    print(text)
    missing = [(r, s) for r in FROZEN_ROWS for s in FROZEN_SEEDS if not any(x.row == r and x.seed == s for x in runs)]
    print(f"wrote {out / 'frozen.md'} from {len(runs)} runs; missing: {missing or 'none'}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
