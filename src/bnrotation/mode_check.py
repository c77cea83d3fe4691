"""The mode check: the same probe samples in training mode (batch statistics) and in evaluation mode (running
statistics), compared.

One ``checks`` line per call of :class:`bnrotation.monitor.StalenessMonitor`. Every fraction is a count over the
probe's samples divided once, so a gap of one sample in twenty is 1/20, the 5% threshold itself (a difference of two
rounded accuracies, 19/20 - 18/20, reads 0.0499…).
"""

from __future__ import annotations

import math

import pandas as pd
import torch

__all__ = ["mode_check"]


def mode_check(step: int, out_train: torch.Tensor, out_eval: torch.Tensor | None,
               y: torch.Tensor | None) -> pd.DataFrame:
    """One ``checks`` line (see :class:`bnrotation.monitor.MonitorRecord`) from the outputs (N, classes) of the
    same N inputs in training mode (batch statistics) and in evaluation mode, and their labels (N,) if any.

    The mode gap is training- minus evaluation-mode accuracy with labels, else the share of samples whose
    predicted class (argmax over dim 1) differs between the modes; all fractions, each a count over the N
    predictions (N times the positions of outputs (N, classes, ...)), divided once. Without
    ``out_eval`` every measure is NaN.
    """
    nan = math.nan
    acc_train = acc_eval = agreement = gap = nan
    if out_eval is not None:
        pred_train, pred_eval = out_train.argmax(1), out_eval.argmax(1)
        n = pred_train.numel()  # N, or every position of outputs (N, classes, ...)
        alike = int((pred_train == pred_eval).sum())
        agreement = alike / n
        gap = (n - alike) / n
        if y is not None:
            right_train, right_eval = int((pred_train == y).sum()), int((pred_eval == y).sum())
            acc_train, acc_eval = right_train / n, right_eval / n
            gap = (right_train - right_eval) / n
    return pd.DataFrame({"step": [step], "acc_train_mode": [acc_train], "acc_eval_mode": [acc_eval],
                         "mode_agreement": [agreement], "mode_gap": [gap], "probe_size": [len(out_train)]})
