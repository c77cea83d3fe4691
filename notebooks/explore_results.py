# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The rotation study, explored from its results
#
# This notebook reads the parquet results only (no training, no torch) and walks through the main
# figures of `make figures`. It runs as a notebook (`jupytext --to notebook notebooks/explore_results.py`)
# or as a plain script:
#
# ```bash
# BNROTATION_RESULTS=results/reference python notebooks/explore_results.py
# ```
#
# `BNROTATION_RESULTS` names the results root (the folder holding `runs/`); without it the notebook
# uses `results` if it holds runs, else the committed `results/reference` (the rule `make table`,
# `make figures` and `make claims` follow).

# %%
import os
from pathlib import Path

import pandas as pd

from bnrotation.study.analysis import claims
from bnrotation.study.analysis.claims import evidence
from bnrotation.study.analysis.measures import metrics, theory
from bnrotation.study.analysis.results import default_results_root, load_runs
from bnrotation.study.analysis.tables import figures

ROOT = Path(os.environ.get("BNROTATION_RESULTS") or default_results_root())
runs = load_runs(ROOT, tables=figures.TABLES)
print(f"{len(runs)} runs under {ROOT}")

# %% [markdown]
# ## One tidy table
#
# One line per run and quantity of the table (and of the claims): the run is the observation.
# `metrics.tidy(runs, name)` stacks any per-step table (`checks`, `layers`, `channels`,
# `interventions`, `averaging`) of every run the same way, one line per observation.

# %%
per_run = pd.DataFrame([evidence.per_run_values(r) for r in runs])
tidy = per_run.melt(id_vars=["row", "seed"], value_vars=[
    "rotation_per_100_deg", "norm_growth", "acc_eval_mode", "acc_train_mode", "checks_below_90",
    "update_cos", "grad_cos", "drift_mid", "predicted_lag_mid", "lag_mid", "abs_mean_over_std_mid"],
    var_name="quantity", value_name="value")
tidy.head(12)

# %%
summary = tidy.groupby(["quantity", "row"])["value"].agg(["mean", "std", "count"]).unstack("quantity")
summary.round(4)

# %%
checks = metrics.tidy(runs, "checks")
checks[checks["in_window"]].groupby("row")[["acc_train_mode", "acc_eval_mode"]].describe().round(3)

# %% [markdown]
# ## Accuracy falls with rotation, not with norm growth
#
# The article's central figure: one point per run, the published row means hollow.

# %%
figures.apply_style()
data = figures.load_data(ROOT, runs)


def show(draw):
    """Draw one figure of `make figures` and print its caption (or why it cannot be drawn)."""
    try:
        fig, caption = draw(data)
    except figures.Skip as why:
        print(f"not drawn: {why}")
        return None
    print(caption)
    return fig


show(figures.fig_accuracy_vs_rotation)

# %%
show(figures.fig_accuracy_vs_norm_growth)

# %% [markdown]
# ## Training mode stays high while evaluation mode falls

# %%
show(figures.fig_accuracy_over_steps)

# %% [markdown]
# ## Rotation over training, beside the rotational-equilibrium prediction
#
# Only rows with weight decay have a prediction (AdamW here). The literature's formula gives an
# angle per step; the net angle over 100 steps of a momentum-averaged random walk is about 41.5
# per-step angles (β = 0.9), not 100.

# %%
for row, (prediction, _) in figures.theory_by_row(data).items():
    if prediction.applies:
        print(f"{row}: {prediction.formula} = {prediction.per_step_rad:.2e} rad/step, "
              f"{prediction.net_deg_per_100:.2f}° net per 100 steps ({prediction.source})")
    else:
        print(f"{row}: {prediction.reason}")
print(f"k(100, 0.9) = {theory.random_walk_factor(100, 0.9):.1f}")
show(figures.fig_rotation_over_steps)

# %% [markdown]
# ## From rotation to a stale mean: drift and lag of the middle layer

# %%
show(figures.fig_drift)

# %%
show(figures.fig_lag_measured_vs_predicted)

# %% [markdown]
# ## Which statistics carry the damage
#
# At the failing checks (stored statistics below 90%): one layer at a time, then the k channels with
# the largest lag. Both figures are skipped, with the reason, when no check fails.

# %%
show(figures.fig_single_layer)

# %%
show(figures.fig_top_k)

# %% [markdown]
# ## Weight averaging
#
# Skipped, with the reason, until the runs carry an averaging table.

# %%
show(figures.fig_averaging)

# %% [markdown]
# ## The claims report
#
# `make claims` writes the same verdicts to `claims.md` in the results root (the reference runs':
# `results/reference/claims.md`).

# %%
markdown, named = claims.build_report(ROOT, runs)
pd.DataFrame([(c.name, c.verdict, c.published, c.measured) for c in named],
             columns=["check", "verdict", "published", "measured"])
