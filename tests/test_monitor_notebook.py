"""notebooks/monitor_your_model.py: the monitor attached to a network and a loop of its own, run at its test size."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MONITOR_NOTEBOOK = "monitor_your_model.py"  # it trains a model (torch): not among the results notebooks
NOTEBOOK = ROOT / "notebooks" / MONITOR_NOTEBOOK
# A summary line: the warm-up's words while it holds the verdict back, then the modes, rotation (from the second
# call on), the lag and E.
SUMMARY = re.compile(r"^step +(\d+)  (?:UNDETERMINED \(.*?\) \| )?(?:warming up, \d+ steps? left(?:; the rule would fire|; UNDETERMINED \(.*?\))? \| )?(STALE )?"
                     r"train ([\d.]+)% / eval ([\d.]+)%(?: \| rotation [\d.]+°/100 steps)? \| "
                     r"lag median ([\d.]+)σ in \S+, max [\d.]+σ(?: \| E median [\d.]+σ in \S+)?$", re.M)


def test_five_marked_lines_attach_the_monitor():
    import jupytext
    assert len(jupytext.read(NOTEBOOK).cells) > 5  # a percent-format notebook, not a bare script
    marked = [line.strip() for line in NOTEBOOK.read_text().splitlines() if line.rstrip().endswith("# monitor")]
    assert len(marked) == 5, marked
    assert marked[0] == "from bnrotation.monitor import StalenessMonitor  # monitor"


@pytest.mark.slow
def test_the_notebook_runs_at_test_size_and_re_estimation_closes_the_gap(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), BNROTATION_NOTEBOOK_SCALE="test",
               BNROTATION_NOTEBOOK_OUT=str(tmp_path), MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(NOTEBOOK)], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    calls = SUMMARY.findall(out)
    assert len(calls) >= 11 and [int(c[0]) for c in calls[:3]] == [0, 30, 60]  # every 30 steps from step 0
    late = [c for c in calls if int(c[0]) >= 150]
    assert max(float(c[2]) - float(c[3]) for c in late) > 20  # once trained, a gap of over 20 points on the probe
    before, after = map(float, re.search(r"mode gap on the probe: (-?[\d.]+) before, (-?[\d.]+) after", out).groups())
    assert before >= 0.05 and after < 0.05 and after < before
    held = re.search(r"evaluation mode ([\d.]+)% before; evaluation mode ([\d.]+)% after re-estimation", out)
    assert float(held.group(2)) > float(held.group(1)) + 10
    assert "StaleStatisticsWarning" in done.stderr and f"{MONITOR_NOTEBOOK}:" in done.stderr  # warned, at its line
    assert re.search(r"Thresholds\(mode_gap=0.05, lag_sigma=0.25(?:, eval_error_sigma=[\d.]+)?\): would warn at \d+ of \d+ calls", out)
    assert (tmp_path / "monitor_your_model.png").stat().st_size > 10_000
