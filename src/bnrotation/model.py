"""The study's network (PROTOCOL.md, "Network"), with named layers and a pluggable norm.

Three blocks ``Conv2d(3x3, padding 1, bias=False) -> norm -> ReLU`` with 32, 64,
64 output channels, MaxPool2d(2) after the first and second block, global
average pool, Linear(64 -> K). Layers are named ``conv1, bn1, conv2, bn2,
conv3, bn3, fc`` (``gn*`` for GroupNorm, ``ln*`` for LayerNorm-style GroupNorm
with one group), so results say which layer they are about.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig
from .task import stream_seed

NORM_PREFIX = {"batch": "bn", "group": "gn", "layer": "ln"}


def make_norm(cfg: ModelConfig, channels: int) -> nn.Module:
    """The normalisation layer for ``channels`` channels.

    ``batch``: ``BatchNorm2d(momentum=cfg.bn_momentum, eps=cfg.bn_eps)``, PyTorch's
    convention ``running = (1 - m) * running + m * batch`` (Ioffe & Szegedy 2015).
    ``group``: ``GroupNorm(cfg.group_norm_groups)`` (Wu & He 2018). ``layer``:
    ``GroupNorm(1)``, layer normalisation over (C, H, W) with a per-channel
    affine (Ba et al. 2016). The last two keep no running statistics.
    """
    if cfg.norm == "batch":
        return nn.BatchNorm2d(channels, eps=cfg.bn_eps, momentum=cfg.bn_momentum)
    groups = cfg.group_norm_groups if cfg.norm == "group" else 1
    return nn.GroupNorm(groups, channels, eps=cfg.bn_eps)


class ConvNet(nn.Module):
    """Input (N, 3, S, S) -> logits (N, K)."""

    def __init__(self, cfg: ModelConfig, num_classes: int = 10):
        super().__init__()
        c1, c2, c3 = cfg.channels
        prefix = NORM_PREFIX[cfg.norm]
        self.norm_names = tuple(f"{prefix}{i}" for i in (1, 2, 3))
        self.conv_names = ("conv1", "conv2", "conv3")
        for name, (cin, cout) in zip(self.conv_names, ((3, c1), (c1, c2), (c2, c3))):
            self.add_module(name, nn.Conv2d(cin, cout, 3, padding=1, bias=False))
        for name, c in zip(self.norm_names, (c1, c2, c3)):
            self.add_module(name, make_norm(cfg, c))
        self.fc = nn.Linear(c3, num_classes)

    def blocks(self) -> list[tuple[str, nn.Conv2d, str, nn.Module]]:
        """``[(conv_name, conv, norm_name, norm), ...]`` in forward order."""
        return [(c, getattr(self, c), n, getattr(self, n)) for c, n in zip(self.conv_names, self.norm_names)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(getattr(self, self.norm_names[0])(self.conv1(x)))  # (N, 32, S, S)
        x = F.max_pool2d(x, 2)  # (N, 32, S/2, S/2)
        x = F.relu(getattr(self, self.norm_names[1])(self.conv2(x)))  # (N, 64, S/2, S/2)
        x = F.max_pool2d(x, 2)  # (N, 64, S/4, S/4)
        x = F.relu(getattr(self, self.norm_names[2])(self.conv3(x)))  # (N, 64, S/4, S/4)
        x = x.mean(dim=(2, 3))  # (N, 64)
        return self.fc(x)  # (N, K)


def build_model(cfg: ModelConfig, num_classes: int, seed: int, device: torch.device | str = "cpu") -> ConvNet:
    """PyTorch's default initialisation, drawn from the run's own ``init`` stream.

    The global RNG is forked, so building a model leaves it untouched and the
    same seed gives the same initial weights to every row.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_seed(seed, "init"))
        model = ConvNet(cfg, num_classes)
    model = model.to(device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model
