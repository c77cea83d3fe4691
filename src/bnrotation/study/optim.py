"""Optimizer factory, projected Adam and learning-rate schedules.

Projected Adam is the study's variant of AdamP: Heo et al., "AdamP: Slowing
Down the Slowdown for Momentum Optimizers on Scale-invariant Weights", ICLR
2021, arXiv:2006.08217. AdamP removes the radial part of Adam's update only
when a weight looks scale-invariant (``|cos(grad, w)| < delta / sqrt(dim)``);
the study removes it always, per output channel, on the conv weights. Both are
:class:`ProjectedAdam`, with ``projection="always"`` or ``"adamp"`` per
parameter group. State names follow ``torch.optim.Adam`` (``step``,
``exp_avg``, ``exp_avg_sq``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import OptimizerConfig, ScheduleConfig

PROJECTIONS = ("never", "always", "adamp")


def radial_coefficient(update: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Per output channel, ``<u_c, w_c> / ||w_c||^2``.

    Args:
        update, weight: (C_out, ...) tensors of the same shape.

    Returns:
        (C_out, 1, ..., 1), broadcastable against ``weight``.

    Raises:
        ValueError: if the shapes differ or ``weight`` has fewer than 2 dims.
    """
    if update.shape != weight.shape or weight.dim() < 2:
        raise ValueError(f"need two (C_out, ...) tensors of one shape, got {tuple(update.shape)} "
                         f"and {tuple(weight.shape)}")
    dims = tuple(range(1, weight.dim()))
    return (update * weight).sum(dims, keepdim=True) / (weight * weight).sum(dims, keepdim=True)


def project_tangential(update: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Remove the radial part of ``update`` per output channel.

    ``u_c - (<u_c, w_c> / ||w_c||^2) w_c`` for each output channel c, so the
    update is tangent to each channel's sphere (PROTOCOL.md, "Projection").

    Args:
        update, weight: (C_out, C_in, kH, kW) or any (C_out, ...) shape.

    Returns:
        A new tensor of the same shape.
    """
    return update - radial_coefficient(update, weight) * weight


class ProjectedAdam(torch.optim.Optimizer):
    """Adam whose update is projected onto each channel's tangent space.

    Per parameter group, ``projection`` is ``"never"`` (plain Adam, equal to
    ``torch.optim.Adam`` without weight decay), ``"always"`` (the study's
    variant: every step, per output channel) or ``"adamp"`` (Heo et al. 2021:
    project per channel, else per layer, only when the gradient's cosine with
    the weight is below ``delta / sqrt(dim)``; the decoupled weight decay of a
    projected step is multiplied by ``wd_ratio``). Weight decay is decoupled,
    as in AdamP. Only parameters with two or more dims are ever projected.

    ``members`` > 1: every parameter holds that many models' weights side by
    side in equal dim-0 chunks (the batched seeds of :mod:`bnrotation.study.ensemble`);
    AdamP's test, its projection and its weight-decay ratio are then decided
    for each member's chunk alone, as in a run of that member alone.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, projection: str = "always",
                 delta: float = 0.1, wd_ratio: float = 0.1, members: int = 1):
        if projection not in PROJECTIONS:
            raise ValueError(f"projection: expected one of {PROJECTIONS}, got {projection!r}")
        if members < 1:
            raise ValueError(f"members: expected an integer >= 1, got {members!r}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        projection=projection, delta=delta, wd_ratio=wd_ratio, members=members)
        super().__init__(params, defaults)

    @staticmethod
    def _adamp_projection(p: torch.Tensor, grad: torch.Tensor, perturb: torch.Tensor, delta: float,
                          eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """AdamP's test and projection (Heo et al. 2021, Algorithm 1): the channel view first, else the whole
        layer, else no projection. Both views are computed and chosen with ``torch.where``, so the decision
        never synchronises with the device. Returns the update and a 0-dim bool tensor: projected or not."""
        out, projected = perturb, torch.zeros((), dtype=torch.bool, device=p.device)
        for rows in (1, p.shape[0]):  # the whole layer, then the channel view, which takes precedence
            w, g = p.reshape(rows, -1), grad.reshape(rows, -1)
            cos = torch.nn.functional.cosine_similarity(g, w, dim=1, eps=eps).abs()
            hit = cos.max() < delta / math.sqrt(w.shape[1])
            flat = perturb.reshape(rows, -1)
            out = torch.where(hit, (flat - radial_coefficient(flat, w) * w).reshape(p.shape), out)
            projected = projected | hit
        return out, projected

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                t = state["step"]
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                # torch.optim.Adam's single-tensor arithmetic, operation for operation
                denom = (exp_avg_sq.sqrt() / (1 - beta2 ** t) ** 0.5).add_(group["eps"])
                step_size = group["lr"] / (1 - beta1 ** t)
                if p.dim() < 2 or group["projection"] == "never":
                    if group["weight_decay"] > 0:
                        p.mul_(1 - group["lr"] * group["weight_decay"])
                    p.addcdiv_(exp_avg, denom, value=-step_size)
                    continue
                perturb = exp_avg / denom  # Adam's direction, before the learning rate
                members = group.get("members", 1)
                for w, g, u in zip(p.chunk(members), grad.chunk(members), perturb.chunk(members)):
                    wd_scale = 1.0
                    if group["projection"] == "always":  # per output channel: no member sees another
                        u = project_tangential(u, w)
                    else:  # adamp: the test and the projection on this member's weights alone
                        u, projected = self._adamp_projection(w, g, u, group["delta"], group["eps"])
                        # a 0-dim float64 tensor acts as a Python float would: no host sync, the same rounding
                        wd_scale = torch.where(projected, torch.tensor(group["wd_ratio"], dtype=torch.float64,
                                                                       device=w.device),
                                               torch.tensor(1.0, dtype=torch.float64, device=w.device))
                    if group["weight_decay"] > 0:
                        w.mul_(1 - group["lr"] * group["weight_decay"] * wd_scale)
                    w.add_(u, alpha=-step_size)
        return loss


def scale_invariant_params(model: nn.Module) -> list[str]:
    """Names of the conv weights: the scale-invariant parameters behind BatchNorm."""
    return [f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.Conv2d)]


def cross_entropy_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                       y: torch.Tensor) -> torch.Tensor:
    """One optimizer step on the mean cross-entropy of ``model(x)`` (logits, (N, classes)) against the labels
    ``y`` ((N,), int64): gradients zeroed (set to None), backward, step. Returns the loss, a scalar tensor whose
    graph is freed."""
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss


def build_optimizer(cfg: OptimizerConfig, model: nn.Module, members: int = 1) -> torch.optim.Optimizer:
    """The optimizer a config names, with two named param groups.

    Group ``conv`` holds the scale-invariant conv weights, group ``other`` the
    norm affine parameters and the linear layer. ``adam_projected`` projects
    the ``conv`` group only (PROTOCOL.md); ``adamp`` applies AdamP's test to
    every parameter with two or more dims, as the reference package does.
    ``members``: the model holds that many seeds side by side
    (:mod:`bnrotation.study.ensemble`); SGD, Adam and AdamW act element by element
    and need nothing more, projected Adam and AdamP decide per member.

    Raises:
        ConfigError-free: ``cfg`` is validated already; an unknown name raises ValueError.
    """
    conv_names = set(scale_invariant_params(model))
    named = list(model.named_parameters())
    groups = [
        {"name": "conv", "params": [p for n, p in named if n in conv_names], "param_names": sorted(conv_names)},
        {"name": "other", "params": [p for n, p in named if n not in conv_names],
         "param_names": [n for n, _ in named if n not in conv_names]},
    ]
    betas = (cfg.beta1, cfg.beta2)
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.name == "adam":
        return torch.optim.Adam(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.name == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.name == "adam_projected":
        groups[0]["projection"], groups[1]["projection"] = "always", "never"
        return ProjectedAdam(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, members=members)
    if cfg.name == "adamp":
        return ProjectedAdam(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                             projection="adamp", delta=cfg.delta, wd_ratio=cfg.wd_ratio, members=members)
    raise ValueError(f"optimizer.name: unknown optimizer {cfg.name!r}")


def build_schedule(cfg: ScheduleConfig, optimizer: torch.optim.Optimizer,
                   steps: int) -> torch.optim.lr_scheduler.LRScheduler | None:
    """``constant``: None. ``cosine``: ``CosineAnnealingLR(T_max=steps, eta_min=0)``,
    stepped once per optimizer step, so the rate reaches 0 at the last step."""
    if cfg.name == "constant":
        return None
    if cfg.name == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps, eta_min=0.0)
    raise ValueError(f"schedule.name: unknown schedule {cfg.name!r}")
