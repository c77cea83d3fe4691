"""Fresh statistics over several batches, pooled as re-estimation pools them.

The monitor's probe (:class:`bnrotation.monitor.StalenessMonitor`) and the check's ``--batches`` may be several
batches; their fresh statistics are then the ones :func:`bnrotation.bnstats.reestimate` would store, so that the
lag they give is the lag re-estimation on the same batches removes.
"""

from __future__ import annotations

import torch

__all__ = ["pooled_moments"]


def pooled_moments(per_batch: list[dict[str, tuple[torch.Tensor, torch.Tensor]]]
                   ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's fresh statistics over several batches, pooled as :func:`bnstats.reestimate` pools them
    (``momentum=None``: PyTorch's cumulative average over batches, as ``torch.optim.swa_utils.update_bn``): the
    mean over batches of each batch's mean, and of each batch's unbiased variance, every batch weighted alike
    whatever its size. A layer that some batches did not reach (a branch the model takes for some inputs only)
    is pooled over the batches that reached it, as re-estimation's forward passes update it only then.
    ``{layer: (mean (C,), var (C,))}`` of one batch is returned as it is."""
    if len(per_batch) == 1:
        return per_batch[0]
    names = dict.fromkeys(name for b in per_batch for name in b)  # every layer reached, in the order first seen
    pooled = {}
    for name in names:
        reached = [b[name] for b in per_batch if name in b]
        pooled[name] = (sum(m for m, _ in reached) / len(reached), sum(v for _, v in reached) / len(reached))
    return pooled
