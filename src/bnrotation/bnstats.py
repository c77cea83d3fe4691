"""BatchNorm statistics: batch-statistics mode, re-estimation, swapping fresh statistics in.

PyTorch's BatchNorm conventions, which everything here depends on
(``torch.nn.modules.batchnorm._BatchNorm``):

* running update with momentum m: ``running = (1 - m) * running + m * batch``;
  with ``momentum=None`` it is the cumulative average over the batches seen
  since the last reset: ``running += (batch - running) / num_batches_tracked``.
* ``running_var`` is updated with the *unbiased* batch variance, while the
  forward pass normalises with the *biased* one.
* in training mode with ``track_running_stats=False`` the layer normalises with
  batch statistics and touches no buffer (not even ``num_batches_tracked``).

Every function restores each state it changes (module train/eval flags,
momentum, ``track_running_stats``), also when it raises.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd
import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from .batches import split_batch

__all__ = ["reestimate", "ReestimationReport", "running_stat_layers", "norm_layers", "frozen_layers",
           "batch_statistics", "running_stats", "swapped_statistics", "top_k_channel_masks", "nonfinite_state",
           "NonFinite", "weights_fingerprint", "parameter_digests", "SavedBuffers"]


def running_stat_layers(model: nn.Module) -> list[tuple[str, _BatchNorm]]:
    """``[(name, module)]`` of the normalisation layers that keep running statistics."""
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, _BatchNorm) and m.track_running_stats and m.running_mean is not None]


@dataclass(frozen=True)
class NonFinite:
    """Names (``module.tensor``) of a model's tensors that hold NaN or infinite values (:func:`nonfinite_state`).

    Attributes:
        parameters: parameters, e.g. ``conv2.weight``: the model itself has diverged.
        running_statistics: running means and variances of BatchNorm layers, e.g. ``bn2.running_mean``:
            evaluation mode is unusable, and re-estimation (:func:`reestimate`) replaces them.
    """

    parameters: tuple[str, ...] = ()
    running_statistics: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.parameters or self.running_statistics)

    def __str__(self) -> str:
        return ", ".join(self.running_statistics + self.parameters)


def nonfinite_state(model: nn.Module) -> NonFinite:
    """Which of ``model``'s parameters and running statistics hold NaN or infinite values (a check of each
    tensor, no copy)."""
    params = tuple(n for n, p in model.named_parameters() if not _all_finite(p))
    stats = tuple(f"{n}.{key}" for n, m in running_stat_layers(model) for key in ("running_mean", "running_var")
                  if not _all_finite(getattr(m, key)))
    return NonFinite(params, stats)


def _all_finite(t: torch.Tensor) -> bool:
    """Whether every value of ``t`` is finite. A NaN or an infinity anywhere makes the sum NaN or infinite, so a
    finite sum settles it in one read of ``t`` with no temporary of its size; only a sum that is not finite
    (a non-finite value, or finite values whose sum overflows) is checked value by value."""
    if not (t.is_floating_point() or t.is_complex()):
        return True
    t = t.detach()
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


# Normalisation layers, of any package: subclasses of these (timm's BatchNormAct2d is a BatchNorm2d).
NORM_LAYER_KINDS = (_BatchNorm, nn.GroupNorm, nn.LayerNorm, nn.modules.instancenorm._InstanceNorm)


def norm_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``[(name, module)]`` of every BatchNorm, GroupNorm, LayerNorm and InstanceNorm layer (any subclass)."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, NORM_LAYER_KINDS)]


def frozen_layers(model: nn.Module) -> list[tuple[str, _BatchNorm]]:
    """BatchNorm layers frozen in evaluation mode: ``training`` False while the model is in training mode
    (fine-tuning with frozen BatchNorm: they normalise with their running statistics in training too).

    None when every module but the root is in evaluation mode: that is a model in evaluation mode under a root
    or wrapper left in training mode (timm's ``ModelEmaV3`` puts only its ``module`` in evaluation mode,
    ``utils/model_ema.py``), whose convolutions are in evaluation mode too. Treating all its layers as frozen
    would make its batch-statistics pass use the running statistics as well: a mode gap of zero by construction.
    A fine-tune that calls ``eval()`` on its BatchNorm layers alone, even on every one of them, or on a backbone
    beside a training head, leaves other modules training: those layers stay frozen."""
    if not model.training:
        return []
    if not any(m.training for m in model.modules() if m is not model):
        return []
    return [(n, m) for n, m in model.named_modules() if isinstance(m, _BatchNorm) and not m.training]


@contextmanager
def batch_statistics(model: nn.Module, keep_frozen: bool = False) -> Iterator[nn.Module]:
    """Normalise with batch statistics and leave every buffer exactly as it was.

    Inside the block the model is in evaluation mode except its BatchNorm
    layers, which are in training mode with ``track_running_stats=False``:
    they normalise with the statistics of the batch they see and update no
    running mean, running variance or ``num_batches_tracked``. Dropout and
    other stochastic layers stay in evaluation mode. This is the suite's
    "training-mode" measurement; the article's snippet used ``net.train()``,
    which moves the running statistics towards the measured batch.

    A BatchNorm subclass from another package that updates a buffer
    whatever ``track_running_stats`` says is undone too: every BatchNorm
    layer's running mean, running variance and ``num_batches_tracked`` are
    put back on exit (with ``momentum=None`` the counter weights the next
    batch, so one stray increment changes training).

    Args:
        keep_frozen: layers frozen in evaluation mode (:func:`frozen_layers`)
            keep normalising with their running statistics, as they do in
            the model's own training steps.
    """
    flags = {m: m.training for m in model.modules()}
    frozen = {m for _, m in frozen_layers(model)} if keep_frozen else set()
    tracking = {m: m.track_running_stats for m in model.modules() if isinstance(m, _BatchNorm) and m not in frozen}
    saved = [(t, t.detach().clone()) for m in model.modules() if isinstance(m, _BatchNorm)
             for t in (m.running_mean, m.running_var, m.num_batches_tracked) if t is not None]
    try:
        model.eval()
        for m in tracking:
            m.train()
            m.track_running_stats = False
        yield model
    finally:
        for m, t in tracking.items():
            m.track_running_stats = t
        for m, f in flags.items():
            m.training = f
        with torch.no_grad():
            for t, value in saved:  # through .data: the same values, and no version bump that would invalidate
                t.data.copy_(value)  # the graph of a forward made before the call (its backward still runs)


def _tensor_bytes(t: torch.Tensor):
    """The bytes of ``t`` as a flat uint8 array on the CPU (no copy for a contiguous CPU tensor; any dtype)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


def weights_fingerprint(model: nn.Module) -> str:
    """SHA-256 (hex, first 16 chars) of every parameter's name, shape, dtype and bytes.

    Buffers are left out on purpose: the fingerprint names the weights a set of
    statistics was estimated for.
    """
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
        h.update(_tensor_bytes(p))
    return h.hexdigest()[:16]


def parameter_digests(model: nn.Module) -> dict[str, str]:
    """``{parameter name: SHA-256 (hex) of its shape, dtype and bytes}``.

    What :func:`reestimate` keeps to prove that no parameter changed: 64 bytes
    per parameter instead of a copy of it, so the check does not double the
    parameters' memory (one parameter at a time passes through host memory).
    An uninitialised lazy parameter digests as ``"uninitialised"``.
    """
    out = {}
    for name, p in model.named_parameters():
        if nn.parameter.is_lazy(p):
            out[name] = "uninitialised"
            continue
        h = hashlib.sha256(f"{tuple(p.shape)}:{p.dtype}".encode())
        h.update(_tensor_bytes(p))
        out[name] = h.hexdigest()
    return out


@dataclass
class ReestimationReport:
    """What :func:`reestimate` did: the provenance to store beside the buffers.

    Attributes:
        layers: names of the layers re-estimated.
        batches, samples: how many batches, and samples in them, went through.
        weights_fingerprint: :func:`weights_fingerprint` of the weights the statistics describe.
        momentum_restored: ``{layer: momentum}`` put back on each re-estimated layer.
        skipped: names of the layers left untouched: frozen (``skip_frozen=True``: in evaluation mode
            inside a model in training mode) or not among the ``layers`` asked for.
    """

    layers: list[str]
    batches: int
    samples: int
    weights_fingerprint: str
    momentum_restored: dict[str, float | None] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    @property
    def summary(self) -> str:
        """One line: how many layers were re-estimated on how many batches and samples, and how many were left
        as they were."""
        left = f"; {len(self.skipped)} left as they were" if self.skipped else ""
        return (f"re-estimated {len(self.layers)} BatchNorm layer{'s' * (len(self.layers) != 1)} on {self.batches} "
                f"batch{'es' * (self.batches != 1)} ({self.samples:,} samples){left}")

    def __repr__(self) -> str:  # the dataclass's would list every layer, twice
        return f"ReestimationReport({self.summary}; weights {self.weights_fingerprint[:12]})"


def _check_initialised(layers: list[tuple[str, _BatchNorm]]) -> None:
    """Raise ValueError naming the first lazy BatchNorm layer that has not been through a forward pass yet."""
    for name, m in layers:
        if any(nn.parameter.is_lazy(t) for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))):
            raise ValueError(f"reestimate: layer {name!r} ({type(m).__name__}) is not initialised: its running "
                             "statistics have no size until a first forward pass; run one batch through the "
                             "model first")


def reestimate(model: nn.Module, batches: Iterable, *, input_key: str = "input",
               device: torch.device | str | None = None, max_batches: int | None = None,
               skip_frozen: bool = False, layers: Iterable[str] | None = None) -> ReestimationReport:
    """Re-estimate every running mean and variance for the model's current weights.

    Resets each BatchNorm layer's running statistics, forwards the batches
    with no gradient and ``momentum=None`` (the plain cumulative average over
    batches, as ``torch.optim.swa_utils.update_bn``), then restores each
    layer's momentum and every module's train/eval flag. Only layers with
    running statistics are put in training mode; dropout and the rest keep
    evaluation mode, so the pass is deterministic for fixed batches. Used by
    Li et al. 2016 (arXiv:1603.04779) and Schneider et al. 2020
    (arXiv:2006.16971); the article's "re-estimation" fix. fvcore's
    ``update_bn_stats`` (PreciseBN; Wu and Johnson 2021, arXiv:2105.07576)
    does the same averaging, over the layers in training mode only, as
    ``skip_frozen=True`` does here.

    Args:
        model: any ``nn.Module``.
        batches: an iterable of tensors (N, ...), ``(input, target)`` tuples or
            lists, or mappings holding the input under ``input_key``; endless
            ones need ``max_batches``.
        input_key: the key of the model input in a mapping batch (default
            ``"input"``); unused for tensors, tuples and lists.
        device: if given, inputs are moved there first.
        max_batches: stop after this many batches (None: all of them); no
            batch past it is drawn from ``batches``. Fewer is not an error:
            ``report.batches`` says how many went through.
        skip_frozen: leave frozen BatchNorm layers alone, for fine-tuning with
            frozen BatchNorm: a layer whose ``training`` flag is False while
            the model is in training mode keeps its running statistics, its
            momentum and ``num_batches_tracked``, and normalises with its
            running statistics during the pass; ``report.skipped`` names it.
            A model in evaluation mode has no frozen layer (every layer is
            re-estimated). Default False: every layer, whatever its flag.
        layers: re-estimate only these layers (names from ``model.named_modules()``); the others keep
            their running statistics, momentum and ``num_batches_tracked`` and normalise with their running
            statistics during the pass, as in evaluation. None (default): every layer.

    Returns:
        A :class:`ReestimationReport`.

    Raises:
        ValueError: if the model has no layer with running statistics (or,
            with ``skip_frozen``, every one is frozen); if ``layers`` names a
            layer without running statistics, or none; if a lazy BatchNorm
            layer is uninitialised (naming it); if ``max_batches`` is not a
            positive integer; or if ``batches`` is empty (the buffers are then
            left as they were).
        TypeError: for a batch it cannot read (buffers left as they were).
        RuntimeError: naming every parameter that changed during the pass
            (compared by :func:`parameter_digests`, not by copies).
    """
    if max_batches is not None and (isinstance(max_batches, bool) or not isinstance(max_batches, int)
                                    or max_batches < 1):
        raise ValueError(f"reestimate: max_batches: expected a positive integer or None, got {max_batches!r}")
    found = running_stat_layers(model)
    if not found:
        raise ValueError("reestimate: the model has no normalisation layer with running statistics")
    _check_initialised(found)
    if layers is not None:
        chosen = list(dict.fromkeys(layers))
        unknown = sorted(set(chosen) - {name for name, _ in found})
        if unknown or not chosen:
            raise ValueError(f"reestimate: layers: {unknown or 'none given'}; expected names of layers with running "
                             f"statistics: {[name for name, _ in found]}")
    frozen = {name for name, m in found if (skip_frozen and model.training and not m.training)
              or (layers is not None and name not in chosen)}
    layers = [(name, m) for name, m in found if name not in frozen]
    if not layers:
        raise ValueError(f"reestimate: every layer with running statistics is frozen (in evaluation mode inside a "
                         f"model in training mode: {sorted(frozen)}); nothing to re-estimate with skip_frozen=True")
    digests = parameter_digests(model)
    saved_buffers = {name: copy.deepcopy(m.state_dict()) for name, m in layers}
    momenta = {name: m.momentum for name, m in layers}
    flags = {m: m.training for m in model.modules()}
    n_batches = n_samples = 0
    try:
        model.eval()
        for _, m in layers:
            m.reset_running_stats()
            m.momentum = None
            m.train()
        with torch.no_grad():
            for batch in itertools.islice(batches, max_batches):
                x, _ = split_batch(batch, input_key, labels=False)
                if device is not None:
                    x = x.to(device)
                model(x)
                n_batches += 1
                n_samples += x.shape[0]
        if n_batches == 0:
            raise ValueError("reestimate: no batches (empty loader); running statistics left unchanged")
    except BaseException:
        for name, m in layers:
            m.load_state_dict(saved_buffers[name])
        raise
    finally:
        for name, m in layers:
            m.momentum = momenta[name]
        for m, f in flags.items():
            m.training = f
    after = parameter_digests(model)
    changed = [n for n in after.keys() | digests.keys() if after.get(n) != digests.get(n)]
    if changed:
        raise RuntimeError(f"reestimate: parameters changed during the statistics pass: {sorted(changed)}")
    return ReestimationReport([n for n, _ in layers], n_batches, n_samples, weights_fingerprint(model), momenta,
                              [n for n, _ in found if n in frozen])


class SavedBuffers:
    """Every BatchNorm layer's running mean, running variance, ``num_batches_tracked`` and momentum, saved to be
    put back exactly.

    The tensors are cloned on their own devices when the object is made; :meth:`restore` copies them back in
    place, bit for bit, and resets each layer's momentum (it can be called any number of times). As a context
    manager it restores on exit, also when the block raises::

        with SavedBuffers(model):
            reestimate(model, loader)
            evaluate(model)          # re-estimated statistics here; the previous ones after the block

    Layers are those of :func:`running_stat_layers` when the object is made.
    """

    def __init__(self, model: nn.Module):
        self.layers = [name for name, _ in running_stat_layers(model)]
        self._saved = [(m, {key: t.detach().clone() for key in ("running_mean", "running_var", "num_batches_tracked")
                            if (t := getattr(m, key, None)) is not None}, m.momentum)
                       for _, m in running_stat_layers(model)]

    def restore(self) -> None:
        """Put every saved buffer and momentum back."""
        with torch.no_grad():
            for m, tensors, momentum in self._saved:
                for key, value in tensors.items():
                    getattr(m, key).copy_(value)
                m.momentum = momentum

    def __enter__(self) -> SavedBuffers:
        return self

    def __exit__(self, *exc) -> bool:
        self.restore()
        return False


def running_stats(model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{layer: (running_mean (C,), running_var (C,))}``, cloned."""
    return {n: (m.running_mean.detach().clone(), m.running_var.detach().clone()) for n, m in running_stat_layers(model)}


@contextmanager
def swapped_statistics(model: nn.Module, fresh: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
                       channels: Mapping[str, torch.Tensor] | None = None) -> Iterator[nn.Module]:
    """Temporarily give chosen layers (or channels) the ``fresh`` statistics.

    Args:
        fresh: ``{layer: (mean (C,), var (C,))}``; layers not in it keep their stored statistics.
        channels: optional ``{layer: bool mask (C,)}``; only masked channels of
            a layer get fresh statistics. Without it every channel of every
            layer in ``fresh`` does.

    Raises:
        KeyError: for a layer name without running statistics.
    """
    layers = dict(running_stat_layers(model))
    unknown = [n for n in fresh if n not in layers]
    if unknown:
        raise KeyError(f"no layer with running statistics named {unknown}; have {sorted(layers)}")
    saved = {n: (layers[n].running_mean.clone(), layers[n].running_var.clone()) for n in fresh}
    try:
        with torch.no_grad():
            for name, (mean, var) in fresh.items():
                m = layers[name]
                mask = channels.get(name) if channels is not None else None
                if channels is not None and mask is None:
                    continue
                if mask is None:
                    m.running_mean.copy_(mean)
                    m.running_var.copy_(var)
                else:
                    m.running_mean[mask] = mean.to(m.running_mean)[mask]
                    m.running_var[mask] = var.to(m.running_var)[mask]
        yield model
    finally:
        with torch.no_grad():
            for name, (mean, var) in saved.items():
                layers[name].running_mean.copy_(mean)
                layers[name].running_var.copy_(var)


def top_k_channel_masks(lag: Mapping[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    """Masks selecting the ``k`` channels with the largest |lag| across all layers.

    Args:
        lag: ``{layer: (C,) lag in standard deviations}``.
        k: 0 selects nothing; ``k >= total channels`` selects all.

    Returns:
        ``{layer: bool (C,)}``. Ties are broken by layer order, then channel index.
    """
    names = list(lag)
    flat = torch.cat([lag[n].abs().double().flatten().cpu() for n in names])
    order = torch.argsort(-flat, stable=True)[:max(0, k)]
    chosen = torch.zeros_like(flat, dtype=torch.bool)
    chosen[order] = True
    masks, start = {}, 0
    for n in names:
        c = lag[n].numel()
        masks[n] = chosen[start:start + c].to(lag[n].device)
        start += c
    return masks
