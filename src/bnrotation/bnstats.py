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
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm


def running_stat_layers(model: nn.Module) -> list[tuple[str, _BatchNorm]]:
    """``[(name, module)]`` of the normalisation layers that keep running statistics."""
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, _BatchNorm) and m.track_running_stats and m.running_mean is not None]


def norm_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``[(name, module)]`` of every BatchNorm, GroupNorm, LayerNorm and InstanceNorm layer."""
    kinds = (_BatchNorm, nn.GroupNorm, nn.LayerNorm, nn.modules.instancenorm._InstanceNorm)
    return [(n, m) for n, m in model.named_modules() if isinstance(m, kinds)]


def frozen_layers(model: nn.Module) -> list[tuple[str, _BatchNorm]]:
    """BatchNorm layers frozen in evaluation mode: ``training`` False while the model is in training mode
    (fine-tuning with frozen BatchNorm: they normalise with their running statistics in training too)."""
    if not model.training:
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

    Args:
        keep_frozen: layers frozen in evaluation mode (:func:`frozen_layers`)
            keep normalising with their running statistics, as they do in
            the model's own training steps.
    """
    flags = {m: m.training for m in model.modules()}
    frozen = {m for _, m in frozen_layers(model)} if keep_frozen else set()
    tracking = {m: m.track_running_stats for m in model.modules() if isinstance(m, _BatchNorm) and m not in frozen}
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


def weights_fingerprint(model: nn.Module) -> str:
    """SHA-256 (hex, first 16 chars) of every parameter's name, shape, dtype and bytes.

    Buffers are left out on purpose: the fingerprint names the weights a set of
    statistics was estimated for.
    """
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        t = p.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return h.hexdigest()[:16]


def batch_input(batch, key: str = "input") -> torch.Tensor:
    """The model input of one batch: a tensor, the first item of a tuple/list, or ``batch[key]``.

    Raises:
        TypeError: naming what was found, for anything else.
    """
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0]
    if isinstance(batch, Mapping):
        if key in batch and isinstance(batch[key], torch.Tensor):
            return batch[key]
        raise TypeError(f"batch is a mapping without a tensor under key {key!r} "
                        f"(keys: {sorted(map(str, batch))}); pass input_key=")
    raise TypeError(f"cannot read a model input from a batch of type {type(batch).__name__}; "
                    "expected a tensor, an (input, target) tuple or list, or a mapping")


@dataclass
class ReestimationReport:
    """What :func:`reestimate` did: the provenance to store beside the buffers."""

    layers: list[str]
    batches: int
    samples: int
    weights_fingerprint: str
    momentum_restored: dict[str, float | None] = field(default_factory=dict)


def reestimate(model: nn.Module, batches: Iterable, *, input_key: str = "input",
               device: torch.device | str | None = None) -> ReestimationReport:
    """Re-estimate every running mean and variance for the model's current weights.

    Resets each BatchNorm layer's running statistics, forwards every batch
    with no gradient and ``momentum=None`` (the plain cumulative average over
    batches, as ``torch.optim.swa_utils.update_bn``), then restores each
    layer's momentum and every module's train/eval flag. Only layers with
    running statistics are put in training mode; dropout and the rest keep
    evaluation mode, so the pass is deterministic for fixed batches. Used by
    Li et al. 2016 (arXiv:1603.04779) and Schneider et al. 2020
    (arXiv:2006.16971); the article's "re-estimation" fix.

    Args:
        model: any ``nn.Module``.
        batches: an iterable of tensors (N, ...), ``(input, target)`` tuples or
            lists, or mappings holding the input under ``input_key``.
        device: if given, inputs are moved there first.

    Returns:
        A :class:`ReestimationReport`.

    Raises:
        ValueError: if the model has no layer with running statistics, or
            ``batches`` is empty (the buffers are then left as they were).
        TypeError: for a batch it cannot read (buffers left as they were).
        RuntimeError: if a parameter changed during the pass.
    """
    layers = running_stat_layers(model)
    if not layers:
        raise ValueError("reestimate: the model has no normalisation layer with running statistics")
    before_params = {n: p.detach().clone() for n, p in model.named_parameters()}
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
            for batch in batches:
                x = batch_input(batch, input_key)
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
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before_params[n])]
    if changed:
        raise RuntimeError(f"reestimate: parameters changed during the statistics pass: {changed}")
    return ReestimationReport([n for n, _ in layers], n_batches, n_samples, weights_fingerprint(model), momenta)


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
