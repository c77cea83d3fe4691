"""The committed condition map (results/reference/map, issue 49), committed in batches as its runs finish: its map.md
is what map_report writes from the committed runs, and no folder there is refused. Reads committed files only."""

from __future__ import annotations

from conftest import ROOT

from bnrotation.study.analysis.tables import map_report
from bnrotation.study.condition_map import ROOT as MAP_DIR, runs_in_map

MAP = f"results/reference/{MAP_DIR}"


def test_the_committed_map_md_is_what_map_report_writes_from_the_committed_runs(monkeypatch):
    monkeypatch.chdir(ROOT)
    runs, problems = map_report.load_map_runs(MAP)
    assert not problems and runs
    assert len(runs) <= runs_in_map()
    assert (ROOT / MAP / "map.md").read_text() == map_report.report_text(runs, "results/reference")
    assert (ROOT / MAP / "map.png").is_file() and (ROOT / MAP / "map.pdf").is_file()
