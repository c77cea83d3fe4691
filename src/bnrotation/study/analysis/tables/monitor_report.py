"""``results/monitor.md``: how the staleness monitor's warning rule classifies the reference runs' checks (no torch).

:class:`bnrotation.monitor.StalenessMonitor` warns when two signals cross their thresholds
(:class:`bnrotation.monitor.Thresholds`) together: the mode gap (training- minus evaluation-mode accuracy)
is at least ``mode_gap`` and the worst layer's median |running-mean lag| is at least ``lag_sigma``. Here that
rule is applied to the suite's own runs at every check that is also a log step (at full scale every 100 steps
from step 2,000 to 6,000):

* mode gap: ``acc_train_mode - acc_eval_mode`` of the ``checks`` table, on the held-out set
  (``scale.heldout_size`` samples, 4,000 at full scale), as a fraction;
* lag: over the BatchNorm layers, the largest median over channels of ``|lag_sigma|`` of the ``channels``
  table at the same step, in σ: the monitor's ``lag_median_abs_sigma``, measured by the monitor itself on the
  probe set (``task.probe_size`` samples);
* a check fails when its evaluation-mode accuracy is below :data:`bnrotation.study.article.FAIL_BELOW` (90%), the
  table's "Checks below 90%".

This is the rule on the lag alone, scored against a truth close to its own mode gap. The rule's thresholds are
now chosen against an intervention (re-estimation recovers accuracy) and read E as well:
:mod:`bnrotation.study.analysis.tables.calibration` (``make calibrate``, ``calibration.md``).

:func:`threshold_table` gives, for the default thresholds and a grid around them, the share of failing checks
the rule warns at (true-positive rate) and of passing checks (false-positive rate), per row (seeds pooled)
and over all rows, with the counts. Runs without running statistics (GroupNorm, LayerNorm rows) log no lag:
the monitor does not attach to them, so they are listed, not classified. Diverged runs are left out, as from
every mean of the table. ``make table`` writes the report (:func:`write_monitor`).

The monitor measures its mode gap on its probe batch, not on a held-out set; the report says what that
changes (:func:`to_markdown`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from .... import records
from ...article import FAIL_BELOW
from ...rows import ROWS, row_order
from ....staleness import Thresholds
from ..measures.metrics import in_window
from ..formatting import schema_versions
from ..results import Run

# monitor.Thresholds' defaults (bnrotation.staleness, torch-free); tests/test_monitoring.py checks that rule_fires
# decides as Thresholds.crossed does on the lag alone, the rule's signal when this report was written.
DEFAULT_MODE_GAP = Thresholds().mode_gap  # fraction
DEFAULT_LAG_SIGMA = Thresholds().lag_sigma  # σ
# The grid around the defaults; 0 is "that signal alone" (the other one decides).
MODE_GAPS = (0.0, 0.01, 0.02, 0.05, 0.10)
LAG_SIGMAS = (0.0, 0.1, 0.25, 0.5, 1.0)
ALL = "all"  # the ``row`` of the lines over every row
SIGNAL_COLUMNS = ("row", "seed", "step", "acc_train_mode", "acc_eval_mode", "mode_gap", "lag_sigma", "lag_layer",
                  "failing")


def rule_fires(mode_gap, lag_sigma, gap_threshold: float, lag_threshold: float):
    """The monitor's rule: ``mode_gap >= gap_threshold`` and ``lag_sigma >= lag_threshold``. NaN never fires.

    Args:
        mode_gap: fraction(s); lag_sigma: σ; scalars or arrays of one shape.

    Returns:
        A bool, or a bool array of the inputs' shape.
    """
    # the library's rule itself (Thresholds.warns), E left out: one place for "at or above" and for NaN
    return Thresholds(gap_threshold, lag_threshold, math.inf).warns(mode_gap, lag_sigma, math.nan)


def check_signals(run: Run) -> pd.DataFrame:
    """One run's two signals at each check inside its check window that is also a log step.

    Returns:
        One line per such check with a finite lag: ``row``, ``seed``, ``step``, ``acc_train_mode``,
        ``acc_eval_mode`` (fractions, held-out set), ``mode_gap`` (their difference), ``lag_sigma`` (largest
        over norm layers of the median over channels of |lag|, σ), ``lag_layer`` (that norm layer),
        ``failing`` (``acc_eval_mode < FAIL_BELOW``). Empty for a run without running statistics.
    """
    checks = in_window(run, run.tables["checks"])
    ch = run.tables["channels"][["step", "norm_layer", "lag_sigma"]]
    ch = ch[np.isfinite(ch["lag_sigma"])]
    if ch.empty or checks.empty:
        return pd.DataFrame(columns=SIGNAL_COLUMNS)
    per_layer = ch.assign(abs_lag=ch["lag_sigma"].abs()).groupby(["step", "norm_layer"])["abs_lag"].median()
    per_layer = per_layer.reset_index().sort_values(["step", "abs_lag", "norm_layer"], ascending=[True, False, True])
    worst = per_layer.drop_duplicates("step").rename(columns={"abs_lag": "lag_sigma", "norm_layer": "lag_layer"})
    out = checks[["step", "acc_train_mode", "acc_eval_mode"]].merge(worst, on="step", how="inner")
    out = out.assign(row=run.row, seed=run.seed, mode_gap=out["acc_train_mode"] - out["acc_eval_mode"],
                     failing=out["acc_eval_mode"] < FAIL_BELOW)
    return out[list(SIGNAL_COLUMNS)].sort_values("step", ignore_index=True)


def classify(signals: pd.DataFrame, gap_threshold: float, lag_threshold: float) -> dict:
    """The rule's outcome over the checks in ``signals`` (:func:`check_signals` lines).

    Returns:
        ``failing`` and ``passing`` (check counts), ``caught`` (failing checks it warns at) and ``tpr``
        (``caught / failing``), ``false_alarms`` (passing checks it warns at) and ``fpr``; a rate is NaN
        when its count is 0.
    """
    fires = rule_fires(signals["mode_gap"].to_numpy(float), signals["lag_sigma"].to_numpy(float),
                       gap_threshold, lag_threshold)
    failing = signals["failing"].to_numpy(bool)
    n_fail, n_pass = int(failing.sum()), int((~failing).sum())
    caught, false_alarms = int((fires & failing).sum()), int((fires & ~failing).sum())
    return {"failing": n_fail, "caught": caught, "tpr": caught / n_fail if n_fail else math.nan,
            "passing": n_pass, "false_alarms": false_alarms, "fpr": false_alarms / n_pass if n_pass else math.nan}


def all_signals(runs: list[Run]) -> tuple[pd.DataFrame, list[str]]:
    """:func:`check_signals` of every run that did not diverge, stacked; and the ``row seed=<s>`` of the runs
    left out for having no lag (no running statistics)."""
    frames, without = [], []
    for r in sorted(runs, key=lambda r: (row_order(r.row), r.seed)):
        if r.diverged:
            continue
        s = check_signals(r)
        if s.empty:
            without.append(f"{r.row} seed={r.seed}")
        else:
            frames.append(s)
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=SIGNAL_COLUMNS)), without


def threshold_table(runs: list[Run], mode_gaps: Sequence[float] = MODE_GAPS,
                    lag_sigmas: Sequence[float] = LAG_SIGMAS) -> pd.DataFrame:
    """The rule's true- and false-positive rates for every pair of thresholds, per row and over all rows.

    Args:
        mode_gaps: gap thresholds (fractions); lag_sigmas: lag thresholds (σ).

    Returns:
        One line per (``mode_gap``, ``lag_sigma``, ``row``), ``row`` = :data:`ALL` for every row together,
        with ``seeds`` (the row's seeds, comma-separated) and the columns of :func:`classify`. Empty when no
        run logged a lag.
    """
    return grid(all_signals(runs)[0], mode_gaps, lag_sigmas)


def grid(signals: pd.DataFrame, mode_gaps: Sequence[float] = MODE_GAPS,
         lag_sigmas: Sequence[float] = LAG_SIGMAS) -> pd.DataFrame:
    """:func:`threshold_table` from the stacked :func:`check_signals` lines."""
    lines = []
    if signals.empty:
        return pd.DataFrame(lines)
    groups = [(row, g) for row, g in signals.groupby("row", sort=False)] + [(ALL, signals)]
    seeds = {row: ",".join(str(s) for s in sorted(g["seed"].unique())) for row, g in groups}
    for gap in mode_gaps:
        for lag in lag_sigmas:
            for row, g in groups:
                lines.append({"mode_gap": gap, "lag_sigma": lag, "row": row, "seeds": seeds[row],
                              **classify(g, gap, lag)})
    return pd.DataFrame(lines)


# ----------------------------------------------------------------------------- the report
def _rate(count: int, n: int) -> str:
    return f"{count}/{n} ({100 * count / n:.0f}%)" if n else "–"


def _quartiles(values: pd.Series, fmt: str) -> str:
    if values.empty:
        return "–"
    q = values.astype(float).quantile([0.25, 0.5, 0.75]).to_numpy()
    return f"{q[1]:{fmt}} ({q[0]:{fmt}} to {q[2]:{fmt}})"


def _label(row: str) -> str:
    return f"{ROWS[row].label} (`{row}`)" if row in ROWS else f"`{row}`"


def _sizes(runs: list[Run], section: str, key: str) -> str:
    sizes = sorted({int(r.config.get(section, {}).get(key, 0)) for r in runs if not r.diverged})
    return " or ".join(f"{s:,}" for s in sizes) if sizes else "?"


def to_markdown(table: pd.DataFrame, signals: pd.DataFrame, without: list[str], runs: list[Run], root: Path,
                gap: float = DEFAULT_MODE_GAP, lag: float = DEFAULT_LAG_SIGMA) -> str:
    """``monitor.md``: the default thresholds per row, the grid over all rows, and the two signals' quartiles
    at failing and passing checks."""
    heldout, probe = _sizes(runs, "scale", "heldout_size"), _sizes(runs, "task", "probe_size")
    schema = schema_versions(r.info.get("schema_version") for r in runs)
    out = ["# The monitor's warning rule on these runs\n",
           f"Rebuilt by `make table` from the runs under `{root}` ({schema}). At every "
           "check inside the check window that is also a log step: mode gap = training- minus evaluation-mode "
           f"accuracy on the held-out set ({heldout} samples); lag = the largest, over BatchNorm layers, median over "
           "channels of |running mean − fresh mean| / fresh std, with the fresh statistics of the probe set "
           f"({probe} samples): the monitor's own `lag_median_abs_sigma`. A check fails when its evaluation-mode "
           f"accuracy is below {FAIL_BELOW:.0%}. The monitor (`bnrotation.monitor.Thresholds`) warns when mode gap "
           "≥ g and lag ≥ l. Caught: failing checks it warns at (true-positive rate); false alarms: passing checks "
           "it warns at (false-positive rate). Counts pool the seeds of a row.\n"]
    if table.empty:
        out.append("No run logged a running-mean lag: nothing to classify.")
    else:
        here = table[(table["mode_gap"] == gap) & (table["lag_sigma"] == lag)]
        out += [f"## The default thresholds: mode gap ≥ {gap:g}, lag ≥ {lag:g}σ\n",
                "| Row | Seeds | Failing checks caught | Passing checks with a false alarm |", "|---|---|---:|---:|"]
        for _, r in here.iterrows():
            name = "**All rows**" if r["row"] == ALL else _label(r["row"])
            out.append(f"| {name} | {r['seeds'] if r['row'] != ALL else ''} | {_rate(r['caught'], r['failing'])} | "
                       f"{_rate(r['false_alarms'], r['passing'])} |")
        overall = table[table["row"] == ALL]
        gaps, lags = sorted(overall["mode_gap"].unique()), sorted(overall["lag_sigma"].unique())
        head = ["lag alone" if g == 0 else f"gap ≥ {g:g}" for g in gaps]
        out += ["", "## Around the defaults, all rows: caught / false alarms, share (count)\n",
                f"{int(overall['failing'].iloc[0])} failing and {int(overall['passing'].iloc[0])} passing checks. "
                "Columns: the lag threshold (0: the gap alone decides); lines: the gap threshold (0: the lag alone).\n",
                "| | " + " | ".join("gap alone" if lg == 0 else f"lag ≥ {lg:g}σ" for lg in lags) + " |",
                "|---|" + "---:|" * len(lags)]
        for g, name in zip(gaps, head):
            cells = []
            for lg in lags:
                r = overall[(overall["mode_gap"] == g) & (overall["lag_sigma"] == lg)].iloc[0]
                text = f"{100 * r['tpr']:.0f}% ({r['caught']}) / {100 * r['fpr']:.0f}% ({r['false_alarms']})"
                cells.append(f"**{text}**" if (g, lg) == (gap, lag) else text)
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        fail, ok = signals[signals["failing"]], signals[~signals["failing"]]
        out += ["", "## The two signals: median (quartiles)\n",
                "| Checks | n | Mode gap | Lag (σ) |", "|---|---:|---:|---:|",
                f"| failing | {len(fail)} | {_quartiles(fail['mode_gap'], '.3f')} | "
                f"{_quartiles(fail['lag_sigma'], '.3f')} |",
                f"| passing | {len(ok)} | {_quartiles(ok['mode_gap'], '.3f')} | {_quartiles(ok['lag_sigma'], '.3f')} |",
                "", "## Reading it\n",
                f"- The gap here is measured on {heldout} held-out samples. Training-mode accuracy is at least "
                f"{signals['acc_train_mode'].min():.1%} at every check, and every failing check has a gap of at least "
                f"{fail['mode_gap'].min():.3f}" + (f", so the gap threshold ({gap:g}) holds at every failing check: "
                                                  "these runs test the lag threshold given the gap, not the gap "
                                                  "threshold." if fail["mode_gap"].min() >= gap else ".")
                if len(fail) else "- No check failed here: the rule's true-positive rate is not measured.",
                f"- The monitor measures its gap on its probe batch (here the {probe}-sample probe set; in a user's loop "
                "whatever batch is passed): both modes on the same few samples, so the gap is a sampling estimate "
                "whose standard error is about sqrt(a (1 − a) / n) for an evaluation-mode accuracy a on n samples "
                "(0.013 at a = 0.9 and n = 512, 0.038 at n = 64). Near the gap threshold a small probe flips the "
                "decision either way; well above it (failing checks) it does not change it. The lag in this report "
                "is the monitor's own."]
    if without:
        out.append(f"\nNo running statistics, so no lag and no warning (left out): {', '.join(without)}.")
    return "\n".join(out) + "\n"


def write_monitor(runs: list[Run], out: Path, root: Path) -> Path:
    """Write ``<out>/monitor.md`` atomically and return its path."""
    signals, without = all_signals(runs)
    table = grid(signals)
    path = Path(out) / "monitor.md"
    records.atomic_write_text(path, to_markdown(table, signals, without, runs, root))
    return path
