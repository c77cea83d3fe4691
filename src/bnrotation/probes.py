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
from .evaluation import CompiledEvaluation, evaluation_call, evaluation_mode, model_logits
from .staleness import mean_lag_sigma, sigma


def _channels(w: torch.Tensor) -> torch.Tensor:
    """(C_out, ...) -> (C_out, D) in float64."""
    return w.detach().reshape(w.shape[0], -1).double()


def rotation_deg(w_before: torch.Tensor, w_after: torch.Tensor) -> torch.Tensor:
    """Angle each output channel turned between two weights, in degrees.

    ``2 * atan2(||a - b||, ||a + b||)`` on the unit vectors a, b of each
    channel, in float64: accurate down to tiny angles, where ``arccos`` of a
    float32 cosine cannot resolve sub-degree turns (PROTOCOL.md). Computed by
    :func:`turn_rows`, through which the monitor measures it.

    Args:
        w_before, w_after: (C_out, ...) conv weights of one layer.

    Returns:
        (C_out,) float64, in [0, 180].

    Raises:
        ValueError: if the shapes differ.
    """
    if w_before.shape != w_after.shape:
        raise ValueError(f"rotation_deg: shapes differ, {tuple(w_before.shape)} vs {tuple(w_after.shape)}")
    return turn_rows(w_before, w_after)[1]


# Float64 values per block of rows in :func:`turn_rows` on a CPU (2 MiB): a block's float64 copies, unit rows, sum and
# difference stay in cache, and no full-size float64 temporary is allocated; on a CPU a fresh allocation of many
# MiB costs more in page faults than the arithmetic on it. A row is reduced alone, in a block as in the whole
# weight (on timm's resnet18 the monitor's records are bit for bit those of whole-weight passes).
ROW_BLOCK = 1 << 18


@torch.no_grad()
def turn_rows(w_before: torch.Tensor | None, w_after: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each output channel's norm, and the angle it turned since ``w_before``, in one pass over the rows.

    The rows are taken in blocks (:data:`ROW_BLOCK` float64 values on a CPU, all at once on another device); in
    each block, once: the float64 copies, their row norms and unit rows a (before) and b (after), ``a - b`` and
    ``a + b`` and their norms; the angle is ``2 * atan2(||a - b||, ||a + b||)`` in degrees (:func:`rotation_deg`).

    Args:
        w_before: (C_out, ...) the weight then (any floating dtype, ``w_after``'s shape and device), or None.
        w_after: (C_out, ...) the weight now.

    Returns:
        ``(norms, rotation)``: |w_c| of ``w_after`` per row (C_out,) float64 (:func:`channel_norms`), and the
        angle per row in degrees (C_out,) float64, in [0, 180] (None without ``w_before``).

    Raises:
        ValueError: if the shapes differ.
    """
    if w_before is not None and w_before.shape != w_after.shape:
        raise ValueError(f"rotation_deg: shapes differ, {tuple(w_before.shape)} vs {tuple(w_after.shape)}")
    rows = w_after.detach().reshape(w_after.shape[0], -1)
    then = w_before.detach().reshape(rows.shape) if w_before is not None else None
    c, d = rows.shape
    device = rows.device
    norms = torch.empty(c, dtype=torch.float64, device=device)
    minus, plus = (torch.empty_like(norms), torch.empty_like(norms)) if then is not None else (None, None)
    block = max(1, ROW_BLOCK // max(d, 1)) if device.type == "cpu" else max(c, 1)
    size = min(block, c) * d
    scratch = torch.empty(size * (3 if then is not None else 1), dtype=torch.float64, device=device)
    for i in range(0, c, block):
        j = min(i + block, c)
        k = (j - i) * d
        b = scratch[:k].view(j - i, d).copy_(rows[i:j])  # float64
        n = b.norm(dim=1, keepdim=True)
        norms[i:j] = n[:, 0]
        if then is None:
            continue
        b.div_(n)  # the unit rows now
        a = scratch[size:size + k].view(j - i, d).copy_(then[i:j])
        a.div_(a.norm(dim=1, keepdim=True))  # the unit rows then
        t = scratch[2 * size:2 * size + k].view(j - i, d)
        minus[i:j] = torch.sub(a, b, out=t).norm(dim=1)
        plus[i:j] = torch.add(a, b, out=t).norm(dim=1)
    return norms, (torch.rad2deg(2 * torch.atan2(minus, plus)) if then is not None else None)


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


def input_moments(z: torch.Tensor, scratch: "Scratch | None" = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per channel mean and unbiased variance of one layer input (N, C, *): two (C,) float64 tensors.

    Two passes in the input's precision (float32 for half inputs): the channel mean, then the sums of the
    centred values and of their squares, combined in float64 as ``mean + r / n`` and
    ``(Σc² - r² / n) / (n - 1)`` with ``r = Σc`` (the corrected two-pass algorithm; Chan, Golub and LeVeque,
    "Algorithms for computing the sample variance", The American Statistician 37(3), 1983). The centring
    keeps the variance accurate when |mean| is many σ. Against float64 the mean is within 1e-6 σ and the
    variance within 1e-5 relative, also at |mean| = 30σ (``tests/test_probes.py``). On a CPU it is faster
    than ``torch.var_mean``, whose float32 reductions accumulate in float64 (`make bench`, section (c), times
    both).

    Args:
        scratch: where the centred values go (:class:`Scratch`, reused across the layers of one pass: on a CPU a
            fresh allocation of a layer input's size costs page faults); the same values as without.

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
    out = scratch.like(z) if scratch is not None else None
    centred = z - mean.view(shape) if out is None else torch.sub(z, mean.view(shape), out=out)
    r = centred.sum(dims).double()
    m2 = (centred.square_().sum(dims).double() - r * r / n).clamp_min(0)
    return mean.double() + r / n, m2 / (n - 1)


class Scratch:
    """One buffer, grown as needed, lent as a tensor of a given tensor's shape and strides (:meth:`like`)."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None
        self.largest = 0  # bytes of the largest tensor asked for

    def like(self, z: torch.Tensor) -> torch.Tensor | None:
        """An uninitialised tensor with ``z``'s shape, strides, dtype and device, over this buffer (valid until the
        next call); None for a ``z`` whose values do not fill its memory densely (a view with gaps or overlaps),
        whose elementwise results would not be laid out as ``z``'s."""
        self.largest = max(self.largest, z.numel() * z.element_size())
        if not any(z.is_contiguous(memory_format=f) for f in _DENSE_FORMATS.get(z.dim(), (torch.contiguous_format,))):
            return None
        b = self.buffer
        if b is None or b.numel() < z.numel() or b.dtype != z.dtype or b.device != z.device:
            self.buffer = b = torch.empty(z.numel(), dtype=z.dtype, device=z.device)
        return b.as_strided(z.shape, z.stride())


_DENSE_FORMATS = {4: (torch.contiguous_format, torch.channels_last),
                  5: (torch.contiguous_format, torch.channels_last_3d)}


@torch.no_grad()
def batch_statistics_pass(model: nn.Module, x: torch.Tensor, layers: list[tuple[str, nn.Module]] | None = None,
                          keep_frozen: bool = False, scratch: Scratch | None = None
                          ) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """One forward pass with batch statistics (:func:`bnstats.batch_statistics`): the output, and the mean and
    variance of each normalisation layer's *input* on ``x`` (:func:`input_moments`).

    No buffer changes. Each layer's moments are reduced inside its forward pre-hook, so no activation is kept;
    the layers' centred inputs share one buffer for the pass (:class:`Scratch`).

    Args:
        x: (N, ...) inputs.
        layers: ``[(name, module)]`` whose inputs to measure; default every norm layer (:func:`bnstats.norm_layers`).
        keep_frozen: passed to :func:`bnstats.batch_statistics`.
        scratch: the buffer to lend (a new one by default); after the pass its ``largest`` is the bytes of the
            largest layer input measured.

    Returns:
        The model's logits on ``x`` (:func:`.evaluation.read_logits`), and ``{layer name: (mean (C,), var (C,))}``
        in float64.

    Raises:
        TypeError: for an output that holds no logits (:func:`.evaluation.read_logits`).
    """
    layers = norm_layers(model) if layers is None else layers
    moments: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    scratch = Scratch() if scratch is None else scratch
    hooks = [m.register_forward_pre_hook(
        lambda mod, inp, name=name: moments.__setitem__(name, input_moments(inp[0], scratch)))
             for name, m in layers]
    try:
        with batch_statistics(model, keep_frozen=keep_frozen):
            out = model_logits(model, x)
    finally:
        for h in hooks:
            h.remove()
    return out, moments


def pooled_chunk_moments(parts: list[tuple[int, torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and unbiased variance (C,) of one layer's input over several chunks of a batch, from each chunk's
    ``(n, mean (C,), var (C,))`` (n: values per channel), exactly as over the whole batch: the pairwise update of
    Chan, Golub and LeVeque (1983), ``M2 = Σ M2_c + Σ n_c (mean_c - mean)²``, in float64. One chunk is returned as
    it is.

    Raises:
        ValueError: for no chunks, or fewer than 2 values per channel in all.
    """
    if not parts:
        raise ValueError("pooled_chunk_moments: no chunks")
    if len(parts) == 1:
        return parts[0][1], parts[0][2]
    n = sum(k for k, _, _ in parts)
    if n < 2:
        raise ValueError(f"pooled_chunk_moments: {n} values per channel, at least 2 needed for a variance")
    mean = sum(k * m.double() for k, m, _ in parts) / n
    m2 = sum((k - 1) * v.double() + k * (m.double() - mean).square() for k, m, v in parts)
    return mean, m2 / (n - 1)


def evaluation_path_pass(model: nn.Module, x, layers: list[tuple[str, nn.Module]] | None = None,
                         chunk: int | None = None, scratch: Scratch | None = None
                         ) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """One forward pass in evaluation mode (running statistics in every layer): the output, and the mean and
    variance of each normalisation layer's *input* with the network upstream in evaluation mode.

    These are the "expected" statistics of Huang et al., "Delving into the Estimation Shift of Batch
    Normalization in a Network" (CVPR 2022): what a layer meets at evaluation time, where the upstream layers
    normalise with their own running statistics. :func:`batch_statistics_pass` gives the statistics with the
    network upstream in training mode, which the running statistics estimate. A layer's running statistics
    against the latter measure its own lag; against these, the lag it meets, its own and what the layers above
    it carry through depth. For the first normalisation layer on a path the two are the same inputs.

    The pass runs eagerly (hooks do not reach a compiled graph), in chunks of ``chunk`` samples as
    :func:`.evaluation.evaluation_forward` (each sample's evaluation-mode output is its own); each layer's
    moments are reduced inside its forward pre-hook per chunk (:func:`input_moments`) and pooled over the chunks
    exactly (:func:`pooled_chunk_moments`). A layer called more than once per pass keeps its last call's input,
    as in :func:`batch_statistics_pass`. No buffer changes; every module's training flag is restored.

    Args:
        x: (N, ...) inputs, or a mapping the model reads whole (one pass).
        layers: ``[(name, module)]`` whose inputs to measure; default every norm layer
            (:func:`bnstats.norm_layers`).
        chunk: samples per chunk (None or >= N: one pass).
        scratch: the buffer to lend (:class:`Scratch`).

    Returns:
        The model's logits on ``x`` in evaluation mode (:func:`.evaluation.read_logits`), and ``{layer name:
        (mean (C,), var (C,))}`` in float64, for every layer the pass reached.

    Raises:
        TypeError: for an output that holds no logits (:func:`.evaluation.read_logits`).
    """
    layers = norm_layers(model) if layers is None else layers
    scratch = Scratch() if scratch is None else scratch
    parts: dict[str, dict[int, tuple[int, torch.Tensor, torch.Tensor]]] = {name: {} for name, _ in layers}
    at = [0]  # the chunk being run

    def hook(mod, inp, name):
        z = inp[0]
        parts[name][at[0]] = (z.numel() // z.shape[1], *input_moments(z, scratch))

    hooks = [m.register_forward_pre_hook(lambda mod, inp, name=name: hook(mod, inp, name)) for name, m in layers]
    try:  # no_grad as a block, not a decorator: make mutants (mutmut) skips decorated functions
        with torch.no_grad(), evaluation_mode(model):
            if not isinstance(x, torch.Tensor) or chunk is None or chunk >= len(x):
                out = model_logits(model, x)
            else:
                outs = []
                for at[0], c in enumerate(x.split(max(1, chunk))):
                    outs.append(model_logits(model, c))
                out = torch.cat(outs)
    finally:
        for h in hooks:
            h.remove()
    return out, {name: pooled_chunk_moments(list(p.values())) for name, p in parts.items() if p}


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


def lag_sigma(running_mean: torch.Tensor, fresh_mean: torch.Tensor, fresh_var: torch.Tensor,
              eps: float) -> torch.Tensor:
    """Running-mean lag per channel: ``(running_mean - fresh_mean) / sqrt(fresh_var + eps)``, in sigma
    (:func:`bnrotation.staleness.mean_lag_sigma`). Shapes (C,). ``eps`` is the layer's (``norm.eps``), the σ
    BatchNorm divides by, as the monitor and the study pass it; it has no default, since without it a
    near-constant channel's lag is meaningless (10⁶ σ)."""
    return mean_lag_sigma(running_mean.double(), fresh_mean, fresh_var, eps)


def drift_sigma_per_step(fresh_mean_now: torch.Tensor, fresh_mean_before: torch.Tensor,
                         fresh_var_now: torch.Tensor, interval: int, eps: float = 0.0) -> torch.Tensor:
    """Drift per channel: ``|mean(t) - mean(t - interval)| / (sqrt(var(t) + eps) * interval)``, sigma per step
    (``eps``: the layer's, as the monitor passes it). (C,)"""
    return (fresh_mean_now - fresh_mean_before).abs() / (sigma(fresh_var_now, eps) * interval)


def predicted_lag_sigma(drift: torch.Tensor, momentum: float) -> torch.Tensor:
    """Steady-state lag of an exponential average behind a mean drifting at ``drift`` sigma/step.

    ``drift * (1 - m) / m``: (1 - m) / m is the average age, in steps, of
    PyTorch's running average with momentum m (the article's lag formula).
    """
    return drift * (1.0 - momentum) / momentum


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, mode: str, chunk: int = 1000,
             compiled: CompiledEvaluation | None = None) -> float:
    """Top-1 accuracy on (x, y), as a fraction.

    ``mode="eval"``: ``model.eval()``, running statistics, in chunks of
    ``chunk`` samples (results do not depend on the chunking); through
    ``compiled`` when given (:class:`.evaluation.CompiledEvaluation`).
    ``mode="train"``: BatchNorm normalises with the statistics of the whole
    set ``x`` in one pass (:func:`bnstats.batch_statistics`); no running
    statistic changes.

    Raises:
        ValueError: for another mode.
    """
    if mode == "train":
        with batch_statistics(model):
            return (model_logits(model, x).argmax(1) == y).double().mean().item()
    if mode != "eval":
        raise ValueError(f"accuracy: mode must be 'eval' or 'train', got {mode!r}")
    with evaluation_mode(model):
        forward = evaluation_call(model, compiled)
        correct = torch.zeros((), dtype=torch.long, device=y.device)  # counted on the device: one sync
        for xc, yc in zip(x.split(chunk), y.split(chunk)):
            correct += (model_logits(forward, xc).argmax(1) == yc).sum()
    return int(correct) / len(y)
