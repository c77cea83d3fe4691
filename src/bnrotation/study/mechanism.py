"""The optimizer-state log: what decides between the mechanisms that keep Adam rotating (issue 64).

With ``scale.mechanism_every`` = k > 0, the runner logs every k steps, for each weight layer that feeds a
normalisation layer (the monitor's pairing), one line of the ``mechanism`` table:

* ``angular_update_deg``: the angle between each output channel's weight before and after that one optimizer step,
  its median over the layer's output channels (degrees per step; the channel's flattened weight, as the monitor's
  rotation);
* ``update_rms`` and ``grad_rms``: the root mean square of the step's weight update and of the gradient it came from;
* ``normalised_step_median`` and ``normalised_step_p99``: Adam's normalised step |m̂| / (√v̂ + ε) after the step, with
  m̂ = m / (1 − β1^t) and v̂ = v / (1 − β2^t) (Kingma & Ba 2015, arXiv 1412.6980; torch.optim.Adam's ``exp_avg``,
  ``exp_avg_sq``), its median and 99th percentile over the layer's weights: the size of the step in units of the
  learning rate;
* ``sqrt_v_median`` and ``eps_share_median``: the median of √v̂ (the gradient's units) and of ε / (√v̂ + ε), the share
  of the step's denominator that is ε (towards 1 as √v̂ falls towards ε).

The four optimizer-state columns are NaN for an optimizer without Adam's state (SGD); its ``update_rms`` is the
equivalent. It also keeps the training loss of every step (the ``losses`` table), for the loss's spikes; and with it
on, every accuracy check adds the held-out set's median output margin in evaluation mode (``margin_eval_median``:
the true class's logit minus the largest other, running statistics) to the ``checks`` table.

Nothing here changes the model or the optimizer; the weights before the step are the only copy it keeps. Runs of
several seeds batched into one model (``batch_seeds``) are refused with it on (:func:`.config.check_row`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from ..evaluation import evaluation_forward

__all__ = ["mechanism_steps", "weight_layers", "snapshot", "mechanism_lines", "margin_median"]


def mechanism_steps(steps: int, every: int) -> set[int]:
    """The steps logged: every ``every`` from ``every`` to ``steps`` (none when ``every`` is 0)."""
    return set(range(every, steps + 1, every)) if every else set()


def weight_layers(model: nn.Module, weight_names: list[str]) -> dict[str, nn.Parameter]:
    """``{layer name: its weight parameter}`` for the named weight layers (the pairing's, in forward order)."""
    modules = dict(model.named_modules())
    return {name: modules[name].weight for name in weight_names}


@torch.no_grad()
def snapshot(layers: dict[str, nn.Parameter]) -> dict[str, torch.Tensor]:
    """A copy of each layer's weight, ``(C_out, ...)``, taken before the optimizer step."""
    return {name: w.detach().clone() for name, w in layers.items()}


def _angles_deg(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """The angle between each output channel's flattened weight before and after, (C_out,) degrees."""
    a, b = before.flatten(1).double(), after.flatten(1).double()  # (C_out, fan_in)
    cos = (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))
    return torch.rad2deg(torch.arccos(cos.clamp(-1.0, 1.0)))


def _median(x: torch.Tensor) -> float:
    """The median of ``x``'s values, the mean of the two middle ones for an even count (``torch.median`` gives the
    lower one)."""
    return float(torch.quantile(x.flatten().double(), 0.5))


def _adam_columns(optimizer: torch.optim.Optimizer, w: nn.Parameter) -> dict[str, float]:
    """The normalised step and the second moment's columns for weight ``w`` (NaN without Adam's state)."""
    state = optimizer.state.get(w, {})
    group = next((g for g in optimizer.param_groups if any(p is w for p in g["params"])), None)
    if "exp_avg_sq" not in state or group is None or "betas" not in group:
        return dict.fromkeys(("normalised_step_median", "normalised_step_p99", "sqrt_v_median",
                              "eps_share_median"), math.nan)
    (beta1, beta2), eps, t = group["betas"], group["eps"], float(state["step"])
    m_hat = state["exp_avg"].double().flatten() / (1 - beta1 ** t)
    sqrt_v = (state["exp_avg_sq"].double().flatten() / (1 - beta2 ** t)).sqrt()
    ns = m_hat.abs() / (sqrt_v + eps)
    q = torch.quantile(ns, torch.tensor([0.5, 0.99], dtype=ns.dtype, device=ns.device))
    return {"normalised_step_median": float(q[0]), "normalised_step_p99": float(q[1]),
            "sqrt_v_median": _median(sqrt_v), "eps_share_median": _median(eps / (sqrt_v + eps))}


@torch.no_grad()
def mechanism_lines(step: int, layers: dict[str, nn.Parameter], before: dict[str, torch.Tensor],
                    optimizer: torch.optim.Optimizer) -> pd.DataFrame:
    """The ``mechanism`` table's lines at ``step``, one per layer (the module docstring defines each column), from
    the weights ``before`` the step (:func:`snapshot`), the weights and gradients now, and the optimizer's state."""
    lines = []
    for name, w in layers.items():
        delta = (w.detach().double() - before[name].double())
        grad = w.grad.detach().double() if w.grad is not None else torch.full_like(delta, math.nan)
        lines.append({"step": step, "layer": name,
                      "angular_update_deg": _median(_angles_deg(before[name], w.detach())),
                      "update_rms": float(delta.pow(2).mean().sqrt()), "grad_rms": float(grad.pow(2).mean().sqrt()),
                      **_adam_columns(optimizer, w)})
    return pd.DataFrame(lines)


@torch.no_grad()
def margin_median(model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int) -> float:
    """The median over ``(x (N, ...), y (N,))`` of the true class's logit minus the largest other class's, in
    evaluation mode (running statistics; the model's flags restored). Negative where the sample is misclassified."""
    logits = evaluation_forward(model, x, chunk).double()  # (N, K)
    true = logits.gather(1, y[:, None]).squeeze(1)  # (N,)
    other = logits.scatter(1, y[:, None], -np.inf).amax(1)  # (N,)
    return float((true - other).median())
