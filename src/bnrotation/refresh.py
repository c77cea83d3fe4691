"""Refresh only when needed: re-estimate the running statistics when the staleness monitor's rule fires (or only
the layers over its lag threshold), with the monitor's measurements before and after and a handle that puts the
previous buffers back. Above both :mod:`bnrotation.bnstats` (the re-estimation) and :mod:`bnrotation.monitor` (the
rule), which it combines through :mod:`bnrotation.oneshot` (the monitor of a measurement at one moment, and its
records before and after re-estimation, as the checkpoint check takes them)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn as nn

from .bnstats import ReestimationReport, SavedBuffers
from .monitor import MonitorRecord
from .oneshot import measure_reestimated, one_shot_monitor
from .staleness import Thresholds

__all__ = ["reestimate_if_stale", "GatedReestimation", "GATE_SCOPES"]


@dataclass
class GatedReestimation:
    """What :func:`reestimate_if_stale` measured and did.

    Attributes:
        fired: whether anything was re-estimated: the monitor's rule fired on the probe before, or the monitor
            could not judge (``before.undetermined``, which cannot rule staleness out).
        scope: ``"model"`` (every layer re-estimated when the rule fires) or ``"layers"`` (only those over the
            lag threshold).
        layers: the layers re-estimated (empty when the rule did not fire).
        before, after: the monitor's records (:class:`monitor.MonitorRecord`) on the probe before and after the
            re-estimation, at steps 0 and 1; ``after`` is ``before`` when nothing was re-estimated. Their
            ``mode_gap``, ``acc_eval_mode`` (with labels) and ``worst_median_lag_sigma`` are the rule's inputs.
        report: the :class:`ReestimationReport`, None when nothing was re-estimated.
        saved: the buffers as they were before (:class:`SavedBuffers`); :meth:`restore` puts them back.

    Usable as a context manager: the re-estimated statistics inside the block, the previous ones after it.
    """

    fired: bool
    scope: str
    layers: list[str]
    before: MonitorRecord
    after: MonitorRecord
    report: ReestimationReport | None
    saved: SavedBuffers

    def restore(self) -> None:
        """Put back every BatchNorm buffer and momentum as they were before the call (:class:`SavedBuffers`)."""
        self.saved.restore()

    def __enter__(self) -> GatedReestimation:
        return self

    def __exit__(self, *exc) -> bool:
        self.restore()
        return False

    @property
    def helped(self) -> bool:
        """Re-estimated, and the worst median |lag| fell while the mode gap did not grow (nor, with labels, the
        evaluation-mode accuracy fall)."""
        b, a = self.before, self.after
        acc_kept = not a.acc_eval_mode < b.acc_eval_mode  # NaN (no labels) keeps it
        return bool(self.fired and a.worst_median_lag_sigma < b.worst_median_lag_sigma
                    and a.mode_gap <= b.mode_gap and acc_kept)

    def lags(self) -> pd.DataFrame:
        """One line per BatchNorm layer: ``norm_layer``, ``reestimated``, and ``lag_median_abs_sigma_before``,
        ``lag_median_abs_sigma_after``, ``lag_max_abs_sigma_before``, ``lag_max_abs_sigma_after`` (σ)."""
        cols = ["norm_layer", "lag_median_abs_sigma", "lag_max_abs_sigma"]
        out = self.before.layers[cols].merge(self.after.layers[cols], on="norm_layer", suffixes=("_before", "_after"))
        out.insert(1, "reestimated", out["norm_layer"].isin(self.layers))
        return out

    @property
    def summary(self) -> str:
        """One line: whether the rule fired, what was re-estimated, and the mode gap, lag and accuracy before and
        after."""
        b, a = self.before, self.after
        acc = (f", eval-mode accuracy {b.acc_eval_mode:.1%} -> {a.acc_eval_mode:.1%}"
               if not math.isnan(b.acc_eval_mode) else "")
        if not self.fired:
            return (f"not stale (mode gap {b.mode_gap:.3f}, worst median lag {b.worst_median_lag_sigma:.3f}σ"
                    f"{acc}): nothing re-estimated")
        if b.undetermined:
            return (f"undetermined ({b.undetermined}): re-estimated {len(self.layers)} layer(s) all the same; "
                    f"worst median lag {b.worst_median_lag_sigma:.3f}σ -> {a.worst_median_lag_sigma:.3f}σ{acc}")
        return (f"stale: re-estimated {len(self.layers)} layer(s); mode gap {b.mode_gap:.3f} -> {a.mode_gap:.3f}, "
                f"worst median lag {b.worst_median_lag_sigma:.3f}σ -> {a.worst_median_lag_sigma:.3f}σ{acc}")


GATE_SCOPES = ("model", "layers")


def reestimate_if_stale(model: nn.Module, batches: Iterable, probe, *, thresholds: Thresholds | None = None,
                        scope: str = "model", input_key: str = "input", target_key: str = "target",
                        device: torch.device | str | None = None, max_batches: int | None = None,
                        skip_frozen: bool = False) -> GatedReestimation:
    """Re-estimate the running statistics only when the monitor finds them stale, and measure before and after.

    The staleness monitor (:class:`monitor.StalenessMonitor`, no warning) measures the mode gap and each layer's
    running-mean lag on ``probe``; when its rule fires (:class:`monitor.Thresholds`: the mode gap and the worst
    layer's median |lag| both at or over their thresholds, or a running statistic not finite),
    :func:`reestimate` runs on ``batches`` (also when the monitor cannot judge, :attr:`monitor.MonitorRecord.
    undetermined`: a probe too small for the gap threshold cannot rule staleness out, and re-estimation costs a
    pass; then over every layer), over every layer (``scope="model"``) or only the layers whose median
    |lag| is at or over ``thresholds.lag_sigma`` or whose running statistics are not finite
    (``scope="layers"``; the others normalise with their running statistics during the pass), and the monitor
    measures again. As in :func:`reestimate`, dropout stays off and no parameter changes. A refresh before every
    evaluation costs a pass over ``batches``; this costs two forward passes of the probe when the statistics
    are fine.

    Args:
        model: any ``nn.Module`` with BatchNorm layers that keep running statistics.
        batches: the re-estimation batches (:func:`reestimate`).
        probe: the batch to judge on, as :class:`monitor.StalenessMonitor` takes it: a tensor, ``(x, y)``, or a
            mapping with ``input_key`` (and ``target_key``). With labels, ``before`` and ``after`` hold the
            evaluation-mode accuracy on it. A probe that is also among ``batches`` judges the statistics on
            data they were estimated on: a diagnostic, not a held-out score.
        thresholds: the rule (default ``Thresholds()``).
        scope: ``"model"`` or ``"layers"``.

    Returns:
        A :class:`GatedReestimation`; its :meth:`~GatedReestimation.restore` (or leaving it as a context
        manager) puts back the previous buffers exactly.

    Raises:
        ValueError: for a ``scope`` other than :data:`GATE_SCOPES`; what :class:`monitor.StalenessMonitor`
            raises for a model or probe it cannot measure; what :func:`reestimate` raises (the buffers are then
            left as they were).
        TypeError: for thresholds that are not a :class:`monitor.Thresholds`, or a probe the monitor cannot read.
    """

    if scope not in GATE_SCOPES:
        raise ValueError(f"reestimate_if_stale: scope: expected one of {', '.join(GATE_SCOPES)}, got {scope!r}")
    thresholds = Thresholds() if thresholds is None else thresholds
    monitor = one_shot_monitor(model, probe, thresholds=thresholds, input_key=input_key, target_key=target_key)
    saved = SavedBuffers(monitor.model)
    before = monitor(0)
    if not before.stale and not before.undetermined:
        return GatedReestimation(False, scope, [], before, before, None, saved)
    chosen = None  # an undetermined verdict cannot rule staleness out: every layer, whatever the scope
    if scope == "layers" and not before.undetermined:
        bad = {name.rsplit(".", 1)[0] for name in before.nonfinite.running_statistics}
        lag = before.layers.set_index("norm_layer")["lag_median_abs_sigma"]
        chosen = [name for name in saved.layers if name in bad or lag.get(name, math.nan) >= thresholds.lag_sigma]
    _, after, report = measure_reestimated(monitor, batches, before, input_key=input_key, device=device,
                                           max_batches=max_batches, skip_frozen=skip_frozen, layers=chosen)
    return GatedReestimation(True, scope, report.layers, before, after, report, saved)
