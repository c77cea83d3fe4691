"""The table's columns, one function each, from a run's parquet tables (no torch).

Definitions are PROTOCOL.md's ("Measured quantities"); each function names the
column it computes.
"""

from __future__ import annotations

import math

import pandas as pd

from .results import Run

LAST_CONV = "conv3"
MIDDLE_CONV = "conv2"


def check_window(run: Run) -> tuple[int, int]:
    """(first, last) step of the check window, from the run's own config."""
    scale = run.config["scale"]
    return int(scale["check_start"]), int(scale["steps"])


def rotation_per_100_deg(run: Run, layer: str = LAST_CONV) -> float:
    """Column "Rotation per 100 steps": per interval, the median over ``layer``'s channels of the
    channel rotation, scaled to 100 steps; averaged over the intervals ending inside the check window."""
    ch = run.tables["channels"]
    first, last = check_window(run)
    interval = int(run.config["scale"]["log_every"])
    sel = ch[(ch["layer"] == layer) & (ch["step"] >= max(first, 1)) & (ch["step"] <= last)]
    per_interval = sel.groupby("step")["rotation_deg"].median()
    return float(per_interval.mean() * 100.0 / interval) if len(per_interval) else math.nan


def norm_growth(run: Run, layer: str = LAST_CONV) -> float:
    """Column "Norm growth": ||W(last step)|| / ||W(0)||, Frobenius norm of ``layer``'s weight."""
    lay = run.tables["layers"]
    w = lay[lay["layer"] == layer].set_index("step")["weight_norm"].sort_index()
    return float(w.iloc[-1] / w.loc[0]) if 0 in w.index and len(w) > 1 else math.nan


def _window_checks(run: Run) -> pd.DataFrame:
    checks = run.tables["checks"]
    first, last = check_window(run)
    return checks[(checks["step"] >= first) & (checks["step"] <= last)]


def acc_eval_mode(run: Run) -> float:
    """Column "Evaluation-mode accuracy": mean of the checks' evaluation-mode accuracy."""
    return float(_window_checks(run)["acc_eval_mode"].mean())


def acc_train_mode(run: Run) -> float:
    """Mean of the checks' training-mode accuracy (held-out set's own batch statistics)."""
    return float(_window_checks(run)["acc_train_mode"].mean())


def checks_below(run: Run, threshold: float = 0.90) -> tuple[int, int]:
    """Column "Checks below 90%": (checks below ``threshold``, all checks) of this run."""
    acc = _window_checks(run)["acc_eval_mode"]
    return int((acc < threshold).sum()), int(len(acc))


def final_reestimated_acc(run: Run) -> float:
    """Evaluation-mode accuracy after full re-estimation at the run's last intervention step."""
    iv = run.tables.get("interventions")
    if iv is None or iv.empty:
        return math.nan
    sel = iv[iv["intervention"] == "reestimate"]
    return float(sel.loc[sel["step"].idxmax(), "acc_eval_mode"]) if len(sel) else math.nan
