"""Issue 17's analysis on synthetic results with known answers: every seed found and n stated; no torch."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bnrotation import article, records
from bnrotation.analysis import claims, evidence, findings, registry, table
from bnrotation.analysis.results import load_runs
from bnrotation.rows import ROWS

from test_analysis import replication, write_replication, write_run  # noqa: F401 (replication: a fixture)
from test_dense import dense_table


def _load(root: Path):
    return load_runs(root, tables=claims.TABLES)


def _checks(root: Path) -> tuple[str, dict]:
    md, checks = claims.build_report(root, _load(root))
    return md, {c.name: c for c in checks}


def add_dense_seeds(root: Path, row: str, seeds, *, r: float = 0.0, s: float = 0.0, **run) -> None:
    """Runs of ``row`` at ``seeds`` (the published figures, as :func:`write_replication` makes them) with a dense
    table whose middle-layer fresh means drift at r σ per step (±2% across seeds) and wander with step s."""
    pub = ROWS[row].published
    for seed in seeds:
        f = 1 + 0.02 * (seed - seeds[len(seeds) // 2])
        write_run(root, row, seed, rotation=pub.rotation_deg_per_100, norm_growth=pub.norm_growth,
                  acc_eval=pub.acc_eval_mode, **run)
        records.write_table(dense_table(r=r * f, s=s, seed=seed, channels=32).assign(row=row, seed=seed),
                            records.run_dir(root, row, seed) / "dense.parquet", "dense")


# ----------------------------------------------------------------------------- every seed found, n stated
def test_the_seeds_column_names_the_seeds_and_expects_those_the_rows_sweeps_run(tmp_path):
    """sgd at seeds 0-9 is the default sweep's 0-2 and the ten-seed set's 3-9: 10 of 10, not "10 of 3"; adam at
    0-4 is missing 5-9; adam_lr3e-4 is in no ten-seed set, so 0-2 is all of it."""
    for row, seeds in (("sgd", range(10)), ("adam", range(5)), ("adam_lr3e-4", range(3))):
        for seed in seeds:
            write_run(tmp_path, row, seed, rotation=1.0, norm_growth=1.1, acc_eval=0.95)
    lines = table.build_table(_load(tmp_path)).set_index("row")
    assert lines.loc["sgd", "seeds_expected"] == 10 and lines.loc["sgd", "seeds_missing"] == ""
    assert lines.loc["adam", "seeds_missing"] == "5,6,7,8,9"
    md = table.to_markdown(table.build_table(_load(tmp_path)), tmp_path)
    assert "| SGD, lr 0.05, momentum 0.9 (`sgd`) | 0–9 (10) |" in md
    assert "| Adam, lr 3e-3 (`adam`) | 0–4 (5; not run: 5–9) |" in md
    assert "| Adam, lr 3e-4 (`adam_lr3e-4`) | 0–2 (3) |" in md and "of 3" not in md
    forced = table.build_table(_load(tmp_path), seeds_expected=3).set_index("row")  # --seeds 3
    assert forced.loc["adam", "seeds_missing"] == "" and forced.loc["sgd", "seeds_expected"] == 3
    assert "Seeds per row: `sgd` 0–9, `adam_lr3e-4` 0–2, `adam` 0–4." in claims.build_report(tmp_path, _load(tmp_path))[0]


def test_every_check_with_a_verdict_states_n_per_row(replication):
    _, checks = _checks(replication)
    for c in checks.values():
        if c.verdict != "NOT RUN":
            assert re.search(r"n = \d+ seeds?|n per row: |on the seeds both rows ran", c.measured), (c.name, c.measured)
