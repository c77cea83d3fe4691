"""The committed staleness zoo (results/reference/zoo) and the runs made again with the evaluation path
(results/reference/zoo_eval_path): each zoo.md is what zoo_report writes from its committed runs, and a run made
with evaluation_path=true trained and measured exactly as the zoo's run of the same architecture, optimizer and
seed (the option adds columns and changes nothing else). Reads committed files only."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from conftest import ROOT

from bnrotation.study.analysis.tables import zoo_report

ZOO, EVAL_PATH = "results/reference/zoo", "results/reference/zoo_eval_path"
SECOND_ZOO_DIR = "results/reference/zoo2"  # the second zoo (issue 48): its finished runs, committed as they land


@pytest.mark.parametrize("root", [ZOO, EVAL_PATH, SECOND_ZOO_DIR])
def test_the_committed_zoo_md_is_what_zoo_report_writes_from_the_committed_runs(root, monkeypatch):
    monkeypatch.chdir(ROOT)
    runs, problems = zoo_report.load_zoo_runs(root)
    assert not problems and runs
    assert (ROOT / root / "zoo.md").read_text() == zoo_report.report_text(runs, root)
    assert ("## A layer's own lag" in (ROOT / root / "zoo.md").read_text()) == (root == EVAL_PATH)


def _same(a: pd.Series, b: pd.Series) -> bool:
    return all(x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


def test_a_run_with_the_evaluation_path_is_the_zoos_run_with_more_columns():
    again = sorted((ROOT / EVAL_PATH / "runs").glob("*/seed=*"))
    assert again
    for folder in again:
        first = ROOT / ZOO / "runs" / folder.parent.name / folder.name
        for table in ("checks", "layers"):
            a, b = pd.read_parquet(first / f"{table}.parquet"), pd.read_parquet(folder / f"{table}.parquet")
            measured = [c for c in a.columns if c != "check_seconds"]  # a timing, not a measurement
            assert set(measured) <= set(b.columns), (folder, table)
            for c in measured:
                assert len(a) == len(b) and _same(a[c], b[c]), (folder, table, c)
        layers = pd.read_parquet(folder / "layers.parquet")
        assert layers["eval_path_error_median_sigma"].notna().all(), folder
