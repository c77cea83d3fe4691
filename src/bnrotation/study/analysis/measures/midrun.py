"""Checkpoints taken mid-run under a decaying learning rate: accuracy and lag against the rate (no torch).

The study expects, since most real schedules decay the learning rate, "the
effect to show up mostly in checkpoints taken mid-run": while the rate is still
high, Adam rotates the weights fast and the running statistics trail them. Here
a run's checks are split by the learning rate logged with them (the
``checks`` table's ``lr``): the checks above the check window's median rate
(the *high-rate* checks; under cosine decay to 0, the first half of the window)
against those below it (the *low-rate* checks, the second half); a check at
exactly the median rate is in neither. Accuracies are evaluation-mode,
fractions; lag is |running-mean lag| in σ (the ``channels`` table).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...article import FAIL_BELOW
from ..results import Run
from ..stats import spearman_rho
from . import metrics


def rate_halves(run: Run, threshold: float = FAIL_BELOW) -> dict:
    """One run's checks in the check window, split at the window's median learning rate.

    Returns:
        ``acc_high`` and ``acc_low`` (mean evaluation-mode accuracy of the high- and low-rate checks, NaN for
        none), ``n_high`` and ``n_low`` (checks), ``failing_high`` and ``failing_low`` (checks below
        ``threshold``), ``lr_median`` (the split) and ``rho_lr_acc`` (Spearman's ρ between the learning rate
        and evaluation-mode accuracy over all the window's checks; NaN for a constant rate). Checks in a run are
        not independent draws, so ρ describes, it does not test.
    """
    checks = metrics.in_window(run, run.tables["checks"])
    lr, acc = checks["lr"].astype(float), checks["acc_eval_mode"].astype(float)
    median = float(lr.median()) if len(lr) else math.nan
    high, low = acc[lr > median], acc[lr < median]
    return {"acc_high": float(high.mean()) if len(high) else math.nan,
            "acc_low": float(low.mean()) if len(low) else math.nan,
            "n_high": int(len(high)), "n_low": int(len(low)),
            "failing_high": int((high < threshold).sum()), "failing_low": int((low < threshold).sum()),
            "lr_median": median, "rho_lr_acc": spearman_rho(lr, acc) if lr.nunique() > 1 else math.nan}


def reestimated_at_every_step(run: Run) -> pd.DataFrame:
    """Per intervention step inside the check window: ``step``, ``stored`` (evaluation-mode accuracy with the
    stored running statistics) and ``reestimated`` (after re-estimating every layer), fractions. Empty for a run
    that logged no interventions."""
    iv = run.tables.get("interventions")
    if iv is None or iv.empty:
        return pd.DataFrame(columns=["step", "stored", "reestimated"])
    iv = metrics.in_window(run, iv)
    wide = iv[iv["intervention"].isin(["none", "reestimate"])].pivot_table(index="step", columns="intervention",
                                                                             values="acc_eval_mode")
    wide = wide.rename(columns={"none": "stored", "reestimate": "reestimated"}).reset_index()
    return wide.reindex(columns=["step", "stored", "reestimated"])


def over_checks(run: Run) -> pd.DataFrame:
    """Per logged check step in the window: ``step``, ``lr``, ``acc_eval_mode``, ``acc_train_mode`` and
    ``lag_network_median_abs_sigma``, the median |lag| over every BatchNorm channel of the network at that step (σ;
    NaN where the step logged no channels)."""
    checks = metrics.in_window(run, run.tables["checks"])[["step", "lr", "acc_eval_mode", "acc_train_mode"]]
    ch = run.tables["channels"]
    ch = ch[np.isfinite(ch["lag_sigma"])]
    lag = ch.assign(abs_lag=ch["lag_sigma"].abs()).groupby("step")["abs_lag"].median()
    return checks.assign(lag_network_median_abs_sigma=checks["step"].map(lag).astype(float)).reset_index(drop=True)
