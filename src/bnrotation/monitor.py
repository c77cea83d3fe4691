"""A staleness monitor for any ``nn.Module``: the rotation study's three early-warning measurements.

The study (Pradeep 2026, "Batch norm's running statistics describe a network
that has already moved") ends with what would have caught its failure early:

1. accuracy on one fixed batch in training mode and in evaluation mode, side by side;
2. the angle each output channel of each convolution turns per 100 steps;
3. how far each normalisation layer's stored running mean sits from the mean
   the current weights produce, in that channel's standard deviations.

To the lag it adds the variance (:mod:`bnrotation.staleness`): per channel E, the exact RMS
error of the evaluation-mode normalised activation against the training-mode one, from the mean
shift d and the scale ratio s, every σ the layer's own sqrt(var + eps). The rule
(:class:`Thresholds`) reads the mode gap with E or the lag; its thresholds were fixed on the
suite's synthetic runs only, and its measured recall, false alarms and lead time, in sample and
out of sample, are in ``docs/monitor.md`` ("Where the thresholds come from", written by
``make calibrate``) and ``results/reference/calibration.md``.

:class:`StalenessMonitor` measures all of them on any model, at any step, from a
fixed probe batch. It finds each normalisation layer and the weight whose
output it normalises (:func:`find_pairs`: ``torch.fx`` where the model traces,
the order of execution on two probe samples for every layer fx cannot place;
``docs/pairing.md``) and returns tidy
records with the column names of the suite's ``checks``, ``layers`` and
``channels`` tables (:mod:`bnrotation.records`). A call leaves every buffer,
parameter, gradient, optimizer state, random stream and module training flag
as it found them. The suite's runner measures through it; so can a plain
PyTorch training loop::

    monitor = StalenessMonitor(model, (x_probe, y_probe))
    ...
    if step % 100 == 0:
        record = monitor(step)
        progress.set_postfix_str(record.summary)

The monitor is the call and its records; what it stands on lives below it: the probe batch, read and checked once
(:mod:`bnrotation.probe_batch`), the pooling of several batches' statistics (:mod:`bnrotation.pooling`), the weight
rows its rotation and cosines come from (:mod:`bnrotation.weight_rows`), the pairing (:mod:`bnrotation.pairing`), the
measurements (:mod:`bnrotation.probes`) and the rule (:mod:`bnrotation.staleness`). A measurement of a model at one
moment (the check, the audit, gated re-estimation) is :mod:`bnrotation.oneshot`'s.

Nothing here imports the suite's task or network.
"""

from __future__ import annotations

import math
import numbers
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from .batches import sample_count
from .bnstats import NonFinite, nonfinite_state
from .evaluation import CompiledEvaluation, eval_chunk, evaluation_forward, without_autocast
from .lint import findings_line, lint_batchnorm
from .pairing import NormPair, find_pairs, rng_devices
from .pooling import pooled_moments
from .probe_batch import read_probe, smallest_probe
from .probes import Scratch, batch_statistics_pass, drift_sigma_per_step, evaluation_path_pass, predicted_lag_sigma
from .staleness import Thresholds, channel_signals, in_warmup, sigma, warmup_steps
from .weight_rows import WeightRows, gathered

# Thresholds (the rule, bnrotation.staleness) and find_pairs (bnrotation.pairing) are the monitor's public API too.
__all__ = ["StalenessMonitor", "MonitorRecord", "Thresholds", "StaleStatisticsWarning", "MonitorSetupWarning",
           "find_pairs", "mode_check", "uncompiled", "default_warmup_steps"]


class StaleStatisticsWarning(UserWarning):
    """The running statistics describe other weights: the mode gap and E or the lag crossed the monitor's
    thresholds."""


class MonitorSetupWarning(UserWarning):
    """At construction: what the monitor cannot measure as asked (layers left unpaired, a probe too small for the
    mode-gap threshold), and how it reads a model output that is not a tensor (the ``logits`` of a transformers
    ``ModelOutput``: :func:`bnrotation.evaluation.read_logits`)."""


# ----------------------------------------------------------------------------- the probe batch
# ----------------------------------------------------------------------------- the mode check
def mode_check(step: int, out_train: torch.Tensor, out_eval: torch.Tensor | None,
               y: torch.Tensor | None) -> pd.DataFrame:
    """One ``checks`` line (see :class:`MonitorRecord`) from the outputs (N, classes) of the same N inputs in
    training mode (batch statistics) and in evaluation mode, and their labels (N,) if any.

    The mode gap is training- minus evaluation-mode accuracy with labels, else the share of samples whose
    predicted class (argmax over dim 1) differs between the modes; all fractions. Without ``out_eval``
    every measure is NaN.
    """
    nan = math.nan
    acc_train = acc_eval = agreement = nan
    if out_eval is not None:
        pred_train, pred_eval = out_train.argmax(1), out_eval.argmax(1)
        agreement = float((pred_train == pred_eval).double().mean())
        if y is not None:
            acc_train = float((pred_train == y).double().mean())
            acc_eval = float((pred_eval == y).double().mean())
    gap = acc_train - acc_eval if y is not None else 1.0 - agreement
    return pd.DataFrame({"step": [step], "acc_train_mode": [acc_train], "acc_eval_mode": [acc_eval],
                         "mode_agreement": [agreement], "mode_gap": [gap], "probe_size": [len(out_train)]})


# ----------------------------------------------------------------------------- one call's records
@dataclass
class MonitorRecord:
    """What one :meth:`StalenessMonitor.measure` call measured.

    Attributes:
        step: the optimizer step.
        checks: one line: ``step``, ``acc_train_mode``, ``acc_eval_mode`` (fractions; NaN without labels),
            ``mode_agreement`` (share of probe samples predicted alike in both modes), ``mode_gap``
            (training- minus evaluation-mode accuracy, or 1 - agreement without labels), ``probe_size``.
        layers: one line per normalisation layer: ``step``, ``layer`` (the upstream weight layer, "" if
            unpaired; ``cat(a, b, ...)`` for one paired per segment, whose weight norm and cosines are those of
            its segments' weight rows taken together), ``norm_layer``, ``weight_norm``, ``update_cos``, ``grad_cos``,
            ``rotation_deg_per_100`` (median over channels), ``lag_median_abs_sigma``,
            ``lag_max_abs_sigma``, ``worst_channel``, ``channels_above_1_sigma``, and the median and maximum
            over channels of |d|, |log s| and E (:mod:`bnrotation.staleness`): ``mean_shift_median_abs_sigma``,
            ``mean_shift_max_abs_sigma``, ``log_std_ratio_median_abs``, ``log_std_ratio_max_abs``,
            ``eval_error_median_sigma``, ``eval_error_max_sigma``; with ``evaluation_path``, also the median
            and maximum of E along the evaluation path, ``eval_path_error_median_sigma`` and
            ``eval_path_error_max_sigma``.
        channels: one line per channel, the suite's ``channels`` columns: ``step``, ``layer`` (the weight
            layer of the channel's segment), ``norm_layer``, ``channel``, ``rotation_deg`` (since the previous
            call), ``rotation_deg_per_100``, ``weight_norm``, ``update_cos``, ``running_mean``, ``running_var``, ``fresh_mean``, ``fresh_var``,
            ``lag_sigma``, ``drift_sigma_per_step``, ``predicted_lag_sigma``, ``abs_mean_over_std``, and the
            variance-aware signal of :mod:`bnrotation.staleness`: ``mean_shift_sigma`` (d, running σ),
            ``log_std_ratio`` (log s) and ``eval_error_sigma`` (E, the RMS error of the evaluation-mode
            normalised activation against the training-mode one, running σ); with ``evaluation_path``, also
            ``eval_path_mean`` and ``eval_path_var`` (the layer's input moments with the network upstream in
            evaluation mode) and ``eval_path_error_sigma`` (E of the running statistics against them). Every σ
            is the layer's own sqrt(var + eps).
        stale: the rule's verdict, at any step: whether the thresholds were crossed, or a running statistic
            holds NaN or infinite values. During the monitor's warm-up it is not announced: see :attr:`flagged`.
        summary: one line for a progress bar; it starts with ``STALE`` when :attr:`flagged`, and during the
            warm-up, which holds the rule's verdict back, with ``warming up, k steps left`` (k: the steps until
            the monitor's ``warmup_steps``), followed by ``; the rule would fire`` when :attr:`stale`.
        nonfinite: the parameters and running statistics that hold NaN or infinite values
            (:class:`.bnstats.NonFinite`; false when there are none). Their layers' measures are NaN and left
            out of the summary's medians, which name them instead.
        warming_up: whether the step is below the monitor's ``warmup_steps``, where the rule's verdict is kept
            in :attr:`stale` but not announced.
        undetermined: why the rule could not judge this call, in one line, or "" when it could: a probe smaller
            than :func:`.probe_batch.smallest_probe` of the gap threshold (one sample could cross it), no mode gap
            measured (``modes=False``) or a NaN one, a layer whose fresh statistics are infinite (activations that
            overflow: its lag would read 0σ), no layer whose lag or E is finite, or, with labels and a gap under
            the threshold, a probe on which even an evaluation mode collapsed to one constant class could not cross
            it (training-mode accuracy within the threshold of the largest class's share: a model that does not
            classify the probe, or a probe of one class; without labels, training-mode predictions of one class
            for all but a share of the probe under the threshold). Then :attr:`stale` is False
            (unless a running statistic is non-finite, which is stale whatever else) and :attr:`summary` starts
            with ``UNDETERMINED``: a quantity that is NaN or meaningless by construction is never read as "not
            stale".
    """

    step: int
    checks: pd.DataFrame
    layers: pd.DataFrame
    channels: pd.DataFrame
    stale: bool
    summary: str
    nonfinite: NonFinite = field(default_factory=NonFinite)
    warming_up: bool = False
    undetermined: str = ""

    @property
    def flagged(self) -> bool:
        """Whether this call tells the user the statistics are stale: the :class:`StaleStatisticsWarning` (with
        ``warn=True``), ``STALE`` at the start of :attr:`summary`, and the ``stale`` an adapter logs
        (:func:`bnrotation.integrations.record_metrics`). That is :attr:`stale` outside the warm-up, and at any
        step a running statistic that holds NaN or infinite values."""
        return bool(self.nonfinite.running_statistics) or (self.stale and not self.warming_up)

    @property
    def mode_gap(self) -> float:
        """The probe's training- minus evaluation-mode accuracy (1 - agreement without labels), a fraction."""
        return float(self.checks["mode_gap"].iloc[0])

    @property
    def acc_eval_mode(self) -> float:
        """The probe's evaluation-mode accuracy, a fraction; NaN without labels."""
        return float(self.checks["acc_eval_mode"].iloc[0])

    @property
    def worst_median_lag_sigma(self) -> float:
        """The largest, over layers, median |running-mean lag| in fresh σ: the lag the rule reads (NaN when none)."""
        lag = self.layers["lag_median_abs_sigma"]
        return float(lag.max()) if lag.notna().any() else math.nan

    @property
    def worst_median_eval_error_sigma(self) -> float:
        """The largest, over layers, median E in running σ (:mod:`bnrotation.staleness`): the E the rule reads
        (NaN when none)."""
        e = self.layers["eval_error_median_sigma"]
        return float(e.max()) if e.notna().any() else math.nan

    def worst(self) -> tuple[str, int, float] | None:
        """(norm layer, channel, signed lag in σ) of the channel with the largest |lag|; None without lag."""
        ch = self.channels[np.isfinite(self.channels["lag_sigma"])]
        if ch.empty:
            return None
        line = ch.loc[ch["lag_sigma"].abs().idxmax()]
        return str(line["norm_layer"]), int(line["channel"]), float(line["lag_sigma"])


@dataclass
class _Previous:
    """The previous call: its step, each paired weight layer's weight then (a copy, which the next call
    overwrites in place with the weight it measures), and the fresh means."""

    step: int
    weights: dict[str, torch.Tensor]
    fresh_mean: dict[str, torch.Tensor] = field(default_factory=dict)


def _median_max(name: str, unit: str, values: torch.Tensor) -> dict[str, float]:
    """A layer line's ``<name>_median<unit>`` and ``<name>_max<unit>`` over the finite values (C,); NaN without."""
    finite = values[torch.isfinite(values)]
    if not finite.numel():
        return {f"{name}_median{unit}": math.nan, f"{name}_max{unit}": math.nan}
    # the median of an even count is the mean of the two middle values, as numpy and pandas take it (the
    # analysis recomputes these offline); torch.median would take the lower one
    return {f"{name}_median{unit}": float(finite.quantile(0.5)), f"{name}_max{unit}": float(finite.max())}


def _channel_count(norm: nn.Module) -> int:
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


# Packages whose frames a warning skips to reach the user's line: this one (the monitor, its adapters, the check,
# the gated re-estimation, the audit), torch's decorators, and the training frameworks the adapters run inside.
_NOT_THE_CALLER = frozenset({"bnrotation", "torch", "lightning", "pytorch_lightning", "lightning_fabric",
                             "transformers", "accelerate"})


def _caller_stacklevel() -> int:
    """``warnings.warn``'s stacklevel, from the function that warns, that names the first line outside
    :data:`_NOT_THE_CALLER`'s packages: the user's ``monitor(step)`` line in a plain loop, ``trainer.fit(...)``
    under an adapter, ``reestimate_if_stale(...)`` or ``StalenessMonitor(...)``; not ``torch.no_grad``'s wrapper
    or a callback hook. Python's default filter then shows each warning once per such line."""
    frame, level = sys._getframe(1), 1  # level 1: the function that warns
    while frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[0] in _NOT_THE_CALLER:
        frame, level = frame.f_back, level + 1
    return level


def uncompiled(model: nn.Module) -> nn.Module:
    """The module a ``torch.compile``d model wraps (``OptimizedModule._orig_mod``: the same parameters and
    buffers), else ``model``. The monitor measures it eagerly: compiling graphs for the probe batch would cost
    more than the measurements."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # never imported: nothing was compiled
    if eval_frame is not None and isinstance(model, eval_frame.OptimizedModule):
        return model._orig_mod
    return model


def default_warmup_steps(layers: list[nn.Module], remaining: float = 0.01) -> int:
    """Steps until every BatchNorm layer's running statistics hold less than ``remaining`` of their initial
    values: :func:`bnrotation.staleness.warmup_steps` of the momenta of ``layers``' BatchNorm layers that track
    running statistics (``ceil(ln(remaining) / ln(1 - m))`` for the smallest momentum m; 1 for
    ``momentum=None``); 0 without BatchNorm layers. 44 at PyTorch's default m = 0.1."""
    return warmup_steps([m.momentum for m in layers if isinstance(m, _BatchNorm) and m.track_running_stats],
                        remaining)


class StalenessMonitor:
    """The study's three early-warning measurements on any model, from a fixed probe batch.

    Args:
        model: any ``nn.Module`` with BatchNorm layers that keep running statistics (with
            ``running_statistics_only=False`` also GroupNorm, LayerNorm and InstanceNorm layers, whose
            rotation and input moments are measured and whose lag is NaN). A ``torch.compile``d model
            (``OptimizedModule``) is measured through the module it wraps (``_orig_mod``, which holds the same
            parameters and buffers), eagerly: no graph is compiled for the probe, and ``monitor.model`` is
            that module. Its output is read as logits (N, classes, ...) (:func:`bnrotation.evaluation.read_logits`):
            a tensor, or the ``logits`` of a mapping or transformers ``ModelOutput`` (a Hugging Face model as it
            is, said once in a :class:`MonitorSetupWarning`).
        probe: a tensor, an ``(x, y)`` tuple, or a mapping holding the input under ``input_key`` and the
            labels under ``target_key``; labels are optional. With ``input_key=None`` the mapping goes to the
            model whole (``model(batch)``), labels still read from ``target_key``. Or several
            such batches, a list of ``(x, y)`` tuples or mappings (:func:`.probe_batch.split_probes`): each goes
            through its own passes, the fresh statistics are pooled as :func:`bnstats.reestimate` pools them
            (:func:`.pooling.pooled_moments`), and the mode check reads every sample. Or a
            :class:`.probe_batch.CheckedProbe`, taken as it is when it was checked on this model. Keep it fixed
            across calls: the drift and the lag compare statistics of the same inputs. Inputs (N, ...) on the
            model's device. The mode gap moves by 1/N per sample: warns at construction
            (:class:`MonitorSetupWarning`) when that is above ``thresholds.mode_gap``, naming the smallest
            probe for it; ``docs/pairing.md`` advises on the size.
        thresholds: when to warn (:class:`Thresholds`).
        warn: raise a :class:`StaleStatisticsWarning` when a record is :attr:`~MonitorRecord.flagged` (the
            thresholds crossed past the warm-up, or non-finite running statistics at any step).
        modes: measure the training- against evaluation-mode check on the probe batch (one extra
            evaluation-mode forward pass per call).
        warmup_steps: no staleness warning, no ``STALE`` in the summary and no ``stale`` in an adapter's
            metrics at a step below it (:attr:`MonitorRecord.flagged`; the record's ``stale`` is still the rule's
            verdict, logged by an adapter as ``stale_rule``; non-finite running statistics always warn).
            Default (None): :func:`default_warmup_steps` of the monitored layers' momenta, the steps until their
            running statistics hold less than 1% of their initial values (44 at PyTorch's default momentum of
            0.1); before that, a lag measures the initialisation, and an untrained model's two modes differ by
            chance alone.
        evaluation_path: also measure each layer's input moments with the network upstream in evaluation mode
            (:func:`bnrotation.probes.evaluation_path_pass`; Huang et al., CVPR 2022, "expected" statistics), and E
            of the running statistics against them: the lag a layer meets at evaluation time, its own and what
            the layers above it carry through depth, beside E against the training-path statistics, its own. The
            evaluation-mode pass of the mode check measures them (run eagerly, with hooks; without ``modes`` that
            pass is made for them alone). Adds the ``eval_path_*`` columns of :class:`MonitorRecord`; ``make
            bench``, section (c), gives its cost.
        compiled: a :class:`bnrotation.evaluation.CompiledEvaluation` the mode check's evaluation-mode pass runs
            through (the suite's runner passes its own), or None (the default): eagerly.

    Unpaired layers (:attr:`pairing`, :func:`find_pairs`) are counted by reason, with a few of each reason's
    layers, in one :class:`MonitorSetupWarning` at construction (:meth:`Pairing.unpaired_text`; every one in
    ``monitor.pairing.describe()``): their lag is measured, their rotation is not. BatchNorm settings that break
    the running statistics (:func:`bnrotation.lint.lint_batchnorm`, kept in :attr:`findings`) are counted by rule
    in one more (:func:`bnrotation.lint.findings_line`).

    A call costs one forward pass in training mode with batch statistics (it gives the fresh statistics
    and the training-mode predictions at once), one in evaluation mode, and a pass over the paired
    weights. It changes no buffer, parameter, gradient, optimizer state, random stream or module flag.
    Layers frozen in evaluation mode while the model trains keep their running statistics in the
    training-mode pass, as they do in the model's own training steps.

    Raises:
        ValueError: for a model without such layers, a probe of fewer than 2 samples, with non-finite
            values, of a shape the model cannot run on, or with labels that are not the output's class
            indices; for a model whose output holds no logits (a tuple, say; the message names the wrapper that
            fixes it, ``ModelLogits``); for a ``warmup_steps`` that is not an int >= 0 or None.
        TypeError: for a model that is not an ``nn.Module``, a probe it cannot read, ``thresholds`` that are
            not a :class:`Thresholds`, or an ``evaluation_path`` that is not a bool.
    """

    def __init__(self, model: nn.Module, probe, *, input_key: str | None = "input", target_key: str = "target",
                 thresholds: Thresholds = Thresholds(), warn: bool = True, modes: bool = True,
                 running_statistics_only: bool = True, warmup_steps: int | None = None,
                 evaluation_path: bool = False, compiled: CompiledEvaluation | None = None):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
        model = uncompiled(model)
        self.model = model
        if warmup_steps is not None and (isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int)
                                         or warmup_steps < 0):
            raise ValueError(f"warmup_steps: expected an int >= 0 or None, got {warmup_steps!r}")
        for name, m in model.named_modules():
            if isinstance(m, nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params():
                raise ValueError(f"{name or 'model'}: an uninitialised lazy module; run one forward pass before "
                                 "attaching the monitor")
        if not isinstance(evaluation_path, bool):
            raise TypeError(f"evaluation_path: expected a bool, got {evaluation_path!r}")
        if not isinstance(thresholds, Thresholds):
            raise TypeError(f"thresholds: expected a bnrotation.monitor.Thresholds, got {type(thresholds).__name__}"
                            " (write Thresholds(mode_gap=..., lag_sigma=...))")
        probe = read_probe(model, probe, input_key, target_key)  # as it is when already checked on this model
        self.batches = list(probe.batches)  # [(x (N_b, ...), y (N_b,) or None)]
        self.x = self.batches[0][0]  # what the pairing traces
        ys = [y for _, y in self.batches]
        self.y = ys[0] if len(ys) == 1 or ys[0] is None else torch.cat(ys)  # (N,) over every batch
        n = sum(sample_count(x) for x, _ in self.batches)
        # the labels of the probe's largest class: what a constant guess of it gets right (_collapse_gap)
        self.largest_class = int(torch.bincount(self.y.flatten().long().cpu()).max()) if self.y is not None else 0
        note = probe.output_note
        self.output_note = note  # "" for a model that returns a tensor
        if note:  # said once, here: every pass of every call reads the logits the same way (read_logits)
            warnings.warn(note, MonitorSetupWarning, stacklevel=_caller_stacklevel())
        self.pairing = find_pairs(model, self.x, running_statistics_only)
        modules = dict(model.named_modules())
        self.layers = [(p, modules[p.norm]) for p in self.pairing.pairs + self.pairing.unpaired]
        # every weight layer of a paired layer's segments, once: the weight pass measures each once per call
        self.weight_layers = {w: modules[w] for p in self.pairing.pairs for w in p.weights}
        self.thresholds, self.warn, self.modes = thresholds, warn, modes
        self.evaluation_path = evaluation_path
        self.compiled = compiled  # the mode check's evaluation-mode pass runs through it when given
        self.warmup_steps = (default_warmup_steps([m for _, m in self.layers]) if warmup_steps is None
                             else warmup_steps)
        if self.pairing.unpaired:
            warnings.warn(self.pairing.unpaired_text(), MonitorSetupWarning, stacklevel=_caller_stacklevel())
        self.findings = lint_batchnorm(model, pairing=self.pairing)  # BatchNorm settings that break the statistics
        if self.findings:
            warnings.warn(findings_line(self.findings), MonitorSetupWarning, stacklevel=_caller_stacklevel())
        smallest = smallest_probe(thresholds.mode_gap)
        if modes and n < smallest:  # without the mode check no gap is measured
            warnings.warn(f"probe: one of its {n} samples moves the mode gap by {1 / n:.2%}, more than the "
                          f"threshold of {thresholds.mode_gap:.2%}: one sample alone can cross it; use at least "
                          f"{smallest} samples (docs/pairing.md, 'Probe size')", MonitorSetupWarning,
                          stacklevel=_caller_stacklevel())
        self.previous: _Previous | None = None
        # the evaluation-mode pass's chunk (evaluation.eval_chunk), from the model's weight bytes and the largest
        # normalisation-layer input per probe sample that each call's training-mode pass measures
        self.weight_bytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
        self.eval_chunk: int | None = None
        self.last_fresh: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None  # the last call's, float64

    def state_dict(self) -> dict:
        """What the next call compares with (the previous call's step, weights and fresh means), for a
        resumable run. The weights are copies: the next call overwrites the monitor's own in place."""
        if self.previous is None:
            return {}
        return {"step": self.previous.step, "weights": {k: v.clone() for k, v in self.previous.weights.items()},
                "fresh_mean": dict(self.previous.fresh_mean),
                "last_fresh": {k: list(v) for k, v in (self.last_fresh or {}).items()}}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict`'s output (weights copied to their layers' devices).

        Raises:
            ValueError: when its weights are not this model's paired weight layers, of their shapes.
        """
        if not state:
            self.previous, self.last_fresh = None, None
            return
        weights = {}
        for name, w in state["weights"].items():
            layer = self.weight_layers.get(name)
            if layer is None or tuple(w.shape) != tuple(layer.weight.shape):
                want = f"{tuple(layer.weight.shape)}" if layer is not None else "no paired weight layer of that name"
                raise ValueError(f"monitor state: weights[{name!r}] of shape {tuple(w.shape)}, but this model has "
                                 f"{want}: a state of another model?")
            weights[name] = w.to(layer.weight.device, copy=True)  # a copy: the next call overwrites it in place
        self.previous = _Previous(int(state["step"]), weights, dict(state["fresh_mean"]))
        self.last_fresh = {k: (v[0], v[1]) for k, v in state["last_fresh"].items()}

    @property
    def unpaired(self) -> list[NormPair]:
        """The layers left unpaired (``pairing.unpaired``), each with its reason: their lag is measured, their
        rotation is not."""
        return self.pairing.unpaired

    def snapshot(self) -> dict[str, torch.Tensor]:
        """Clones of the paired weights, ``{weight layer: (C_out, ...)}`` (each weight layer of a segment once):
        take one just before
        ``optimizer.step()`` and pass it to :meth:`measure` to get the update and gradient cosines of
        that step."""
        return {name: w.weight.detach().clone() for name, w in self.weight_layers.items()}

    def __call__(self, step: int, weights_before_step: Mapping[str, torch.Tensor] | None = None) -> MonitorRecord:
        return self.measure(step, weights_before_step)

    @torch.no_grad()
    def measure(self, step: int, weights_before_step: Mapping[str, torch.Tensor] | None = None) -> MonitorRecord:
        """Measure at ``step``: the mode check on the probe batch, each channel's rotation since the previous
        call, and each channel's running-mean lag, drift and |mean|/σ.

        Args:
            step: the optimizer step (for the rotation and drift per step, and the records).
            weights_before_step: :meth:`snapshot` taken before this step's ``optimizer.step()``; gives the
                update cosine cos(w(t+1) - w(t), w(t)) and the gradient cosine cos(∇L, w(t)), else NaN.

        Returns:
            A :class:`MonitorRecord`. Warns with :class:`StaleStatisticsWarning` when it is
            :attr:`~MonitorRecord.flagged` (the thresholds crossed at a step past the warm-up, or a running statistic
            that holds NaN or infinite values), and with ``RuntimeWarning`` when a parameter does.

        Raises:
            TypeError: when ``step`` is not an int >= 0.
            ValueError: when ``step`` is not after the previous call's.
        """
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise TypeError(f"step: expected the optimizer step as an int >= 0, got {step!r}")
        step = int(step)
        if self.previous is not None and step <= self.previous.step:
            raise ValueError(f"step {step} is not after the previous call's step {self.previous.step}")
        with without_autocast(self.model):  # float32 whatever autocast context the caller trains in
            return self._measure(step, weights_before_step)

    def _measure(self, step: int, weights_before_step: Mapping[str, torch.Tensor] | None) -> MonitorRecord:
        with torch.random.fork_rng(devices=rng_devices(self.model)):
            scratch = Scratch()
            outs, moments, evals, paths = [], [], [], []
            layers = [(p.norm, m) for p, m in self.layers]
            for x, _ in self.batches:  # one batch: the probe; several: pooled as re-estimation pools them
                out, fresh = batch_statistics_pass(self.model, x, layers, keep_frozen=True, scratch=scratch)
                if isinstance(x, torch.Tensor):
                    self.eval_chunk = eval_chunk(x.device, len(x), self.weight_bytes,
                                                 scratch.largest // max(len(x), 1))
                outs.append(out)
                moments.append(fresh)
                if self.evaluation_path:  # the mode check's evaluation-mode pass measures them
                    out_eval, path = evaluation_path_pass(self.model, x, layers, self.eval_chunk, scratch)
                    paths.append(path)
                    evals.append(out_eval if self.modes else None)
                else:
                    evals.append(self._eval_forward(x) if self.modes else None)
            out_train = outs[0] if len(outs) == 1 else torch.cat(outs)
            fresh = pooled_moments(moments)
            path = pooled_moments(paths) if paths else None
            out_eval = None if not self.modes else evals[0] if len(evals) == 1 else torch.cat(evals)
        checks = self._checks(step, out_train, out_eval)
        prev = self.previous
        interval = step - prev.step if prev is not None else None
        kept = prev.weights if prev is not None else {}
        try:
            rows = self._weight_pass(weights_before_step, kept)  # kept now holds this call's weights
            layer_rows, channel_columns = [], []
            for pair, norm in self.layers:
                layer_line, channels = self._layer(step, interval, pair, norm, fresh.get(pair.norm), rows)
                if path is not None:
                    self._eval_path_columns(norm, path.get(pair.norm), layer_line, channels)
                layer_rows.append(layer_line)
                channel_columns.append(channels)
        except BaseException:
            if prev is not None:  # its weights were overwritten, maybe part-way: the next call measures no rotation
                self.previous = _Previous(prev.step, {}, prev.fresh_mean)
            raise
        self.previous = _Previous(step, kept, {name: mean.cpu() for name, (mean, _) in fresh.items()})
        self.last_fresh = fresh
        channels = pd.DataFrame({k: np.concatenate([c[k] for c in channel_columns]) for k in channel_columns[0]})
        record = MonitorRecord(step, checks, pd.DataFrame(layer_rows), channels, False, "",
                               nonfinite_state(self.model), warming_up=in_warmup(step, self.warmup_steps))
        record.undetermined = self._undetermined(record, out_train)
        record.stale = self._stale(record)
        record.summary = self._summary(record)
        if record.nonfinite.parameters and self.warn:
            warnings.warn(f"step {step}: the model has diverged: NaN or infinite values in "
                          f"{', '.join(record.nonfinite.parameters)}; the measures of their layers are NaN",
                          RuntimeWarning, stacklevel=_caller_stacklevel())
        if record.nonfinite.running_statistics and self.warn:
            warnings.warn(f"step {step}: running statistics hold NaN or infinite values "
                          f"({', '.join(record.nonfinite.running_statistics)}): evaluation mode is unusable. "
                          "Re-estimate them (bnrotation.reestimate) before evaluating or saving this model",
                          StaleStatisticsWarning, stacklevel=_caller_stacklevel())
        elif record.flagged and self.warn:
            worst = record.worst()
            where = f"{worst[0]} channel {worst[1]} ({worst[2]:+.2f}σ)" if worst else "?"
            warnings.warn(f"step {step}: running statistics are stale: {record.summary}; worst channel {where}. "
                          "Re-estimate them (bnrotation.reestimate) before evaluating or saving this "
                          "model", StaleStatisticsWarning, stacklevel=_caller_stacklevel())
        return record

    # ------------------------------------------------------------------------- parts of a call
    def _eval_forward(self, x=None) -> torch.Tensor:
        return evaluation_forward(self.model, self.x if x is None else x, self.eval_chunk, self.compiled)

    def _checks(self, step: int, out_train: torch.Tensor, out_eval: torch.Tensor | None) -> pd.DataFrame:
        return mode_check(step, out_train, out_eval, self.y)

    def _weight_pass(self, before: Mapping[str, torch.Tensor] | None,
                     kept: dict[str, torch.Tensor]) -> dict[str, WeightRows]:
        """Each weight layer's per-output-channel measures, once per call however many segments use it; ``kept``
        (the previous call's weights) is overwritten with this call's, in place (:meth:`WeightRows.of`)."""
        rows = {}
        for name, layer in self.weight_layers.items():
            w = layer.weight.detach()
            wb = before.get(name) if before is not None else None
            rows[name] = WeightRows.of(w, kept, name, wb, layer.weight.grad)
        return rows

    def _layer(self, step: int, interval: int | None, pair: NormPair, norm: nn.Module,
               moments: tuple[torch.Tensor, torch.Tensor] | None, weights: dict[str, WeightRows]):
        """One layer's line and channel columns; ``moments`` None for a layer the probe's training-mode pass did not
        reach (never called, or behind a branch not taken): its fresh measures are NaN."""
        if moments is None:
            c = _channel_count(norm)
            moments = (torch.full((c,), math.nan, dtype=torch.float64),) * 2
        f_mean, f_var = (t.cpu() for t in moments)  # (C,) float64
        c = f_mean.numel()
        nan = torch.full((c,), math.nan, dtype=torch.float64)
        has_running = isinstance(norm, _BatchNorm) and norm.running_mean is not None
        r_mean = norm.running_mean.double().cpu() if has_running else nan
        r_var = norm.running_var.double().cpu() if has_running else nan
        prev = self.previous
        prev_mean = prev.fresh_mean.get(pair.norm) if prev is not None else None
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
            **_median_max("mean_shift", "_abs_sigma", signals.mean_shift_sigma.abs()),
            **_median_max("log_std_ratio", "_abs", signals.log_std_ratio.abs()),
            **_median_max("eval_error", "_sigma", signals.eval_error_sigma),
        }
        return line, channels

    @staticmethod
    def _eval_path_columns(norm: nn.Module, moments: tuple[torch.Tensor, torch.Tensor] | None, line: dict,
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
        line.update(_median_max("eval_path_error", "_sigma", error))

    def _undetermined(self, record: MonitorRecord, out_train: torch.Tensor) -> str:
        """Why the rule cannot judge ``record`` (:attr:`MonitorRecord.undetermined`), or "" (``out_train``: the
        training-mode outputs (N, classes, ...) of the call)."""
        n = int(record.checks["probe_size"].iloc[0])
        smallest = smallest_probe(self.thresholds.mode_gap)
        if not self.modes:
            return "no mode gap measured (modes=False), and the rule needs it"
        if n < smallest:
            return (f"a probe of {n} samples: one sample moves the mode gap by {1 / n:.1%}, more than the "
                    f"{self.thresholds.mode_gap:.1%} threshold; the rule needs at least {smallest}")
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
        collapse = self._collapse_gap(record, out_train)
        if record.mode_gap >= self.thresholds.mode_gap or collapse >= self.thresholds.mode_gap:
            return ""  # a gap that crosses is judged; one that could cross, had evaluation mode collapsed, too
        if self.y is None:
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

    def _collapse_gap(self, record: MonitorRecord, out_train: torch.Tensor) -> float:
        """The mode gap an evaluation mode collapsed to the probe's largest class would leave (a fraction):
        training-mode accuracy minus that class's share of the labels; without labels, where the gap is the share
        of changed predictions, the share of training-mode predictions (``out_train`` (N, classes, ...), argmax
        over dim 1) that are not of the class it predicts most."""
        if self.y is None:
            pred = out_train.argmax(1).flatten()
            return (pred.numel() - int(torch.bincount(pred.long().cpu()).max())) / pred.numel()
        n = self.y.numel()
        right = round(float(record.checks["acc_train_mode"].iloc[0]) * n)
        return (right - self.largest_class) / n  # in counts: 5 of 100 samples is the 5% threshold itself

    def _stale(self, record: MonitorRecord) -> bool:
        if record.nonfinite.running_statistics:
            return True
        return not record.undetermined and self.thresholds.crossed(record.mode_gap, record.worst_median_lag_sigma,
                                                                   record.worst_median_eval_error_sigma)

    def _rotation_text(self, record: MonitorRecord) -> str:
        """The summary's rotation: the median over paired layers, how many of the layers they are when some are
        unpaired, and that nothing is measured when none is."""
        paired, total = len(self.pairing.pairs), len(self.layers)
        if not paired:
            return "rotation: no layer paired (monitor.pairing)"
        rot = record.layers["rotation_deg_per_100"]
        if not rot.notna().any():
            return ""
        share = f" ({paired} of {total} layers paired)" if paired < total else ""
        return f"rotation {rot.median():.2f}°/100 steps{share}"

    def _summary(self, record: MonitorRecord) -> str:
        c = record.checks.iloc[0]
        if not math.isnan(c["acc_train_mode"]):
            modes = f"train {c['acc_train_mode']:.1%} / eval {c['acc_eval_mode']:.1%}"
        elif not math.isnan(c["mode_agreement"]):
            modes = f"modes agree {c['mode_agreement']:.1%}"
        else:
            modes = ""
        rot_text = self._rotation_text(record)
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
        text = " | ".join(t for t in (bad, modes, rot_text, lag_text, err_text) if t)
        if record.flagged:
            return "STALE " + text
        if record.undetermined and record.warming_up:  # a summary in the warm-up starts by saying so
            left = self.warmup_steps - record.step
            held = f"warming up, {left} step{'s' * (left != 1)} left; UNDETERMINED ({record.undetermined})"
            return " | ".join(t for t in (held, text) if t)
        if record.undetermined:
            return " | ".join(t for t in (f"UNDETERMINED ({record.undetermined})", text) if t)
        if record.warming_up:  # the rule's verdict is held back: say so, and what it is
            left = self.warmup_steps - record.step
            held = f"warming up, {left} step{'s' * (left != 1)} left"
            held += "; the rule would fire" if record.stale else ""
            return " | ".join(t for t in (held, text) if t)
        return text
