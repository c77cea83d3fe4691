"""Reading the ``interventions`` table: which fix brings the accuracy back, and how few channels it takes (no torch).

The table (:mod:`bnrotation.records`) has one line per (step, intervention):
``none`` (the stored running statistics), ``reestimate`` (every layer fresh),
``layer`` (one layer fresh, ``norm_layer`` names it) and ``top_k`` (the ``k``
channels of largest |lag| across the network fresh, k = 0, 1, 2, 4, ..., all).
Accuracies are evaluation-mode, as fractions (a schema-1 run's ``layer`` column is read as ``norm_layer``,
:func:`..results.read_table`). The runner logs it at each
intervention step; :mod:`bnrotation.study.diagnose` builds the same table from a
checkpoint and formats it with the functions here.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...article import FAIL_BELOW
from ..formatting import cell
from ..results import Run

RECOVERY_THRESHOLD = FAIL_BELOW  # "recovers": evaluation-mode accuracy >= the accuracy below which a check fails


def accuracy_of(table: pd.DataFrame, intervention: str, *, norm_layer: str = "", k: int = -1) -> float:
    """The accuracy of one intervention in a one-step table; NaN if it is not there."""
    sel = table[(table["intervention"] == intervention) & (table["norm_layer"] == norm_layer) & (table["k"] == k)]
    return float(sel["acc_eval_mode"].iloc[0]) if len(sel) else math.nan


def top_k_curve(table: pd.DataFrame) -> pd.Series:
    """Accuracy against k (index: k, ascending) from a one-step table."""
    sel = table[table["intervention"] == "top_k"]
    return sel.set_index("k")["acc_eval_mode"].sort_index()


def smallest_k(curve: pd.Series, threshold: float = RECOVERY_THRESHOLD) -> int | None:
    """The smallest k of the curve whose accuracy is at least ``threshold``; None if none is.

    Resolved to the curve's grid (0, 1, 2, 4, ...): the true smallest k lies
    between the previous grid point (exclusive) and this one.
    """
    hit = curve[curve >= threshold]
    return int(hit.index[0]) if len(hit) else None


def worst_step(iv: pd.DataFrame) -> int:
    """The intervention step whose stored statistics give the lowest accuracy (the earliest on a tie).

    Raises:
        ValueError: if the table has no ``none`` line.
    """
    none = iv[iv["intervention"] == "none"].sort_values("step", kind="stable").reset_index(drop=True)
    if none.empty:
        raise ValueError("the interventions table has no 'none' line (stored statistics)")
    return int(none.loc[none["acc_eval_mode"].idxmin(), "step"])


def per_step(iv: pd.DataFrame, threshold: float = RECOVERY_THRESHOLD) -> pd.DataFrame:
    """One line per step, ascending: ``stored``, ``reestimated``, ``<norm layer>`` (that layer alone fresh; the layers
    in the order the table first names them), ``k_needed`` (smallest grid k reaching ``threshold``, NaN if none:
    :func:`smallest_k`) and ``channels`` (all channels: the curve's largest k, 0 without a curve). Each accuracy
    is :func:`accuracy_of`'s, NaN where the step lacks it. Empty for an empty table."""
    if iv.empty:
        return pd.DataFrame()
    steps = pd.Index(np.unique(iv["step"]), name="step")
    kind, whole = iv["intervention"], (iv["norm_layer"] == "") & (iv["k"] == -1)

    def accuracy(sel: pd.DataFrame, keys: list[str]) -> pd.Series:  # the first line of each key, as accuracy_of
        return sel.drop_duplicates(keys).set_index(keys)["acc_eval_mode"]

    by_layer = iv[kind == "layer"].sort_values("step", kind="stable")
    alone = (accuracy(by_layer[by_layer["k"] == -1], ["step", "norm_layer"]).unstack("norm_layer")
             .reindex(index=steps, columns=by_layer["norm_layer"].unique()).rename_axis(columns=None))
    top_k = iv[kind == "top_k"]
    out = pd.DataFrame({"stored": accuracy(iv[(kind == "none") & whole], ["step"]),
                        "reestimated": accuracy(iv[(kind == "reestimate") & whole], ["step"])}, index=steps).join(alone)
    out["k_needed"] = top_k[top_k["acc_eval_mode"] >= threshold].groupby("step")["k"].min()
    out["channels"] = top_k.groupby("step")["k"].max().reindex(steps, fill_value=0)
    return out.reset_index()


def describe_step(table: pd.DataFrame, threshold: float = RECOVERY_THRESHOLD) -> list[str]:
    """The report lines for one step's table: each intervention's accuracy and the k needed."""
    line = lambda label, text: f"  {label:<28}{text}"
    lines = [line("stored statistics", cell(accuracy_of(table, "none"), "pct")),
             line("full re-estimation", cell(accuracy_of(table, "reestimate"), "pct"))]
    for norm in table.loc[table["intervention"] == "layer", "norm_layer"]:
        lines.append(line(f"fresh {norm} only", cell(accuracy_of(table, "layer", norm_layer=norm), "pct")))
    curve = top_k_curve(table)
    if len(curve):
        lines.append(line("top-k channels by |lag|", " · ".join(f"k={k} {cell(a, 'pct')}" for k, a in curve.items())))
        k = smallest_k(curve, threshold)
        total = int(curve.index.max())
        label = f"smallest k reaching {threshold:.0%}"
        if k is None:
            lines.append(line(label, f"not reached, not even with all {total} channels"))
        else:
            below = curve.index[curve.index < k]
            between = (f" (the exact smallest lies in {int(below.max()) + 1}..{k})"
                       if len(below) and k - int(below.max()) > 1 else "")
            lines.append(line(label, f"{k} of {total} channels on the grid{between}"))
    return lines


def logged_report(run: Run, threshold: float = RECOVERY_THRESHOLD) -> str:
    """The report of :func:`bnrotation.study.diagnose.main` without a step: every logged step, then the worst.

    Raises:
        ValueError: naming the run, if it logged no interventions (``interventions=false``, or a norm
            without running statistics).
    """
    iv = run.tables.get("interventions")
    if iv is None or iv.empty:
        raise ValueError(f"{run.path}: no interventions logged (interventions=false, or a norm without "
                         "running statistics, which has nothing to re-estimate)")
    steps = per_step(iv, threshold)
    layers = [c for c in steps.columns if c not in ("step", "stored", "reestimated", "k_needed", "channels")]
    n_held = int(run.config["scale"]["heldout_size"])
    out = [f"{run.row} seed={run.seed}: interventions logged at {len(steps)} steps ({run.path / 'interventions.parquet'})",
           f"Evaluation-mode accuracy on the {n_held:,} held-out samples after each intervention; "
           f"k = fewest top-|lag| channels given fresh statistics to reach {threshold:.0%} (grid 0, 1, 2, 4, ...).",
           "",
           "| step | stored | re-estimated | " + " | ".join(f"{la} only" for la in layers) + f" | k for {threshold:.0%} |",
           "|---:|---:|---:|" + "---:|" * len(layers) + "---:|"]
    for _, s in steps.iterrows():
        k = "–" if math.isnan(s["k_needed"]) else f"{int(s['k_needed'])} of {int(s['channels'])}"
        out.append(f"| {int(s['step'])} | {cell(s['stored'], 'pct')} | {cell(s['reestimated'], 'pct')} | "
                   + " | ".join(cell(s[la], 'pct') for la in layers) + f" | {k} |")
    worst = worst_step(iv)
    out += ["", f"Worst intervention step: {worst} (lowest accuracy with the stored statistics)"
            + _worst_check_note(run)]
    out += describe_step(iv[iv["step"] == worst], threshold)
    if (run.path / "checkpoints" / f"step={worst}.pt").exists():
        out.append(f"  {'exact k from the checkpoint':<28}make diagnose RUN={run.path} STEP={worst}")
    else:
        out.append(f"  {'exact k from the checkpoint':<28}needs checkpoints/step={worst}.pt, which this run folder "
                   "lacks (checkpoints are not committed: rerun the row to make them)")
    return "\n".join(out) + "\n"


def _worst_check_note(run: Run) -> str:
    checks = run.tables.get("checks")
    if checks is None or checks.empty:
        return ""
    checks = checks.sort_values("step", kind="stable").reset_index(drop=True)
    worst = checks.loc[checks["acc_eval_mode"].idxmin()]
    return (f"; the worst of all {len(checks)} checks: step {int(worst['step'])}, "
            f"{cell(float(worst['acc_eval_mode']), 'pct')}")
