"""A staleness monitor for any ``nn.Module``: the rotation study's three early-warning measurements.

The study (Pradeep 2026, "Batch norm's running statistics describe a network
that has already moved") ends with what would have caught its failure early:

1. accuracy on one fixed batch in training mode and in evaluation mode, side by side;
2. the angle each output channel of each convolution turns per 100 steps;
3. how far each normalisation layer's stored running mean sits from the mean
   the current weights produce, in that channel's standard deviations.

:class:`StalenessMonitor` measures all three on any model, at any step, from a
fixed probe batch. It finds each normalisation layer and the weight whose
output it normalises (:func:`find_pairs`: ``torch.fx`` where the model traces,
the order of execution on the probe batch where it does not) and returns tidy
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

from .bnstats import NonFinite, batch_statistics, nonfinite_state, norm_layers, running_stat_layers
from .probes import (batch_statistics_pass, channel_cosines, channel_norms, cosine, drift_sigma_per_step,
                     evaluation_forward, evaluation_mode, lag_sigma, predicted_lag_sigma, rotation_deg)

# Layers whose weight rows are output channels: what a normalisation layer directly downstream normalises.
WEIGHT_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


class StaleStatisticsWarning(UserWarning):
    """The running statistics describe other weights: the mode gap and the lag crossed the monitor's thresholds."""


# ----------------------------------------------------------------------------- pairing
@dataclass(frozen=True)
class NormPair:
    """A normalisation layer and the layer whose output it normalises.

    Attributes:
        norm: the normalisation layer's name (``model.named_modules()``).
        weight: the upstream convolution or linear layer's name; ``None`` when unpaired.
        reason: why it is unpaired ("" when paired).
    """

    norm: str
    weight: str | None
    reason: str = ""


@dataclass
class Pairing:
    """What :func:`find_pairs` found: ``pairs`` in forward order, ``unpaired`` with the reason, and ``method``
    (``fx`` or ``execution order``)."""

    pairs: list[NormPair]
    unpaired: list[NormPair]
    method: str

    def describe(self) -> str:
        lines = [f"{len(self.pairs)} normalisation layer(s) paired by {self.method}:"]
        lines += [f"  {p.weight} -> {p.norm}" for p in self.pairs]
        lines += [f"  unpaired: {p.norm} ({p.reason})" for p in self.unpaired]
        return "\n".join(lines)


def _fx_pairs(model: nn.Module, norms: dict[str, nn.Module]) -> tuple[list[NormPair], list[NormPair]] | None:
    """Pairs read off a ``torch.fx`` trace; None when the model does not trace."""
    try:
        graph = torch.fx.symbolic_trace(model).graph
    except Exception:  # noqa: BLE001 - any model fx cannot trace falls back to execution order
        return None
    modules = dict(model.named_modules())
    pairs, unpaired, seen = [], [], set()
    for node in graph.nodes:
        if node.op != "call_module" or node.target not in norms or node.target in seen:
            continue
        seen.add(node.target)
        src = node.args[0] if node.args else None
        if isinstance(src, torch.fx.Node) and src.op == "call_module" and isinstance(modules.get(src.target),
                                                                                       WEIGHT_LAYERS):
            pairs.append(NormPair(node.target, src.target))
        else:
            what = (f"{src.op} {getattr(src.target, '__name__', src.target)}" if isinstance(src, torch.fx.Node)
                    else type(src).__name__)
            unpaired.append(NormPair(node.target, None, f"its input comes from {what}, not directly from a "
                                                        "convolution or linear layer"))
    unpaired += [NormPair(n, None, "not called in the traced forward") for n in norms if n not in seen]
    return pairs, unpaired


def _execution_pairs(model: nn.Module, norms: dict[str, nn.Module],
                     x) -> tuple[list[NormPair], list[NormPair]]:
    """Pairs found by running ``x`` through the model: a norm layer is paired with the convolution or linear
    layer whose output tensor *is* its input. Run with batch statistics and no gradient: no buffer changes."""
    outputs: dict[str, torch.Tensor] = {}
    found: dict[str, list[str | None]] = {}
    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, WEIGHT_LAYERS):
            hooks.append(m.register_forward_hook(lambda mod, inp, out, name=name: outputs.__setitem__(name, out)))
        if name in norms:
            def pre(mod, inp, name=name):
                src = next((w for w, out in outputs.items() if out is inp[0]), None)
                found.setdefault(name, []).append(src)
            hooks.append(m.register_forward_pre_hook(pre))
    try:
        with torch.no_grad(), batch_statistics(model):
            model(x)
    finally:
        for h in hooks:
            h.remove()
    pairs, unpaired = [], []
    for name in found:  # forward order
        sources = set(found[name])
        if len(sources) == 1 and None not in sources:
            pairs.append(NormPair(name, sources.pop()))
        elif len(sources) > 1:
            unpaired.append(NormPair(name, None, f"called {len(found[name])} times on the outputs of different "
                                                 "layers"))
        else:
            unpaired.append(NormPair(name, None, "its input is not the output of a convolution or linear layer"))
    unpaired += [NormPair(n, None, "not called on the probe batch") for n in norms if n not in found]
    return pairs, unpaired


def find_pairs(model: nn.Module, x=None, running_statistics_only: bool = True) -> Pairing:
    """Each normalisation layer and the convolution or linear layer directly upstream of it.

    Tries ``torch.fx.symbolic_trace`` first (the graph says which module's output a norm layer takes);
    where the model does not trace (data-dependent control flow), runs ``x`` through it and pairs each norm
    layer with the layer whose output tensor is its input. A norm layer whose input comes from anything else
    (an addition, a concatenation, a reshape) is reported unpaired with the reason, never guessed.

    Args:
        x: a probe input for the execution-order fallback (needed only when fx fails).
        running_statistics_only: only BatchNorm layers that keep running statistics (the monitor's
            default); else every BatchNorm, GroupNorm, LayerNorm and InstanceNorm layer.

    Raises:
        ValueError: when the model has no such layer, or does not trace and no ``x`` is given.
    """
    layers = running_stat_layers(model) if running_statistics_only else norm_layers(model)
    if not layers:
        what = "BatchNorm layer with running statistics" if running_statistics_only else "normalisation layer"
        raise ValueError(f"the model has no {what} (BatchNorm1d/2d/3d, SyncBatchNorm or a subclass with "
                         "track_running_stats=True): there are no running statistics to go stale")
    norms = dict(layers)
    found = _fx_pairs(model, norms)
    if found is not None:
        return Pairing(*found, "fx")
    if x is None:
        raise ValueError("the model does not trace with torch.fx; pass a probe input to pair its layers by "
                         "execution order")
    return Pairing(*_execution_pairs(model, norms, x), "execution order")


# ----------------------------------------------------------------------------- the probe batch
def split_probe(probe, input_key: str = "input", target_key: str = "target") -> tuple[torch.Tensor,
                                                                                     torch.Tensor | None]:
    """``(x, y)`` from a probe batch: a tensor (no labels), an ``(x, y)`` or ``(x,)`` tuple or list, or a
    mapping with ``input_key`` (and optionally ``target_key``).

    Raises:
        TypeError: naming what was found, for anything else.
        ValueError: when labels are given but their count differs from the inputs'.
    """
    if isinstance(probe, torch.Tensor):
        x, y = probe, None
    elif isinstance(probe, (tuple, list)) and len(probe) in (1, 2) and isinstance(probe[0], torch.Tensor):
        x, y = probe[0], probe[1] if len(probe) > 1 else None
    elif isinstance(probe, Mapping) and isinstance(probe.get(input_key), torch.Tensor):
        x, y = probe[input_key], probe.get(target_key)
    else:
        keys = f" (keys: {sorted(map(str, probe))})" if isinstance(probe, Mapping) else ""
        n = f" of {len(probe)} items" if isinstance(probe, (tuple, list)) else ""
        raise TypeError(f"probe: expected a tensor, an (input, target) tuple, or a mapping with a tensor under "
                        f"{input_key!r}; got {type(probe).__name__}{n}{keys}")
    if y is not None and (not isinstance(y, torch.Tensor) or len(y) != len(x)):
        raise ValueError(f"probe: {len(x)} inputs but labels {type(y).__name__} "
                         f"{tuple(y.shape) if isinstance(y, torch.Tensor) else ''}")
    return x, y


def _check_probe(model: nn.Module, x: torch.Tensor, y: torch.Tensor | None) -> None:
    """Fail at construction, naming the probe, on what would fail or mislead at the first call: non-finite or
    non-floating inputs, inputs the model cannot run on (tried on two samples in evaluation mode, which
    changes no buffer; flags and random streams restored), outputs without a class dim, and labels that are
    not class indices of the output.

    Raises:
        ValueError: naming the probe and what was expected.
    """
    if not x.is_floating_point():
        raise ValueError(f"probe: expected floating-point inputs, got {x.dtype}")
    bad = int((~torch.isfinite(x)).sum())
    if bad:
        raise ValueError(f"probe: {bad} of {x.numel()} input values are NaN or infinite")
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=_rng_devices(model)), evaluation_mode(model):
            out = model(x[:2])  # eagerly: a compiled evaluation would compile a graph for 2 samples
    except Exception as e:  # any error the model raises on these inputs, reported as the probe's
        raise ValueError(f"probe: the model cannot run on the probe inputs {tuple(x.shape)} "
                         f"({type(e).__name__}: {e})") from e
    if not isinstance(out, torch.Tensor) or out.dim() < 2:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"probe: the model's output on the probe must be (N, classes, ...) for the mode check, "
                         f"got {got}")
    if y is not None:
        if y.is_floating_point() or y.is_complex():
            raise ValueError(f"probe: labels must be class indices (an integer tensor), got {y.dtype}")
        k = out.shape[1]
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= k):
            raise ValueError(f"probe: labels must lie in [0, {k}) for a model with {k} outputs, got "
                             f"[{int(y.min())}, {int(y.max())}]")


# ----------------------------------------------------------------------------- thresholds
@dataclass(frozen=True)
class Thresholds:
    """When :class:`StalenessMonitor` warns: both the mode gap and the lag at or above their threshold.

    Attributes:
        mode_gap: training-mode minus evaluation-mode accuracy on the probe batch (with labels), or the
            share of probe samples whose predicted class differs between the two modes (without), as a
            fraction. Default 0.05. The share of changed predictions is at least the accuracy gap, and much
            larger where both modes are often wrong (an untrained model): without labels the rule is
            stricter, and on the same model can warn where it would not with labels.
        lag_sigma: the largest, over layers, median |running-mean lag| in σ. Default 0.1σ.

    The defaults come from the suite's 30 reference runs
    (:func:`bnrotation.analysis.monitoring.threshold_table`, ``<root>/monitor.md``), by how often the rule
    fires at checks that fail (evaluation-mode accuracy below 90%) and at checks that pass: with a lag of
    0.25σ, the study's predicted lag under Adam, it caught 200 of the 373 failing checks (54%) and no passing
    one; with 0.1σ, 330 (88%), and 18 of 611 passing ones (3%), all between 90% and 95%.
    """

    mode_gap: float = 0.05
    lag_sigma: float = 0.1

    def __post_init__(self) -> None:
        for key in ("mode_gap", "lag_sigma"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"Thresholds.{key}: expected a finite number >= 0, got {value!r}")

    def crossed(self, mode_gap: float, lag_sigma: float) -> bool:
        """The rule: ``mode_gap`` (fraction) at least :attr:`mode_gap` and ``lag_sigma`` (the worst layer's median
        |lag|, σ) at least :attr:`lag_sigma`. NaN never crosses."""
        return bool(mode_gap >= self.mode_gap and lag_sigma >= self.lag_sigma)


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
            unpaired), ``norm_layer``, ``weight_norm``, ``update_cos``, ``grad_cos``,
            ``rotation_deg_per_100`` (median over channels), ``lag_median_abs_sigma``,
            ``lag_max_abs_sigma``, ``worst_channel``, ``channels_above_1_sigma``.
        channels: one line per channel, the suite's ``channels`` columns: ``step``, ``layer``,
            ``norm_layer``, ``channel``, ``rotation_deg`` (since the previous call), ``rotation_deg_per_100``,
            ``weight_norm``, ``update_cos``, ``running_mean``, ``running_var``, ``fresh_mean``, ``fresh_var``,
            ``lag_sigma``, ``drift_sigma_per_step``, ``predicted_lag_sigma``, ``abs_mean_over_std``.
        stale: whether the thresholds were crossed, or a running statistic holds NaN or infinite values.
        summary: one line for a progress bar.
        nonfinite: the parameters and running statistics that hold NaN or infinite values
            (:class:`.bnstats.NonFinite`; false when there are none). Their layers' measures are NaN and left
            out of the summary's medians, which name them instead.
    """

    step: int
    checks: pd.DataFrame
    layers: pd.DataFrame
    channels: pd.DataFrame
    stale: bool
    summary: str
    nonfinite: NonFinite = field(default_factory=NonFinite)

    def worst(self) -> tuple[str, int, float] | None:
        """(norm layer, channel, signed lag in σ) of the channel with the largest |lag|; None without lag."""
        ch = self.channels[np.isfinite(self.channels["lag_sigma"])]
        if ch.empty:
            return None
        line = ch.loc[ch["lag_sigma"].abs().idxmax()]
        return str(line["norm_layer"]), int(line["channel"]), float(line["lag_sigma"])


@dataclass
class _Previous:
    step: int
    weights: dict[str, torch.Tensor]
    fresh_mean: dict[str, torch.Tensor] = field(default_factory=dict)


def _caller_stacklevel() -> int:
    """``warnings.warn``'s stacklevel, from :meth:`StalenessMonitor.measure`, that names the first line outside
    this module and torch's decorators: the user's ``monitor(step)`` or ``monitor.measure(step)``, not
    ``torch.no_grad``'s wrapper."""
    frame, level = sys._getframe(1), 1  # level 1: the function that warns
    while frame.f_back is not None and (frame.f_code.co_filename == __file__
                                        or frame.f_globals.get("__name__", "").startswith("torch.")):
        frame, level = frame.f_back, level + 1
    return level


def _rng_devices(model: nn.Module) -> list[int]:
    return sorted({t.device.index or 0 for t in model.parameters() if t.device.type == "cuda"})


class StalenessMonitor:
    """The study's three early-warning measurements on any model, from a fixed probe batch.

    Args:
        model: any ``nn.Module`` with BatchNorm layers that keep running statistics (with
            ``running_statistics_only=False`` also GroupNorm, LayerNorm and InstanceNorm layers, whose
            rotation and input moments are measured and whose lag is NaN).
        probe: a tensor, an ``(x, y)`` tuple, or a mapping holding the input under ``input_key`` and the
            labels under ``target_key``; labels are optional. Keep it fixed across calls: the drift and
            the lag compare statistics of the same inputs. Inputs (N, ...) on the model's device.
        thresholds: when to warn (:class:`Thresholds`).
        warn: raise a :class:`StaleStatisticsWarning` when the thresholds are crossed.
        modes: measure the training- against evaluation-mode check on the probe batch (one extra
            evaluation-mode forward pass per call).

    A call costs one forward pass in training mode with batch statistics (it gives the fresh statistics
    and the training-mode predictions at once), one in evaluation mode, and a pass over the paired
    weights. It changes no buffer, parameter, gradient, optimizer state, random stream or module flag.
    Layers frozen in evaluation mode while the model trains keep their running statistics in the
    training-mode pass, as they do in the model's own training steps.

    Raises:
        ValueError: for a model without such layers, a probe of fewer than 2 samples, with non-finite
            values, of a shape the model cannot run on, or with labels that are not the output's class
            indices.
        TypeError: for a model that is not an ``nn.Module``, a probe it cannot read, or ``thresholds`` that are
            not a :class:`Thresholds`.
    """

    def __init__(self, model: nn.Module, probe, *, input_key: str = "input", target_key: str = "target",
                 thresholds: Thresholds = Thresholds(), warn: bool = True, modes: bool = True,
                 running_statistics_only: bool = True):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.x, self.y = split_probe(probe, input_key, target_key)
        if len(self.x) < 2:
            raise ValueError(f"probe: BatchNorm needs at least 2 samples for batch statistics, got {len(self.x)}")
        for name, m in model.named_modules():
            if isinstance(m, nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params():
                raise ValueError(f"{name or 'model'}: an uninitialised lazy module; run one forward pass before "
                                 "attaching the monitor")
        if not isinstance(thresholds, Thresholds):
            raise TypeError(f"thresholds: expected a bnrotation.monitor.Thresholds, got {type(thresholds).__name__}"
                            " (write Thresholds(mode_gap=..., lag_sigma=...))")
        _check_probe(model, self.x, self.y)
        self.pairing = find_pairs(model, self.x, running_statistics_only)
        modules = dict(model.named_modules())
        self.layers = [(p, modules[p.norm], modules[p.weight] if p.weight else None)
                       for p in self.pairing.pairs + self.pairing.unpaired]
        self.thresholds, self.warn, self.modes = thresholds, warn, modes
        self.previous: _Previous | None = None
        self.last_fresh: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None  # the last call's, float64

    def state_dict(self) -> dict:
        """What the next call compares with (the previous call's step, weights and fresh means), for a
        resumable run."""
        if self.previous is None:
            return {}
        return {"step": self.previous.step, "weights": dict(self.previous.weights),
                "fresh_mean": dict(self.previous.fresh_mean),
                "last_fresh": {k: list(v) for k, v in (self.last_fresh or {}).items()}}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict`'s output."""
        if not state:
            self.previous, self.last_fresh = None, None
            return
        self.previous = _Previous(int(state["step"]), dict(state["weights"]), dict(state["fresh_mean"]))
        self.last_fresh = {k: (v[0], v[1]) for k, v in state["last_fresh"].items()}

    @property
    def unpaired(self) -> list[NormPair]:
        return self.pairing.unpaired

    def snapshot(self) -> dict[str, torch.Tensor]:
        """Clones of the paired weights, ``{weight layer: (C_out, ...)}``: take one just before
        ``optimizer.step()`` and pass it to :meth:`measure` to get the update and gradient cosines of
        that step."""
        return {p.weight: w.weight.detach().clone() for p, _, w in self.layers if w is not None}

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
            A :class:`MonitorRecord`. Warns with :class:`StaleStatisticsWarning` when the thresholds are crossed or a
            running statistic holds NaN or infinite values, and with ``RuntimeWarning`` when a parameter does.

        Raises:
            TypeError: when ``step`` is not an int >= 0.
            ValueError: when ``step`` is not after the previous call's.
        """
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise TypeError(f"step: expected the optimizer step as an int >= 0, got {step!r}")
        step = int(step)
        if self.previous is not None and step <= self.previous.step:
            raise ValueError(f"step {step} is not after the previous call's step {self.previous.step}")
        with torch.random.fork_rng(devices=_rng_devices(self.model)):
            out_train, fresh = batch_statistics_pass(self.model, self.x, [(p.norm, m) for p, m, _ in self.layers],
                                                     keep_frozen=True)
            out_eval = self._eval_forward() if self.modes else None
        checks = self._checks(step, out_train, out_eval)
        layer_rows, channel_columns = [], []
        interval = step - self.previous.step if self.previous is not None else None
        for pair, norm, weight in self.layers:
            layer_line, channels = self._layer(step, interval, pair, norm, weight, fresh[pair.norm],
                                               weights_before_step)
            layer_rows.append(layer_line)
            channel_columns.append(channels)
        self.previous = _Previous(step, {p.weight: w.weight.detach().clone() for p, _, w in self.layers
                                         if w is not None},
                                  {name: mean.cpu() for name, (mean, _) in fresh.items()})
        self.last_fresh = fresh
        channels = pd.DataFrame({k: np.concatenate([c[k] for c in channel_columns]) for k in channel_columns[0]})
        record = MonitorRecord(step, checks, pd.DataFrame(layer_rows), channels, False, "",
                               nonfinite_state(self.model))
        record.stale = self._stale(record)
        record.summary = self._summary(record)
        if record.nonfinite.parameters and self.warn:
            warnings.warn(f"step {step}: the model has diverged: NaN or infinite values in "
                          f"{', '.join(record.nonfinite.parameters)}; the measures of their layers are NaN",
                          RuntimeWarning, stacklevel=_caller_stacklevel())
        if record.nonfinite.running_statistics and self.warn:
            warnings.warn(f"step {step}: running statistics hold NaN or infinite values "
                          f"({', '.join(record.nonfinite.running_statistics)}): evaluation mode is unusable. "
                          "Re-estimate them (bnrotation.bnstats.reestimate) before evaluating or saving this model",
                          StaleStatisticsWarning, stacklevel=_caller_stacklevel())
        elif record.stale and self.warn:
            worst = record.worst()
            where = f"{worst[0]} channel {worst[1]} ({worst[2]:+.2f}σ)" if worst else "?"
            warnings.warn(f"step {step}: running statistics are stale: {record.summary}; worst channel {where}. "
                          "Re-estimate them (bnrotation.bnstats.reestimate) before evaluating or saving this "
                          "model", StaleStatisticsWarning, stacklevel=_caller_stacklevel())
        return record

    # ------------------------------------------------------------------------- parts of a call
    def _eval_forward(self) -> torch.Tensor:
        return evaluation_forward(self.model, self.x)

    def _checks(self, step: int, out_train: torch.Tensor, out_eval: torch.Tensor | None) -> pd.DataFrame:
        return mode_check(step, out_train, out_eval, self.y)

    def _layer(self, step: int, interval: int | None, pair: NormPair, norm: nn.Module, weight: nn.Module | None,
               moments: tuple[torch.Tensor, torch.Tensor], before: Mapping[str, torch.Tensor] | None):
        f_mean, f_var = (t.cpu() for t in moments)  # (C,) float64
        c = f_mean.numel()
        nan = torch.full((c,), math.nan, dtype=torch.float64)
        has_running = isinstance(norm, _BatchNorm) and norm.running_mean is not None
        r_mean = norm.running_mean.double().cpu() if has_running else nan
        r_var = norm.running_var.double().cpu() if has_running else nan
        prev = self.previous
        prev_mean = prev.fresh_mean.get(pair.norm) if prev is not None else None
        drift = drift_sigma_per_step(f_mean, prev_mean, f_var, interval) if prev_mean is not None else nan
        momentum = norm.momentum if has_running and norm.momentum is not None else math.nan
        lag = lag_sigma(r_mean, f_mean, f_var)  # (C,)
        w = weight.weight.detach() if weight is not None else None
        if w is not None and w.shape[0] != c:
            raise ValueError(f"{pair.weight} -> {pair.norm}: {w.shape[0]} output channels but {c} normalised")
        wb = before.get(pair.weight) if (before is not None and pair.weight) else None
        rot = (rotation_deg(prev.weights[pair.weight], w).cpu()
               if w is not None and prev is not None and pair.weight in prev.weights else nan)
        per_100 = rot * 100.0 / interval if interval else nan
        channels = {  # columns of (C,) arrays; measure() makes one frame of every layer's
            "step": np.full(c, step), "layer": np.full(c, pair.weight or "", dtype=object),
            "norm_layer": np.full(c, pair.norm, dtype=object),
            "channel": np.arange(c), "rotation_deg": rot.numpy(), "rotation_deg_per_100": per_100.numpy(),
            "weight_norm": (channel_norms(w).cpu() if w is not None else nan).numpy(),
            "update_cos": (channel_cosines(w.double() - wb.double(), wb).cpu() if wb is not None else nan).numpy(),
            "running_mean": r_mean.numpy(), "running_var": r_var.numpy(),
            "fresh_mean": f_mean.numpy(), "fresh_var": f_var.numpy(), "lag_sigma": lag.numpy(),
            "drift_sigma_per_step": drift.numpy(), "predicted_lag_sigma": predicted_lag_sigma(drift, momentum).numpy(),
            "abs_mean_over_std": (f_mean.abs() / f_var.sqrt()).numpy(),
        }
        abs_lag = lag.abs()
        finite = torch.isfinite(abs_lag)
        grad = weight.weight.grad if weight is not None else None
        line = {
            "step": step, "layer": pair.weight or "", "norm_layer": pair.norm,
            "weight_norm": float(w.double().norm()) if w is not None else math.nan,
            "update_cos": cosine(w.double() - wb.double(), wb) if wb is not None else math.nan,
            "grad_cos": cosine(grad, wb) if wb is not None and grad is not None else math.nan,
            "rotation_deg_per_100": float(per_100.median()) if torch.isfinite(per_100).any() else math.nan,
            "lag_median_abs_sigma": float(abs_lag[finite].median()) if finite.any() else math.nan,
            "lag_max_abs_sigma": float(abs_lag[finite].max()) if finite.any() else math.nan,
            "worst_channel": int(torch.where(finite, abs_lag, -1.0).argmax()) if finite.any() else -1,
            "channels_above_1_sigma": int((abs_lag[finite] > 1.0).sum()),
        }
        return line, channels

    def _stale(self, record: MonitorRecord) -> bool:
        gap = float(record.checks["mode_gap"].iloc[0])
        lag = record.layers["lag_median_abs_sigma"]
        worst_median = float(lag.max()) if lag.notna().any() else math.nan
        return self.thresholds.crossed(gap, worst_median) or bool(record.nonfinite.running_statistics)

    def _summary(self, record: MonitorRecord) -> str:
        c = record.checks.iloc[0]
        if not math.isnan(c["acc_train_mode"]):
            modes = f"train {c['acc_train_mode']:.1%} / eval {c['acc_eval_mode']:.1%}"
        elif not math.isnan(c["mode_agreement"]):
            modes = f"modes agree {c['mode_agreement']:.1%}"
        else:
            modes = ""
        rot = record.layers["rotation_deg_per_100"]
        rot_text = f"rotation {rot.median():.2f}°/100 steps" if rot.notna().any() else ""
        lag = record.layers.dropna(subset=["lag_median_abs_sigma"])
        lag_text = ""
        if len(lag):
            top = lag.loc[lag["lag_median_abs_sigma"].idxmax()]
            lag_text = (f"lag median {top['lag_median_abs_sigma']:.2f}σ in {top['norm_layer']}, "
                        f"max {lag['lag_max_abs_sigma'].max():.2f}σ")
        bad = f"NON-FINITE {record.nonfinite}" if record.nonfinite else ""
        text = " | ".join(t for t in (bad, modes, rot_text, lag_text) if t)
        return ("STALE " if record.stale else "") + text
