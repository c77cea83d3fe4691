"""Running-mean lag against depth, one BatchNorm layer at a time (no torch).

Estimation shift (Huang et al., CVPR 2022, "Delving into the Estimation Shift
of Batch Normalization in a Network") predicts that the gap between a
BatchNorm layer's running statistics and the statistics of the current
network accumulates through the layers: each layer normalised with slightly
wrong statistics hands a shifted input to the next, so deeper layers should lag
more. With 21 BatchNorm layers, ResNet-20 can show it where the study's three
layers cannot.

Depth here is a layer's position in the forward order the runner logs the
layers in (:func:`.metrics.conv_layers`; 0 is the stem). In ResNet-20 a
projection shortcut's norm layer (``layer2.0.shortcut.1``, ``layer3.0.shortcut.1``)
comes after its block's second convolution in that order, though it sits only
one convolution below the block's input.

Lag is ``|running_mean − fresh_mean| / fresh_std`` per channel (the ``channels``
table's ``lag_sigma``, in σ), over the (step, channel) pairs inside the check
window.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..results import Run
from ..stats import spearman_rho
from . import metrics

PROFILE_COLUMNS = ("depth", "layer", "norm_layer", "n", "lag_window_median_abs_sigma", "lag_window_max_abs_sigma")


def layer_profile(run: Run) -> pd.DataFrame:
    """One line per BatchNorm layer of ``run``, in forward order: ``depth`` (0, 1, …), ``layer`` (the conv
    layer it normalises), ``norm_layer`` ("" where the table does not name it), ``n`` (finite (step, channel)
    pairs in the check window), ``lag_window_median_abs_sigma`` (median |lag| over them, σ) and
    ``lag_window_max_abs_sigma`` (the largest, σ). Empty for a run that logs no lag (no running statistics)."""
    ch = metrics.in_window(run, run.tables["channels"])
    ch = ch[np.isfinite(ch["lag_sigma"])]
    by_layer = dict(list(ch.groupby("layer", sort=False)))  # each layer's lines, in the table's order
    lines = []
    for depth, layer in enumerate(metrics.conv_layers(run)):
        sel = by_layer.get(layer)
        if sel is None:
            continue
        lag = sel["lag_sigma"].abs()
        norm = str(sel["norm_layer"].iloc[0]) if "norm_layer" in sel else ""
        lines.append({"depth": depth, "layer": layer, "norm_layer": norm, "n": int(len(lag)),
                      "lag_window_median_abs_sigma": float(lag.median()), "lag_window_max_abs_sigma": float(lag.max())})
    return pd.DataFrame(lines, columns=list(PROFILE_COLUMNS))


def depth_rho(profile: pd.DataFrame, column: str = "lag_window_median_abs_sigma") -> float:
    """Spearman's ρ between ``depth`` and ``column`` over the layers of a profile (:func:`layer_profile` or
    :func:`row_profile`): +1 when the lag grows layer after layer. NaN with fewer than 3 layers."""
    return spearman_rho(profile["depth"], profile[column]) if len(profile) >= 3 else math.nan


def row_profile(runs: list[Run]) -> pd.DataFrame:
    """The layer profile of a row: per layer (matched by ``layer`` name, in the first run's forward order) the
    mean over ``runs`` (seeds) of each run's median and worst |lag| (σ), with ``seeds`` (how many runs have the
    layer) and ``median_sd`` (the sample standard deviation over seeds of the median, NaN for one seed)."""
    profiles = [layer_profile(r).assign(seed=r.seed) for r in runs]
    profiles = [p for p in profiles if len(p)]
    if not profiles:
        return pd.DataFrame(columns=[*PROFILE_COLUMNS, "seeds", "median_sd"])
    stacked = pd.concat(profiles, ignore_index=True)
    order = list(profiles[0]["layer"])
    g = stacked.groupby("layer")
    out = pd.DataFrame({"layer": order})
    out["depth"] = [int(g.get_group(la)["depth"].iloc[0]) for la in order]
    out["norm_layer"] = [str(g.get_group(la)["norm_layer"].iloc[0]) for la in order]
    out["n"] = [int(g.get_group(la)["n"].sum()) for la in order]
    for col in ("lag_window_median_abs_sigma", "lag_window_max_abs_sigma"):
        out[col] = [float(g.get_group(la)[col].mean()) for la in order]
    out["seeds"] = [int(g.get_group(la)["seed"].nunique()) for la in order]
    out["median_sd"] = [float(g.get_group(la)["lag_window_median_abs_sigma"].std(ddof=1)) for la in order]
    return out[[*PROFILE_COLUMNS, "seeds", "median_sd"]]


def short_name(layer: str) -> str:
    """A layer's name for a crowded axis: ``layer2.0.bn1`` → ``2.0.bn1``, ``layer3.0.shortcut.1`` →
    ``3.0.sc``, ``layer1.2.conv2`` → ``1.2.conv2``; other names as they are (``bn2``, ``conv1``)."""
    if not layer.startswith("layer"):
        return layer
    name = layer[len("layer"):]
    return name.replace("shortcut.0", "sc").replace("shortcut.1", "sc")
