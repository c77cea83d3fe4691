"""``make figures``: every figure of the write-up, from the parquet results (no torch).

    python -m bnrotation.study.analysis.tables.figures --results results/reference   # into results/reference/figures

Writes ``<out>/<name>.png`` (for reading) and ``<out>/<name>.pdf`` (vector, for
write-ups) for each figure, and ``<out>/README.md``, which shows every figure
with its caption. Every caption states n (runs, seeds, checks or channels the
figure rests on), and so does every image, under the plot (:func:`footnote`), so
that a figure copied without its caption still says what it rests on; runs not
at the article's scale get a boxed warning inside the image, above the plot. A figure whose data is missing (say, the averaging table
before the averaging runs exist) is listed in the README as not drawn, with the
reason. One style for all: seaborn ``whitegrid``, one colour per row of the
study, the same in every figure.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from ....helptext import plain
from ... import article
from .... import records
from ...article import FAIL_BELOW
from ...rows import ARTICLE_ROWS, ROWS, TASKS, network_label, on_fashion_mnist, row_order
from ..formatting import cell
from ..measures import depth, intervention_log, lag, metrics, midrun, theory
from ..results import (ALL_TABLES, Run, add_results_arguments, at_protocol_scale, command_inputs, describe_scale,
                       protocol_scale, scale_note)
from . import averaging_report
from .table import run_metrics

TABLES = ALL_TABLES


class Skip(Exception):
    """A figure cannot be drawn from these results; the message says why."""


@dataclass
class Data:
    """What every figure draws from: the runs, one line of table metrics per run, and row colours."""

    root: Path
    runs: list[Run]
    per_run: pd.DataFrame  # one line per run: row, seed, label and the table's columns
    palette: dict[str, tuple]

    @property
    def rows(self) -> list[str]:
        return sorted(self.per_run["row"].unique(), key=row_order)

    @functools.cached_property
    def _arch_of(self) -> dict[str, str]:
        # figures ask per row and per point: one pandas lookup each took ~1 ms
        return {str(r): str(a) for r, a in self.per_run.drop_duplicates("row")[["row", "arch"]].itertuples(False)}

    def arch(self, row: str) -> str:
        """The network ``row``'s runs trained (``model.arch``: ``convnet``, ``resnet20``)."""
        return self._arch_of[row]

    @property
    def mixed(self) -> bool:
        """Whether the runs trained more than one network: then every row's label names its network."""
        return len(set(self._arch_of.values())) > 1

    def label(self, row: str) -> str:
        """The row's label; where the runs mix networks, with its network when the label does not name it
        (``'Adam, lr 3e-3 (the study's ConvNet)'``; ``'ResNet-20, Adam, lr 3e-3'`` names it already)."""
        label = ROWS[row].label if row in ROWS else row
        network = network_label(self.arch(row))
        return f"{label} ({network})" if self.mixed and network not in label else label

    def table(self, name: str) -> pd.DataFrame:
        return metrics.tidy(self.runs, name)


@dataclass
class Drawn:
    """One figure's outcome: its file stem, title and caption, or the reason it was not drawn."""

    name: str
    title: str
    caption: str = ""
    skipped: str = ""


def apply_style() -> None:
    """The one style of every figure (seaborn whitegrid, paper context, readable fonts)."""
    sns.set_theme(context="paper", style="whitegrid", font_scale=1.15,
                  rc={"figure.dpi": 110, "savefig.dpi": 150, "axes.titlesize": "medium",
                      "legend.frameon": False, "pdf.fonttype": 42, "svg.fonttype": "none"})


def row_palette(rows: list[str]) -> dict[str, tuple]:
    """A fixed colour per row (:attr:`bnrotation.study.rows.RowSpec.colour`), so a row keeps its colour whichever
    rows are present; rows without a fixed colour get further ones, in registry order."""
    pal = {r: matplotlib.colors.to_rgb(spec.colour) for r, spec in ROWS.items() if spec.colour}
    extra = [r for r in sorted(rows, key=row_order) if r not in pal]
    pal.update(zip(extra, sns.color_palette("husl", max(len(extra), 1))))
    return pal


def load_data(root: Path, runs: list[Run]) -> Data:
    per_run = pd.DataFrame([run_metrics(r) for r in runs])
    per_run["label"] = [ROWS[r].label if r in ROWS else r for r in per_run["row"]]
    return Data(root, runs, per_run, row_palette(list(per_run["row"].unique())))


def runs_text(per_run: pd.DataFrame) -> str:
    """'n = 21 runs, 7 rows × 3 seeds', or the seeds per row when they differ; where the runs trained more than
    one network, how many rows each: '…; 10 rows of the study's ConvNet, 5 of ResNet-20'."""
    counts = per_run.groupby("row")["seed"].nunique()
    n_runs, n_rows = len(per_run), len(counts)
    networks = ""
    if "arch" in per_run and per_run["arch"].nunique() > 1:
        rows_of = per_run.drop_duplicates("row").groupby("arch", sort=False)["row"].count()
        networks = "; " + ", ".join(f"{k} row{'s' * (k != 1)} of {network_label(a)}" if i == 0 else
                                    f"{k} of {network_label(a)}" for i, (a, k) in enumerate(rows_of.items()))
    if counts.nunique() == 1:
        seeds = int(counts.iloc[0])
        return f"n = {n_runs} run{'s' * (n_runs != 1)}, {n_rows} row{'s' * (n_rows != 1)} × {seeds} " \
               f"seed{'s' * (seeds != 1)}" + networks
    per = ", ".join(f"{r} {int(counts[r])}" for r in sorted(counts.index, key=row_order))
    return f"n = {n_runs} runs; seeds per row: {per}" + networks


def span(counts: pd.Series) -> str:
    """'2,624' or '2,460–2,624': the range of per-row counts."""
    lo, hi = int(counts.min()), int(counts.max())
    return f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,}"


def footnote(fig: plt.Figure, d: Data, n: str) -> None:
    """Write ``n`` (what the figure rests on: runs, seeds, checks, points) into the image, under everything
    drawn; and when the runs are not at the article's scale (:func:`..results.at_protocol_scale`), a boxed
    warning above everything, saying their scale and that published figures in the image are for orientation
    only. Call it last: it places both outside the figure's drawn extent, which ``bbox_inches="tight"`` keeps."""
    import textwrap

    box = fig.get_tightbbox(fig.canvas.get_renderer())  # inches
    width_in, height_in = fig.get_size_inches()
    chars = max(60, int(box.width * 15))  # about 15 characters of small type per inch
    fig.text(box.x0 / width_in, (box.y0 - 0.08) / height_in, textwrap.fill(n, chars), ha="left", va="top",
             fontsize="small", color="0.2")
    if not at_protocol_scale(d.runs):
        warning = (f"Not the article's scale: {describe_scale(d.runs[0].scale)} (the article: "
                   f"{describe_scale(protocol_scale())}). Published figures shown here are for orientation only.")
        fig.text(box.x0 / width_in, (box.y1 + 0.12) / height_in, textwrap.fill(warning, chars), ha="left",
                 va="bottom", fontsize="small", color="#6b3d00",
                 bbox={"boxstyle": "round,pad=0.4", "facecolor": "#fff1cc", "edgecolor": "#c88a00"})


def norms(d: Data) -> dict[str, str]:
    """Per row, the normalisation its runs used (``model.norm`` in their ``config.yaml``): ``batch`` keeps
    running statistics; ``group`` and ``layer`` (GroupNorm, LayerNorm) have none to go stale."""
    return {r.row: str(r.config.get("model", {}).get("norm", ROWS[r.row].norm if r.row in ROWS else "batch"))
            for r in d.runs}


def _facets(n: int, wrap: int = 4, size: tuple[float, float] = (3.4, 2.7), sharey: bool = True,
            sharex: bool = True):
    cols = min(n, wrap)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(size[0] * cols, size[1] * rows), squeeze=False,
                             sharex=sharex, sharey=sharey)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _wrap(text: str, width: int = 30) -> str:
    import textwrap
    return "\n".join(textwrap.wrap(text, width))


def _outer_labels(axes: list, xlabel: str, ylabel: str) -> None:
    """Axis labels on the outer facets only; tick labels back on a facet with no facet below it."""
    for ax in axes:
        spec = ax.get_subplotspec()
        below = [b for b in axes if b.get_subplotspec().colspan == spec.colspan
                 and b.get_subplotspec().rowspan.start > spec.rowspan.start]
        ax.set_xlabel(xlabel if not below else "")
        if not below:
            ax.xaxis.set_tick_params(labelbottom=True)
        ax.set_ylabel(ylabel if spec.is_first_col() else "")


def _pct(ax, axis: str = "y") -> None:
    fmt = matplotlib.ticker.PercentFormatter(1.0, decimals=0)
    (ax.yaxis if axis == "y" else ax.xaxis).set_major_formatter(fmt)


def _log_axis(axis, which: str) -> None:
    """A log-scale axis labelled 0.5, 1, 2, 5, 10, ... (plain numbers, no minor labels)."""
    getattr(axis.axes, f"set_{which}scale")("log")
    axis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


# ----------------------------------------------------------------------------- 1, 2: one point per run
# Rows without running statistics (GroupNorm, LayerNorm) are drawn as squares, rows with them as circles; rows of
# ResNet-20, which share the colour of the study's row with the same optimizer, as triangles (dashed lines).
NO_RUNNING_STATS_MARKER, RUNNING_STATS_MARKER, RESNET_MARKER = "s", "o", "^"
NETWORK_STYLE = {"convnet": ("o", "-"), "resnet20": ("^", "--")}  # (marker, line style) per network
# The task of a row (per_run's ``task``, :data:`bnrotation.study.rows.TASKS`) by marker; a Fashion-MNIST row keeps the
# colour of its twin on the templates (the same optimizer and settings), so that the pair reads across tasks.
TASK_MARKER = {TASKS["noisy_templates"]: RUNNING_STATS_MARKER, TASKS["fashion_mnist"]: "D"}


def network_style(d: Data, row: str) -> tuple[str, str]:
    """(marker, line style) of ``row``: the study's ConvNet circles and solid lines, ResNet-20 triangles and
    dashed lines (:data:`NETWORK_STYLE`; another network like the study's)."""
    return NETWORK_STYLE.get(d.arch(row), NETWORK_STYLE["convnet"])


def _accuracy_scatter(d: Data, x: str, published_attr: str, xlabel: str, log: bool) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    handles, labels = [], []
    norm = norms(d)
    for row in d.rows:
        g = d.per_run[d.per_run["row"] == row]
        color = d.palette[row]
        batch = norm.get(row, "batch") == "batch"
        marker = (RESNET_MARKER if d.arch(row) == "resnet20" else TASK_MARKER.get(g["task"].iloc[0],
                                                                                 RUNNING_STATS_MARKER)) if batch \
            else NO_RUNNING_STATS_MARKER
        h = ax.scatter(g[x], g["acc_eval_mode"], s=42 if batch else 38, color=color, edgecolor="white",
                       linewidth=0.6, zorder=3, marker=marker)
        handles.append(h)
        labels.append(d.label(row) + ("" if batch else ": no running statistics"))
        spec = ROWS.get(row)
        pub = getattr(spec.published, published_attr) if spec and spec.published else math.nan
        if spec and spec.published and not math.isnan(pub):
            ax.scatter([pub], [spec.published.acc_eval_mode], s=110, facecolor="none", edgecolor=color,
                       linewidth=1.8, zorder=2)
    if log:
        _log_axis(ax.xaxis, "x")
        values = d.per_run[x].dropna()
        ax.set_xlim(min(0.3, values.min() / 1.3) if len(values) else 0.3,
                    max(40.0, values.max() * 1.3) if len(values) else 40.0)  # the published rows all fit
    ax.set_xlabel(xlabel)
    ax.set_ylabel("evaluation-mode accuracy\n(mean of the checks)")
    ax.set_ylim(0, 1.04)
    _pct(ax)
    ax.axhline(0.1, color="0.6", lw=0.8, ls=":", zorder=1)
    ax.text(ax.get_xlim()[0], 0.1, " chance", va="bottom", ha="left", fontsize="small", color="0.45")
    from matplotlib.lines import Line2D
    handles += [Line2D([], [], ls="", marker=RUNNING_STATS_MARKER, color="0.3", markersize=6),
                Line2D([], [], ls="", marker=NO_RUNNING_STATS_MARKER, color="0.3", markersize=6),
                Line2D([], [], ls="", marker="o", markerfacecolor="none", markeredgecolor="0.3",
                       markersize=9, markeredgewidth=1.6)]
    labels += ["one run, BatchNorm (filled circle)" if not d.mixed else
               f"one run, {network_label('convnet')}, BatchNorm (filled circle)",
               "one run, no running statistics: GroupNorm or\nLayerNorm, nothing to go stale (filled square)",
               "published row mean (hollow)"]
    if any(d.arch(row) == "resnet20" for row in d.rows):  # same colours as the study's rows: another marker
        handles.insert(-2, Line2D([], [], ls="", marker=RESNET_MARKER, color="0.3", markersize=7))
        labels.insert(-2, f"one run, {network_label('resnet20')}, BatchNorm (filled triangle;\nthe colour of the "
                          "study's row with its optimizer)")
    if (d.per_run["task"] == TASKS["fashion_mnist"]).any():  # a row's twin on real images: its colour, a diamond
        handles.insert(-2, Line2D([], [], ls="", marker=TASK_MARKER[TASKS["fashion_mnist"]], color="0.3",
                                  markersize=6))
        labels.insert(-2, f"one run on {TASKS['fashion_mnist']} (filled diamond; the colour of\nits row on the "
                          f"{TASKS['noisy_templates']})")
    ax.legend(handles, labels, loc="center left", bbox_to_anchor=(1.01, 0.5))
    footnote(fig, d, f"{runs_text(d.per_run)}: one point per run; accuracy: mean of each run's checks.")
    return fig


_FIGURES: list[tuple[str, str, Callable[[Data], tuple[plt.Figure, str]]]] = []


def figure(name: str, title: str):
    """Register a figure's drawing function under ``name`` (its file, ``figures/<name>.png``) and ``title``, in the
    order of definition: :data:`FIGURES`."""
    def register(draw: Callable[[Data], tuple[plt.Figure, str]]):
        _FIGURES.append((name, title, draw))
        return draw

    return register


def _scatter_figure(d: Data, against: str, columns: tuple[str, str], axis: str, log: bool,
                    caption: str) -> tuple[plt.Figure, str]:
    """Figures 1 and 2: evaluation-mode accuracy against ``against`` (the words), with their shared key."""
    key = (f"one filled point per run ({runs_text(d.per_run)}), coloured by row; squares: rows without running "
           "statistics (GroupNorm, LayerNorm); hollow markers are the article's row means")
    return (_accuracy_scatter(d, *columns, axis, log=log),
            f"Evaluation-mode accuracy against {against}, {key}{caption}")


@figure("01_accuracy_vs_rotation", "Evaluation-mode accuracy against rotation")
def fig_accuracy_vs_rotation(d: Data) -> tuple[plt.Figure, str]:
    return _scatter_figure(d, "rotation", ("rotation_per_100_deg", "rotation_deg_per_100"),
                           "rotation of the last conv layer per 100 steps (degrees, log scale)", True,
                           " (3 seeds each). Accuracy: mean of the checks in the check window; rotation: per 100-step "
                           "interval ending in that window, the median over the last conv layer's channels of the "
                           "angle each channel turned, averaged over the intervals. The article's central figure: "
                           "accuracy falls with rotation.")


@figure("02_accuracy_vs_norm_growth", "Evaluation-mode accuracy against norm growth")
def fig_accuracy_vs_norm_growth(d: Data) -> tuple[plt.Figure, str]:
    return _scatter_figure(d, "norm growth", ("norm_growth", "norm_growth"),
                           "norm growth of the last conv layer, ‖W(end)‖ / ‖W(0)‖ (×)", False,
                           ". The relation the article rejects: the row with the radial part projected out grows "
                           "less than Adam and does worse.")


# ----------------------------------------------------------------------------- 3: accuracy over steps
def _band(ax, steps, mean, lo, hi, color, label, ls="-"):
    ax.plot(steps, mean, color=color, lw=1.6, ls=ls, label=label)
    ax.fill_between(steps, lo, hi, color=color, alpha=0.2, lw=0)


@figure("03_accuracy_over_steps", "Training- and evaluation-mode accuracy over steps")
def fig_accuracy_over_steps(d: Data) -> tuple[plt.Figure, str]:
    checks = d.table("checks")
    rows = d.rows
    fig, axes = _facets(len(rows))
    modes = (("acc_train_mode", "training mode (held-out set's own batch statistics)", "0.25", "--"),
             ("acc_eval_mode", "evaluation mode (running statistics)", None, "-"))
    n_checks = []
    for ax, row in zip(axes, rows):
        g = checks[checks["row"] == row]
        n_checks.append(len(g))
        for col, label, color, ls in modes:
            s = g.groupby("step")[col].agg(["mean", "min", "max"])
            _band(ax, s.index, s["mean"], s["min"], s["max"], color or d.palette[row], label, ls)
        ax.set_title(_wrap(d.label(row), 34))
        ax.set_ylim(0, 1.04)
        _pct(ax)
        ax.axhline(0.1, color="0.6", lw=0.8, ls=":")
    _outer_labels(axes, "step", "accuracy on the held-out set")
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color="0.25", ls="--", lw=1.6), Line2D([], [], color="0.45", ls="-", lw=1.6)]
    fig.legend(handles, [m[1] for m in modes], loc="lower center", bbox_to_anchor=(0.5, 1.0),
               ncol=1 if len(rows) < 3 else 2)
    fig.tight_layout()
    footnote(fig, d, f"{runs_text(d.per_run)}; {sum(n_checks):,} checks. Line: mean over seeds; band: lowest to "
                     "highest seed.")
    return fig, (f"Training- and evaluation-mode accuracy on the held-out set at every check, per row; line: mean "
                 f"over seeds, band: lowest to highest seed ({runs_text(d.per_run)}; {sum(n_checks)} checks). "
                 "Evaluation mode in the row's colour, training mode dashed grey; dotted: chance (10%).")


# ----------------------------------------------------------------------------- 4: rotation over steps
def _rotation_frame(d: Data) -> pd.DataFrame:
    frames = []
    for r in d.runs:
        s = metrics.rotation_per_100_series(r)
        frames.append(pd.DataFrame({"row": r.row, "seed": r.seed, "step": s.index, "rotation": s.to_numpy()}))
    return pd.concat(frames, ignore_index=True)


def theory_by_row(d: Data) -> dict[str, tuple[theory.Prediction, pd.DataFrame]]:
    """Per row, the equilibrium prediction at the row's configured learning rate, and its net rotation
    per 100 steps at every check step's logged learning rate (``step``, ``net_deg_per_100``)."""
    out = {}
    checks = d.table("checks")
    for r in d.runs:
        if r.row in out:
            continue
        opt = r.config["optimizer"]
        pred = theory.predict(opt)
        lr = checks[checks["row"] == r.row].groupby("step")["lr"].mean()
        net = [theory.predict(opt, lr=v).net_deg_per_100 for v in lr]
        out[r.row] = (pred, pd.DataFrame({"step": lr.index, "net_deg_per_100": net}))
    return out


@figure("04_rotation_over_steps", "Rotation over steps, with the learning rate and the equilibrium prediction")
def fig_rotation_over_steps(d: Data) -> tuple[plt.Figure, str]:
    rot = _rotation_frame(d)
    checks = d.table("checks")
    preds = theory_by_row(d)
    rows = d.rows
    fig, axes = _facets(len(rows), size=(3.6, 2.8), sharey=True)
    first, last = metrics.check_window(d.runs[0])
    for ax, row in zip(axes, rows):
        g = rot[rot["row"] == row].groupby("step")["rotation"].agg(["mean", "min", "max"])
        g = g[g["mean"] > 0]
        _band(ax, g.index, g["mean"], g["min"], g["max"], d.palette[row], "measured")
        _log_axis(ax.yaxis, "y")
        ax.axvspan(first, last, color="0.9", zorder=0, lw=0)
        pred, series = preds[row]
        if pred.applies:
            ax.plot(series["step"], series["net_deg_per_100"], color="black", ls="--", lw=1.2)
        lr = checks[checks["row"] == row].groupby("step")["lr"].mean()
        twin = ax.twinx()
        twin.plot(lr.index, lr.to_numpy(), color="0.35", ls=":", lw=1.4)
        twin.set_ylim(0, max(float(lr.max()) * 1.15, 1e-12) if len(lr) else 1)
        twin.grid(False)
        twin.tick_params(labelsize="x-small", colors="0.35")
        twin.yaxis.get_offset_text().set_fontsize("x-small")
        twin.set_ylabel("learning rate", fontsize="x-small", color="0.35")
        ax.set_title(_wrap(d.label(row), 34))
    _outer_labels(axes, "step", "rotation per 100 steps (°)")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    handles = [Line2D([], [], color="0.4", lw=1.6), Line2D([], [], color="black", ls="--", lw=1.2),
               Line2D([], [], color="0.35", ls=":", lw=1.4), Patch(color="0.9")]
    labels = ["measured (mean over seeds; band: seed range)",
              "equilibrium prediction, net angle per 100 steps\n(rows with weight decay only)",
              "learning rate at the checks (right axis)", "check window"]
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=1 if len(rows) < 3 else 2)
    fig.tight_layout()
    footnote(fig, d, f"{runs_text(d.per_run)}; {len(rot):,} intervals. Per interval: the median over the last conv "
                     "layer's channels.")
    applies = [f"{row}: {p.net_deg_per_100:.2f}° net ({p.path_deg_per_100:.1f}° summed over the steps)"
               for row, (p, _) in preds.items() if p.applies]
    return fig, (f"Rotation of the last conv layer per 100 steps over training, per row ({runs_text(d.per_run)}): "
                 "per interval the median over channels of the angle turned, scaled to 100 steps; line: mean over "
                 "seeds, band: seed range; log scale. Dotted, right axis: the learning rate logged at the checks. "
                 "Dashed: the rotational-equilibrium prediction where one applies (weight decay > 0: SGD with "
                 "momentum, sqrt(2ηλ/(1+α)) rad per step, Wan et al. 2021; AdamW, sqrt(2ηλ(1−β1)/(1+β1)), Kosson "
                 "et al. 2024), converted to the net angle over 100 steps of a momentum-averaged random walk "
                 "(k(100, 0.9) ≈ 41.5 steps' worth, see theory.py)"
                 + (f": {'; '.join(applies)}." if applies else ". No row here has weight decay, so none applies.")
                 + " Rows without weight decay have no equilibrium and no prediction.")


# ----------------------------------------------------------------------------- 5: lag, measured vs predicted
@figure("05_lag_measured_vs_predicted", "Running-mean lag per channel, measured against predicted")
def fig_lag_measured_vs_predicted(d: Data) -> tuple[plt.Figure, str]:
    ch = d.table("channels")
    ch = ch[(ch["layer"] == metrics.MIDDLE_CONV) & ch["in_window"] & (ch["step"] > 0)]
    ch = ch.assign(measured=ch["lag_sigma"].abs())
    ch = ch[(ch["measured"] > 0) & (ch["predicted_lag_sigma"] > 0)]
    rows = [r for r in d.rows if (ch["row"] == r).any()]
    if not rows:
        raise Skip("no run has running statistics and a logged lag in the middle layer")
    fig, axes = _facets(len(rows), size=(3.1, 3.0))
    lo = float(min(ch["measured"].quantile(0.001), ch["predicted_lag_sigma"].quantile(0.001)))
    hi = float(max(ch["measured"].max(), ch["predicted_lag_sigma"].max()))
    lo, hi = max(lo, 1e-5), hi * 1.5
    n_points = []
    for ax, row in zip(axes, rows):
        g = ch[ch["row"] == row]
        n_points.append(len(g))
        ax.scatter(g["predicted_lag_sigma"], g["measured"], s=4, alpha=0.25, color=d.palette[row], lw=0,
                   rasterized=True)
        ax.plot([lo, hi], [lo, hi], color="0.3", lw=1, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ratio = g["measured"].median() / g["predicted_lag_sigma"].median()
        ax.text(0.04, 0.96, f"medians: {g['measured'].median():.2g}σ measured,\n"
                            f"{g['predicted_lag_sigma'].median():.2g}σ predicted (×{ratio:.2g})",
                transform=ax.transAxes, va="top", fontsize="x-small")
        ax.set_title(_wrap(d.label(row), 30))
    _outer_labels(axes, "predicted lag, drift·(1−m)/m (σ)", "measured |lag| (σ)")
    fig.tight_layout()
    footnote(fig, d, f"{runs_text(d.per_run[d.per_run['row'].isin(rows)])}; {sum(n_points):,} points (channel × "
                     f"logged step × seed), {span(pd.Series(n_points))} per row. Rows without running statistics "
                     "have no lag.")
    return fig, (f"Measured against predicted running-mean lag per channel of the middle layer (conv2 → bn2), "
                 f"log-log, per row; one point per channel, logged step in the check window and seed "
                 f"({runs_text(d.per_run[d.per_run['row'].isin(rows)])}; {sum(n_points):,} points, "
                 f"{span(pd.Series(n_points))} per row). Measured: |running mean − fresh mean| / fresh std "
                 "on the probe set; predicted: the article's formula, drift per step × (1 − m)/m with the row's "
                 "BatchNorm momentum m. Dashed: equality.")


# ----------------------------------------------------------------------------- 6, 7: interventions at failing checks
def failing_lines(d: Data) -> pd.DataFrame:
    """Every ``interventions`` line at the failing checks (stored statistics below 90%) of every run."""
    frames = []
    for r in d.runs:
        steps = metrics.failing_steps(r, FAIL_BELOW)
        iv = r.tables.get("interventions")
        if steps and iv is not None:
            frames.append(iv[iv["step"].isin(steps)])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


@figure("06_single_layer_fresh_statistics", "Fresh statistics for one layer at a time, at the failing checks")
def fig_single_layer(d: Data) -> tuple[plt.Figure, str]:
    wide = metrics.failing_checks(d.runs, FAIL_BELOW)
    if wide.empty:
        raise Skip(f"no failing check (evaluation-mode accuracy below {FAIL_BELOW:.0%} with the stored "
                   "statistics at an intervention step) in these runs")
    all_layers = sorted(c for c in wide.columns if c not in ("step", "stored", "reestimated", "k_needed", "channels",
                                                             "row", "seed"))
    lift = article.MIDDLE_LIFT[0]  # the lowest accuracy the article reports with the middle layer alone fresh
    lift_text = cell(lift.value, "pct", digits=0)
    rows = [r for r in d.rows if (wide["row"] == r).any()]
    layers_of = {row: [la for la in all_layers if wide.loc[wide["row"] == row, la].notna().any()] for row in rows}
    same = len({tuple(v) for v in layers_of.values()}) == 1  # one network: one set of layers, shared x axes
    fig, axes = _facets(len(rows), size=(3.6, 3.0) if same else (5.2, 3.2), sharex=same)
    counts = []
    for ax, row in zip(axes, rows):
        layers = layers_of[row]
        columns = ["stored", *layers, "reestimated"]
        order = ["stored"] + [f"{depth.short_name(name)} fresh" for name in layers] + ["all fresh"]
        g = wide.loc[wide["row"] == row, columns]
        counts.append(f"{row} {len(g)}")
        for _, line in g.iterrows():
            ax.plot(range(len(order)), line.to_numpy(), color=d.palette[row], alpha=0.35, lw=1, marker="o",
                    markersize=3)
        ax.plot(range(len(order)), g.mean().to_numpy(), color="black", lw=0, marker="_", markersize=16,
                markeredgewidth=2)
        if f"{metrics.MIDDLE_NORM} fresh" in order:  # the article's figure belongs to the middle layer's column only
            x = order.index(f"{metrics.MIDDLE_NORM} fresh")
            ax.hlines(lift.value, x - 0.45, x + 0.45, color="0.3", ls="--", lw=1.2, zorder=3)
        ax.set_xticks(range(len(order)), order, rotation=35 if same else 90, ha="right" if same else "center",
                      fontsize=None if len(order) < 10 else "xx-small")
        ax.set_ylim(0, 1.04)
        _pct(ax)
        ax.set_title(_wrap(d.label(row), 34) + f"\n{len(g)} failing check{'s' * (len(g) != 1)}")
    _outer_labels(axes, "", "evaluation-mode accuracy")
    from matplotlib.lines import Line2D
    key = [(Line2D([], [], color="0.45", alpha=0.6, lw=1, marker="o", markersize=3),
            "one failing check (seed × step), in the row's colour"),
           (Line2D([], [], color="black", lw=0, marker="_", markersize=16, markeredgewidth=2), "mean"),
           (Line2D([], [], color="0.3", ls="--", lw=1.2),
            f"article: {lift_text}, the lowest accuracy it reports with fresh bn2 statistics alone")]
    fig.tight_layout()
    fig.legend(*zip(*key), loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3)
    footnote(fig, d, f"{runs_text(d.per_run[d.per_run['row'].isin(rows)])}; {len(wide)} failing checks in all "
                     f"(evaluation-mode accuracy below {FAIL_BELOW:.0%} with the stored statistics, at an "
                     "intervention step).")
    return fig, (f"Evaluation-mode accuracy at the failing checks (below {FAIL_BELOW:.0%} with the stored running "
                 "statistics, at the intervention steps) after giving fresh (re-estimated) statistics to one "
                 "BatchNorm layer at a time, the stored ones elsewhere; \"all fresh\": every layer re-estimated. "
                 f"One line per failing check (seed × step), black bar: mean. Failing checks per row: "
                 f"{', '.join(counts)}. Dashed, in the bn2 column: {lift_text}, the lowest accuracy the article reports "
                 "for the middle layer (bn2) alone.")


@figure("07_top_k_channels", "Accuracy against the number of top-lag channels given fresh statistics")
def fig_top_k(d: Data) -> tuple[plt.Figure, str]:
    iv = failing_lines(d)
    if iv.empty:
        raise Skip(f"no failing check (evaluation-mode accuracy below {FAIL_BELOW:.0%}) in these runs")
    top = iv[iv["intervention"] == "top_k"]
    rows = [r for r in d.rows if (top["row"] == r).any()]
    totals = {row: int(top.loc[top["row"] == row, "k"].max()) for row in rows}  # all channels of the row's network
    total = max(totals.values())
    one_total = len(set(totals.values())) == 1
    networks = {d.arch(r): totals[r] for r in rows}
    all_k = f"k = {total}" if one_total else "k = all channels of the row's network (" + ", ".join(
        f"{network_label(a)}: {k}" for a, k in networks.items()) + ")"
    threshold = intervention_log.RECOVERY_THRESHOLD
    k_needed = metrics.failing_checks(d.runs, FAIL_BELOW)  # the smallest grid k reaching it, per failing check
    fig, axes = _facets(len(rows), size=(3.9, 2.8), sharex=one_total)
    counts = []
    for ax, row in zip(axes, rows):  # one panel per row: its failing checks, thin, and their median
        n_all = totals[row]
        g = top[top["row"] == row]
        checks = g.groupby(["seed", "step"])
        counts.append(f"{row} {checks.ngroups}")
        for _, c in checks:
            c = c.sort_values("k")
            ax.plot(c["k"], c["acc_eval_mode"], color=d.palette[row], lw=0.8, alpha=0.3)
        median = g.groupby("k")["acc_eval_mode"].median()
        ax.plot(median.index, median.to_numpy(), color=d.palette[row], lw=2.2, marker="o", markersize=3.5)
        ax.axhline(threshold, color="0.3", ls=":", lw=1)
        needed = k_needed.loc[k_needed["row"] == row, "k_needed"].dropna()  # (failing checks reaching it,)
        reach = (f"; k to {threshold:.0%}: {needed.median():g}" if len(needed) else f"; none reaches {threshold:.0%}") \
            + (f" ({needed.min():g}–{needed.max():g})" if needed.nunique() > 1 else "")
        ax.set_xscale("symlog", base=2, linthresh=1)
        ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator([t for t in (0, 1, 4, 16, 64) if 2 * t <= n_all]
                                                                  + [n_all]))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlim(0, n_all * 1.1)
        ax.set_ylim(0, 1.04)
        _pct(ax)
        ax.set_title(_wrap(d.label(row), 34) + f"\n{checks.ngroups} failing check{'s' * (checks.ngroups != 1)}"
                     + reach + ("" if one_total else f"; of {n_all}"))
    _outer_labels(axes, f"channels given fresh statistics, k\n(largest |lag| first, of {total})" if one_total else
                  "channels given fresh statistics, k\n(largest |lag| first; the right end: all)",
                  "evaluation-mode accuracy")
    from matplotlib.lines import Line2D
    key = [(Line2D([], [], color="0.45", lw=0.8, alpha=0.5), "one failing check (seed × step), in the row's colour"),
           (Line2D([], [], color="0.3", lw=2.2, marker="o", markersize=3.5), "median over the row's failing checks"),
           (Line2D([], [], color="0.3", ls=":", lw=1), f"{threshold:.0%}, the recovery threshold")]
    fig.tight_layout()
    fig.legend(*zip(*key), loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3)
    footnote(fig, d, f"{runs_text(d.per_run[d.per_run['row'].isin(rows)])}; "
                     f"{top.groupby(['row', 'seed', 'step']).ngroups} failing checks in all (below {FAIL_BELOW:.0%} "
                     f"with the stored statistics, at an intervention step); k = 0: stored statistics, {all_k}: "
                     "all re-estimated.")
    return fig, (f"Evaluation-mode accuracy against the number k of channels given fresh statistics, channels "
                 f"ranked by |running-mean lag| across all BatchNorm layers (k = 0: stored statistics; {all_k}: "
                 f"all re-estimated), at the failing checks (below {FAIL_BELOW:.0%} with stored statistics), one "
                 f"panel per row: thin lines, each failing check; thick line, their median; dotted, "
                 f"{threshold:.0%}; in each title, the median (and range) over the row's failing checks of the "
                 "smallest k on the grid 0, 1, 2, 4, ... that reaches it. Failing checks per row: "
                 f"{', '.join(counts)}. "
                 "An open question of the article: how few channels carry the damage.")


# ----------------------------------------------------------------------------- 8: drift per channel
@figure("08_drift_per_channel", "Drift per channel of the middle layer")
def fig_drift(d: Data) -> tuple[plt.Figure, str]:
    ch = d.table("channels")
    ch = ch[(ch["layer"] == metrics.MIDDLE_CONV) & ch["in_window"] & (ch["drift_sigma_per_step"] > 0)]
    if ch.empty:
        raise Skip("no drift logged in the middle layer inside the check window")
    rows = [r for r in d.rows if (ch["row"] == r).any()]
    ch = ch.assign(label=ch["row"].map(d.label))  # the label the order below uses (with its network, if mixed)
    fig, ax = plt.subplots(figsize=(7.6, 0.55 * len(rows) + 1.6))
    with warnings.catch_warnings():  # seaborn 0.13.2 passes matplotlib 3.11's deprecated `vert`
        warnings.simplefilter("ignore", matplotlib.MatplotlibDeprecationWarning)
        sns.boxplot(data=ch, x="drift_sigma_per_step", y="label", order=[d.label(r) for r in rows], hue="label",
                    hue_order=[d.label(r) for r in rows], palette={d.label(r): d.palette[r] for r in rows},
                    log_scale=True, whis=(5, 95), fliersize=0, width=0.6, ax=ax, legend=False)
    for row, drift in article.MIDDLE_DRIFT.items():
        ax.axvline(drift.value, color=d.palette.get(row, "0.3"), ls="--", lw=1.2)
        ax.text(drift.value, -0.7, f"article median,\n{row}: {drift.value}", ha="center", va="bottom",
                fontsize="x-small")
    marks = [drift.value for drift in article.MIDDLE_DRIFT.values()]
    medians = " and ".join(f"{ROWS[row].short} ({cell(drift.value, 'plain', digits=drift.decimals)})"
                           for row, drift in article.MIDDLE_DRIFT.items())
    ax.set_xlim(min(float(ch["drift_sigma_per_step"].quantile(0.002)), *marks) / 1.5,
                max(float(ch["drift_sigma_per_step"].quantile(0.998)), *marks) * 1.5)
    ax.set_xlabel("drift of the fresh mean, middle layer (σ per step, log scale)")
    ax.set_ylabel("")
    n = ch.groupby("row").size()
    interval = pd.Series([int(r.config["scale"]["log_every"]) for r in d.runs])
    footnote(fig, d, f"{runs_text(d.per_run[d.per_run['row'].isin(rows)])}; {span(n)} values per row (channel × "
                     f"logged interval in the check window × seed); Δ = {span(interval)} steps.")
    return fig, (f"Drift per channel of the middle layer (conv2 → bn2): |fresh mean(t) − fresh mean(t − Δ)| / "
                 f"(fresh std · Δ) on the fixed probe set, one value per channel, logged interval ending in the "
                 f"check window, and seed ({runs_text(d.per_run[d.per_run['row'].isin(rows)])}; "
                 f"{span(n)} values per row). Box: quartiles and median; whiskers: 5th "
                 f"to 95th percentile. Dashed: the article's medians under {medians}, whose Δ "
                 f"the article does not give; here Δ is the log interval, {span(interval)} steps. Drift falls as Δ "
                 "grows: `lag.md` tabulates it up to "
                 f"{lag.INTERVAL_MULTIPLES[-1]} intervals.")


# ----------------------------------------------------------------------------- 9: weight averaging
@figure("09_averaging", "Weight averaging (EMA, tail average) and BatchNorm statistics policies")
def fig_averaging(d: Data) -> tuple[plt.Figure, str]:
    frames = [averaging_report.run_values(r).assign(row=r.row, seed=r.seed) for r in d.runs]
    frames = [f for f in frames if not f.empty]
    if not frames:
        raise Skip("no averaging results (the averaging table is absent or empty in every run)")
    av = pd.concat(frames, ignore_index=True)
    av = av.assign(model=[averaging_report.averaged_model(line) for _, line in av.iterrows()])
    rows = [r for r in d.rows if (av["row"] == r).any()]
    present = set(av["policy"])
    policies = [p for p in averaging_report.POLICY_ORDER if p in present] + sorted(present - set(averaging_report.POLICY_ORDER))
    kinds = av.drop_duplicates("model")
    order = {a: i for i, a in enumerate(averaging_report.AVERAGE_ORDER)}
    models = [m for _, _, _, m in sorted(zip(kinds["average"].map(order).fillna(len(order)),
                                            kinds["decay"].fillna(0.0), kinds["window_steps"], kinds["model"]))]
    fig, axes = _facets(len(rows), size=(3.8, 3.0))
    colors = dict(zip(models, sns.color_palette("dark", len(models))))
    for ax, row in zip(axes, rows):
        sns.pointplot(data=av[av["row"] == row], x="policy", y="acc_eval_mode", hue="model", order=policies,
                      hue_order=models, palette=colors, errorbar=("pi", 100), dodge=0.5, markersize=4,
                      linestyle="none", err_kws={"linewidth": 1.2}, ax=ax, legend=False)
        ax.set_ylim(0, 1.04)
        _pct(ax)
        ax.set_title(_wrap(d.label(row), 34))
        ax.tick_params(axis="x", rotation=25)
    _outer_labels(axes, "BatchNorm buffer policy", "evaluation-mode accuracy")
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], ls="", marker="o", color=colors[m]) for m in models]
    fig.legend(handles, models, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=min(len(models), 4))
    fig.tight_layout()
    steps = av.groupby("row")["steps"].max()
    footnote(fig, d, f"{runs_text(d.per_run[d.per_run['row'].isin(rows)])}; {span(steps)} evaluations per run. "
                     "Point: mean over seeds; bar: range over seeds.")
    return fig, (f"Weight averaging and BatchNorm statistics, per row: evaluation-mode accuracy of the live weights, "
                 f"exponential moving averages (EMA) of the weights and the tail average, under each policy for the "
                 f"BatchNorm buffers (none: the live model's own; copy: one constituent's; average: the mean of the "
                 f"buffers; mixture: their law-of-total-variance mixture; refresh: re-estimated on the averaged "
                 f"weights). Point: mean over seeds of each run's mean over its evaluations in the check window "
                 f"({span(steps)} per run); bar: range over seeds "
                 f"({runs_text(d.per_run[d.per_run['row'].isin(rows)])}). The same numbers, with spreads: "
                 f"averaging.md (make table).")


# ----------------------------------------------------------------------------- 10: lag against depth (ResNet-20)
@figure("10_lag_by_depth", "ResNet-20: running-mean lag against depth, per BatchNorm layer")
def fig_lag_by_depth(d: Data) -> tuple[plt.Figure, str]:
    rows = [r for r in d.rows if d.arch(r) == "resnet20"]
    runs = {row: [r for r in d.runs if r.row == row] for row in rows}
    per_seed = {row: [depth.layer_profile(r) for r in runs[row]] for row in rows}
    rows = [row for row in rows if any(len(p) for p in per_seed[row])]
    if not rows:
        raise Skip(f"no {network_label('resnet20')} run with a logged lag (rows resnet20_*): the study's network has "
                   "only three BatchNorm layers")
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.4), sharey=True)
    columns = (("lag_window_median_abs_sigma", "median |lag| over the layer's (step, channel) pairs"),
               ("lag_window_max_abs_sigma", "worst channel: largest |lag| over the same pairs"))
    names = []
    for ax, (column, title) in zip(axes, columns):
        for row in rows:
            profile = depth.row_profile(runs[row])
            names = names if len(names) >= len(profile) else list(profile["norm_layer"].where(
                profile["norm_layer"] != "", profile["layer"]))
            seeds = pd.concat([p.assign(seed=i) for i, p in enumerate(per_seed[row]) if len(p)])
            band = seeds.groupby("depth")[column].agg(["min", "max"])
            ax.fill_between(band.index, band["min"], band["max"], color=d.palette[row], alpha=0.15, lw=0)
            rho = depth.depth_rho(profile)
            ax.plot(profile["depth"], profile[column], color=d.palette[row], lw=1.6, marker="^", markersize=4,
                    label=f"{d.label(row)} (ρ of the median with depth {cell(rho, 'rho')})")
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xticks(range(len(names)), [depth.short_name(n) for n in names], rotation=90, fontsize="x-small")
        for i in range(1, len(names)):  # stage boundaries: the stem, then layer1, layer2, layer3
            if names[i].split(".")[0] != names[i - 1].split(".")[0]:
                ax.axvline(i - 0.5, color="0.6", lw=0.8, ls=":")
        ax.set_xlabel("BatchNorm layer, in forward order (depth 0: the stem)")
    axes[0].set_ylabel("|running-mean lag| (σ, log scale)")
    fig.tight_layout()
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2)
    pairs = pd.concat([p for row in rows for p in per_seed[row]])["n"]
    text = (f"{runs_text(d.per_run[d.per_run['row'].isin(rows)])}; {len(names)} BatchNorm layers per run; "
            f"{span(pairs)} (step, channel) pairs per layer and run, in the check window. Line: mean over seeds of "
            "each run's value per layer; band: lowest to highest seed.")
    footnote(fig, d, text)
    return fig, (f"Running-mean lag against depth in {network_label('resnet20')}: per BatchNorm layer, in the "
                 "forward order the runner logs the layers in (the two projection shortcuts' norm layers, "
                 "`…sc`, after their block's second conv), the median |running mean − fresh mean| / fresh std over "
                 "the layer's (step, channel) pairs in the check window (left) and the largest (right), per row "
                 f"({text.rstrip('.')}). Dotted: stage boundaries. In the key, Spearman's ρ of each row's profile "
                 "with depth; "
                 "estimation shift (Huang et al., CVPR 2022) predicts the lag to grow with depth "
                 "(`resnet_lag_grows_with_depth` tests it on the Adam row).")


# ----------------------------------------------------------------------------- 11: cosine decay, mid-run
@figure("11_cosine_mid_run", "Cosine decay: accuracy and lag against the learning rate at each check")
def fig_cosine_mid_run(d: Data) -> tuple[plt.Figure, str]:
    rows = [r for r in d.rows if r in ROWS and ROWS[r].schedule == "cosine"]
    if not rows:
        raise Skip("no runs of a cosine-decay row (adam_cosine, resnet20_adam_cosine)")
    frames = [midrun.over_checks(r).assign(row=r.row, seed=r.seed) for r in d.runs if r.row in rows]
    checks = pd.concat(frames, ignore_index=True)
    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.0))
    panels = (("acc_eval_mode", "evaluation-mode accuracy"),
              ("lag_network_median_abs_sigma", "median |running-mean lag| over every\nBatchNorm channel (σ, log scale)"))
    for ax, (column, ylabel) in zip(axes, panels):
        for row in rows:
            g = checks[checks["row"] == row]
            marker, ls = network_style(d, row)
            ax.scatter(g["lr"], g[column], color=d.palette[row], marker=marker, s=10, alpha=0.35, lw=0)
            mean = g.groupby("step")[[column, "lr"]].mean()
            ax.plot(mean["lr"], mean[column], color=d.palette[row], ls=ls, lw=1.6, label=d.label(row))
            split = float(g.groupby("seed")["lr"].median().mean())
            ax.axvline(split, color=d.palette[row], ls=ls, lw=0.8, alpha=0.6)
        ax.invert_xaxis()  # the rate decays: the run goes from left to right
        ax.set_xlabel("learning rate at the check (decays left to right)")
        ax.set_ylabel(ylabel)
        ax.xaxis.get_offset_text().set_fontsize("x-small")
    axes[0].set_ylim(0, 1.04)
    _pct(axes[0])
    axes[0].axhline(FAIL_BELOW, color="0.3", ls=":", lw=1)
    if checks["lag_network_median_abs_sigma"].gt(0).any():
        axes[1].set_yscale("log")
    from matplotlib.lines import Line2D
    handles, labels = axes[0].get_legend_handles_labels()
    styles = {d.arch(r) for r in rows}
    for arch in NETWORK_STYLE:
        if arch in styles:
            marker, ls = NETWORK_STYLE[arch]
            handles.append(Line2D([], [], color="0.3", ls=ls, marker=marker, markersize=5))
            labels.append(f"{network_label(arch)}: {'triangles, dashed' if arch == 'resnet20' else 'circles, solid'} "
                          "(one point per check and seed; line: mean over seeds)")
    handles.append(Line2D([], [], color="0.3", lw=0.8))
    labels.append("thin vertical: the median rate of the window, which splits high- from low-rate checks")
    fig.tight_layout()
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=1)
    per_run = checks.groupby(["row", "seed"]).size()
    text = (f"{runs_text(d.per_run[d.per_run['row'].isin(rows)])}; {span(per_run)} checks per run, "
            f"{len(checks):,} in all.")
    footnote(fig, d, text)
    return fig, ("Checkpoints under cosine decay to 0, against the learning rate at each check of the window: "
                 "evaluation-mode accuracy (left; dotted: 90%) and the median |running-mean lag| over every "
                 f"BatchNorm channel of the network at that check (right), per cosine row ({text.rstrip('.')}). "
                 "The same colour "
                 "for both networks' cosine rows: the study's ConvNet in circles and solid lines, ResNet-20 in "
                 "triangles and dashed lines. The article expects the failures of a decaying schedule to fall on "
                 "checkpoints taken while the rate is still high (`resnet_cosine_high_rate_checks_exposed`).")


# ----------------------------------------------------------------------------- 12: top-k, both networks
@figure("12_top_k_both_networks", "How many channels carry the damage, both networks side by side")
def fig_top_k_networks(d: Data) -> tuple[plt.Figure, str]:
    iv = failing_lines(d)
    top = iv[iv["intervention"] == "top_k"] if len(iv) else iv
    rows = [r for r in d.rows if len(top) and (top["row"] == r).any()]
    archs = list(dict.fromkeys(d.arch(r) for r in rows))
    if "resnet20" not in archs:
        raise Skip(f"no failing check in a {network_label('resnet20')} run: nothing to set beside the study's network")
    fig, axes = plt.subplots(1, len(archs), figsize=(5.4 * len(archs), 3.9), sharey=True, squeeze=False)
    threshold = intervention_log.RECOVERY_THRESHOLD
    counts = []
    for ax, arch in zip(axes[0], archs):
        totals = []
        for row in [r for r in rows if d.arch(r) == arch]:
            g = top[(top["row"] == row) & (top["k"] > 0)]
            total = int(g["k"].max())
            totals.append(total)
            marker, ls = network_style(d, row)
            for _, c in g.groupby(["seed", "step"]):
                c = c.sort_values("k")
                ax.plot(c["k"] / total, c["acc_eval_mode"], color=d.palette[row], lw=0.7, alpha=0.2, ls=ls)
            median = g.groupby("k")["acc_eval_mode"].median()
            n = g.groupby(["seed", "step"]).ngroups
            counts.append(f"{row} {n}")
            ax.plot(median.index / total, median.to_numpy(), color=d.palette[row], lw=2.0, ls=ls, marker=marker,
                    markersize=4, label=f"{d.label(row)}: {n} failing check{'s' * (n != 1)}")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0, decimals=1))
        ax.axhline(threshold, color="0.3", ls=":", lw=1)
        ax.set_ylim(0, 1.04)
        _pct(ax)
        ax.set_title(f"{network_label(arch)}: {' / '.join(map(str, sorted(set(totals))))} channels")
        ax.set_xlabel("share of all channels given fresh statistics\n(largest |lag| first; log scale)")
    axes[0][0].set_ylabel("evaluation-mode accuracy")
    fig.tight_layout()
    from matplotlib.lines import Line2D
    handles = [h for ax in axes[0] for h in ax.get_legend_handles_labels()[0]]
    labels = [label for ax in axes[0] for label in ax.get_legend_handles_labels()[1]]
    fig.legend(handles + [Line2D([], [], color="0.3", ls=":", lw=1)],
               labels + [f"{threshold:.0%}, the recovery threshold"], loc="lower center", bbox_to_anchor=(0.5, 1.0),
               ncol=2 if len(labels) > 3 else 1, fontsize="small")
    text = (f"{runs_text(d.per_run[d.per_run['row'].isin(rows)])}; "
            f"{top.groupby(['row', 'seed', 'step']).ngroups} failing checks in all (below {FAIL_BELOW:.0%} with the "
            "stored statistics, at an intervention step): " + ", ".join(counts) + ".")
    footnote(fig, d, text)
    return fig, ("How many channels carry the damage, in both networks side by side: evaluation-mode accuracy at "
                 "the failing checks against the share of all BatchNorm channels given fresh statistics, channels "
                 "ranked by |running-mean lag| across the network (k = 1, 2, 4, … and all, as a share of the "
                 "network's channels; k = 0, the stored statistics, is left off the log axis). Thin lines: each "
                 f"failing check; thick: their median per row; dotted: {threshold:.0%}. The study's ConvNet in "
                 f"circles and solid lines, ResNet-20 in triangles and dashed lines, in the colour of the row's "
                 f"optimizer ({text.rstrip('.')}). `resnet_top_k_channel_share` gives the shares.")


# ----------------------------------------------------------------------------- 13: both tasks


@figure("13_accuracy_vs_rotation_both_tasks", "Evaluation-mode accuracy against rotation, the templates and "
        "Fashion-MNIST")
def fig_accuracy_vs_rotation_by_task(d: Data) -> tuple[plt.Figure, str]:
    """The article's seven rows on both tasks: evaluation-mode accuracy against the last conv layer's rotation,
    one point per run, circles on the templates and diamonds on Fashion-MNIST, each pair of twins in one colour.

    Raises:
        Skip: when the runs hold no Fashion-MNIST run of these rows (nothing to set beside the templates).
    """
    twins = {row: row for row in ARTICLE_ROWS} | {on_fashion_mnist(row): row for row in ARTICLE_ROWS}
    per_run = d.per_run[d.per_run["row"].isin(twins) & (d.per_run["arch"] == "convnet")]
    fmnist = per_run[per_run["task"] == TASKS["fashion_mnist"]]
    if fmnist.empty:
        raise Skip(f"no {TASKS['fashion_mnist']} runs of the article's rows (rows `fmnist_*`: "
                   "make sweep SET=fashion_mnist)")
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    for row in [r for r in d.rows if r in set(per_run["row"])]:
        g = per_run[per_run["row"] == row]
        ax.scatter(g["rotation_per_100_deg"], g["acc_eval_mode"], s=42, color=d.palette[row], edgecolor="white",
                   linewidth=0.6, zorder=3, marker=TASK_MARKER.get(g["task"].iloc[0], RUNNING_STATS_MARKER))
    _log_axis(ax.xaxis, "x")
    ax.set_xlabel("rotation of the last conv layer per 100 steps (degrees, log scale)")
    ax.set_ylabel("evaluation-mode accuracy\n(mean of the checks)")
    ax.set_ylim(0, 1.04)
    _pct(ax)
    ax.axhline(0.1, color="0.6", lw=0.8, ls=":", zorder=1)
    from matplotlib.lines import Line2D
    settings = list(dict.fromkeys(twins[r] for r in d.rows if r in set(per_run["row"])))
    handles = [Line2D([], [], ls="", marker="o", color=d.palette[row], markersize=6) for row in settings]
    labels = [ROWS[row].label for row in settings]
    tasks = list(dict.fromkeys(per_run.sort_values("task", key=lambda t: t != TASKS["noisy_templates"])["task"]))
    handles += [Line2D([], [], ls="", marker=TASK_MARKER.get(t, "o"), color="0.3", markersize=6) for t in tasks]
    labels += [f"one run on {t}" for t in tasks]
    ax.legend(handles, labels, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
    n = "; ".join(f"{t}: {runs_text(per_run[per_run['task'] == t])}" for t in tasks)
    footnote(fig, d, f"{n}. One point per run; accuracy: mean of each run's checks.")
    return fig, (f"Evaluation-mode accuracy against rotation on both tasks, one point per run ({n}): circles on "
                 f"the {TASKS['noisy_templates']}, diamonds on {TASKS['fashion_mnist']}, a row and its "
                 f"{TASKS['fashion_mnist']} twin (`fmnist_<row>`) in one colour. Accuracy: mean of the checks in the "
                 "check window; rotation: as in figure 1. Does accuracy fall with rotation on real images too? "
                 "`claims.md`, section \"Does it happen on real images? Fashion-MNIST\", weighs it.")


FIGURES: tuple[tuple[str, str, Callable[[Data], tuple[plt.Figure, str]]], ...] = tuple(_FIGURES)


def save(fig: plt.Figure, out: Path, name: str) -> None:
    """``<out>/<name>.png`` and ``.pdf``, written atomically, without time stamps (same bytes for same data)."""
    import io
    for ext, meta in (("png", {"Software": None}), ("pdf", {"CreationDate": None, "Producer": None})):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, bbox_inches="tight", metadata=meta)
        records.atomic_write_bytes(out / f"{name}.{ext}", buf.getvalue())


def make_figures(root: Path, runs: list[Run], out: Path, only: tuple[str, ...] = ()) -> list[Drawn]:
    """Draw every figure (or only those named in ``only``) into ``out``; with every figure, write the index
    ``out/README.md``.

    Returns:
        One :class:`Drawn` per figure, drawn or skipped with its reason.
    """
    apply_style()
    d = load_data(root, runs)
    done = []
    for name, title, draw in FIGURES:
        if only and name not in only:
            continue
        try:
            fig, caption = draw(d)
        except Skip as why:
            done.append(Drawn(name, title, skipped=str(why)))
            for ext in ("png", "pdf"):
                (out / f"{name}.{ext}").unlink(missing_ok=True)  # no stale figure beside a "not drawn" entry
            continue
        save(fig, out, name)
        plt.close(fig)
        done.append(Drawn(name, title, caption))
    if not only:  # a partial run must not replace the index of every figure
        records.atomic_write_text(out / "README.md", index_markdown(done, root, scale_note(runs)))
    return done


def index_markdown(done: list[Drawn], root: Path, scale: str = "") -> str:
    """``README.md`` of the figures folder: every figure, its caption, and the figures not drawn; ``scale`` (the
    runs' scale, :func:`..results.scale_note`) under the heading."""
    out = ["# Figures\n",
           f"Regenerated by `make figures` from the runs under `{root}` (parquet only). Each figure is a PNG "
           "(shown here) and a vector PDF beside it, for write-ups." + (f" {scale}" if scale else "") + "\n"]
    for f in done:
        out.append(f"## {int(f.name[:2])}. {f.title}\n")
        if f.skipped:
            out.append(f"Not drawn: {f.skipped}.\n")
            continue
        out.append(f"![{f.title}]({f.name}.png)\n")
        out.append(f"{f.caption} ([PDF]({f.name}.pdf))\n")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_results_arguments(p)
    p.add_argument("--out", default=None, help="folder for the figures and their README.md "
                   "(default: figures/ in the results root read)")
    p.add_argument("--only", nargs="*", default=(), help="names of the figures to draw (default: all)")
    args = p.parse_args(argv)
    matplotlib.use("Agg")  # files only, no window
    found = command_inputs(args, TABLES, subfolder="figures")
    if found is None:
        return 2
    root, runs, out = found
    done = make_figures(root, runs, out, tuple(args.only))
    for f in done:
        print(f"{'skipped' if f.skipped else 'wrote  '} {out / f.name}" + (f" ({f.skipped})" if f.skipped else ""),
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
