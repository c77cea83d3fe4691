"""What stale statistics cost, layer by layer, on the two tasks (issue 64, item 4; no torch).

For each run and each BatchNorm layer, over a window of steps:

* ``e``: how stale the layer is, the median over its channels and the window's logged steps of E, the RMS error
  the running statistics make in the evaluation-mode normalised activation (``bnrotation.staleness.channel_signals``:
  E = √(d² + ρ(s − 1)²), in running σ; docs/PROTOCOL.md);
* ``cost``: what the layer's staleness costs, the mean over the window's intervention steps of the
  evaluation-mode accuracy with that layer's running statistics swapped for re-estimated ones (the others left as
  they are: the runner's ``layer`` intervention) minus the accuracy with every layer's stored statistics, a
  fraction;
* ``cost_per_e``: ``cost`` over ``e``, the accuracy lost per unit of E (fraction per running σ): the layer's
  sensitivity, comparable between tasks that go stale by different amounts.

The window is the condition map's (steps :data:`WINDOW`), over every committed seed that has it, so that the map's
reference points are compared with the committed runs like with like: the same window, the most seeds.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ...config import ModelConfig
from ...condition_map import MAP_STEPS
from ....staleness import channel_signals
from ..results import BadRunError, Run, load_run
from ..stats import Z, SeedStat

__all__ = ["WINDOW", "ROWS", "layer_signals", "layer_costs", "sensitivity_table", "load_reference",
           "where_tasks_differ"]

WINDOW = (2000, MAP_STEPS)  # the map's check window, inclusive
ROWS = {("noisy_templates", "sgd"): "sgd", ("noisy_templates", "adam"): "adam",
        ("fashion_mnist", "sgd"): "fmnist_sgd", ("fashion_mnist", "adam"): "fmnist_adam"}  # the committed rows
SIGNAL_COLUMNS = ("running_mean", "running_var", "fresh_mean", "fresh_var")  # the channels table's, in this order


def _between(df: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    return df[(df["step"] >= window[0]) & (df["step"] <= window[1])]


def layer_signals(run: Run, channels: pd.DataFrame) -> pd.DataFrame:
    """Per norm layer of ``channels`` (a slice of ``run``'s channels table), the medians over its lines of E, |d|
    and |log s| (``e``, ``mean_part``, ``var_part``; each layer's own eps from ``run.json``)."""
    lines = []
    for layer, part in channels.groupby("norm_layer", sort=True):
        eps = float(((run.info.get("norm_layers") or {}).get(layer) or {}).get("eps", ModelConfig().bn_eps))
        sig = channel_signals(*(part[c].to_numpy(float) for c in SIGNAL_COLUMNS), eps)
        lines.append({"norm_layer": layer, "e": float(np.nanmedian(sig.eval_error_sigma)),
                      "mean_part": float(np.nanmedian(np.abs(sig.mean_shift_sigma))),
                      "var_part": float(np.nanmedian(np.abs(sig.log_std_ratio)))})
    return pd.DataFrame(lines, columns=["norm_layer", "e", "mean_part", "var_part"])


def layer_costs(run: Run, window: tuple[int, int] = WINDOW) -> pd.DataFrame:
    """One line per norm layer of ``run``: ``norm_layer``, ``e``, ``cost``, ``cost_per_e`` (the module docstring
    defines each) over ``window``, and the run's ``mode_gap`` there (training- minus evaluation-mode accuracy,
    mean over its checks). ``cost`` is NaN for a layer without a ``layer`` intervention in the window, and
    ``cost_per_e`` NaN where E is 0 (a layer whose statistics are exact has no sensitivity to measure).

    Raises:
        KeyError: a run without a channels or interventions table.
    """
    signals = layer_signals(run, _between(run.tables["channels"], window))
    iv = _between(run.tables["interventions"], window)
    stored = iv[iv["intervention"] == "none"].set_index("step")["acc_eval_mode"]
    swapped = iv[iv["intervention"] == "layer"]
    cost = {layer: float((g.set_index("step")["acc_eval_mode"] - stored.reindex(g["step"]).to_numpy()).mean())
            for layer, g in swapped.groupby("norm_layer")}
    checks = _between(run.tables["checks"], window)
    gap = float((checks["acc_train_mode"] - checks["acc_eval_mode"]).mean())
    out = signals.assign(cost=signals["norm_layer"].map(cost).astype(float), mode_gap=gap)
    out["cost_per_e"] = np.where(out["e"] > 0, out["cost"] / out["e"].where(out["e"] > 0), math.nan)
    return out[["norm_layer", "e", "cost", "cost_per_e", "mode_gap"]]


def sensitivity_table(runs: dict[tuple[str, str], list[Run]], window: tuple[int, int] = WINDOW) -> pd.DataFrame:
    """Per (task, optimizer) of ``runs`` and per norm layer: ``n`` seeds, the seeds (``seeds``, e.g. ``0-9``), and
    the mean and sd over seeds of ``e``, ``cost``, ``cost_per_e`` and ``mode_gap`` (:func:`layer_costs`), unrounded.
    A run whose checks do not reach ``window``'s end is left out (its window is not the same)."""
    lines = []
    for (task, optimizer), group in runs.items():
        per_run = [layer_costs(r, window).assign(seed=r.seed) for r in group
                   if r.tables["checks"]["step"].max() >= window[1]]
        if not per_run:
            continue
        frame = pd.concat(per_run, ignore_index=True)
        for layer, g in frame.groupby("norm_layer", sort=True):
            line = {"task": task, "optimizer": optimizer, "norm_layer": layer, "n": int(g["seed"].nunique()),
                    "seeds": _seed_words(g["seed"])}
            for col in ("e", "cost", "cost_per_e", "mode_gap"):
                st = SeedStat.of(g[col], g["seed"])
                line[col], line[f"{col}_sd"] = st.mean, st.sd
            lines.append(line)
    return pd.DataFrame(lines)


def _seed_words(seeds: pd.Series) -> str:
    from ..formatting import seed_ranges
    return seed_ranges(sorted(int(s) for s in seeds.unique()))


def load_reference(reference: str | Path) -> tuple[dict[tuple[str, str], list[Run]], list[str]]:
    """The committed runs of :data:`ROWS` under ``reference`` (``runs/<row>/seed=<s>``), every seed, and one line
    per folder refused."""
    runs, problems = {}, []
    for key, row in ROWS.items():
        for folder in sorted((Path(reference) / "runs" / row).glob("seed=*")):
            try:
                runs.setdefault(key, []).append(load_run(folder, ("checks", "channels", "interventions")))
            except BadRunError as err:
                problems.append(str(err))
    return runs, problems


def where_tasks_differ(table: pd.DataFrame, optimizer: str = "adam") -> dict | None:
    """The layer where the two tasks' sensitivity differs for ``optimizer``: among the layers whose ``cost_per_e``
    differs between the templates and Fashion-MNIST by more than :data:`..stats.Z` Welch standard errors of the
    difference (over seeds), the one with the largest difference in those units; None when no layer does (or a
    task is missing). Returns ``norm_layer``, each task's ``cost_per_e``, their ``difference`` (templates minus
    Fashion-MNIST) and ``z`` (the difference in standard errors)."""
    t = table[table["optimizer"] == optimizer].set_index(["norm_layer", "task"])
    best = None
    for layer in sorted({k[0] for k in t.index}):
        try:
            a, b = t.loc[(layer, "noisy_templates")], t.loc[(layer, "fashion_mnist")]
        except KeyError:
            continue
        se = math.sqrt(a["cost_per_e_sd"] ** 2 / a["n"] + b["cost_per_e_sd"] ** 2 / b["n"])
        diff = a["cost_per_e"] - b["cost_per_e"]
        z = abs(diff) / se if se > 0 else math.nan
        if z > Z and (best is None or z > best["z"]):
            best = {"norm_layer": layer, "noisy_templates": float(a["cost_per_e"]),
                    "fashion_mnist": float(b["cost_per_e"]), "difference": float(diff), "z": float(z)}
    return best


PER_E = 0.1  # the sensitivity is printed per this much E (running σ): docs/monitor.md's fit threshold
TASK_WORDS = {"noisy_templates": "templates", "fashion_mnist": "Fashion-MNIST"}


def _pm(mean: float, sd: float, scale: float = 100.0, digits: int = 1) -> str:
    """``mean ± sd`` times ``scale`` at ``digits`` decimals, rounded here and only here; ``–`` for NaN."""
    if math.isnan(mean):
        return "–"
    text = f"{mean * scale:.{digits}f}"
    text = text.lstrip("-") if float(text) == 0 else text  # no "-0.0"
    return text + ("" if math.isnan(sd) else f" ± {sd * scale:.{digits}f}")


def markdown(table: pd.DataFrame) -> str:
    """:func:`sensitivity_table` as a Markdown table: E in σ, the cost and the mode gap in points, the
    sensitivity in points per :data:`PER_E` σ of E; each ± the sd over seeds."""
    head = ["Task", "Optimizer", "Layer", "Seeds", "E (σ)", "Cost (points)", f"Points per {PER_E:g}σ of E",
            "Mode gap (points)"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|---|---:|---:|---:|---:|"]
    for r in table.itertuples(index=False):
        lines.append("| " + " | ".join([TASK_WORDS[r.task], r.optimizer, r.norm_layer, f"{r.n} ({r.seeds})",
                                        _pm(r.e, r.e_sd, 1.0, 3), _pm(r.cost, r.cost_sd),
                                        _pm(r.cost_per_e, r.cost_per_e_sd, 100 * PER_E),
                                        _pm(r.mode_gap, r.mode_gap_sd)]) + " |")
    return "\n".join(lines)


def sentence(table: pd.DataFrame, window: tuple[int, int] = WINDOW) -> str:
    """The generated sentence (at most 30 words): the layer where the two tasks' sensitivity differs for Adam
    (:func:`where_tasks_differ`), with both values, or that no layer differs beyond the rule."""
    d = where_tasks_differ(table)
    steps = f"steps {window[0]:,}–{window[1]:,}"
    if d is None:
        return f"Over {steps}, no layer's sensitivity to stale statistics differs between the tasks beyond {Z:g} standard errors."
    per = 100 * PER_E
    return (f"Over {steps}, Adam's stale {d['norm_layer']} costs the templates {d['noisy_templates'] * per:.1f} points "
            f"per {PER_E:g}σ of E, Fashion-MNIST {d['fashion_mnist'] * per:.1f}: there the tasks differ most.")
