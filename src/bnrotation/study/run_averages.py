"""The runner's ``averaging`` table: what a run keeps to score weight averages, and how it scores them.

A run with ``averaging.enabled`` keeps one :class:`~bnrotation.averaging.EMA` per decay and the tail snapshots
(:class:`RunAverages`), and at each averaging evaluation scores the live model, each EMA and the tail average under
each BatchNorm buffer policy (:data:`~bnrotation.averaging.POLICIES`). The averages themselves are the library's
(:mod:`bnrotation.averaging`); this module holds only what the study's config (:class:`AveragingConfig`) asks of a run.

The runner builds its averages through a factory it takes as an argument
(``runner.run(cfg, averages=...)``, :data:`AveragesFactory`); a tool that wants to see every average the run
scores passes a subclass (``experiments/audit_averaging.py`` audits each copy).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from ..averaging import EMA, EMA_POLICIES, POLICIES, BufferProvenance, average_checkpoints
from ..bnstats import running_stat_layers
from ..evaluation import CompiledEvaluation
from ..probes import accuracy, fresh_statistics, lag_sigma
from .config import AveragingConfig

__all__ = ["RunAverages", "AveragesFactory", "lag_network_median_abs_sigma"]


def lag_network_median_abs_sigma(model: nn.Module, fresh: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> float:
    """The averaging table's ``lag_network_median_abs_sigma``: the median, over every channel of every BatchNorm
    layer with running statistics (the whole network at once, not a layer's median as the monitor's
    ``lag_median_abs_sigma``), of |running mean - fresh mean| / sqrt(fresh var + the layer's eps)
    (:func:`probes.lag_sigma`, the monitor's ``lag_sigma``), in σ; NaN for a model without such layers.

    Args:
        fresh: ``{norm layer: (mean, var)}``, each (C,), :func:`probes.fresh_statistics` of the model's weights
            on the probe (it depends on the weights only, so copies that share weights share it).
    """
    lags = [lag_sigma(m.running_mean.detach(), *fresh[name], float(m.eps)).abs().cpu()  # (C,) each
            for name, m in running_stat_layers(model)]
    return float(torch.cat(lags).median()) if lags else math.nan


class RunAverages:
    """What a run keeps for the ``averaging`` table: one :class:`EMA` per decay and the tail snapshots.

    Call :meth:`after_step` after every optimizer step and :meth:`evaluate`
    at the evaluation steps. Nothing here touches the live model's weights,
    buffers or random streams, so the training run is the same with or
    without it.
    """

    COLUMNS = ("average", "decay", "window_steps", "policy", "constituents", "acc_eval_mode",
               "lag_network_median_abs_sigma")

    def __init__(self, cfg: AveragingConfig, model: nn.Module):
        self.cfg = cfg
        self.emas = [EMA(model, d) for d in cfg.ema_decays]
        self.snapshots: deque[tuple[int, dict]] = deque(maxlen=cfg.tail_steps // cfg.tail_every)

    def after_step(self, model: nn.Module, step: int) -> None:
        """EMA updates; a snapshot (weights and buffers) every ``tail_every`` steps."""
        for ema in self.emas:
            ema.update(model)
        if self.cfg.tail_steps and step % self.cfg.tail_every == 0:
            self.snapshots.append((step, {k: v.detach().clone() for k, v in model.state_dict().items()}))

    def evaluate(self, model: nn.Module, step: int, x: torch.Tensor, y: torch.Tensor, probe_x: torch.Tensor,
                 batches: Sequence, chunk: int = 1000, live_accuracy: float | None = None,
                 live_fresh: Mapping[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
                 compiled: CompiledEvaluation | None = None) -> pd.DataFrame:
        """Evaluation-mode accuracy on (x, y) of the live model, each EMA and the tail average, per policy; each
        averaged copy, once scored, is handed to :meth:`after_scoring`.

        Args:
            batches: the re-estimation batches of this step, used by every ``refresh``.
            live_accuracy, live_fresh: the live model's evaluation-mode accuracy on (x, y) and its fresh
                statistics on ``probe_x`` when already measured at this step (the runner's check and
                monitor); computed here otherwise.
            compiled: what every evaluation-mode pass runs through (:func:`.probes.accuracy`); None: eagerly.

        Returns:
            DataFrame with :attr:`COLUMNS`: ``average`` live | ema | tail;
            ``decay`` (NaN but for ema); ``window_steps`` (tail window in
            steps, -1 otherwise); ``policy`` (none for live);
            ``constituents`` (snapshots averaged, EMA updates, 1 for live);
            ``lag_network_median_abs_sigma`` (median |lag| over every channel of the network on ``probe_x``, σ).
        """
        rows = []

        def add(average: str, decay: float, window: int, policy: str, n: int, m: nn.Module, fresh: Mapping,
                acc: float | None = None, provenance: BufferProvenance | None = None) -> None:
            lag = lag_network_median_abs_sigma(m, fresh)
            acc = accuracy(m, x, y, "eval", chunk, compiled) if acc is None else acc
            rows.append((average, decay, window, policy, n, acc, lag))
            if provenance is not None:  # an averaged copy, not the live model
                self.after_scoring(model, step, x, y, m, provenance, average=average, decay=decay, policy=policy)

        add("live", math.nan, -1, "none", 1, model,
            fresh_statistics(model, probe_x) if live_fresh is None else live_fresh, live_accuracy)
        for ema in self.emas:
            fresh = fresh_statistics(ema.module, probe_x)  # the same weights under every policy
            for policy in EMA_POLICIES:
                m, provenance = ema.averaged(policy, model, batches if policy == "refresh" else None)
                add("ema", ema.decay, -1, policy, ema.updates, m, fresh, provenance=provenance)
        states = [s for t, s in self.snapshots if t > step - self.cfg.tail_steps]
        fresh = None
        for policy in POLICIES if states else ():
            m, provenance = average_checkpoints(model, states, policy=policy,
                                                batches=batches if policy == "refresh" else None)
            fresh = fresh_statistics(m, probe_x) if fresh is None else fresh
            add("tail", math.nan, self.cfg.tail_steps, policy, len(states), m, fresh, provenance=provenance)
        df = pd.DataFrame(rows, columns=list(self.COLUMNS))
        df["constituents"] = df["constituents"].astype(np.int64)
        df["window_steps"] = df["window_steps"].astype(np.int64)
        return df

    def after_scoring(self, model: nn.Module, step: int, x: torch.Tensor, y: torch.Tensor, averaged: nn.Module,
                      provenance: BufferProvenance, *, average: str, decay: float, policy: str) -> None:
        """Called by :meth:`evaluate` once for each averaged copy it has scored (not for the live model); does
        nothing here. A subclass that wants every copy the table scores overrides it
        (``experiments/audit_averaging.py`` audits each) and reaches the runner through
        ``runner.run(cfg, averages=...)``.

        Args:
            model: the live model at ``step``; x, y: the held-out set the copy was scored on.
            averaged: the copy (its own module: changing it changes nothing in the run).
            provenance: where its BatchNorm buffers came from (``averaged``'s policy).
            average, decay, policy: the copy's row keys in the ``averaging`` table.
        """

    def state_dict(self) -> dict:
        """Everything :meth:`load_state_dict` needs to continue exactly: each EMA's weights, buffers and update
        count, and the tail snapshots (for a resumable run)."""
        return {"emas": [{"decay": e.decay, "updates": e.updates, "module": e.module.state_dict()} for e in self.emas],
                "snapshots": [{"step": t, "state": s} for t, s in self.snapshots]}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            ValueError: if the EMA decays differ from this object's.
        """
        decays = [e["decay"] for e in state["emas"]]
        if decays != [e.decay for e in self.emas]:
            raise ValueError(f"saved EMA decays {decays} differ from {[e.decay for e in self.emas]}")
        for ema, saved in zip(self.emas, state["emas"]):
            ema.module.load_state_dict(saved["module"])
            ema.updates = int(saved["updates"])
        self.snapshots.clear()
        self.snapshots.extend((int(s["step"]), dict(s["state"])) for s in state["snapshots"])


AveragesFactory = Callable[[AveragingConfig, nn.Module], RunAverages]
"""What the runner calls to build a run's averages: ``(cfg.averaging, model) -> RunAverages`` (the class itself,
or a subclass, or a function returning one)."""
