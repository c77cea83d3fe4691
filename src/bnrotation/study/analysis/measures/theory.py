"""What the rotational-equilibrium literature predicts for the rotation, beside what is measured (no torch).

With weight decay, a scale-invariant weight vector (a conv channel behind
BatchNorm) reaches an equilibrium norm at which the shrinking by decay balances
the growth by the (mostly tangential) updates; from then on each step turns the
channel by an expected angle that depends only on the hyper-parameters:

- SGD with momentum α and L2 weight decay λ (``torch.optim.SGD``'s
  ``weight_decay``, added to the gradient before the momentum buffer), learning
  rate η: ``sqrt(2 η λ / (1 + α))`` radians per step. Wan, Zhu, Zhang and Sun,
  "Spherical Motion Dynamics", NeurIPS 2021, arXiv:2006.08419 (the angular
  update Δ_t between w_t and w_{t+1} in equilibrium).
- AdamW (decoupled decay, ``w <- w - η λ w`` each step, β1 the first-moment
  coefficient): ``sqrt(2 η λ (1 - β1) / (1 + β1))`` radians per step. Kosson,
  Messmer and Jaggi, "Rotational Equilibrium: How Weight Decay Balances Learning
  Across Neural Networks", ICML 2024, arXiv:2305.17212 (expected angular update,
  Table 1). Their random-walk model: the equilibrium norm is set by the full
  contribution of each gradient, sqrt(η C / (2 λ)) for C coordinates, while one
  momentum-averaged step has the smaller RMS sqrt(C (1 - β1) / (1 + β1)).

Both assume a constant learning rate held long enough to reach equilibrium
(the norm relaxes on a time scale of about 1 / (2 η λ) steps) and gradients that
behave like noise from step to step. Without weight decay there is no
equilibrium: the norm grows without bound and the angular update keeps falling,
so no prediction applies (the study's SGD and Adam rows); Adam with coupled L2
decay has an equilibrium that depends on the gradient's size, which the runs do
not log, so no prediction is made for it either.

Converting to the table's unit, degrees per 100 steps. The literature gives an
angle per step, in radians (× 180/π for degrees). The table measures the *net*
angle between w(t - 100) and w(t), which is not 100 × the per-step angle:

- ``path_deg_per_100`` = 100 δ · 180/π sums the per-step angles; by the
  triangle inequality on the sphere it bounds the net angle from above (equal
  only if every step turned the same way).
- ``net_deg_per_100`` is the net angle the same random-walk model predicts. An
  update that averages white-noise gradients with momentum β (Adam's EMA or SGD's
  heavy ball) has autocorrelation β^|j|, so over n steps the summed update has
  RMS ``k(n, β) = sqrt((1 + β)/(1 - β) · (n - 2β(1 - β^n)/(1 - β²)))`` times
  that of one step; k(100, 0.9) ≈ 41.5 (not 100, not sqrt(100) = 10).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RAD_TO_DEG = 180.0 / math.pi
KOSSON_2024 = "Kosson et al. 2024, arXiv:2305.17212"
WAN_2021 = "Wan et al. 2021, arXiv:2006.08419"


def sgdm_angular_update(lr: float, weight_decay: float, momentum: float) -> float:
    """Equilibrium angular update of SGD with heavy-ball momentum and L2 decay, radians per step.

    ``sqrt(2 η λ / (1 + α))`` (Wan et al. 2021, arXiv:2006.08419).

    Raises:
        ValueError: for a learning rate or decay <= 0 (no equilibrium) or a momentum outside [0, 1).
    """
    _check(lr, weight_decay, momentum, "momentum")
    return math.sqrt(2.0 * lr * weight_decay / (1.0 + momentum))


def adamw_angular_update(lr: float, weight_decay: float, beta1: float) -> float:
    """Equilibrium expected angular update of AdamW (decoupled decay), radians per step.

    ``sqrt(2 η λ (1 - β1) / (1 + β1))`` (Kosson et al. 2024, arXiv:2305.17212, Table 1).

    Raises:
        ValueError: for a learning rate or decay <= 0 (no equilibrium) or a β1 outside [0, 1).
    """
    _check(lr, weight_decay, beta1, "beta1")
    return math.sqrt(2.0 * lr * weight_decay * (1.0 - beta1) / (1.0 + beta1))


def _check(lr: float, weight_decay: float, beta: float, name: str) -> None:
    if not (lr > 0 and weight_decay > 0):
        raise ValueError(f"no rotational equilibrium without a learning rate and weight decay > 0 "
                         f"(got lr={lr}, weight_decay={weight_decay})")
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {beta}")


def random_walk_factor(n: int, beta: float) -> float:
    """RMS of the sum of ``n`` consecutive momentum-averaged white-noise updates, in units of one update.

    ``sqrt((1 + β)/(1 - β) · (n - 2β(1 - β^n)/(1 - β²)))``; 1 for n = 1, sqrt(n) for β = 0, and
    about sqrt(n (1 + β)/(1 - β)) for n >> 1/(1 - β).

    Raises:
        ValueError: for n < 1 or β outside [0, 1).
    """
    if n < 1 or not 0.0 <= beta < 1.0:
        raise ValueError(f"need n >= 1 and beta in [0, 1), got n={n}, beta={beta}")
    return math.sqrt((1 + beta) / (1 - beta) * (n - 2 * beta * (1 - beta ** n) / (1 - beta ** 2)))


@dataclass(frozen=True)
class Prediction:
    """The equilibrium rotation predicted for one configuration, or why none applies.

    Angles: ``per_step_rad`` radians per step; ``net_deg_per_100`` and
    ``path_deg_per_100`` degrees per 100 steps (see the module docstring);
    ``equilibrium_steps`` = 1 / (2 η λ), the relaxation time of the norm, in steps.
    """

    applies: bool
    reason: str
    source: str = ""
    formula: str = ""
    per_step_rad: float = math.nan
    beta: float = math.nan
    equilibrium_steps: float = math.nan
    equilibrium_norm: float = math.nan  # per channel; AdamW only, when the fan-in is given

    @property
    def path_deg_per_100(self) -> float:
        return 100.0 * self.per_step_rad * RAD_TO_DEG

    def net_deg(self, steps: int = 100) -> float:
        """Net rotation over ``steps`` steps, degrees, in the random-walk model."""
        if not self.applies:
            return math.nan
        return random_walk_factor(steps, self.beta) * self.per_step_rad * RAD_TO_DEG

    @property
    def net_deg_per_100(self) -> float:
        return self.net_deg(100)


def adamw_equilibrium_norm(lr: float, weight_decay: float, fan_in: int) -> float:
    """Equilibrium norm of one channel's weight vector (``fan_in`` coordinates) under AdamW:
    ``sqrt(η C / (2 λ))`` (Kosson et al. 2024, arXiv:2305.17212, Table 1).

    Raises:
        ValueError: for a learning rate or decay <= 0, or fan_in < 1.
    """
    _check(lr, weight_decay, 0.0, "beta1")
    if fan_in < 1:
        raise ValueError(f"fan_in must be >= 1, got {fan_in}")
    return math.sqrt(lr * fan_in / (2.0 * weight_decay))


def predict(optimizer: dict, lr: float | None = None, fan_in: int | None = None) -> Prediction:
    """The equilibrium prediction for a run's resolved ``optimizer`` config.

    Args:
        optimizer: the ``optimizer`` section of a run's ``config.yaml`` (name, lr, weight_decay,
            momentum, beta1).
        lr: the learning rate to predict at (default the config's); pass a schedule's current value
            to follow it, valid only while it changes slowly against ``equilibrium_steps``.
        fan_in: coordinates per output channel (C_in x kH x kW), for AdamW's equilibrium norm.

    Returns:
        A :class:`Prediction`; ``applies`` is False, with the reason, where no formula applies.

    Raises:
        KeyError: naming the missing key of ``optimizer``.
    """
    name = optimizer["name"]
    lr = float(optimizer["lr"] if lr is None else lr)
    wd = float(optimizer["weight_decay"])
    if wd <= 0:
        return Prediction(False, "no weight decay: no equilibrium norm, so no predicted angular update")
    if lr <= 0:
        return Prediction(False, "learning rate 0: the weights do not move")
    if name == "sgd":
        beta = float(optimizer["momentum"])
        return Prediction(True, "SGD with momentum and L2 decay", WAN_2021, "sqrt(2 lr wd / (1 + momentum))",
                          sgdm_angular_update(lr, wd, beta), beta, 1.0 / (2 * lr * wd))
    if name == "adamw":
        beta = float(optimizer["beta1"])
        norm = adamw_equilibrium_norm(lr, wd, fan_in) if fan_in else math.nan
        return Prediction(True, "AdamW (decoupled decay)", KOSSON_2024, "sqrt(2 lr wd (1 - beta1) / (1 + beta1))",
                          adamw_angular_update(lr, wd, beta), beta, 1.0 / (2 * lr * wd), norm)
    return Prediction(False, f"{name} with weight decay: its equilibrium depends on the gradient's size "
                             "(not logged), no closed form used here")
