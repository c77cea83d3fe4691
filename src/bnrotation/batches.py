"""What a batch may look like: a tensor, an ``(input, target)`` tuple or list, or a mapping.

One reader for the three places that take a user's batches: the monitor's probe
(:func:`bnrotation.probe_batch.split_probe`), the check's ``--batches``
(:func:`bnrotation.inputs.load_batches`) and re-estimation's loader
(:func:`bnrotation.bnstats.reestimate`). The shapes are those of a PyTorch
``DataLoader``'s default collation: a tensor (N, ...), a tuple or list whose
first item is the input (N, ...) and second the targets (N,), or a dict.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["split_batch", "sample_count"]


def sample_count(x) -> int:
    """Samples in model inputs: a tensor's first dim, or that of a mapping's first tensor of at least one dim
    (0 when it has none)."""
    if isinstance(x, torch.Tensor):
        return len(x)
    return next((len(v) for v in x.values() if isinstance(v, torch.Tensor) and v.dim() > 0), 0)


def split_batch(batch, input_key: str | None = "input", target_key: str = "target", *, labels: bool = True,
                what: str = "batch") -> tuple[torch.Tensor | dict, torch.Tensor | None]:
    """``(x, y)`` from one batch.

    Reads a tensor (no labels), an ``(x, y)`` or ``(x,)`` tuple or list, or a mapping with a tensor under
    ``input_key`` (and optionally ``target_key``). With ``input_key=None`` a mapping is the model's input whole
    (a model whose ``forward(batch)`` reads its own keys): ``x`` is the mapping, ``y`` still
    ``batch[target_key]`` if present.

    Args:
        labels: read the targets too, and check them: ``y`` (N,) with one label per input. With
            ``labels=False`` (a pass that needs the inputs only, such as re-estimation) ``y`` is None, and a
            tuple or list may hold more items after the input (as ``torch.optim.swa_utils.update_bn`` allows).
        what: the name the error messages give the batch (``"probe"``, ``"batch"``).

    Raises:
        TypeError: naming what was found, for anything else.
        ValueError: when labels are read and their count differs from the inputs'.
    """
    if isinstance(batch, torch.Tensor):
        x, y = batch, None
    elif (isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor)
          and (len(batch) <= 2 or not labels)):
        x, y = batch[0], batch[1] if len(batch) > 1 else None
    elif isinstance(batch, Mapping) and input_key is None and sample_count(batch):
        x, y = dict(batch), batch.get(target_key)
    elif isinstance(batch, Mapping) and input_key is not None and isinstance(batch.get(input_key), torch.Tensor):
        x, y = batch[input_key], batch.get(target_key)
    else:
        keys = f" (keys: {sorted(map(str, batch))})" if isinstance(batch, Mapping) else ""
        n = f" of {len(batch)} items" if isinstance(batch, (tuple, list)) else ""
        whole = (" (input_key=None passes a mapping whole; it needs a tensor with one value per sample)"
                 if isinstance(batch, Mapping) else "")
        raise TypeError(f"{what}: expected a tensor, an (input, target) tuple, or a mapping with a tensor under "
                        f"{input_key!r}; got {type(batch).__name__}{n}{keys}{whole}")
    if not labels:
        return x, None
    if y is not None and (not isinstance(y, torch.Tensor) or len(y) != sample_count(x)):
        raise ValueError(f"{what}: {sample_count(x)} inputs but labels {type(y).__name__} "
                         f"{tuple(y.shape) if isinstance(y, torch.Tensor) else ''}")
    return x, y
