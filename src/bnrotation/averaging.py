"""Weight averaging and EMA, with BatchNorm running statistics that match the averaged weights.

Averaging checkpoints, or keeping an exponential moving average (EMA) of the
weights, makes a new point in parameter space; the running statistics of any
constituent describe the activations of *other* weights. Parameters are averaged; what happens to the
BatchNorm buffers is one named policy (:data:`POLICIES`):

* ``copy``: the buffers of one constituent (for an EMA: of the live model),
  what many pipelines do by accident (``AveragedModel(use_buffers=False)``).
* ``average``: the weighted arithmetic mean of the running means and of the
  running variances (for an EMA: an EMA of the buffers, as
  ``AveragedModel(use_buffers=True)`` keeps).
* ``mixture``: the moments of the mixture of the constituents' activation
  distributions, by the law of total variance,
  ``mean = sum_i w_i mu_i`` and ``var = sum_i w_i var_i + sum_i w_i (mu_i - mean)^2``:
  better than ``average``, which drops the second term, and still not the
  statistics of the averaged network. Checkpoints only (an EMA keeps no constituents).
* ``refresh``: re-estimation on the averaged weights (:func:`bnstats.reestimate`),
  whose report (the weights fingerprint) is kept as the buffers' provenance.

``num_batches_tracked`` (PyTorch reads it only when ``momentum=None``) is set
explicitly by each policy: ``copy`` takes the source's; ``average`` and
``mixture`` take the largest count among the constituents (an EMA: the live
model's); ``refresh`` leaves the number of re-estimation batches.

Sources: EMA of iterates, Polyak & Juditsky 1992; tail averaging, SWA,
Izmailov et al. 2018 (arXiv:1803.05407), whose ``update_bn`` is the
``refresh`` policy.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from .bnstats import ReestimationReport, reestimate, running_stat_layers, weights_fingerprint
from .checkpoints import Checkpoint, checkpoint_path, load_checkpoint, state_of

__all__ = ["POLICIES", "EMA_POLICIES", "BufferProvenance", "mixture_moments", "policy_buffers",
           "average_checkpoints", "saved_checkpoints", "EMA", "StateDiff", "compare_states"]

POLICIES = ("copy", "average", "mixture", "refresh")
EMA_POLICIES = ("copy", "average", "refresh")

@dataclass
class BufferProvenance:
    """Where an averaged model's BatchNorm buffers come from.

    Attributes:
        policy: one of :data:`POLICIES`.
        source: what the buffers are, in words.
        weights_fingerprint: :func:`bnstats.weights_fingerprint` of the one set
            of weights the statistics were estimated for; None when they blend
            statistics of several different networks.
        report: the re-estimation report, for ``refresh``.
    """

    policy: str
    source: str
    weights_fingerprint: str | None
    report: ReestimationReport | None = None


# ----------------------------------------------------------------------------- averaging checkpoints
def normalised_weights(weights: Sequence[float] | None, n: int) -> list[float]:
    """``weights`` scaled to sum to 1; uniform when None.

    Raises:
        ValueError: for no constituents, a length other than ``n``, or a
            negative, non-finite or all-zero weight.
    """
    if n == 0:
        raise ValueError("no checkpoints to average")
    if weights is None:
        return [1.0 / n] * n
    w = [float(x) for x in weights]
    if len(w) != n:
        raise ValueError(f"{len(w)} weights for {n} checkpoints")
    if not all(math.isfinite(x) and x >= 0 for x in w) or sum(w) <= 0:
        raise ValueError(f"weights must be finite, >= 0 and not all 0, got {w}")
    return [x / sum(w) for x in w]


def weighted_mean(tensors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """``sum_i w_i t_i``, accumulated in float64 and returned in the first tensor's dtype. Shapes equal."""
    acc = sum(w * t.detach().double() for w, t in zip(weights, tensors))
    return acc.to(tensors[0].dtype)


def mixture_moments(means: Sequence[torch.Tensor], variances: Sequence[torch.Tensor],
                    weights: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of the mixture ``sum_i w_i D_i`` of distributions with the given moments.

    Law of total variance: ``mean = sum_i w_i mu_i``,
    ``var = sum_i w_i var_i + sum_i w_i (mu_i - mean)^2``. Computed in float64.

    Args:
        means, variances: one (C,) tensor per constituent.
        weights: mixture weights summing to 1.

    Returns:
        (mean (C,), variance (C,)) in the dtype of ``means[0]``.
    """
    mu = torch.stack([m.detach().double() for m in means])  # (n, C)
    var = torch.stack([v.detach().double() for v in variances])  # (n, C)
    w = torch.tensor(weights, dtype=torch.float64, device=mu.device).unsqueeze(1)  # (n, 1)
    mean = (w * mu).sum(0)  # (C,)
    total = (w * var).sum(0) + (w * (mu - mean) ** 2).sum(0)  # (C,)
    return mean.to(means[0].dtype), total.to(means[0].dtype)


def _key(layer: str, name: str) -> str:
    return f"{layer}.{name}" if layer else name


def _check_states(model: nn.Module, states: list[dict]) -> None:
    want = model.state_dict()
    for i, s in enumerate(states):
        missing = sorted(set(want) - set(s))
        if missing:
            raise ValueError(f"checkpoint {i} lacks {missing}")
        bad = [k for k in want if tuple(s[k].shape) != tuple(want[k].shape)]
        if bad:
            raise ValueError(f"checkpoint {i}: shapes of {bad} differ from the model's")


def _fingerprint(model: nn.Module, state: Mapping[str, torch.Tensor]) -> str:
    """:func:`bnstats.weights_fingerprint` of ``model``'s architecture holding ``state``."""
    m = copy.deepcopy(model)
    m.load_state_dict(state)
    return weights_fingerprint(m)


def policy_buffers(model: nn.Module, states: list[dict], weights: list[float], policy: str,
                   copy_from: int = -1) -> dict[str, torch.Tensor]:
    """Every buffer of ``model`` under ``policy`` (``copy``, ``average`` or ``mixture``).

    Buffers outside the BatchNorm layers (none in the study's network) are
    always copied from constituent ``copy_from``.

    Returns:
        ``{buffer name: tensor}``; running means and variances (C,), counts ().
    """
    out = {n: states[copy_from][n].detach().clone() for n, _ in model.named_buffers()}
    if policy == "copy":
        return out
    for layer, _ in running_stat_layers(model):
        mk, vk, nk = (_key(layer, b) for b in ("running_mean", "running_var", "num_batches_tracked"))
        means, variances = [s[mk] for s in states], [s[vk] for s in states]
        if policy == "mixture":
            out[mk], out[vk] = mixture_moments(means, variances, weights)
        else:
            out[mk], out[vk] = weighted_mean(means, weights), weighted_mean(variances, weights)
        if nk in out:
            out[nk] = torch.stack([s[nk] for s in states]).max()  # the most-trained constituent's count
    return out


def average_checkpoints(model: nn.Module, checkpoints: Sequence[Checkpoint], weights: Sequence[float] | None = None,
                        policy: str = "average", *, copy_from: int = -1, batches: Iterable | None = None,
                        input_key: str = "input") -> tuple[nn.Module, BufferProvenance]:
    """A new model holding the weighted average of the checkpoints' parameters, buffers by ``policy``.

    Args:
        model: the architecture (its own state is not used; it is not changed).
        checkpoints: models, state dicts or checkpoint dicts.
        weights: one per checkpoint, normalised to sum to 1; uniform when None.
        policy: one of :data:`POLICIES`.
        copy_from: the constituent whose buffers ``copy`` takes (default: the last).
        batches: re-estimation batches, required by ``refresh`` (see :func:`bnstats.reestimate`).

    Returns:
        (averaged model, provenance of its buffers).

    Raises:
        ValueError: for an unknown policy, bad weights, no checkpoints,
            ``copy_from`` out of range, checkpoints that do not fit ``model``,
            or ``refresh`` without batches.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
    states = [state_of(c) for c in checkpoints]
    w = normalised_weights(weights, len(states))
    if not -len(states) <= copy_from < len(states):
        raise ValueError(f"copy_from={copy_from} is not a constituent index of {len(states)} checkpoints")
    if policy == "refresh" and batches is None:
        raise ValueError("policy 'refresh' needs batches to re-estimate the statistics with")
    _check_states(model, states)
    params = {n: weighted_mean([s[n] for s in states], w) for n, _ in model.named_parameters()}
    buffers = policy_buffers(model, states, w, "copy" if policy == "copy" else
                             "mixture" if policy == "mixture" else "average", copy_from)
    out = copy.deepcopy(model)
    out.load_state_dict({**params, **buffers})
    if policy == "refresh":
        report = reestimate(out, batches, input_key=input_key)
        return out, BufferProvenance("refresh", f"re-estimated on the averaged weights ({report.batches} batches)",
                                     report.weights_fingerprint, report)
    if policy == "copy":
        source = copy_from % len(states)
        return out, BufferProvenance("copy", f"buffers of constituent {source} of {len(states)}",
                                     _fingerprint(model, states[source]))
    prints = {_fingerprint(model, s) for s in states}
    return out, BufferProvenance(policy, f"{policy} of the buffers of {len(states)} constituents",
                                 prints.pop() if len(prints) == 1 else None)


def saved_checkpoints(run_dir: str | Path, last: int | None = None) -> list[dict]:
    """The checkpoints a run saved (``checkpoints/step=<n>.pt``), oldest first; only the ``last`` newest if given.

    With :func:`average_checkpoints` this is SWA-style tail averaging of a finished run.

    Raises:
        FileNotFoundError: naming the folder, if it holds no checkpoint.
    """
    folder = checkpoint_path(run_dir, 0).parent
    paths = sorted(folder.glob("step=*.pt"), key=lambda p: int(p.stem.split("=", 1)[1]))
    if not paths:
        raise FileNotFoundError(f"{folder}: no saved checkpoints (run with save_checkpoints=true)")
    return [load_checkpoint(p) for p in (paths[-last:] if last else paths)]


# ----------------------------------------------------------------------------- EMA of the weights
class EMA:
    """Exponential moving average of a model's weights, and separately of its floating-point buffers.

    After each optimizer step, ``ema = decay * ema + (1 - decay) * live``; the
    first update copies. The update is the arithmetic of ``torch.optim.swa_utils``'s
    ``get_ema_multi_avg_fn`` (one fused ``_foreach_lerp_(ema, live, 1 - decay)``
    on the device, bit for bit) with a host-side update count, so it never
    synchronises with the device (``AveragedModel`` branches on its count
    tensor every update: a synchronisation once that tensor is on the GPU).
    It is a method here, not the function ``get_ema_multi_avg_fn`` returns,
    because that function is local and cannot be pickled: an ``EMA`` goes
    through ``torch.save``, ``pickle`` and ``copy.deepcopy``.
    ``self.module`` holds the EMA weights and an EMA of the running means and
    variances, what ``AveragedModel(use_buffers=True)`` keeps (the ``average``
    policy); its integer buffers (``num_batches_tracked``) follow the live
    model's, where ``AveragedModel`` would truncate an EMA of the count.

    Raises:
        ValueError: for a decay outside (0, 1).
    """

    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.updates = 0
        self.module = copy.deepcopy(model).requires_grad_(False)
        for p in self.module.parameters():
            p.grad = None

    def _pairs(self, model: nn.Module) -> tuple[list, list, list, list]:
        """(EMA floats, live floats, EMA integers, live integers): parameters then buffers, same order."""
        ema_f, live_f, ema_i, live_i = [], [], [], []
        mine = itertools.chain(self.module.named_parameters(), self.module.named_buffers())
        theirs = itertools.chain(model.named_parameters(), model.named_buffers())
        for (name, a), (other, b) in itertools.zip_longest(mine, theirs, fillvalue=("<none>", None)):
            if name != other:
                raise ValueError(f"EMA.update: the model's {other!r} does not match the EMA's {name!r}")
            (ema_f if a.is_floating_point() else ema_i).append(a)
            (live_f if a.is_floating_point() else live_i).append(b.detach())
        return ema_f, live_f, ema_i, live_i

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """One EMA step towards ``model`` (call once per optimizer step)."""
        ema_f, live_f, ema_i, live_i = self._pairs(model)
        if self.updates == 0:
            torch._foreach_copy_(ema_f, live_f)
        else:
            torch._foreach_lerp_(ema_f, live_f, 1 - self.decay)  # swa_utils.get_ema_multi_avg_fn's update
        if ema_i:
            torch._foreach_copy_(ema_i, live_i)
        self.updates += 1

    def averaged(self, policy: str, live: nn.Module, batches: Iterable | None = None,
                 input_key: str = "input") -> tuple[nn.Module, BufferProvenance]:
        """A copy of the EMA weights with buffers by ``policy`` (one of :data:`EMA_POLICIES`).

        ``copy`` takes the buffers of ``live``; ``average`` keeps the EMA of
        the buffers; ``refresh`` re-estimates on ``batches``.

        Raises:
            ValueError: for another policy, before any update, or ``refresh`` without batches.
        """
        if policy not in EMA_POLICIES:
            raise ValueError(f"EMA policy: expected one of {', '.join(EMA_POLICIES)}, got {policy!r}")
        if self.updates == 0:
            raise ValueError("EMA.averaged: no update yet")
        out = copy.deepcopy(self.module)
        if policy == "copy":
            with torch.no_grad():
                for b_avg, b_live in zip(out.buffers(), live.buffers(), strict=True):
                    b_avg.copy_(b_live)
            return out, BufferProvenance("copy", "buffers of the live model", weights_fingerprint(live))
        if policy == "average":
            return out, BufferProvenance("average", f"EMA (decay {self.decay}) of the live model's buffers", None)
        if batches is None:
            raise ValueError("policy 'refresh' needs batches to re-estimate the statistics with")
        report = reestimate(out, batches, input_key=input_key)
        return out, BufferProvenance("refresh", f"re-estimated on the EMA weights ({report.batches} batches)",
                                     report.weights_fingerprint, report)


@dataclass
class StateDiff:
    """Parameters and buffers that differ between two states: ``{name: max |a - b|}``.

    ``inf`` where a tensor is missing on one side or the shapes differ.
    """

    parameters: dict[str, float]
    buffers: dict[str, float]

    @property
    def same_parameters(self) -> bool:
        return not self.parameters

    @property
    def same_buffers(self) -> bool:
        return not self.buffers


def _max_abs_diff(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    if a is None or b is None or a.shape != b.shape:
        return math.inf
    return float((a.detach().double() - b.detach().to(a.device).double()).abs().max()) if a.numel() else 0.0


def compare_states(a: Checkpoint, b: Checkpoint, model: nn.Module | None = None) -> StateDiff:
    """Diff two checkpoints, parameters and buffers apart, so equal weights with different buffers are told apart.

    Args:
        a, b: models, state dicts or checkpoint dicts.
        model: tells parameters from buffers when neither ``a`` nor ``b`` is a model.

    Raises:
        TypeError: when no model says which entries are parameters.
    """
    ref = model if model is not None else a if isinstance(a, nn.Module) else b if isinstance(b, nn.Module) else None
    if ref is None:
        raise TypeError("compare_states: pass a model (as a, b or model=) to tell parameters from buffers")
    params = {n for n, _ in ref.named_parameters()}
    sa, sb = state_of(a), state_of(b)
    diff = StateDiff({}, {})
    for name in sorted(set(sa) | set(sb)):
        ta, tb = sa.get(name), sb.get(name)
        if ta is not None and tb is not None and ta.shape == tb.shape and torch.equal(ta, tb.to(ta.device)):
            continue
        (diff.parameters if name in params else diff.buffers)[name] = _max_abs_diff(ta, tb)
    return diff
