"""The weight-row arithmetic of the monitor's rotation and cosines: each weight layer's output channels as rows.

A weight layer's output channel c is the row ``w[c]`` of its weight (C_out, ...) flattened. :class:`WeightRows`
holds one layer's per-row measures at one call of the monitor (norm, rotation since the previous call, and the
terms of the update and gradient cosines); :func:`gathered` takes a normalisation layer's channels from the rows of
the weight layers that feed it (one, or one per concatenated segment: :class:`bnrotation.pairing.Segment`).
:class:`bnrotation.monitor.StalenessMonitor` makes the rows once per call and builds its ``layers`` and
``channels`` columns from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .probes import channel_cosines, turn_rows

__all__ = ["WeightRows", "gathered"]


@dataclass
class WeightRows:
    """One weight layer's measures per output channel (all (C_out,) float64 on the CPU; None where not
    measured): ``norm`` |w_c|, ``rotation`` (degrees since the previous call), and for the update and gradient
    cosines the dot products with the weights before the step and the squared norms, which a norm layer's
    segments add up over the rows they take (the cosine of the rows taken together, as :func:`.probes.cosine`
    of one weight layer's whole weight)."""

    norm: torch.Tensor
    rotation: torch.Tensor | None = None
    update_cos: torch.Tensor | None = None
    update: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (u·wb, |u|², |wb|²) per row
    grad: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (g·wb, |g|², |wb|²) per row

    @classmethod
    def of(cls, w: torch.Tensor, kept: dict[str, torch.Tensor], name: str, before: torch.Tensor | None,
           grad: torch.Tensor | None) -> "WeightRows":
        """From the weight ``w`` (C_out, ...) of the layer ``name``, the previous call's copy of it ``kept[name]``
        (if any; then overwritten with ``w``, in place where it fits, else replaced by a copy), the weight
        ``before`` this step and the gradient ``grad`` (each None when absent)."""
        then = kept.get(name)
        fits = then is not None and then.shape == w.shape
        norm, rotation = turn_rows(then if fits else None, w)
        if fits and then.dtype == w.dtype and then.device == w.device:
            then.copy_(w)  # no new allocation: on a CPU a fresh one of a weight's size costs page faults
        else:
            kept[name] = w.clone()
        rows = cls(norm.cpu(), rotation.cpu() if rotation is not None else None)
        if before is not None:
            wb = _flat_rows(before)
            u = _flat_rows(w) - wb
            rows.update_cos = channel_cosines(u, wb).cpu()
            wb_sq = wb.square().sum(1)
            rows.update = ((u * wb).sum(1).cpu(), u.square().sum(1).cpu(), wb_sq.cpu())
            if grad is not None:
                g = _flat_rows(grad)
                rows.grad = ((g * wb).sum(1).cpu(), g.square().sum(1).cpu(), wb_sq.cpu())
        return rows

    @staticmethod
    def whole_norm(parts: list[tuple[WeightRows, slice]]) -> float:
        """|w| of the rows ``parts`` take, together; NaN without rows."""
        if not parts:
            return math.nan
        return float(torch.cat([r.norm[s] for r, s in parts]).square().sum().sqrt())

    @staticmethod
    def whole_cosine(parts: list[tuple[WeightRows, slice]], which: str) -> float:
        """The cosine ``"update"`` (of w(t+1) - w(t) with w(t)) or ``"grad"`` (of the gradient with w(t)) over
        the rows ``parts`` take, together; NaN where not measured or a norm is 0."""
        terms = [getattr(r, which) for r, _ in parts]
        if not parts or any(t is None for t in terms):
            return math.nan
        dot, a, b = (sum(float(t[k][s].sum()) for t, (_, s) in zip(terms, parts)) for k in range(3))
        return dot / math.sqrt(a * b) if a > 0 and b > 0 else math.nan


def _flat_rows(w: torch.Tensor) -> torch.Tensor:
    """(C_out, ...) -> (C_out, D) float64."""
    return w.detach().reshape(w.shape[0], -1).double()


def gathered(parts: list[tuple[WeightRows, slice]], key: str, missing: torch.Tensor) -> torch.Tensor:
    """A norm layer's (C,) column of the weight rows its segments take (``missing`` where a segment's weight
    layer lacks it, or without segments)."""
    if not parts:
        return missing
    pieces, start = [], 0
    for rows, s in parts:
        values = getattr(rows, key)
        n = s.stop - s.start
        pieces.append(values[s] if values is not None else missing[start:start + n])
        start += n
    return torch.cat(pieces) if len(pieces) > 1 else pieces[0]
