"""``results/lag.md``, written by ``make table``: the lag formula checked channel by channel, drift against the
interval it is measured over, and the dense windows' drift and lag models (no torch).

The numbers come from :mod:`..measures.lag` (per run: :func:`~..measures.lag.run_lags`, the drift over
multiples of the log interval; over seeds: :func:`~..measures.lag.lag_table`,
:func:`~..measures.lag.drift_scaling_table`) and :mod:`..measures.dense` (the dense windows); this module
only writes them as markdown. The dense windows' two sections are also quoted in ``claims.md``'s findings.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .... import records
from ..formatting import cell, schema_versions, seed_ranges
from ..measures import dense
from ..measures.dense import GAUSSIAN_MEDIAN_ABS, MODEL_NAMES, MODELS, gaussian_median_log_error
from ..measures.lag import COLUMNS, drift_scaling_table, lag_table
from ..measures.metrics import MIDDLE_CONV, MIDDLE_NORM
from ..results import Run, count


def drift_markdown(scaling: pd.DataFrame) -> list[str]:
    """The "drift against the interval" section of ``lag.md`` (no lines when no run logged drift)."""
    if scaling.empty:
        return []
    intervals = sorted(int(c[:-5]) for c in scaling.columns if c.endswith("_mean") and c[:-5].isdigit())
    out = ["\n## Drift of the middle layer against the interval Δ\n",
           f"Median drift of `{MIDDLE_CONV}`'s fresh means, |fresh mean(t) − fresh mean(t − Δ)| / (fresh std · Δ) "
           "in σ per step, over the (step, channel) pairs whose interval ends inside the check window, recomputed "
           "from the logged fresh statistics at multiples of the log interval (the table above uses the first). "
           "Exponent: least-squares slope of log drift on log Δ; 0 if the mean moves at a steady rate, −0.5 if it "
           "wanders like a random walk. Each cell: mean over seeds ± sample standard deviation.\n",
           "| Row | Seeds | " + " | ".join(f"Δ = {d:,}" for d in intervals) + " | Exponent, first doubling | "
           "Exponent, all Δ |", "|---|---:|" + "---:|" * (len(intervals) + 2)]
    for _, r in scaling.iterrows():
        cells = [cell(r[f"{d}_mean"], "plain", r[f"{d}_std"], digits=5) for d in intervals]
        cells += [cell(r[f"{k}_mean"], "plain", r[f"{k}_std"], digits=2) for k in ("first_doubling", "exponent")]
        out.append(f"| {r['label']} (`{r['row']}`) | {r['n_seeds']} | " + " | ".join(cells) + " |")
    return out


def to_markdown(table: pd.DataFrame, without: list[str], root: Path, scaling: pd.DataFrame | None = None,
                dense_sections: list[str] | None = None, *, schema: str) -> str:
    """``results/lag.md``: one line per row and layer, ``mean ± spread`` in each cell; ``schema``, the runs' schema
    versions in words (:func:`..formatting.schema_versions`)."""
    out = ["# The lag formula, channel by channel\n",
           f"Rebuilt by `make table` from the runs under `{root}` ({schema}). "
           "Per row and conv layer (the lag is that of the BatchNorm after it), over the channels and log steps "
           "inside the check window: measured lag = |running mean − fresh mean| / fresh std; predicted lag = "
           "drift · (1 − m) / m, with the drift of the fresh mean over the last log interval, in σ per step; "
           "Spearman ρ ranks the two against each other over the (step, channel) pairs. Each cell: mean over "
           "seeds ± sample standard deviation over seeds; n: (step, channel) pairs per seed.\n"]
    if not table.empty:
        out += ["| Row | Layer | Seeds | n | " + " | ".join(h for _, h, _ in COLUMNS) + " |",
                "|---|---|---:|---:|" + "---:|" * len(COLUMNS)]
        for _, r in table.iterrows():
            cells = [cell(r[f"{k}_mean"], "plain", r[f"{k}_std"], digits=digits) for k, _, digits in COLUMNS]
            out.append(f"| {r['label']} (`{r['row']}`) | {r['layer']} ({r['norm_layer']}) | {r['n_seeds']} | "
                       f"{r['n_per_seed']} | " + " | ".join(cells) + " |")
    else:
        out.append("No run logged a running-mean lag.")
    if without:
        out.append("\nNo running statistics, so no lag to measure: " + ", ".join(f"`{w}`" for w in without) + ".")
    if scaling is not None:
        out += drift_markdown(scaling)
    if dense_sections:
        out += dense_sections
    return "\n".join(out) + "\n"


def dense_markdown(runs: list[Run]) -> list[str]:
    """The two sections of ``lag.md`` from the dense windows (:mod:`..measures.dense`): drift at short intervals, and
    the lag of a wandering mean against the steady-drift and random-walk models."""

    return ["\n## Drift at short intervals, from the dense windows\n",
            *dense_drift_markdown(*dense.dense_drift_table(runs)),
            "\n## The lag of a wandering mean: steady drift or random walk\n",
            *lag_models_markdown(dense.lag_model_table(runs))]


def write_lag(runs: list[Run], out: Path, root: Path) -> str:
    """Write ``<out>/lag.md`` atomically and return its text."""
    table, without = lag_table(runs)
    md = to_markdown(table, without, root, drift_scaling_table(runs), dense_markdown(runs),
                     schema=schema_versions(r.info.get("schema_version") for r in runs))
    records.atomic_write_text(Path(out) / "lag.md", md)
    return md


def lacking_text(lacking: dict[str, list[int]]) -> str:
    """``'`sgd` (seeds 0–2), `adamw` (seeds 0–2)'``: the runs without dense windows, by row."""
    return ", ".join(f"`{row}` (seed{'s' * (len(seeds) != 1)} {seed_ranges(seeds)})" for row, seeds in lacking.items())


def dense_drift_markdown(table: pd.DataFrame, lacking: dict[str, list[int]]) -> list[str]:
    """The table of :func:`dense_drift_table`: per row, the middle layer's median drift at each Δ, mean ± sample
    sd over seeds, with the seeds; then the runs without dense windows. One line saying so when no run has
    them."""
    if table.empty:
        return ["No run here has dense windows (`scale.dense_windows`; the `ten_seeds` set writes them: `make sweep "
                "SET=ten_seeds`), so no drift below the log interval is measured. Runs without: "
                + (lacking_text(lacking) or "none with running statistics") + "."]
    intervals = sorted(int(c[:-5]) for c in table.columns if c.endswith("_mean") and c[:-5].isdigit())
    out = [f"Median drift of `{MIDDLE_NORM}`'s fresh means (the input of the middle layer's BatchNorm), "
           "|fresh mean(t) − fresh mean(t − Δ)| / (fresh std(t) · Δ) in σ per step, over its channels and the pairs "
           "(t − Δ, t) whose both ends lie in the same dense window; per run, then mean over seeds ± sample "
           "standard deviation. Exponent: least-squares slope of log drift on log Δ over these Δ (0 for a steady "
           "drift, −0.5 for a random walk).\n",
           "| Row | Seeds (n) | " + " | ".join(f"Δ = {d}" for d in intervals) + " | Exponent |",
           "|---|---|" + "---:|" * (len(intervals) + 1)]
    for _, r in table.iterrows():
        cells = [cell(r[f"{d}_mean"], "plain", r[f"{d}_std"], digits=5) for d in intervals]
        cells.append(cell(r["exponent_mean"], "plain", r["exponent_std"], digits=2))
        out.append(f"| {r['label']} (`{r['row']}`) | {r['seeds']} ({r['n_seeds']}) | " + " | ".join(cells) + " |")
    if lacking:
        out += ["", "Runs without dense windows, left out above: " + lacking_text(lacking) + "."]
    return out


def lag_models_markdown(table: pd.DataFrame) -> list[str]:
    """The table of :func:`lag_model_table`, and per row which model predicts the measured lag better. One line
    saying so when no run has dense windows."""
    if table.empty:
        return ["No run here has dense windows (`scale.dense_windows`), so the fresh mean's path is not known step "
                "by step and no model is fitted."]
    out = [f"Per channel of `{MIDDLE_NORM}` and dense window: r = the mean and s = the sample standard deviation of "
           "the fresh mean's increments d_t = (fresh mean(t) − fresh mean(t − 1)) / fresh std(t), in σ per step (the "
           "probe set is fixed, so the increments carry no sampling noise of their own). From them, the lag at the "
           "window's last step predicted by a steady drift, |r|/m; by a random walk, s/√(m(2 − m)); by both, "
           "√(r²/m² + s²/(m(2 − m))) with r² less its estimation variance s²/n; and by a random walk whose steps "
           "are correlated, AR(1) with the increments' lag-1 autocorrelation ρ, s √((1 + qρ)/((1 − q²)(1 − qρ))), "
           "q = 1 − m (`lag.predicted_lag_*`; the runner's timing: the lag is read one step after the batch that "
           "updated the running mean, so 1/m where the article's timing gives (1 − m)/m). Each is set against the "
           "measured |lag| = |running mean − fresh mean| / fresh std there. RMS ratio: "
           "√(mean measured² / mean predicted²), 1 when a model gets the mean-square lag right; the model whose "
           "|log RMS ratio| is smallest predicts better. Median |log(|measured| / predicted)| and median "
           f"|measured| / predicted are the error channel by channel: for a Gaussian lag whose RMS is exactly right "
           f"they are {gaussian_median_log_error():.2f} and {GAUSSIAN_MEDIAN_ABS:.3f}, not 0 and 1. Lag-1 "
           "autocorrelation of the increments: 0 for the i.i.d. steps the random walk assumes. Batches' share: the "
           "part of the mean-square measured lag that the training batches' own means put there (sampling noise, "
           "and the probe set's offset from them), which no model of the fresh mean's path includes. Each cell: "
           "mean over seeds ± sample standard deviation.\n",
           "| Row | Seeds (n) | Median abs r (σ/step) | Median s (σ/step) | Lag-1 autocorrelation | Batches' share | "
           + " | ".join(f"{MODEL_NAMES[m].capitalize()}: RMS ratio, median abs log error, median ratio"
                        for m in MODELS) + " | Better |",
           "|---|---|" + "---:|" * (4 + len(MODELS)) + "---|"]
    for _, r in table.iterrows():
        head = [cell(r["r_mean"], "plain", r["r_std"], digits=5), cell(r["s_mean"], "plain", r["s_std"], digits=5),
                cell(r["autocorrelation_mean"], "plain", r["autocorrelation_std"], digits=2),
                cell(r["noise_share_mean"], "pct", r["noise_share_std"], digits=0, spread_sign=False)]
        models = [", ".join(cell(r[f"{m}_{k}_mean"], "plain", r[f"{m}_{k}_std"])  # 3 significant digits
                            for k in ("rms_ratio", "log_error", "ratio")) for m in MODELS]
        out.append(f"| {r['label']} (`{r['row']}`) | {r['seeds']} ({r['n_seeds']}) | " + " | ".join(head + models)
                   + f" | {MODEL_NAMES[r['best']]} ({r['best_seeds']} of {count(r['n_seeds'], 'seed')}) |")
    return out
