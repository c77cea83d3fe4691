"""The networks, with named layers and a pluggable norm.

:class:`ConvNet` is the study's network (PROTOCOL.md, "Network"): three blocks
``Conv2d(3x3, padding 1, bias=False) -> norm -> ReLU`` with 32, 64, 64 output
channels, MaxPool2d(2) after the first and second block, global average pool,
Linear(64 -> K). Layers are named ``conv1, bn1, conv2, bn2, conv3, bn3, fc``
(``gn*`` for GroupNorm, ``ln*`` for LayerNorm-style GroupNorm with one group),
so results say which layer they are about.

:class:`ResNet20` is a CIFAR-style ResNet-20 (He, Zhang, Ren and Sun, "Deep
Residual Learning for Image Recognition", CVPR 2016, arXiv:1512.03385,
section 4.2): a 3x3 stem, three stages of three basic blocks with 16, 32 and
64 channels (the second and third start with stride 2), a norm after every
convolution, 1x1 projection shortcuts with a norm where the shape changes,
global average pooling and a linear head: 19 convolutions and 2 shortcut
convolutions, each followed by its own norm layer.
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
    """The study's network. Input (N, C, S, S) -> logits (N, K); C = ``in_channels`` (3 for the templates, 1
    for Fashion-MNIST)."""

    def __init__(self, cfg: ModelConfig, num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        c1, c2, c3 = cfg.channels
        prefix = NORM_PREFIX[cfg.norm]
        self.norm_names = tuple(f"{prefix}{i}" for i in (1, 2, 3))
        self.conv_names = ("conv1", "conv2", "conv3")
        for name, (cin, cout) in zip(self.conv_names, ((in_channels, c1), (c1, c2), (c2, c3))):
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


class BasicBlock(nn.Module):
    """``conv1 -> norm -> ReLU -> conv2 -> norm``, plus the shortcut, then ReLU (He et al. 2016).

    The shortcut is the identity, or ``1x1 conv (stride) -> norm`` (``shortcut.0``, ``shortcut.1``) where
    the stride or the width changes. Input (N, C_in, S, S) -> (N, C_out, S / stride, S / stride).
    """

    def __init__(self, cfg: ModelConfig, c_in: int, c_out: int, stride: int):
        super().__init__()
        prefix = NORM_PREFIX[cfg.norm]
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.add_module(f"{prefix}1", make_norm(cfg, c_out))
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.add_module(f"{prefix}2", make_norm(cfg, c_out))
        self.norm_names = (f"{prefix}1", f"{prefix}2")
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), make_norm(cfg, c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(getattr(self, self.norm_names[0])(self.conv1(x)))  # (N, C_out, S', S')
        out = getattr(self, self.norm_names[1])(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet20(nn.Module):
    """CIFAR-style ResNet-20 (see the module docstring). Input (N, C, S, S) -> logits (N, K), C = ``in_channels``.

    Layers: ``conv1``/``bn1`` (stem), ``layer<i>.<j>.conv1``/``.bn1``, ``.conv2``/``.bn2`` and
    ``layer<i>.0.shortcut.0``/``.shortcut.1`` for stages i = 1, 2, 3 and blocks j = 0, 1, 2; ``fc``.
    """

    def __init__(self, cfg: ModelConfig, num_classes: int = 10, in_channels: int = 3, blocks_per_stage: int = 3):
        super().__init__()
        c1, c2, c3 = cfg.channels
        prefix = NORM_PREFIX[cfg.norm]
        self.conv1 = nn.Conv2d(in_channels, c1, 3, padding=1, bias=False)
        self.add_module(f"{prefix}1", make_norm(cfg, c1))
        self.norm_name = f"{prefix}1"
        c_in = c1
        for i, (width, stride) in enumerate(((c1, 1), (c2, 2), (c3, 2)), start=1):
            blocks = []
            for j in range(blocks_per_stage):
                blocks.append(BasicBlock(cfg, c_in, width, stride if j == 0 else 1))
                c_in = width
            self.add_module(f"layer{i}", nn.Sequential(*blocks))
        self.fc = nn.Linear(c3, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(getattr(self, self.norm_name)(self.conv1(x)))  # (N, 16, S, S)
        x = self.layer3(self.layer2(self.layer1(x)))  # (N, 64, S/4, S/4)
        return self.fc(x.mean(dim=(2, 3)))  # (N, K)


ARCHITECTURES = {"convnet": ConvNet, "resnet20": ResNet20}


def build_network(cfg: ModelConfig, num_classes: int, seed: int, device: torch.device | str = "cpu",
                in_channels: int = 3) -> nn.Module:
    """The network ``cfg.arch`` names, for inputs of ``in_channels`` channels (``task.in_channels``), with
    PyTorch's default initialisation drawn from the run's own ``init`` stream.

    The global RNG is forked, so building a model leaves it untouched and the
    same seed gives the same initial weights to every row.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_seed(seed, "init"))
        model = ARCHITECTURES[cfg.arch](cfg, num_classes, in_channels)
    model = model.to(device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model
