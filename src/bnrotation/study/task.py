"""The two tasks a run can train on: noisy templates (PROTOCOL.md, "Task: noisy templates") and
Fashion-MNIST ("Task: Fashion-MNIST"), chosen by ``task.name``; :func:`build_task` builds either.

Both offer the same three draws (:meth:`sample` for training batches, :meth:`fixed_set` for the held-out and
probe sets, and :func:`reestimation_batches`), each from its own random stream, so the runner, the probes and
the analysis never ask which task they run.

Noisy templates:

K classes, one template per class, a 3xSxS tensor of i.i.d. N(0, 1) values.
A sample of class y is ``scale * template[y] + noise`` with i.i.d. N(0, 1)
noise; labels are uniform. Each random stream (templates, training batches,
held-out set, probe set, weight init) has its own generator seeded from
``(seed, stream)``, so changing one part of the protocol never shifts another
part's stream, and every row sees the same templates, data and init at a given
seed.

Two knobs of the condition map morph the tasks towards each other (``task.train_size``, ``task.pixel_noise``:
:class:`.config.TaskConfig`); at their defaults (0) nothing here draws a number more than before, so every stream
and sample is the protocol's, bit for bit. A finite training set is drawn once from its own stream, ``trainset``
(the last of :data:`STREAMS`, so that no other stream's seed moves).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from . import fashion_mnist
from .config import ConfigError, RunConfig, TaskConfig

STREAMS = ("templates", "train", "heldout", "probe", "init", "reestimate", "trainset")


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

    With ``task.train_size`` N > 0 the training set is finite: N samples of the task drawn once, on the CPU, from
    the ``trainset`` stream (:meth:`population`'s :meth:`sample`), then moved to ``device``; training batches and
    re-estimation batches are drawn from it uniformly with replacement, the probe set is N of its samples, and
    the held-out set is still drawn from the task itself (new samples).

    Attributes:
        templates: (K, 3, S, S), float32 (float64 for a run with ``dtype=float64``).
        train_x, train_y: the finite training set, (N, 3, S, S) and (N,), or None (a fresh sample at every draw).
    """

    cfg: TaskConfig
    templates: torch.Tensor  # (K, 3, S, S)
    train_x: torch.Tensor | None = None  # (N, 3, S, S)
    train_y: torch.Tensor | None = None  # (N,)

    @classmethod
    def build(cls, cfg: TaskConfig, seed: int, device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> "NoisyTemplates":
        """The task of ``seed``; its templates, and so every sample, in ``dtype`` (the random numbers are drawn
        in float32 whatever ``dtype``, so a float64 run sees the float32 run's data, exactly widened); with
        ``cfg.train_size`` > 0 its finite training set too, drawn on the CPU."""
        g = generator(seed, "templates")
        templates = torch.randn(cfg.num_classes, 3, cfg.image_size, cfg.image_size, generator=g)
        task = cls(cfg, templates.to(dtype=dtype))
        if cfg.train_size:
            x, y = task.sample(cfg.train_size, generator(seed, "trainset"))  # (N, 3, S, S), (N,)
            task = cls(cfg, task.templates, x, y)
        return task.to(device)

    def to(self, device: torch.device | str) -> "NoisyTemplates":
        """The same task with its templates and finite training set on ``device``."""
        return NoisyTemplates(self.cfg, *(None if t is None else t.to(device)
                                          for t in (self.templates, self.train_x, self.train_y)))

    def cpu(self) -> "NoisyTemplates":
        """The same task on the CPU (where the fixed sets are drawn)."""
        return self.to("cpu")

    def population(self) -> "NoisyTemplates":
        """The task itself, without a finite training set: new samples at every draw (the held-out set's)."""
        return NoisyTemplates(self.cfg, self.templates)

    def at_step(self, step: int) -> "NoisyTemplates":
        """The training data of optimizer step ``step`` (1-based): this task, or with the data swap
        (``task.swap_step`` S > 0) the source of that step: fresh samples (:meth:`population`) at steps up to S
        and the finite set after it (``task.swap_to=finite``), or the other way round (``fresh``)."""
        s = self.cfg.swap_step
        if not s or self.train_y is None:
            return self
        fresh_now = (step <= s) == (self.cfg.swap_to == "finite")
        return self.population() if fresh_now else self

    def sample(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw ``n`` samples with ``gen`` (which must live on the templates' device): new samples of the task,
        or, with a finite training set, ``n`` of its samples uniformly with replacement.

        Returns:
            x: (n, 3, S, S) in the templates' dtype (the noise drawn in float32); y: (n,) int64 labels in [0, K).
        """
        dev = self.templates.device
        if self.train_y is not None:
            idx = torch.randint(0, len(self.train_y), (n,), generator=gen, device=dev)  # (n,)
            return self.train_x[idx], self.train_y[idx]
        y = torch.randint(0, self.cfg.num_classes, (n,), generator=gen, device=dev)  # (n,)
        noise = torch.randn((n,) + tuple(self.templates.shape[1:]), generator=gen, device=dev)
        noise = noise.to(self.templates.dtype)  # no copy in float32
        x = noise.add_(self.templates[y], alpha=self.cfg.template_scale)  # (n, 3, S, S)
        return x, y

    def fixed_set(self, n: int, seed: int, stream: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A fixed set (held-out or probe): drawn on CPU from its own stream, then moved. With a finite training
        set, the probe set is the first ``n`` of a permutation of it (drawn from ``stream``); the held-out set
        is always new samples of the task.

        Drawing on the CPU makes the set identical on every device.

        Raises:
            ConfigError: a probe set larger than the finite training set (naming ``task.probe_size``).
        """
        g, dev = generator(seed, stream), self.templates.device
        if stream != "heldout" and self.train_y is not None:
            if n > len(self.train_y):
                raise ConfigError(f"task.probe_size: expected at most task.train_size={len(self.train_y):,} (the "
                                  f"probe set is drawn from the finite training set), got {n:,}")
            idx = torch.randperm(len(self.train_y), generator=g)[:n].to(dev)  # (n,)
            return self.train_x[idx], self.train_y[idx]
        x, y = self.population().cpu().sample(n, g)
        return x.to(dev), y.to(dev)

    def describe(self) -> dict:
        """What ``run.json`` records of the task, read back from the built tensors where they hold it: the
        classes (templates), the template scale, and the finite training set's size (``train_size``; None: a
        fresh sample at every draw)."""
        return {"name": "noisy_templates", "image_shape": list(self.templates.shape[1:]),
                "num_classes": int(self.templates.shape[0]), "template_scale": self.cfg.template_scale,
                "train_size": None if self.train_y is None else len(self.train_y),
                **({"swap_step": self.cfg.swap_step, "swap_to": self.cfg.swap_to} if self.cfg.swap_step else {})}


@functools.lru_cache(maxsize=4)
def _grey_images(folder: str, split: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One Fashion-MNIST split as float32 (N, 1, size, size) grey levels in [0, 1], and its labels (N,) int64.

    Resized when ``size != 28``: by area averaging where ``size`` divides 28 (14, 7), else bilinearly with
    antialiasing."""
    split_data = fashion_mnist.load_split(folder, split)
    x = torch.from_numpy(split_data.images.astype(np.float32) / 255.0).unsqueeze(1)  # (N, 1, 28, 28)
    if size != fashion_mnist.IMAGE_SIDE:
        exact = fashion_mnist.IMAGE_SIDE % size == 0
        x = torch.nn.functional.interpolate(x, size=(size, size), mode="area" if exact else "bilinear",
                                            antialias=not exact, align_corners=None if exact else False)
    return x, torch.from_numpy(split_data.labels)


@functools.lru_cache(maxsize=4)
def _normalised_images(folder: str, split: str, size: int) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """A split's images normalised with the mean and standard deviation of the *training* images (one value
    each: the images are grey), ``(x - mean) / std``, its labels, and that mean and std. Cached per process:
    seeds trained together share the tensors."""
    train, _ = _grey_images(folder, "train", size)
    mean, std = float(train.double().mean()), float(train.double().std())
    x, y = _grey_images(folder, split, size)
    return (x - mean) / std, y, mean, std


@dataclass
class FashionMNIST:
    """Fashion-MNIST (Xiao et al. 2017, arXiv:1708.07747) with the official split: training batches, the probe
    set and the re-estimation batches come from the training file, the held-out set from the test file.

    A training batch is ``batch_size`` images drawn uniformly with replacement from the 60,000 training images
    (a fresh i.i.d. draw per step, as the templates' are; 6,000 steps of 128 see each image about 13 times). A
    fixed set of n is the first n of a permutation of its file drawn from its stream, so it holds n distinct
    images. Grey levels are scaled to [0, 1] and normalised with the training images' mean and standard
    deviation (:func:`_normalised_images`); images are resized when ``task.image_size`` is not 28.

    The condition map's knobs: ``task.train_size`` N > 0 keeps N distinct training images (the first N of a
    permutation of the training file drawn from the ``trainset`` stream, :attr:`train_index`), from which the
    training batches, the probe set and the re-estimation batches are drawn; ``task.pixel_noise`` adds i.i.d.
    Gaussian noise of that standard deviation (normalised pixel units) to every image of every draw, fresh each
    time, from the draw's own generator (after the indices it draws), held-out and probe sets included.

    Attributes:
        train_x: (N_train, 1, S, S) normalised training images on the run's device, in the run's dtype (N_train:
            60,000, or ``task.train_size``).
        train_y: (N_train,) int64 labels.
        train_index: (N_train,) int64, the kept images' indices in the training file (CPU), or None (all of them).
    """

    cfg: TaskConfig
    train_x: torch.Tensor  # (N_train, 1, S, S)
    train_y: torch.Tensor  # (N_train,)
    norm: tuple[float, float]  # the training images' mean and standard deviation, in [0, 1] grey levels
    train_index: torch.Tensor | None = None  # (N_train,) indices into the training file; None: every image

    @classmethod
    def build(cls, cfg: TaskConfig, seed: int, device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> "FashionMNIST":
        """The task, read from ``cfg.data_dir`` (``seed`` changes nothing: the data are the data).

        Raises:
            DataError: a file missing or malformed (:mod:`bnrotation.study.fashion_mnist`).
            ConfigError: ``task.train_size`` larger than the training file.
        """
        x, y, mean, std = _normalised_images(cfg.data_dir, "train", cfg.image_size)
        index = None
        if cfg.train_size:
            if cfg.train_size > len(y):
                raise ConfigError(f"task.train_size: expected 0 or at most {len(y):,} (Fashion-MNIST's training "
                                  f"file), got {cfg.train_size:,}")
            index = torch.randperm(len(y), generator=generator(seed, "trainset"))[:cfg.train_size]  # (N,)
            x, y = x[index], y[index]
        return cls(cfg, x.to(device=device, dtype=dtype), y.to(device), (mean, std), index)

    def _noisy(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """``x`` plus ``task.pixel_noise`` times i.i.d. N(0, 1) noise drawn with ``gen`` on its device (float32,
        then in ``x``'s dtype); ``x`` itself when the knob is 0, drawing nothing."""
        if not self.cfg.pixel_noise:
            return x
        noise = torch.randn(x.shape, generator=gen, device=x.device).to(x.dtype)  # (n, 1, S, S)
        return x + self.cfg.pixel_noise * noise

    def sample(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` training images drawn uniformly with replacement with ``gen`` (on the data's device), with
        fresh pixel noise (``task.pixel_noise``) drawn after them.

        Returns:
            x: (n, 1, S, S) in the data's dtype; y: (n,) int64 labels in [0, 10).
        """
        idx = torch.randint(0, len(self.train_y), (n,), generator=gen, device=self.train_y.device)  # (n,)
        return self._noisy(self.train_x[idx], gen), self.train_y[idx]

    def fixed_set(self, n: int, seed: int, stream: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``n`` of a permutation, drawn on the CPU from ``stream``, of the test file (``heldout``)
        or of the training set (any other stream: the probe set; the kept images with ``task.train_size``), with
        pixel noise (``task.pixel_noise``) drawn after it from the same stream.

        Raises:
            ConfigError: ``n`` is larger than the file or the kept images (naming the key that asks for it).
        """
        split = "test" if stream == "heldout" else "train"
        x, y, _, _ = _normalised_images(self.cfg.data_dir, split, self.cfg.image_size)
        pool = self.train_index if split == "train" and self.train_index is not None else None
        size = len(y) if pool is None else len(pool)
        if n > size:
            key = "scale.heldout_size" if split == "test" else "task.probe_size"
            kept = f"{split} file" if pool is None else "training images kept by task.train_size"
            raise ConfigError(f"{key}: expected at most {size:,} (Fashion-MNIST's {kept}), got {n:,}")
        g = generator(seed, stream)
        idx = torch.randperm(size, generator=g)[:n]  # (n,)
        idx = idx if pool is None else pool[idx]
        dev = self.train_y.device
        return self._noisy(x[idx], g).to(device=dev, dtype=self.train_x.dtype), y[idx].to(dev)

    def cpu(self) -> "FashionMNIST":
        """The same task with its training images on the CPU."""
        return FashionMNIST(self.cfg, self.train_x.cpu(), self.train_y.cpu(), self.norm, self.train_index)

    def at_step(self, step: int) -> "FashionMNIST":
        """The training data of step ``step``: always this task (the data swap is the templates'; the config
        refuses it here)."""
        return self

    def describe(self) -> dict:
        """What ``run.json`` records of the task: its name, files, sizes and normalisation."""
        files = [str(p) for split in fashion_mnist.FILES
                 for p in fashion_mnist.load_split(self.cfg.data_dir, split).files]
        return {"name": "fashion_mnist", "image_shape": list(self.train_x.shape[1:]), "files": files,
                "train_size": len(self.train_y), "num_classes": fashion_mnist.NUM_CLASSES,
                "pixel_noise": self.cfg.pixel_noise,
                "test_size": len(fashion_mnist.load_split(self.cfg.data_dir, "test").labels),
                "normalisation": {"mean": self.norm[0], "std": self.norm[1]}}


Task = NoisyTemplates | FashionMNIST
TASK_CLASSES = {"noisy_templates": NoisyTemplates, "fashion_mnist": FashionMNIST}


def build_task(cfg: TaskConfig, seed: int, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32) -> Task:
    """The task ``cfg.name`` names, for ``seed``, on ``device``, in ``dtype``.

    Raises:
        DataError: Fashion-MNIST's files are missing or malformed.
    """
    return TASK_CLASSES[cfg.name].build(cfg, seed, device, dtype)


# ----------------------------------------------------------------------------- a run's fixed sets and streams
def run_dtype(cfg: RunConfig) -> torch.dtype:
    """The run's floating-point type (``dtype``): of its weights, data and statistics."""
    return getattr(torch, cfg.dtype)


def memory_format(cfg: RunConfig) -> torch.memory_format:
    """The model's memory format (``model.channels_last``), which its inputs take too."""
    return torch.channels_last if cfg.model.channels_last else torch.contiguous_format


def heldout_set(task: Task, cfg: RunConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The run's held-out set, ``x`` (heldout_size, C, S, S) in the model's memory format, ``y`` (heldout_size,)."""
    x, y = task.fixed_set(cfg.scale.heldout_size, cfg.seed, "heldout")
    return x.contiguous(memory_format=memory_format(cfg)), y


def probe_set(task: Task, cfg: RunConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The run's probe set (fresh statistics, drift, the monitor), ``x`` (probe_size, C, S, S), ``y``."""
    x, y = task.fixed_set(cfg.task.probe_size, cfg.seed, "probe")
    return x.contiguous(memory_format=memory_format(cfg)), y


def reestimation_batches(task: Task, cfg: RunConfig, device: torch.device, step: int) -> list[torch.Tensor]:
    """``scale.reestimate_batches`` fresh training batches from the run's own ``reestimate`` stream.

    The stream is reseeded from (seed, step) and drawn on the CPU, then moved
    to ``device``, so the batches at a step are the same in the runner and in
    offline diagnosis on any device, and the training stream is never touched.
    Drawn once per step and shared by every re-estimation at that step (the
    interventions' and each averaged model's).

    Returns:
        ``scale.reestimate_batches`` tensors (batch_size, C, S, S) in the task's dtype, on ``device``.
    """
    g = generator(cfg.seed * 1_000_003 + step, "reestimate")
    cpu_task = task.at_step(step).cpu()  # with the data swap, the source training draws from at this step
    fmt = memory_format(cfg)
    return [cpu_task.sample(cfg.task.batch_size, g)[0].to(device).contiguous(memory_format=fmt)
            for _ in range(cfg.scale.reestimate_batches)]
