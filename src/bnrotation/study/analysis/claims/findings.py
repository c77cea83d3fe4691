"""Findings on the article's open questions, as sections of ``claims.md`` (no torch).

Not claims with a verdict: what the runs show where the article asks without
answering. Weight averaging under each policy for the BatchNorm buffers
(:mod:`..tables.averaging_report`), normalisation without running statistics (the rows whose
norm is not BatchNorm), and how many channels carry the damage at a failing
check (:func:`..measures.intervention_log.smallest_k`).
"""

from __future__ import annotations

import math

import numpy as np

from ...article import ADAM_RERUN_ACC_EVAL, FAIL_BELOW, MIDDLE_DRIFT, UPDATE_COSINE
from ...rows import PUBLISHED_SEEDS, ROWS, row_order
from ..formatting import cell, seed_ranges, spread
from ..measures import dense, intervention_log, metrics
from ..measures.dense import DENSE_INTERVALS
from ..results import count
from ..stats import share_at_or_below, subset_means
from ..tables import averaging_report, lag_report
from .evidence import CONV_LAYERS, Evidence
from .kinds import matches, said
from .registry import study_run

ADAM, SGD, ACC = "adam", "sgd", "acc_eval_mode"

COMPARED_WITH = "adam"  # the BatchNorm row the norms without running statistics are set beside
NORM_FREE_ROWS = tuple(row for row, spec in ROWS.items() if spec.norm != "batch")


def finding_channels(ev: Evidence) -> list[str]:
    """How many of the channels with the largest |lag| need fresh statistics to lift a failing check."""
    lines = ["### How many channels carry the damage\n"]
    failing = metrics.failing_checks([r for r in ev.runs if study_run(r)])  # ResNet-20, Fashion-MNIST: their own
    if failing.empty:
        return lines + [f"NOT RUN: no failing check (evaluation-mode accuracy below {cell(FAIL_BELOW, 'pct', digits=0)}"
                        " at an intervention step) in these runs, so no damage to locate.\n"]
    lines += ["At each failing check, the channels of all BatchNorm layers are ranked by |running-mean lag| and "
              "only the top k get fresh statistics (figure 7). Below: the smallest k on the grid 0, 1, 2, 4, … "
              f"that lifts evaluation-mode accuracy to {cell(intervention_log.RECOVERY_THRESHOLD, 'pct', digits=0)} "
              "(`interventions.smallest_k`, as `make diagnose` reports it), and how often even all channels do "
              "not.\n",
              "| Row | Failing checks | Median k (share of all channels) | Range of k | Not reached | Channels |",
              "|---|---:|---:|---:|---:|---:|"]
    for row, g in sorted(failing.groupby("row"), key=lambda kv: row_order(kv[0])):
        k, total = g["k_needed"].dropna(), int(g["channels"].max())
        med = f"{int(k.median())} ({cell(k.median() / total, 'pct', digits=0)})" if len(k) else "–"
        span = f"{int(k.min())}–{int(k.max())}" if len(k) else "–"
        lines.append(f"| `{row}` | {len(g)} | {med} | {span} | {int(g['k_needed'].isna().sum())} | {total} |")
    return lines + [""]


def finding_averaging(ev: Evidence) -> list[str]:
    """Each averaged model (EMA, tail average) of each row, from its worst to its best buffer policy."""
    lines = ["### Weight averaging (EMA, tail average) and the running statistics\n"]
    table = averaging_report.build_averaging_table(ev.runs)
    if table.empty:
        return lines + ["NOT RUN: no run has an averaging table yet (the `averaging` parquet is absent or empty).\n"]
    lines += ["Evaluation-mode accuracy of the live weights, of an exponential moving average (EMA) of the weights "
              "and of a tail average, under each policy for the BatchNorm buffers, per run the mean over its "
              "evaluations in the check window, then over seeds (the full table with spreads: `averaging.md`, "
              "written by `make table`; figure 9). Per row, each averaged model from its worst to its best "
              "buffer policy:\n"]
    for row, g in sorted(table.groupby("row"), key=lambda kv: row_order(kv[0])):
        parts = []
        g = g.assign(model=[averaging_report.averaged_model(r) for _, r in g.iterrows()])
        for model, h in g.groupby("model", sort=False):
            lo, hi = h.loc[h["acc_eval_mode_mean"].idxmin()], h.loc[h["acc_eval_mode_mean"].idxmax()]
            parts.append(f"{model} {cell(lo['acc_eval_mode_mean'], 'pct')} ({lo['policy']})" if len(h) == 1 else
                         f"{model} from {cell(lo['acc_eval_mode_mean'], 'pct')} ({lo['policy']}) to "
                         f"{cell(hi['acc_eval_mode_mean'], 'pct')} ({hi['policy']})")
        n = int(g["n_seeds"].max())
        lines.append(f"- `{row}` (n = {n} seed{'s' * (n != 1)}): " + "; ".join(parts) + ".")
    return lines + [""]


def finding_norm_free(ev: Evidence) -> list[str]:
    """GroupNorm and LayerNorm beside Adam with BatchNorm: the gap between training and evaluation mode."""
    lines = ["### Normalisation without running statistics (GroupNorm, LayerNorm)\n"]
    rows = [r for r in NORM_FREE_ROWS if ev.has(r)]
    if not rows:
        return lines + [f"NOT RUN: no runs of {', '.join(f'`{r}`' for r in NORM_FREE_ROWS)} yet.\n"]
    lines += ["The article expects the gap between training and evaluation mode to disappear: these layers "
              "normalise each sample with its own statistics in both modes, though Adam still rotates the weights.\n",
              "| Row | Rotation per 100 steps | Training mode | Evaluation mode | Checks below "
              f"{cell(FAIL_BELOW, 'pct', digits=0)} |",
              "|---|---:|---:|---:|---:|"]
    shown = [r for r in (COMPARED_WITH, *rows) if ev.has(r)]
    for row in shown:
        lines.append(f"| `{row}` | {ev.stat(row, 'rotation_per_100_deg').describe('deg')} | "
                     f"{ev.stat(row, 'acc_train_mode').describe('pct')} | "
                     f"{ev.stat(row, 'acc_eval_mode').describe('pct')} | "
                     f"{ev.stat(row, 'checks_below_90').describe('pct')} |")
    lines.append("")
    for row in shown:
        gap = ev.stat(row, "acc_train_mode").mean - ev.stat(row, "acc_eval_mode").mean
        lines.append(f"- `{row}`: training mode minus evaluation mode, {spread(gap, 'pct')}.")
    return lines + [""]


DRAW_SEEDS = PUBLISHED_SEEDS  # the article's rows are 3-seed means: how much does such a mean vary?
MIN_DRAW_SEEDS = DRAW_SEEDS + 1  # with 3 seeds there is one 3-seed mean and nothing to compare it with


def finding_one_draw(ev: Evidence) -> list[str]:
    """How much a 3-seed mean of evaluation-mode accuracy varies, from every 3-seed subset of a row's seeds
    (:func:`..stats.subset_means`, exact), and where the article's Adam figures fall among them."""
    lines = ["### How much one draw varies\n"]
    rows = [r for r in sorted(ev.per_run["row"].unique(), key=row_order) if ev.stat(r, ACC).n >= MIN_DRAW_SEEDS]
    if not rows:
        return lines + [f"NOT RUN: no row has {MIN_DRAW_SEEDS} or more seeds yet ({ev.seeds_per_row()}); with "
                        f"{DRAW_SEEDS} there is a single {DRAW_SEEDS}-seed mean.\n"]
    pub, rerun = ROWS[ADAM].published.acc_eval_mode, ADAM_RERUN_ACC_EVAL
    lines += [f"The article's table gives {DRAW_SEEDS}-seed means, and the article warns that a rerun gave Adam "
              f"{said(rerun, 'pct')} instead of {cell(pub, 'pct')}. Here, per row with {MIN_DRAW_SEEDS} or more "
              f"seeds, the mean evaluation-mode accuracy of every subset of {DRAW_SEEDS} of its seeds (all C(n, "
              f"{DRAW_SEEDS}), exact, no random resampling): what one {DRAW_SEEDS}-seed draw could have given. "
              "Percentiles interpolate linearly between the ordered means.\n",
              f"| Row | Seeds (n) | {DRAW_SEEDS}-seed means | Median | 5th–95th percentile | Min–max | Mean of all seeds |",
              "|---|---|---:|---:|---:|---:|---:|"]
    draws = {}
    for row in rows:
        s = ev.stat(row, ACC)
        means = subset_means(s.values, DRAW_SEEDS)
        draws[row] = means
        lo, mid, hi = np.percentile(means, [5, 50, 95])
        lines.append(f"| `{row}` | {seed_ranges(s.seeds)} ({s.n}) | {len(means)} | {cell(mid, 'pct')} | "
                     f"{cell(lo, 'pct')}–{cell(hi, 'pct')} | {cell(means.min(), 'pct')}–{cell(means.max(), 'pct')} | "
                     f"{s.describe('pct')} |")
    lines.append("")
    if ADAM in draws:
        means = draws[ADAM]
        lines.append(f"- `{ADAM}`: {cell(share_at_or_below(means, pub), 'pct', digits=0)} of its {len(means)} "
                     f"{DRAW_SEEDS}-seed means lie at or below the article's {cell(pub, 'pct')}, and "
                     f"{cell(share_at_or_below(means, rerun.value), 'pct', digits=0)} at or below its rerun's "
                     f"{said(rerun, 'pct')}.")
    else:
        lines.append(f"- `{ADAM}` has fewer than {MIN_DRAW_SEEDS} seeds: where the article's {cell(pub, 'pct')} and "
                     f"its rerun's {said(rerun, 'pct')} fall is not known yet.")
    return lines + [""]


def _interval_needed(ev: Evidence, row: str, figure) -> str:
    """The Δ at which ``row``'s drift from the dense windows matches ``figure`` (the claims' tolerance), or, where
    none does, where the published drift falls between two measured Δ (log–log interpolation), or outside."""
    stats = {d: ev.stat(row, f"dense_drift_{d}") for d in DENSE_INTERVALS}
    stats = {d: s for d, s in stats.items() if s.n}
    met = [d for d, s in stats.items() if matches(s, figure)]
    if met:
        return f"holds at Δ = {', '.join(map(str, met))}"
    ds = sorted(stats)
    drift = [stats[d].mean for d in ds]
    for (d0, v0), (d1, v1) in zip(zip(ds, drift), zip(ds[1:], drift[1:])):
        if min(v0, v1) <= figure.value <= max(v0, v1) and v0 > 0 and v1 > 0 and v0 != v1:
            at = math.exp(math.log(d0) + (math.log(figure.value) - math.log(v0)) * (math.log(d1) - math.log(d0))
                          / (math.log(v1) - math.log(v0)))
            return f"would need Δ ≈ {at:.0f} (between Δ = {d0} and {d1}, interpolated on log drift against log Δ)"
    lowest, highest = min(ds, key=lambda d: stats[d].mean), max(ds, key=lambda d: stats[d].mean)
    if figure.value > stats[highest].mean:
        return f"holds at no measured Δ: even Δ = {highest} gives only {cell(stats[highest].mean, 'drift')}"
    return f"holds at no measured Δ: even Δ = {lowest} gives {cell(stats[lowest].mean, 'drift')}"


def finding_dense_drift(ev: Evidence) -> list[str]:
    """The middle layer's drift at Δ = 1 to 128 steps from the dense windows, and the Δ, if any, at which both of
    the article's drift figures hold at once (:func:`.kinds.matches`, the claims' tolerance)."""
    lines = ["### Drift at short intervals, from the dense windows\n"]
    table, lacking = dense.dense_drift_table(ev.runs)
    lines += [*lag_report.dense_drift_markdown(table, lacking), ""]
    rows = (ADAM, SGD)
    if any(ev.stat(r, f"dense_drift_{DENSE_INTERVALS[0]}").n < 2 for r in rows):
        return lines + [f"Whether one Δ gives both of the article's drift figures ({said(MIDDLE_DRIFT[ADAM], 'drift')} "
                        f"under Adam, {said(MIDDLE_DRIFT[SGD], 'drift')} under SGD) needs dense windows of two or more "
                        f"seeds of both `{ADAM}` and `{SGD}` (the claims' tolerance rests on the seed spread); "
                        f"{ev.seeds_per_row(rows)}, dense windows: "
                        + ", ".join(f"`{r}` {count(ev.stat(r, f'dense_drift_{DENSE_INTERVALS[0]}').n, 'seed')}"
                                    for r in rows) + ".\n"]
    both = [d for d in DENSE_INTERVALS if all(matches(ev.stat(r, f"dense_drift_{d}"), MIDDLE_DRIFT[r]) for r in rows)]
    figures = f"{said(MIDDLE_DRIFT[ADAM], 'drift')} (Adam) and {said(MIDDLE_DRIFT[SGD], 'drift')} (SGD)"
    if both:
        lines.append(f"Both of the article's figures, {figures}, are met at once (each within the claims' tolerance, "
                     f"two standard errors of the difference) at Δ = {', '.join(map(str, both))} steps.")
    else:
        lines.append(f"No single Δ meets both of the article's figures, {figures}, within the claims' tolerance "
                     f"(two standard errors of the difference): Adam's {_interval_needed(ev, ADAM, MIDDLE_DRIFT[ADAM])}; "
                     f"SGD's {_interval_needed(ev, SGD, MIDDLE_DRIFT[SGD])}.")
    return lines + [""]


def finding_lag_models(ev: Evidence) -> list[str]:
    """The measured lag at the end of each dense window against the steady-drift, random-walk and combined
    predictions from the fresh mean's own increments (:func:`..measures.dense.lag_model_table`)."""
    lines = ["### The lag of a wandering mean: steady drift or random walk\n",
             "The article's lag formula assumes a steady drift r, lag = r(1 − m)/m, about 32 r at m = 0.03. A mean "
             "that wanders as a random walk with step size s lags by s(1 − m)/√(m(2 − m)) in root mean square, "
             "about 4 s; if its steps are correlated, as when an optimizer's momentum averages the gradients over "
             "about ten steps, by more (`lag.predicted_lag_steady`, `lag.predicted_lag_random_walk`, "
             "`lag.predicted_lag_correlated_walk` derive each).\n"]
    table = dense.lag_model_table(ev.runs)
    lines += [*lag_report.lag_models_markdown(table), ""]
    for _, r in table.iterrows():
        errors = "; ".join(f"{dense.MODEL_NAMES[m]} RMS ratio {cell(r[f'{m}_rms_ratio_mean'], 'plain')}, median abs "
                           f"log error {cell(r[f'{m}_log_error_mean'], 'plain')}" for m in dense.MODELS)
        lines.append(f"- `{r['row']}` ({count(r['n_seeds'], 'seed')}: {r['seeds']}): the "
                     f"{dense.MODEL_NAMES[r['best']]} model predicts the measured lag best, on "
                     f"{r['best_seeds']} of {count(r['n_seeds'], 'seed')} ({errors}).")
    return lines + [""]


def finding_update_cosine(ev: Evidence) -> list[str]:
    """The update's cosine with the weights per conv layer, over the whole check window and at its start and end
    (:func:`.evidence.update_cosines`), for the rows whose cosine the article gives."""
    lines = ["### The update's cosine per layer, at the start and end of the window\n"]
    rows = sorted((r for r in UPDATE_COSINE if ev.has(r)), key=row_order)
    if not rows:
        return lines + [f"NOT RUN: no runs of {', '.join(f'`{r}`' for r in UPDATE_COSINE)}.\n"]
    parts = metrics.window_ends(ev.runs_of(rows[0])[0])
    lines += ["cos(w(t+1) − w(t), w(t)) of the step the optimizer takes (momentum included), over each conv layer's "
              "whole weight, mean over the logged steps of each part of the check window, then over seeds ± sample "
              f"standard deviation. The claims use {metrics.LAST_CONV} over the whole window; the article names no "
              "layer. [The article's figure.]\n",
              "| Row | Layer | " + " | ".join(f"Steps {a:,}–{b:,}" for a, b in parts.values()) + " |",
              "|---|---|" + "---:|" * len(parts)]
    for row in rows:
        for layer in CONV_LAYERS:
            cells = [ev.stat(row, f"update_cos_{layer}_{part}").describe("cos") for part in parts]
            lines.append(f"| `{row}` [{said(UPDATE_COSINE[row], 'cos')}] | {layer} | " + " | ".join(cells) + " |")
    return lines + [""]


def findings(ev: Evidence) -> list[str]:
    """Every finding, in the order ``claims.md`` gives them."""
    return [*finding_averaging(ev), *finding_norm_free(ev), *finding_channels(ev), *finding_one_draw(ev),
            *finding_dense_drift(ev), *finding_lag_models(ev), *finding_update_cosine(ev)]
