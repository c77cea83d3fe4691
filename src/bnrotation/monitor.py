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

from . import verdict
from .batches import sample_count
from .bnstats import NonFinite, nonfinite_state
from .evaluation import CompiledEvaluation, eval_chunk, evaluation_forward, without_autocast
from .layer_measures import eval_path_columns, layer_measures
from .lint import findings_line, lint_batchnorm
from .mode_check import mode_check
from .pairing import NormPair, find_pairs, rng_devices
from .pooling import pooled_moments
from .probe_batch import read_probe, smallest_probe
from .probes import Scratch, batch_statistics_pass, evaluation_path_pass
from .staleness import Thresholds, in_warmup, warmup_steps
from .weight_rows import WeightRows

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
                    eval_path_columns(norm, path.get(pair.norm), layer_line, channels)
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
        """One layer's line and channel columns (:func:`layer_measures.layer_measures`)."""
        prev = self.previous
        return layer_measures(step, interval, pair, norm, moments, weights,
                              prev.fresh_mean.get(pair.norm) if prev is not None else None)

    def _undetermined(self, record: MonitorRecord, out_train: torch.Tensor) -> str:
        return verdict.undetermined(record, out_train, self.thresholds, modes=self.modes, y=self.y,
                                    largest_class=self.largest_class)

    def _stale(self, record: MonitorRecord) -> bool:
        return verdict.stale(record, self.thresholds)

    def _summary(self, record: MonitorRecord) -> str:
        rotation = verdict.rotation_text(record, len(self.pairing.pairs), len(self.layers))
        return verdict.summary(record, rotation, self.warmup_steps)
