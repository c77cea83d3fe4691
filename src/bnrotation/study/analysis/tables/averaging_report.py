"""``results/averaging.md``: averaged weights under each BatchNorm buffer policy (no torch).

``make table`` writes it beside ``table.md`` (:func:`write_averaging`). One line per row of the main table that has
an ``averaging`` table; one column per averaged model and buffer policy the
runs logged: the live model, each EMA decay under ``copy``, ``average`` and
``refresh``, the tail average under ``copy``, ``average``, ``mixture`` and
``refresh`` (see :mod:`bnrotation.averaging`). A run's value is the mean over
its evaluation steps inside the check window; a cell is the mean over seeds ±
the sample standard deviation over seeds (n - 1). Two tables: evaluation-mode
accuracy, and the median |running-mean lag| in sigma on the probe set.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from .... import records
from ...rows import ROWS, row_order
from ..formatting import cell, schema_versions
from ..measures.metrics import check_window
from ..results import Run, once_per_run
from ..stats import over_seeds

POLICY_ORDER = ("none", "copy", "average", "mixture", "refresh")
AVERAGE_ORDER = ("live", "ema", "tail")
MEASURES = ("acc_eval_mode", "lag_network_median_abs_sigma")  # columns of the averaging table summarised per run
# (per-run value: <measure> is the mean over the window, <measure>_last the last evaluation; heading; unit and
# decimals of a cell, :func:`..formatting.cell`, the unit's sign left to the heading)
VALUES = (("acc_eval_mode", "Evaluation-mode accuracy (%), mean over the evaluations", "pct", 1),
          ("acc_eval_mode_last", "Evaluation-mode accuracy (%) at the last step", "pct", 1),
          ("lag_network_median_abs_sigma",
           "Median |running-mean lag| over all channels (sigma), mean over the evaluations", "plain", 3))


def column_label(average: str, decay: float, window_steps: int, policy: str) -> str:
    """``Live``, ``EMA 0.999 copy``, ``Tail 1000 steps mixture``."""
    if average == "live":
        return "Live"
    if average == "ema":
        return f"EMA {decay:g} {policy}"
    return f"Tail {int(window_steps)} steps {policy}"


def averaged_model(line: pd.Series) -> str:
    """The averaged model of an ``averaging`` line, without its buffer policy: 'Live', 'EMA 0.999',
    'Tail 1000 steps' (:func:`column_label`)."""
    return column_label(line["average"], line["decay"], line["window_steps"], "").strip()


def _sort_key(average: str, decay: float, window_steps: int, policy: str) -> tuple:
    return (AVERAGE_ORDER.index(average) if average in AVERAGE_ORDER else len(AVERAGE_ORDER),
            0.0 if math.isnan(decay) else decay, window_steps,
            POLICY_ORDER.index(policy) if policy in POLICY_ORDER else len(POLICY_ORDER), policy)


@once_per_run
def run_values(run: Run) -> pd.DataFrame:
    """One run's values per averaged model and policy, from its evaluation steps in the check window.

    Returns:
        DataFrame with average, decay, window_steps, policy, steps (evaluations
        averaged) and, for each of :data:`MEASURES`, its mean over the
        evaluations and ``<measure>_last``, its value at the last one (NaN where
        the run did not log it); empty when the run has no averaging rows. Kept per run
        (:func:`..results.once_per_run`): ``averaging.md``, the claims' findings and the figures share it.
    """
    av = run.tables.get("averaging")
    keys = ["average", "decay", "window_steps", "policy"]
    if av is None or av.empty:
        return pd.DataFrame(columns=keys + ["steps"] + [v for v, *_ in VALUES])
    first, last = check_window(run)
    av = av[(av["step"] >= first) & (av["step"] <= last)].copy()
    for measure in MEASURES:
        if measure not in av.columns:
            av[measure] = math.nan
    av["decay"] = av["decay"].fillna(-1.0)  # groupby drops NaN keys
    av = av.sort_values("step")
    out = av.groupby(keys, as_index=False).agg(steps=("step", "nunique"), **{m: (m, "mean") for m in MEASURES},
                                               **{f"{m}_last": (m, "last") for m in MEASURES})
    out["decay"] = out["decay"].where(out["decay"] >= 0)
    return out


def build_averaging_table(runs: list[Run]) -> pd.DataFrame:
    """Long table: one line per (row, averaged model, policy) with ``<value>_mean``, ``<value>_std``,
    ``n_seeds``, ``seeds`` and ``label``; rows in the main table's order, columns in policy order."""
    per_run = [run_values(r).assign(row=r.row, seed=r.seed) for r in runs]
    per_run = [df for df in per_run if not df.empty]
    if not per_run:
        return pd.DataFrame()
    df = pd.concat(per_run, ignore_index=True)
    df["decay_key"] = df["decay"].fillna(-1.0)
    lines = []
    for (row, average, decay, window, policy), g in df.groupby(["row", "average", "decay_key", "window_steps",
                                                                 "policy"]):
        decay = math.nan if decay < 0 else float(decay)
        line = {"row": row, "average": average, "decay": decay, "window_steps": int(window), "policy": policy,
                "label": column_label(average, decay, window, policy), "n_seeds": int(g["seed"].nunique()),
                "seeds": ",".join(map(str, sorted(g["seed"].unique())))}
        lines.append(line | over_seeds(g, [value for value, *_ in VALUES]))
    out = pd.DataFrame(lines)
    order = out.apply(lambda r: (row_order(r["row"]),) + _sort_key(r["average"], r["decay"], r["window_steps"],
                                                                      r["policy"]), axis=1)
    return out.iloc[sorted(range(len(out)), key=lambda i: order.iloc[i])].reset_index(drop=True)


def to_markdown(table: pd.DataFrame, root: Path, *, schema: str) -> str:
    """Both tables as markdown: one line per row, one column per averaged model and policy; ``schema``, the runs'
    schema versions in words (:func:`..formatting.schema_versions`)."""
    labels = list(dict.fromkeys(table["label"]))
    rows = list(dict.fromkeys(table["row"]))
    out = ["# Weight averaging and BatchNorm buffer policies, measured\n",
           f"Rebuilt by `make table` from the runs under `{root}` ({schema}). "
           "Per run: the mean over its averaging evaluations inside the check window (default: every 500 "
           "steps from step 2,000 and the last step). Each cell: mean over seeds ± sample standard deviation "
           "over seeds; `n` is the number of seeds. Live: the trained model with its own running statistics. "
           "EMA `d`: exponential moving average of the weights with decay d. Tail: the uniform average of the "
           "snapshots of the last steps. Buffer policies: `copy` (the live model's, or the newest snapshot's, "
           "buffers), `average` (mean of running means and of running variances; for an EMA an EMA of the "
           "buffers), `mixture` (law of total variance over the snapshots), `refresh` (re-estimated on the "
           "averaged weights).\n"]
    for value, heading, unit, digits in VALUES:
        out += [f"## {heading}\n", "| Row | n | " + " | ".join(labels) + " |",
                "|---|---:|" + "---:|" * len(labels)]
        for row in rows:
            sel = table[table["row"] == row].set_index("label")
            cells = [cell(sel.loc[lab, f"{value}_mean"], unit, sel.loc[lab, f"{value}_std"], digits=digits,
                          sign=False, spread_sign=False) if lab in sel.index else "–" for lab in labels]
            spec = ROWS.get(row)
            name = f"{spec.label} (`{row}`)" if spec else f"`{row}`"
            out.append(f"| {name} | {int(sel['n_seeds'].max())} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def write_averaging(runs: list[Run], out: str | Path, root: str | Path) -> Path | None:
    """Write ``<out>/averaging.md`` and ``averaging.csv``; returns the markdown path, None if no run has averaging rows."""
    table = build_averaging_table(runs)
    if table.empty:
        return None
    out, schema = Path(out), schema_versions(r.info.get("schema_version") for r in runs)
    records.atomic_write_text(out / "averaging.md", to_markdown(table, Path(root), schema=schema))
    records.atomic_write_text(out / "averaging.csv", table.to_csv(index=False))
    return out / "averaging.md"
