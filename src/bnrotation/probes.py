"""What the study measures (PROTOCOL.md, "Measured quantities").

Every probe is a pure function of tensors (or of a model and a batch) and of
what it measured last time; the runner decides when to call it. Angles are in
degrees, statistics in units of the channel's standard deviation (sigma),
rates per optimizer step. How an evaluation-mode pass runs (in chunks,
compiled or eagerly) is :mod:`bnrotation.evaluation`'s; it changes no result.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .bnstats import batch_statistics, norm_layers
from .evaluation import evaluation_call, evaluation_mode


def _channels(w: torch.Tensor) -> torch.Tensor:
    """(C_out, ...) -> (C_out, D) in float64."""
    return w.detach().reshape(w.shape[0], -1).double()


def rotation_deg(w_before: torch.Tensor, w_after: torch.Tensor) -> torch.Tensor:
    """Angle each output channel turned between two weights, in degrees.

    ``2 * atan2(||a - b||, ||a + b||)`` on the unit vectors a, b of each
    channel, in float64: accurate down to tiny angles, where ``arccos`` of a
    float32 cosine cannot resolve sub-degree turns (PROTOCOL.md).

    Args:
        w_before, w_after: (C_out, ...) conv weights of one layer.

    Returns:
        (C_out,) float64, in [0, 180].

    Raises:
        ValueError: if the shapes differ.
    """
    if w_before.shape != w_after.shape:
        raise ValueError(f"rotation_deg: shapes differ, {tuple(w_before.shape)} vs {tuple(w_after.shape)}")
    a, b = _unit_rows(w_before), _unit_rows(w_after)
    diff = a - b
    return torch.rad2deg(2 * torch.atan2(diff.norm(dim=1), a.add_(b).norm(dim=1)))  # (C_out,); a is a copy


def _unit_rows(w: torch.Tensor) -> torch.Tensor:
    """(C_out, ...) -> (C_out, D) float64 rows of norm 1, always a new tensor: the float64 copy of a float32
    weight is divided in place (the same values as out of place, one full-size copy fewer)."""
    rows = _channels(w)
    norms = rows.norm(dim=1, keepdim=True)
    return rows.div_(norms) if rows.data_ptr() != w.data_ptr() else rows / norms


def channel_norms(w: torch.Tensor) -> torch.Tensor:
    """(C_out, ...) -> (C_out,) float64 Euclidean norm of each output channel."""
    return _channels(w).norm(dim=1)


def cosine(u: torch.Tensor, w: torch.Tensor) -> float:
    """Cosine between two tensors flattened whole (float64); NaN if either is zero."""
    u, w = u.detach().double().flatten(), w.detach().double().flatten()
    denom = u.norm() * w.norm()
    return float((u @ w) / denom) if denom > 0 else float("nan")


def channel_cosines(u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(C_out, ...) x2 -> (C_out,) float64 cosine per output channel (NaN where a norm is 0)."""
    u, w = _channels(u), _channels(w)
    return (u * w).sum(1) / (u.norm(dim=1) * w.norm(dim=1))


def channel_dims(z: torch.Tensor) -> tuple[int, ...]:
    """The dims a normalisation layer's statistics reduce over, for an input (N, C, *spatial): all but dim 1.

    Raises:
        ValueError: for an input of fewer than 2 dims, which has no channel dim.
    """
    if z.dim() < 2:
        raise ValueError(f"a normalisation layer's input needs shape (N, C, ...), got {tuple(z.shape)}")
    return (0, *range(2, z.dim()))


def input_moments(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per channel mean and unbiased variance of one layer input (N, C, *): two (C,) float64 tensors.

    Two passes in the input's precision (float32 for half inputs): the channel mean, then the sums of the
    centred values and of their squares, combined in float64 as ``mean + r / n`` and
    ``(Σc² - r² / n) / (n - 1)`` with ``r = Σc`` (the corrected two-pass algorithm; Chan, Golub and LeVeque,
    "Algorithms for computing the sample variance", The American Statistician 37(3), 1983). The centring
    keeps the variance accurate when |mean| is many σ. Against float64 the mean is within 1e-6 σ and the
    variance within 1e-5 relative, also at |mean| = 30σ (``tests/test_probes.py``). On a CPU it is faster
    than ``torch.var_mean``, whose float32 reductions accumulate in float64 (`make bench`, section (c), times
    both).

    Raises:
        ValueError: for an input of fewer than 2 dims (:func:`channel_dims`).
    """
    dims = channel_dims(z)
    z = z.detach()
    if z.dtype not in (torch.float32, torch.float64):
        z = z.float()
    n = z.numel() // z.shape[1]
    shape = (1, -1) + (1,) * (z.dim() - 2)
    mean = z.sum(dims) / n
    centred = z - mean.view(shape)
    r = centred.sum(dims).double()
    m2 = (centred.square_().sum(dims).double() - r * r / n).clamp_min(0)
    return mean.double() + r / n, m2 / (n - 1)


@torch.no_grad()
def batch_statistics_pass(model: nn.Module, x: torch.Tensor, layers: list[tuple[str, nn.Module]] | None = None,
                          keep_frozen: bool = False) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """One forward pass with batch statistics (:func:`bnstats.batch_statistics`): the output, and the mean and
    variance of each normalisation layer's *input* on ``x`` (:func:`input_moments`).

    No buffer changes. Each layer's moments are reduced inside its forward pre-hook, so no activation is kept.

    Args:
        x: (N, ...) inputs.
        layers: ``[(name, module)]`` whose inputs to measure; default every norm layer (:func:`bnstats.norm_layers`).
        keep_frozen: passed to :func:`bnstats.batch_statistics`.

    Returns:
        The model's output on ``x``, and ``{layer name: (mean (C,), var (C,))}`` in float64.
    """
    layers = norm_layers(model) if layers is None else layers
    moments: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, inp, name=name: moments.__setitem__(name, input_moments(inp[0])))
             for name, m in layers]
    try:
        with batch_statistics(model, keep_frozen=keep_frozen):
            out = model(x)
    finally:
        for h in hooks:
            h.remove()
    return out, moments


def fresh_statistics(model: nn.Module, x: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per channel mean and variance of each norm layer's *input* under the current weights.

    The network runs in training mode (batch statistics upstream) on the probe
    set ``x`` in one pass, inside :func:`bnstats.batch_statistics`, so no
    buffer changes. The variance is the unbiased one, because that is what
    PyTorch's ``running_var`` estimates. This is what the running statistics
    estimate (PROTOCOL.md, "Fresh statistics"). Any input shape (N, C, *)
    works: BatchNorm1d on (N, C) or (N, C, L), 2d, 3d.

    Args:
        x: (N, ...) probe inputs.

    Returns:
        ``{norm layer name: (mean (C,), var (C,))}`` in float64.
    """
    return batch_statistics_pass(model, x)[1]


def lag_sigma(running_mean: torch.Tensor, fresh_mean: torch.Tensor, fresh_var: torch.Tensor) -> torch.Tensor:
    """Running-mean lag per channel: ``(running_mean - fresh_mean) / fresh_std``, in sigma. Shapes (C,)."""
    return (running_mean.double() - fresh_mean) / fresh_var.sqrt()


def drift_sigma_per_step(fresh_mean_now: torch.Tensor, fresh_mean_before: torch.Tensor,
                         fresh_var_now: torch.Tensor, interval: int) -> torch.Tensor:
    """Drift per channel: ``|mean(t) - mean(t - interval)| / (std(t) * interval)``, sigma per step. (C,)"""
    return (fresh_mean_now - fresh_mean_before).abs() / (fresh_var_now.sqrt() * interval)


def predicted_lag_sigma(drift: torch.Tensor, momentum: float) -> torch.Tensor:
    """Steady-state lag of an exponential average behind a mean drifting at ``drift`` sigma/step.

    ``drift * (1 - m) / m``: (1 - m) / m is the average age, in steps, of
    PyTorch's running average with momentum m (the article's lag formula).
    """
    return drift * (1.0 - momentum) / momentum


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, mode: str, chunk: int = 1000) -> float:
    """Top-1 accuracy on (x, y), as a fraction.

    ``mode="eval"``: ``model.eval()``, running statistics, in chunks of
    ``chunk`` samples (results do not depend on the chunking); compiled inside
    :func:`.evaluation.compiled_evaluation`.
    ``mode="train"``: BatchNorm normalises with the statistics of the whole
    set ``x`` in one pass (:func:`bnstats.batch_statistics`); no running
    statistic changes.

    Raises:
        ValueError: for another mode.
    """
    if mode == "train":
        with batch_statistics(model):
            return (model(x).argmax(1) == y).double().mean().item()
    if mode != "eval":
        raise ValueError(f"accuracy: mode must be 'eval' or 'train', got {mode!r}")
    with evaluation_mode(model):
        forward = evaluation_call(model)
        correct = torch.zeros((), dtype=torch.long, device=y.device)  # counted on the device: one sync
        for xc, yc in zip(x.split(chunk), y.split(chunk)):
            correct += (forward(xc).argmax(1) == yc).sum()
    return int(correct) / len(y)
