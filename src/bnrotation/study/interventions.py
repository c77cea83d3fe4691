"""Interventions on the running statistics at a checkpoint: which fix brings evaluation-mode accuracy back.

One re-estimation pass (:func:`bnstats.reestimate`) gives fresh statistics for every layer; then the
accuracy with the stored statistics, with all fresh, with one layer fresh at a time, and with fresh
statistics in only the k channels of largest |lag| across the network (the article's open question: how
few channels carry the damage). The runner logs the table at its intervention steps; offline diagnosis
(:mod:`bnrotation.study.diagnose`) reruns it on a saved checkpoint. Works on any model with BatchNorm layers.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn as nn

from ..bnstats import (ReestimationReport, reestimate, running_stat_layers, running_stats, swapped_statistics,
                       top_k_channel_masks)
from ..evaluation import CompiledEvaluation
from ..probes import accuracy, lag_sigma


def top_k_grid(total: int) -> list[int]:
    """0, 1, 2, 4, ... up to ``total`` channels (``total`` itself included)."""
    ks = [0] + [2 ** i for i in range(total.bit_length()) if 2 ** i < total]
    return ks + [total]


def top_k_accuracy(model: nn.Module, fresh: dict[str, tuple[torch.Tensor, torch.Tensor]],
                   lag: dict[str, torch.Tensor], k: int, x: torch.Tensor, y: torch.Tensor, chunk: int,
                   compiled: CompiledEvaluation | None = None) -> float:
    """Evaluation-mode accuracy with fresh statistics in the ``k`` channels of largest |lag| network-wide.

    Args:
        fresh: ``{norm layer: (mean (C,), var (C,))}``; lag: ``{norm layer: (C,)}`` in sigma.
        compiled: what the evaluation-mode pass runs through (:func:`.probes.accuracy`); None: eagerly.
    """
    with swapped_statistics(model, fresh, channels=top_k_channel_masks(lag, k)):
        return accuracy(model, x, y, "eval", chunk, compiled)


def layer_lags(result: Interventions) -> pd.DataFrame:
    """Per BatchNorm layer, how far the stored running statistics are from the fresh (re-estimated) ones, with the
    monitor's definition and names (:class:`bnrotation.monitor.StalenessMonitor`'s ``layers`` table).

    Args:
        result: :func:`run_interventions`' measurement; its ``lag_sigma`` is the lag of every channel.

    Returns:
        One line per layer, in the order of ``result.fresh``: ``norm_layer``, ``channels``,
        ``lag_median_abs_sigma`` (median over channels of |lag|; lag = (stored - fresh mean) / sqrt(fresh var +
        the layer's eps), :func:`probes.lag_sigma`, in σ), ``worst_channel`` (largest |lag|), ``worst_lag_sigma``
        (its lag, signed, σ), ``median_var_ratio`` (median of stored / fresh running variance).
    """
    lines = []
    for name, (_, var) in result.fresh.items():
        lag = result.lag_sigma[name].cpu()  # (C,)
        worst = int(lag.abs().argmax())
        ratio = result.stored[name][1].double().cpu() / var.double().cpu()  # (C,)
        lines.append({"norm_layer": name, "channels": lag.numel(), "lag_median_abs_sigma": float(lag.abs().median()),
                      "worst_channel": worst, "worst_lag_sigma": float(lag[worst]),
                      "median_var_ratio": float(ratio.median())})
    return pd.DataFrame(lines)


@dataclass
class Interventions:
    """What :func:`run_interventions` measured at one checkpoint.

    Attributes:
        table: one line per intervention: ``intervention`` (none | reestimate |
            layer | top_k), ``k`` (-1 where it does not apply), ``norm_layer``
            (the norm layer made fresh; "" where it does not apply),
            ``acc_eval_mode`` (fraction).
        stored, fresh: ``{norm layer: (running_mean (C,), running_var (C,))}``,
            the checkpoint's statistics and the re-estimated ones.
        lag_sigma: ``{norm layer: (C,)}`` float64, ``(stored - fresh) mean /
            sqrt(fresh var + the layer's eps)`` (:func:`probes.lag_sigma`, the
            monitor's ``lag_sigma``), the ranking of the top-k curve.
        reestimation: provenance of the re-estimation pass.
    """

    table: pd.DataFrame
    stored: dict[str, tuple[torch.Tensor, torch.Tensor]]
    fresh: dict[str, tuple[torch.Tensor, torch.Tensor]]
    lag_sigma: dict[str, torch.Tensor]
    reestimation: ReestimationReport


def run_interventions(model: nn.Module, batches, x: torch.Tensor, y: torch.Tensor, chunk: int,
                      acc_stored: float | None = None, compiled: CompiledEvaluation | None = None) -> Interventions:
    """Evaluation-mode accuracy on (x, y) after each intervention on the running statistics.

    ``none`` (stored statistics), ``reestimate`` (every layer fresh), ``layer``
    (one layer fresh, the stored ones elsewhere) and ``top_k`` (the k channels
    of largest |lag| across the network fresh, k on :func:`top_k_grid`; k = 0
    is the stored model and k = all the re-estimated one). Fresh statistics
    come from one :func:`bnstats.reestimate` pass on a copy; the model itself
    is left unchanged. The runner and offline diagnosis
    (:mod:`bnrotation.study.diagnose`) both call this.

    The two ends of the top-k curve are exact identities and are not evaluated
    again (k = 0 swaps nothing, k = all swaps everything); ``acc_stored``, the
    evaluation-mode accuracy already measured on (x, y) at this step (the
    runner's check), is reused for ``none``. Every evaluation-mode pass runs through ``compiled`` when given
    (the runner's :class:`.evaluation.CompiledEvaluation`), else eagerly.

    Raises:
        ValueError: if the model has no layer with running statistics, or ``batches`` is empty.
    """
    fresh_model = copy.deepcopy(model)
    report = reestimate(fresh_model, batches)
    stored, fresh = running_stats(model), running_stats(fresh_model)
    acc_none = accuracy(model, x, y, "eval", chunk, compiled) if acc_stored is None else acc_stored
    acc_fresh = accuracy(fresh_model, x, y, "eval", chunk, compiled)
    rows = [("none", -1, "", acc_none), ("reestimate", -1, "", acc_fresh)]
    for name in fresh:
        with swapped_statistics(model, {name: fresh[name]}):
            rows.append(("layer", -1, name, accuracy(model, x, y, "eval", chunk, compiled)))
    eps = {n: float(m.eps) for n, m in running_stat_layers(model)}
    lag = {n: lag_sigma(stored[n][0], fresh[n][0].double(), fresh[n][1].double(), eps[n]) for n in fresh}
    total = sum(v.numel() for v in lag.values())
    for k in top_k_grid(total):
        acc = {0: acc_none, total: acc_fresh}.get(k)
        rows.append(("top_k", k, "", acc if acc is not None
                     else top_k_accuracy(model, fresh, lag, k, x, y, chunk, compiled)))
    table = pd.DataFrame(rows, columns=["intervention", "k", "norm_layer", "acc_eval_mode"])
    return Interventions(table, stored, fresh, lag, report)
