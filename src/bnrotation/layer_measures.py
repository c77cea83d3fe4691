"""The per-layer measurement of one monitor call: a normalisation layer's line of the ``layers`` table and its
columns of the ``channels`` table, from its fresh statistics, its running statistics and the rows of the weights
that feed it.

The monitor (:class:`bnrotation.monitor.StalenessMonitor`) runs the passes and calls :func:`layer_measures` once per
layer; the signals are :mod:`bnrotation.staleness`'s, the drift and predicted lag :mod:`bnrotation.probes`'s, the
rotation and cosines :mod:`bnrotation.weight_rows`'s. Every σ is the layer's own sqrt(var + eps).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from .pairing import NormPair
from .probes import drift_sigma_per_step, predicted_lag_sigma
from .staleness import channel_signals, sigma
from .weight_rows import WeightRows, gathered

__all__ = ["layer_measures", "eval_path_columns", "median_max", "channel_count"]


def median_max(name: str, unit: str, values: torch.Tensor) -> dict[str, float]:
    """A layer line's ``<name>_median<unit>`` and ``<name>_max<unit>`` over the finite values (C,); NaN without."""
    finite = values[torch.isfinite(values)]
    if not finite.numel():
        return {f"{name}_median{unit}": math.nan, f"{name}_max{unit}": math.nan}
    # the median of an even count is the mean of the two middle values, as numpy and pandas take it (the
    # analysis recomputes these offline); torch.median would take the lower one
    return {f"{name}_median{unit}": float(finite.quantile(0.5)), f"{name}_max{unit}": float(finite.max())}


def channel_count(norm: nn.Module) -> int:
    """The channels a normalisation layer normalises: its running mean's, else its ``num_features`` or
    ``num_channels``, else its affine weight's elements (0 when it says none of these)."""
    running = getattr(norm, "running_mean", None)
    if isinstance(running, torch.Tensor):
        return running.numel()
    for key in ("num_features", "num_channels"):
        if isinstance(getattr(norm, key, None), int):
            return getattr(norm, key)
    weight = getattr(norm, "weight", None)
    return weight.numel() if isinstance(weight, torch.Tensor) else 0


def layer_measures(step: int, interval: int | None, pair: NormPair, norm: nn.Module,
                   moments: tuple[torch.Tensor, torch.Tensor] | None, weights: dict[str, WeightRows],
                   prev_mean: torch.Tensor | None) -> tuple[dict, dict[str, np.ndarray]]:
    """One normalisation layer's line of the ``layers`` table and its columns of the ``channels`` table (each a
    (C,) array), as :class:`bnrotation.monitor.MonitorRecord` describes them.

    Args:
        step: the optimizer step; ``interval``: steps since the previous call (None at the first: no rotation
            or drift per step).
        pair: the layer and the weight layer(s) that feed it (:class:`pairing.NormPair`); ``norm`` the layer.
        moments: its fresh statistics, (mean (C,), variance (C,)) float64, from the probe's training-mode pass;
            None for a layer the pass did not reach (never called, or behind a branch not taken): its fresh
            measures are NaN.
        weights: each weight layer's rows (:class:`weight_rows.WeightRows`) of this call.
        prev_mean: the previous call's fresh mean (C,), for the drift in σ per step; None at the first call.

    Raises:
        ValueError: when a paired weight layer has fewer output channels than its segment normalises.
    """
    if moments is None:
        c = channel_count(norm)
        moments = (torch.full((c,), math.nan, dtype=torch.float64),) * 2
    f_mean, f_var = (t.cpu() for t in moments)  # (C,) float64
    c = f_mean.numel()
    nan = torch.full((c,), math.nan, dtype=torch.float64)
    has_running = isinstance(norm, _BatchNorm) and norm.running_mean is not None
    r_mean = norm.running_mean.double().cpu() if has_running else nan
    r_var = norm.running_var.double().cpu() if has_running else nan
    momentum = norm.momentum if has_running and norm.momentum is not None else math.nan
    eps = float(getattr(norm, "eps", 0.0))  # every σ is the layer's own sqrt(var + eps)
    drift = drift_sigma_per_step(f_mean, prev_mean, f_var, interval, eps) if prev_mean is not None else nan
    signals = channel_signals(r_mean, r_var, f_mean, f_var, eps)  # each (C,)
    lag = signals.lag_sigma
    spans = pair.spans(c)
    for s in spans:
        have = weights[s.weight].norm.numel()
        fits = have == c if not pair.segments else s.offset + s.stop - s.start <= have
        if not fits:
            raise ValueError(f"{s.weight} -> {pair.norm}: {have} output channels but {c} normalised"
                             + (f" (channels [{s.start}, {s.stop}) from {s.offset} on)" if pair.segments else ""))
    parts = [(weights[s.weight], slice(s.offset, s.offset + s.stop - s.start)) for s in spans]
    rot = gathered(parts, "rotation", nan)
    per_100 = rot * 100.0 / interval if interval else nan
    names = (np.concatenate([np.full(s.stop - s.start, s.weight, dtype=object) for s in spans]) if spans
             else np.full(c, "", dtype=object))
    channels = {  # columns of (C,) arrays; measure() makes one frame of every layer's
        "step": np.full(c, step), "layer": names, "norm_layer": np.full(c, pair.norm, dtype=object),
        "channel": np.arange(c), "rotation_deg": rot.numpy(), "rotation_deg_per_100": per_100.numpy(),
        "weight_norm": gathered(parts, "norm", nan).numpy(),
        "update_cos": gathered(parts, "update_cos", nan).numpy(),
        "running_mean": r_mean.numpy(), "running_var": r_var.numpy(),
        "fresh_mean": f_mean.numpy(), "fresh_var": f_var.numpy(), "lag_sigma": lag.numpy(),
        "drift_sigma_per_step": drift.numpy(), "predicted_lag_sigma": predicted_lag_sigma(drift, momentum).numpy(),
        "abs_mean_over_std": (f_mean.abs() / sigma(f_var, eps)).numpy(),
        "mean_shift_sigma": signals.mean_shift_sigma.numpy(), "log_std_ratio": signals.log_std_ratio.numpy(),
        "eval_error_sigma": signals.eval_error_sigma.numpy(),
    }
    abs_lag = lag.abs()
    finite = torch.isfinite(abs_lag)
    line = {
        "step": step, "layer": pair.weight or "", "norm_layer": pair.norm,
        "weight_norm": WeightRows.whole_norm(parts), "update_cos": WeightRows.whole_cosine(parts, "update"),
        "grad_cos": WeightRows.whole_cosine(parts, "grad"),
        "rotation_deg_per_100": float(per_100.median()) if torch.isfinite(per_100).any() else math.nan,
        "lag_median_abs_sigma": float(abs_lag[finite].median()) if finite.any() else math.nan,
        "lag_max_abs_sigma": float(abs_lag[finite].max()) if finite.any() else math.nan,
        "worst_channel": int(torch.where(finite, abs_lag, -1.0).argmax()) if finite.any() else -1,
        "channels_above_1_sigma": int((abs_lag[finite] > 1.0).sum()),
        **median_max("mean_shift", "_abs_sigma", signals.mean_shift_sigma.abs()),
        **median_max("log_std_ratio", "_abs", signals.log_std_ratio.abs()),
        **median_max("eval_error", "_sigma", signals.eval_error_sigma),
    }
    return line, channels


def eval_path_columns(norm: nn.Module, moments: tuple[torch.Tensor, torch.Tensor] | None, line: dict,
                      channels: dict) -> None:
    """Add the evaluation path's columns to one layer's line and channel columns, in place: its input moments
    with the network upstream in evaluation mode, and E of the running statistics against them (NaN for a
    layer without running statistics, or one the pass did not reach)."""
    c = len(channels["channel"])
    nan = torch.full((c,), math.nan, dtype=torch.float64)
    p_mean, p_var = (t.cpu() for t in moments) if moments is not None else (nan, nan)
    eps = float(getattr(norm, "eps", 0.0))
    error = channel_signals(torch.from_numpy(channels["running_mean"]), torch.from_numpy(channels["running_var"]),
                            p_mean, p_var, eps).eval_error_sigma
    channels.update({"eval_path_mean": p_mean.numpy(), "eval_path_var": p_var.numpy(),
                     "eval_path_error_sigma": error.numpy()})
    line.update(median_max("eval_path_error", "_sigma", error))
