"""The probe batch: what the monitor measures on, read and checked against the model once.

A probe is a tensor, an ``(x, y)`` tuple or list, a mapping, or a list of such batches (:func:`split_probes`,
read as :func:`bnrotation.batches.split_batch` reads any batch). :func:`check_probe` fails, naming the probe, on
what would fail or mislead at the monitor's first call; :func:`read_probe` does both and returns a
:class:`CheckedProbe`, which the monitor (:class:`bnrotation.monitor.StalenessMonitor`) takes as it is for the model
it was checked on, so a command that has read and checked its batches (:func:`bnrotation.inputs.load_probe`) hands
them over without a second reading. :func:`smallest_probe` is the fewest samples the mode-gap threshold needs.
Below the monitor; nothing here measures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from .batches import sample_count, split_batch
from .evaluation import evaluation_mode, logits_note, read_logits
from .pairing import buffers_kept, probe_head, rng_devices

__all__ = ["split_probe", "split_probes", "check_probe", "smallest_probe", "CheckedProbe", "read_probe"]


def split_probe(probe, input_key: str | None = "input", target_key: str = "target") -> tuple[torch.Tensor,
                                                                                            torch.Tensor | None]:
    """``(x, y)`` from a probe batch, read as :func:`bnrotation.batches.split_batch` reads any batch (a tensor,
    an ``(x, y)`` or ``(x,)`` tuple or list, or a mapping), labels checked.

    Raises:
        TypeError, ValueError: as :func:`bnrotation.batches.split_batch`, naming the probe.
    """
    return split_batch(probe, input_key, target_key, what="probe")


def split_probes(probe, input_key: str | None = "input", target_key: str = "target") -> list[tuple]:
    """The probe's batches as ``[(x, y)]``: one batch (:func:`split_probe`), or several, a list whose every item
    is a batch of its own (an ``(x, y)`` tuple or list, or a mapping; bare tensors ``[x, y]`` stay one batch).

    Raises:
        TypeError, ValueError: as :func:`split_probe`, naming the batch; ValueError for an empty list, or batches
            with labels mixed with batches without.
    """
    several = (isinstance(probe, list) and probe
               and all(isinstance(b, (tuple, list, Mapping)) for b in probe))
    if isinstance(probe, list) and not probe:
        raise ValueError("probe: an empty list of batches")
    if not several:
        return [split_probe(probe, input_key, target_key)]
    out = [split_batch(b, input_key, target_key, what=f"probe batch {i}") for i, b in enumerate(probe)]
    if len({y is None for _, y in out}) > 1:
        raise ValueError("probe: some batches have labels and some do not")
    return out


def _dtype_hint(model: nn.Module, tensors: dict[str, torch.Tensor]) -> str:
    """``; the inputs are float64, the model's parameters float32: ...`` when the probe's floating-point dtype is not
    the model's (the common cause of "expected scalar type Double but found Float"), else ""."""
    params = {p.dtype for p in model.parameters() if p.is_floating_point()}
    inputs = {t.dtype for t in tensors.values()}
    if len(params) != 1 or not inputs or inputs == params:
        return ""
    (want,) = params
    got = ", ".join(sorted(str(d).removeprefix("torch.") for d in inputs))
    return (f"; the inputs are {got}, the model's parameters {str(want).removeprefix('torch.')}: save the batches "
            f"as {str(want).removeprefix('torch.')} (x.to({want}))")


def check_probe(model: nn.Module, x, y: torch.Tensor | None) -> str:
    """Fail at construction, naming the probe, on what would fail or mislead at the first call: non-finite or
    non-floating inputs (of a mapping: non-finite floating tensors), inputs the model cannot run on (tried on
    two samples in evaluation mode; flags, random streams and buffers restored), outputs that hold no logits
    (:func:`bnrotation.evaluation.read_logits`: a tensor, or the ``logits`` of a mapping or ``ModelOutput``) or
    logits without a class dim, and labels that are not class indices of the output.

    Returns:
        ``""`` for a model that returns a tensor, else the line saying that its logits are read
        (:func:`bnrotation.evaluation.logits_note`).

    Raises:
        ValueError: naming the probe and what was expected; for an output without logits, the wrapper that fixes
            it.
    """
    if isinstance(x, torch.Tensor) and not x.is_floating_point():
        raise ValueError(f"probe: expected floating-point inputs, got {x.dtype}")
    tensors = {"": x} if isinstance(x, torch.Tensor) else {f"[{k!r}]": v for k, v in x.items()
                                                           if isinstance(v, torch.Tensor) and v.is_floating_point()}
    for key, t in tensors.items():
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            raise ValueError(f"probe{key}: {bad} of {t.numel()} input values are NaN or infinite")
    try:
        with (torch.no_grad(), torch.random.fork_rng(devices=rng_devices(model)), evaluation_mode(model),
              buffers_kept(model)):
            out = model(probe_head(x, 2))  # eagerly: a compiled evaluation would compile a graph for 2
    except Exception as e:  # any error the model raises on these inputs, reported as the probe's
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else f"(a mapping with keys {sorted(map(str, x))})"
        raise ValueError(f"probe: the model cannot run on the probe inputs {shape} "
                         f"({type(e).__name__}: {e}){_dtype_hint(model, tensors)}") from e
    note = logits_note(out)
    try:
        out = read_logits(out)
    except TypeError as e:
        raise ValueError(f"probe: {e}") from None
    if out.dim() < 2:
        raise ValueError(f"probe: the model's output on the probe must be (N, classes, ...) for the mode check, "
                         f"got {tuple(out.shape)}")
    if y is not None:
        if y.is_floating_point() or y.is_complex():
            raise ValueError(f"probe: labels must be class indices (an integer tensor), got {y.dtype}")
        k = out.shape[1]
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= k):
            raise ValueError(f"probe: labels must lie in [0, {k}) for a model with {k} outputs, got "
                             f"[{int(y.min())}, {int(y.max())}]")
    return note


@dataclass(frozen=True)
class CheckedProbe:
    """A probe read (:func:`split_probes`) and checked against one model (:func:`check_probe`, every batch).

    Attributes:
        batches: ``((x (N_b, ...), y (N_b,) or None), ...)``, one per batch, each of at least 2 samples.
        output_note: ``""`` for a model that returns a tensor, else the line saying that its logits are read
            (:func:`bnrotation.evaluation.logits_note`).
        model: the model it was checked on; for another model only :func:`check_probe` runs again.
    """

    batches: tuple[tuple, ...]
    output_note: str
    model: nn.Module = field(repr=False, compare=False)


def read_probe(model: nn.Module, probe, input_key: str | None = "input", target_key: str = "target") -> CheckedProbe:
    """``probe`` read and checked against ``model``: a :class:`CheckedProbe` of ``model`` as it is; one of another
    model checked again (:func:`check_probe`), not read again; anything else read (:func:`split_probes`), its
    batches' sizes checked, and checked against the model.

    Raises:
        TypeError, ValueError: as :func:`split_probes` and :func:`check_probe`, naming the probe (and the batch, of
            several); ValueError for a batch of fewer than 2 samples (BatchNorm's batch statistics need 2).
    """
    if isinstance(probe, CheckedProbe):
        if probe.model is model:
            return probe
        batches = list(probe.batches)
    else:
        batches = split_probes(probe, input_key, target_key)  # [(x (N_b, ...), y (N_b,) or None)]
        for i, (x, _) in enumerate(batches):
            if sample_count(x) < 2:
                where = f" batch {i}" if len(batches) > 1 else ""
                raise ValueError(f"probe{where}: BatchNorm needs at least 2 samples for batch statistics, got "
                                 f"{sample_count(x)}")
    note = [check_probe(model, x, y) for x, y in batches][0]
    return CheckedProbe(tuple(batches), note, model)


def smallest_probe(mode_gap: float) -> int:
    """The fewest probe samples for which one sample moves the mode gap (a fraction) by no more than
    ``mode_gap``: ``ceil(1 / mode_gap)``; 0 (any size) for a threshold of 0."""
    return math.ceil(1.0 / mode_gap - 1e-9) if mode_gap > 0 else 0
