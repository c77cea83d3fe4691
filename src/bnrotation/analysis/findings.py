"""Findings on the article's open questions, as sections of ``claims.md`` (no torch).

Not claims with a verdict: what the runs show where the article asks without
answering. Weight averaging under each policy for the BatchNorm buffers
(:mod:`.averaging`), normalisation without running statistics (the rows whose
norm is not BatchNorm), and how many channels carry the damage at a failing
check (:func:`.interventions.smallest_k`).
"""

from __future__ import annotations

from ..article import FAIL_BELOW
from ..rows import ROWS, row_order
from . import averaging, interventions, metrics
from .evidence import Evidence
from .stats import cell, spread

COMPARED_WITH = "adam"  # the BatchNorm row the norms without running statistics are set beside
NORM_FREE_ROWS = tuple(row for row, spec in ROWS.items() if spec.norm != "batch")


def finding_channels(ev: Evidence) -> list[str]:
    """How many of the channels with the largest |lag| need fresh statistics to lift a failing check."""
    lines = ["### How many channels carry the damage\n"]
    failing = metrics.failing_checks([r for r in ev.runs if r.arch == "convnet"])  # ResNet-20: its own section
    if failing.empty:
        return lines + [f"NOT RUN: no failing check (evaluation-mode accuracy below {cell(FAIL_BELOW, 'pct', digits=0)}"
                        " at an intervention step) in these runs, so no damage to locate.\n"]
    lines += ["At each failing check, the channels of all BatchNorm layers are ranked by |running-mean lag| and "
              "only the top k get fresh statistics (figure 7). Below: the smallest k on the grid 0, 1, 2, 4, … "
              f"that lifts evaluation-mode accuracy to {cell(interventions.RECOVERY_THRESHOLD, 'pct', digits=0)} "
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
    table = averaging.build_averaging_table(ev.runs)
    if table.empty:
        return lines + ["NOT RUN: no run has an averaging table yet (the `averaging` parquet is absent or empty).\n"]
    lines += ["Evaluation-mode accuracy of the live weights, of an exponential moving average (EMA) of the weights "
              "and of a tail average, under each policy for the BatchNorm buffers, per run the mean over its "
              "evaluations in the check window, then over seeds (the full table with spreads: `averaging.md`, "
              "written by `make table`; figure 9). Per row, each averaged model from its worst to its best "
              "buffer policy:\n"]
    for row, g in sorted(table.groupby("row"), key=lambda kv: row_order(kv[0])):
        parts = []
        g = g.assign(model=[averaging.averaged_model(r) for _, r in g.iterrows()])
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


def findings(ev: Evidence) -> list[str]:
    """Every finding, in the order ``claims.md`` gives them."""
    return [*finding_averaging(ev), *finding_norm_free(ev), *finding_channels(ev)]
