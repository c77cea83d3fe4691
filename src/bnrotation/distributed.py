"""Do the ranks of a ``torch.distributed`` job hold the same BatchNorm running statistics?

Under ``DistributedDataParallel`` without ``SyncBatchNorm`` each rank updates its own running statistics from its
own batches. DDP's default buffer sync (``forward_sync_buffers``, formerly ``broadcast_buffers``) copies rank 0's
buffers to every rank before each forward pass, so after that pass the ranks differ again by one update from
different batches; with the sync off they drift apart for the whole run. Evaluation during training then runs on each
rank's own statistics, while the checkpoint holds only the rank that saved it. ``SyncBatchNorm`` computes the
batch statistics over all ranks, so every rank applies the same update.

:func:`ranks_agree` gathers every rank's running statistics in one collective call and measures how far apart
they are, per channel, in the channel's standard deviations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn as nn

from .bnstats import running_stat_layers

__all__ = ["ranks_agree", "RankAgreement"]


@dataclass(frozen=True, eq=False)  # holds a DataFrame, which has no single truth value to compare by
class RankAgreement:
    """How far apart the ranks' BatchNorm running statistics are (:func:`ranks_agree`).

    Attributes:
        world_size: the number of ranks compared.
        mean_spread_sigma: the largest, over layers and channels, spread of the running mean in σ (defined in
            :func:`ranks_agree`); 0.0 when every rank holds the same running means.
        var_spread: the largest relative spread of the running variance (defined in :func:`ranks_agree`), a
            fraction.
        worst_layer: the BatchNorm layer of the largest mean spread (the first layer when all are 0).
        worst_channel: its channel.
        uses_sync_batchnorm: whether the model holds a ``torch.nn.SyncBatchNorm`` (on this rank).
        channels: one line per layer and channel: ``norm_layer``, ``channel``, ``mean_spread_sigma``,
            ``var_spread``, in ``named_modules()`` order.
    """

    world_size: int
    mean_spread_sigma: float
    var_spread: float
    worst_layer: str
    worst_channel: int
    uses_sync_batchnorm: bool
    channels: pd.DataFrame

    def agrees(self, tolerance_sigma: float = 0.0, tolerance_var: float = 0.0) -> bool:
        """Whether both spreads are within the tolerances (σ for the mean, a fraction for the variance).

        The default 0 asks for equality, which ranks hold whose buffers were just broadcast from one rank or updated
        by ``SyncBatchNorm``."""
        return self.mean_spread_sigma <= tolerance_sigma and self.var_spread <= tolerance_var

    @property
    def summary(self) -> str:
        """One line: the spreads, the worst channel and whether the model uses SyncBatchNorm."""
        sync = "SyncBatchNorm" if self.uses_sync_batchnorm else "no SyncBatchNorm"
        return (f"{self.world_size} ranks: running means {self.mean_spread_sigma:.3g}σ apart at most "
                f"({self.worst_layer} channel {self.worst_channel}), running variances {self.var_spread:.3g} "
                f"(relative); {sync}")


def _unwrapped(model: nn.Module) -> nn.Module:
    """The module a ``DistributedDataParallel`` wraps (the same buffers, without the ``module.`` prefix)."""
    ddp = nn.parallel.DistributedDataParallel
    return model.module if isinstance(model, ddp) else model


def ranks_agree(model: nn.Module, group=None) -> RankAgreement:
    """Gather every rank's BatchNorm running statistics and measure how far apart they are. A collective: every
    rank of ``group`` must call it, at the same point.

    Per layer and channel c, over the R ranks r of the group, with ``eps`` the layer's own::

        mean_spread_sigma[c] = (max_r running_mean[r, c] - min_r running_mean[r, c])
                               / sqrt(mean_r running_var[r, c] + eps)
        var_spread[c]        = (max_r running_var[r, c] - min_r running_var[r, c])
                               / (mean_r running_var[r, c] + eps)

    the first in the channel's standard deviations (the unit of the monitor's lag), the second a fraction; both
    computed in float64 from the buffers as stored. With one rank both are 0.

    Args:
        model: the rank's model, or its ``DistributedDataParallel`` wrapper; every ``_BatchNorm`` subclass that
            keeps running statistics is compared (:func:`bnrotation.bnstats.running_stat_layers`).
        group: the process group (``None``: the default group). Under NCCL call ``torch.cuda.set_device`` with the
            rank's GPU first: ``all_gather_object``, which compares the layer sets, needs it.

    Returns:
        The same :class:`RankAgreement` on every rank.

    Raises:
        RuntimeError: when ``torch.distributed`` is not available or its process group is not initialised
            (before any collective).
        ValueError: on every rank, when the ranks hold different BatchNorm layers (names, or channel counts),
            naming the first rank and layer that differ from rank 0's; when no rank has a layer with running
            statistics.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("ranks_agree: torch.distributed's process group is not initialised; call "
                           "torch.distributed.init_process_group first (torchrun sets up its environment)")
    model = _unwrapped(model)
    layers = running_stat_layers(model)
    world = dist.get_world_size(group)
    described = [(name, int(m.running_mean.numel())) for name, m in layers]
    every = [None] * world
    dist.all_gather_object(every, described, group=group)
    for rank, theirs in enumerate(every):
        if theirs != every[0]:
            first = next((i for i, (a, b) in enumerate(zip(every[0], theirs)) if a != b), min(len(theirs),
                                                                                             len(every[0])))
            mine = every[0][first] if first < len(every[0]) else "nothing"
            other = theirs[first] if first < len(theirs) else "nothing"
            raise ValueError(f"ranks_agree: rank {rank} holds other BatchNorm layers than rank 0: at position "
                             f"{first}, rank 0 has {mine} and rank {rank} has {other} ((name, channels))")
    if not layers:
        raise ValueError("ranks_agree: the model has no BatchNorm layer with running statistics on any rank")
    device = layers[0][1].running_mean.device
    local = torch.cat([t.detach().double().flatten().to(device)
                       for _, m in layers for t in (m.running_mean, m.running_var)])  # (2 * total channels,)
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local, group=group)
    stacked = torch.stack(gathered).cpu()  # (ranks, 2 * total channels)
    pieces, start = [], 0
    for name, m in layers:
        c = m.running_mean.numel()
        means, variances = stacked[:, start:start + c], stacked[:, start + c:start + 2 * c]  # (ranks, C) each
        start += 2 * c
        scale = variances.mean(0) + m.eps  # (C,)
        pieces.append(pd.DataFrame({
            "norm_layer": np.full(c, name, dtype=object), "channel": np.arange(c),
            "mean_spread_sigma": ((means.amax(0) - means.amin(0)) / scale.sqrt()).numpy(),
            "var_spread": ((variances.amax(0) - variances.amin(0)) / scale).numpy()}))
    channels = pd.concat(pieces, ignore_index=True)
    worst = channels.loc[channels["mean_spread_sigma"].fillna(math.inf).idxmax()]
    return RankAgreement(world, float(channels["mean_spread_sigma"].max(skipna=False)),
                         float(channels["var_spread"].max(skipna=False)), str(worst["norm_layer"]),
                         int(worst["channel"]), any(isinstance(m, nn.SyncBatchNorm) for m in model.modules()),
                         channels)
