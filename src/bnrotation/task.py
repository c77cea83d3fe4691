"""The noisy-template task (PROTOCOL.md, "Task: noisy templates").

K classes, one template per class, a 3xSxS tensor of i.i.d. N(0, 1) values.
A sample of class y is ``scale * template[y] + noise`` with i.i.d. N(0, 1)
noise; labels are uniform. Each random stream (templates, training batches,
held-out set, probe set, weight init) has its own generator seeded from
``(seed, stream)``, so changing one part of the protocol never shifts another
part's stream, and every row sees the same templates, data and init at a given
seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .config import RunConfig, TaskConfig

STREAMS = ("templates", "train", "heldout", "probe", "init", "reestimate")


def stream_seed(seed: int, stream: str) -> int:
    """A 63-bit seed for one random stream of one run.

    Derived with ``numpy.random.SeedSequence([seed, index])`` so streams are
    statistically independent and stable across versions.

    Raises:
        KeyError: for a stream name not in :data:`STREAMS`.
    """
    if stream not in STREAMS:
        raise KeyError(f"unknown random stream {stream!r}; expected one of {STREAMS}")
    state = np.random.SeedSequence([seed, STREAMS.index(stream)]).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def generator(seed: int, stream: str, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded for ``stream`` (see :func:`stream_seed`)."""
    g = torch.Generator(device=device)
    g.manual_seed(stream_seed(seed, stream))
    return g


@dataclass
class NoisyTemplates:
    """Sampler for the task; templates live on ``device``.

    Attributes:
        templates: (K, 3, S, S), float32 (float64 for a run with ``dtype=float64``).
    """

    cfg: TaskConfig
    templates: torch.Tensor  # (K, 3, S, S)

    @classmethod
    def build(cls, cfg: TaskConfig, seed: int, device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> "NoisyTemplates":
        """The task of ``seed``; its templates, and so every sample, in ``dtype`` (the random numbers are drawn
        in float32 whatever ``dtype``, so a float64 run sees the float32 run's data, exactly widened)."""
        g = generator(seed, "templates")
        templates = torch.randn(cfg.num_classes, 3, cfg.image_size, cfg.image_size, generator=g)
        return cls(cfg, templates.to(device=device, dtype=dtype))

    def sample(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw ``n`` samples with ``gen`` (which must live on the templates' device).

        Returns:
            x: (n, 3, S, S) in the templates' dtype (the noise drawn in float32); y: (n,) int64 labels in [0, K).
        """
        dev = self.templates.device
        y = torch.randint(0, self.cfg.num_classes, (n,), generator=gen, device=dev)  # (n,)
        noise = torch.randn((n,) + tuple(self.templates.shape[1:]), generator=gen, device=dev)
        noise = noise.to(self.templates.dtype)  # no copy in float32
        x = noise.add_(self.templates[y], alpha=self.cfg.template_scale)  # (n, 3, S, S)
        return x, y

    def fixed_set(self, n: int, seed: int, stream: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A fixed set (held-out or probe): drawn on CPU from its own stream, then moved.

        Drawing on the CPU makes the set identical on every device.
        """
        g = generator(seed, stream)
        cpu = NoisyTemplates(self.cfg, self.templates.cpu())
        x, y = cpu.sample(n, g)
        return x.to(self.templates.device), y.to(self.templates.device)


# ----------------------------------------------------------------------------- a run's fixed sets and streams
def run_dtype(cfg: RunConfig) -> torch.dtype:
    """The run's floating-point type (``dtype``): of its weights, data and statistics."""
    return getattr(torch, cfg.dtype)


def memory_format(cfg: RunConfig) -> torch.memory_format:
    """The model's memory format (``model.channels_last``), which its inputs take too."""
    return torch.channels_last if cfg.model.channels_last else torch.contiguous_format


def heldout_set(task: NoisyTemplates, cfg: RunConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The run's held-out set, ``x`` (heldout_size, 3, S, S) in the model's memory format, ``y`` (heldout_size,)."""
    x, y = task.fixed_set(cfg.scale.heldout_size, cfg.seed, "heldout")
    return x.contiguous(memory_format=memory_format(cfg)), y


def probe_set(task: NoisyTemplates, cfg: RunConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The run's probe set (fresh statistics, drift, the monitor), ``x`` (probe_size, 3, S, S), ``y``."""
    x, y = task.fixed_set(cfg.task.probe_size, cfg.seed, "probe")
    return x.contiguous(memory_format=memory_format(cfg)), y


def reestimation_batches(task: NoisyTemplates, cfg: RunConfig, device: torch.device, step: int) -> list[torch.Tensor]:
    """``scale.reestimate_batches`` fresh training batches from the run's own ``reestimate`` stream.

    The stream is reseeded from (seed, step) and drawn on the CPU, then moved
    to ``device``, so the batches at a step are the same in the runner and in
    offline diagnosis on any device, and the training stream is never touched.
    Drawn once per step and shared by every re-estimation at that step (the
    interventions' and each averaged model's).

    Returns:
        ``scale.reestimate_batches`` tensors (batch_size, 3, S, S) in the task's dtype, on ``device``.
    """
    g = generator(cfg.seed * 1_000_003 + step, "reestimate")
    cpu_task = NoisyTemplates(task.cfg, task.templates.cpu())
    fmt = memory_format(cfg)
    return [cpu_task.sample(cfg.task.batch_size, g)[0].to(device).contiguous(memory_format=fmt)
            for _ in range(cfg.scale.reestimate_batches)]
