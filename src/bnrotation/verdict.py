"""The monitor's verdict: whether the rule can judge a call, its rule, and its words.

A call of :class:`bnrotation.monitor.StalenessMonitor` measures (the mode check, :mod:`bnrotation.mode_check`; each
layer, :mod:`bnrotation.layer_measures`); this module reads the record it makes. :func:`undetermined` says why the
rule cannot judge it (a probe too small, a gap that is NaN, statistics that overflow, a probe on which even a
collapsed evaluation mode could not cross the gap threshold), :func:`stale` applies the rule
(:meth:`staleness.Thresholds.crossed`), and :func:`summary` puts it in one line. A quantity that is NaN or
meaningless by construction is never read as "not stale".
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .probe_batch import smallest_probe
from .staleness import Thresholds

__all__ = ["undetermined", "collapse_gap", "stale", "rotation_text", "summary"]


def undetermined(record, out_train: torch.Tensor, thresholds: Thresholds, *, modes: bool = True,
                 y: torch.Tensor | None = None, largest_class: int = 0) -> str:
    """Why the rule cannot judge ``record`` (a :class:`bnrotation.monitor.MonitorRecord`; its
    ``undetermined``), or "" when it can.

    Args:
        out_train: the call's training-mode outputs (N, classes, ...).
        thresholds: the rule's.
        modes: whether the mode check ran (without it no gap is measured, and the rule needs one).
        y: the probe's labels (N,), None when it has none; ``largest_class``: how many of them are of its
            largest class (what a constant guess of it gets right).
    """
    n = int(record.checks["probe_size"].iloc[0])
    smallest = smallest_probe(thresholds.mode_gap)
    if not modes:
        return "no mode gap measured (modes=False), and the rule needs it"
    if n < smallest:
        return (f"a probe of {n} samples: one sample moves the mode gap by {1 / n:.1%}, more than the "
                f"{thresholds.mode_gap:.1%} threshold; the rule needs at least {smallest}")
    if math.isnan(record.mode_gap):
        return "the mode gap is NaN (outputs that are not finite)"
    ch = record.channels
    overflow = ch.loc[np.isinf(ch["fresh_mean"].to_numpy(float)) | np.isinf(ch["fresh_var"].to_numpy(float)),
                      "norm_layer"].unique()
    if len(overflow):  # its lag reads 0σ (an infinite σ) and its E NaN: not measured
        return (f"the fresh statistics of {', '.join(map(str, overflow[:3]))}{' …' if len(overflow) > 3 else ''} "
                "are not finite (activations that overflow: inputs on another scale?)")
    if math.isnan(record.worst_median_lag_sigma) and math.isnan(record.worst_median_eval_error_sigma):
        return "no layer's lag or E is finite (no running statistics measured, or fresh statistics not finite)"
    collapse = collapse_gap(record, out_train, y, largest_class)
    if record.mode_gap >= thresholds.mode_gap or collapse >= thresholds.mode_gap:
        return ""  # a gap that crosses is judged; one that could cross, had evaluation mode collapsed, too
    if y is None:
        return (f"training mode predicts one class for {1 - collapse:.1%} of the probe: an evaluation mode "
                f"collapsed to that class would change {collapse:.1%} of the predictions, not enough to cross the "
                "gap threshold (an untrained model, or a probe of one class)")
    acc = float(record.checks["acc_train_mode"].iloc[0])
    share = acc - collapse
    if share == 1:
        hint = "a probe of one class: give it several"
    elif share > 0.5:
        hint = "a probe dominated by one class, on which a collapse to it hardly shows"
    elif collapse <= 0:
        hint = "a model that has not learned the probe yet, or labels of another task"
    else:
        hint = "a model that has barely learned the probe"
    return (f"a constant guess of the probe's largest class scores {share:.1%} against training mode's "
            f"{acc:.1%}: an evaluation mode collapsed to that class would not cross the gap threshold ({hint})")


def collapse_gap(record, out_train: torch.Tensor, y: torch.Tensor | None, largest_class: int) -> float:
    """The mode gap an evaluation mode collapsed to the probe's largest class would leave (a fraction):
    training-mode accuracy minus that class's share of the labels ``y`` (N,) (``largest_class`` of them); without
    labels, where the gap is the share of changed predictions, the share of training-mode predictions
    (``out_train`` (N, classes, ...), argmax over dim 1) that are not of the class it predicts most. In counts: 5
    of 100 samples is the 5% threshold itself."""
    if y is None:
        pred = out_train.argmax(1).flatten()
        return (pred.numel() - int(torch.bincount(pred.long().cpu()).max())) / pred.numel()
    n = y.numel()
    right = round(float(record.checks["acc_train_mode"].iloc[0]) * n)
    return (right - largest_class) / n


def stale(record, thresholds: Thresholds) -> bool:
    """The rule's verdict on ``record`` (a :class:`bnrotation.monitor.MonitorRecord`): running statistics that
    hold NaN or infinite values, or, where the rule can judge (no ``undetermined`` reason), the ``thresholds``
    crossed by its mode gap with its worst median lag or E (:meth:`staleness.Thresholds.crossed`)."""
    if record.nonfinite.running_statistics:
        return True
    return not record.undetermined and thresholds.crossed(record.mode_gap, record.worst_median_lag_sigma,
                                                          record.worst_median_eval_error_sigma)


def rotation_text(record, paired: int, total: int) -> str:
    """The summary's rotation: the median over the ``paired`` layers (of ``total``) of ``record``'s rotation per
    100 steps, in degrees, how many of the layers they are when some are unpaired, and that nothing is measured
    when none is; "" before a second call (no rotation yet)."""
    if not paired:
        return "rotation: no layer paired (monitor.pairing)"
    rot = record.layers["rotation_deg_per_100"]
    if not rot.notna().any():
        return ""
    share = f" ({paired} of {total} layers paired)" if paired < total else ""
    return f"rotation {rot.median():.2f}°/100 steps{share}"


def summary(record, rotation: str, warmup_steps: int) -> str:
    """``record``'s one line for a progress bar (its ``summary``): ``STALE`` when flagged, else the warm-up and
    ``UNDETERMINED`` with the reason when they apply, then the modes' accuracies (or agreement), ``rotation``
    (:func:`rotation_text`), the worst layer's median lag and its largest channel lag, and the worst median E."""
    c = record.checks.iloc[0]
    if not math.isnan(c["acc_train_mode"]):
        modes = f"train {c['acc_train_mode']:.1%} / eval {c['acc_eval_mode']:.1%}"
    elif not math.isnan(c["mode_agreement"]):
        modes = f"modes agree {c['mode_agreement']:.1%}"
    else:
        modes = ""
    lag = record.layers.dropna(subset=["lag_median_abs_sigma"])
    lag_text = ""
    if len(lag):
        top = lag.loc[lag["lag_median_abs_sigma"].idxmax()]
        lag_text = (f"lag median {top['lag_median_abs_sigma']:.2f}σ in {top['norm_layer']}, "
                    f"max {lag['lag_max_abs_sigma'].max():.2f}σ")
    err = record.layers.dropna(subset=["eval_error_median_sigma"])
    err_text = ""
    if len(err):
        top = err.loc[err["eval_error_median_sigma"].idxmax()]
        err_text = f"E median {top['eval_error_median_sigma']:.2f}σ in {top['norm_layer']}"
    bad = f"NON-FINITE {record.nonfinite}" if record.nonfinite else ""
    text = " | ".join(t for t in (bad, modes, rotation, lag_text, err_text) if t)
    if record.flagged:
        return "STALE " + text
    if record.undetermined and record.warming_up:  # a summary in the warm-up starts by saying so
        left = warmup_steps - record.step
        held = f"warming up, {left} step{'s' * (left != 1)} left; UNDETERMINED ({record.undetermined})"
        return " | ".join(t for t in (held, text) if t)
    if record.undetermined:
        return " | ".join(t for t in (f"UNDETERMINED ({record.undetermined})", text) if t)
    if record.warming_up:  # the rule's verdict is held back: say so, and what it is
        left = warmup_steps - record.step
        held = f"warming up, {left} step{'s' * (left != 1)} left"
        held += "; the rule would fire" if record.stale else ""
        return " | ".join(t for t in (held, text) if t)
    return text
