"""How far a normalisation layer's running statistics are from the fresh ones, and when that is stale (no torch).

One place for the arithmetic that the monitor applies to torch tensors (:mod:`bnrotation.monitor`) and the
analysis to numpy arrays and pandas columns (:mod:`bnrotation.study.analysis.tables.calibration`); neither has a second
copy. Every function here takes per-channel arrays (C,) of one layer, as torch tensors (any device) or numpy
arrays, and returns the same kind: it uses only arithmetic operators and the inputs' own ``log``.

**The units.** Every σ is the one the BatchNorm layer itself divides by, ``sqrt(var + eps)`` with the layer's
``eps`` (:func:`sigma`). A channel with almost no spread then gives a finite, small number, not 10⁶ σ.

**The variance-aware signal** (:func:`channel_signals`). Per channel, with the fresh statistics μ_f, v_f (the
mean and variance of the layer's input under the current weights, on a probe batch) and the running ones μ_r,
v_r, and σ_f = sqrt(v_f + eps), σ_r = sqrt(v_r + eps)::

    d = (μ_f − μ_r) / σ_r        the mean shift, in running σ
    s = σ_f / σ_r                the scale ratio (``log_std_ratio`` = log s)
    E = sqrt(d² + ρ (s − 1)²),   ρ = v_f / (v_f + eps) ∈ [0, 1]

*Derivation.* A BatchNorm layer in training mode normalises an input x by the batch statistics,
t = (x − μ_f) / σ_f; in evaluation mode by the running ones, e = (x − μ_r) / σ_r (the affine γ, β that follow
are the same in both modes). Then e − t = (x − μ_f)(1/σ_r − 1/σ_f) + (μ_f − μ_r)/σ_r. For x of *any*
distribution with mean μ_f and variance v_f, the cross term has mean zero, so the mean square is
v_f (1/σ_r − 1/σ_f)² + d² = ρ (s − 1)² + d², since v_f (1/σ_r − 1/σ_f)² = (v_f / σ_f²)(σ_f/σ_r − 1)². Only
the first two moments enter: E is the exact root-mean-square error of the evaluation-mode normalised
activation against the training-mode one, in units of the normalised activation (= σ_r of the input), before
γ scales it. Where eps ≪ v_f (ρ = 1) it is sqrt(d² + (s − 1)²), the 2-Wasserstein distance between the
Gaussians N(μ_f, σ_f²) and N(μ_r, σ_r²) divided by σ_r (Dowson and Landau, "The Fréchet distance between
multivariate normal distributions", J. Multivariate Anal. 12(3), 1982); in general E is at most that distance.
A near-constant channel (v_f ≪ eps, ρ → 0) has a training-mode output of almost 0 whatever its scale, and E
tends to |d|, the offset evaluation mode adds: the scale of nothing costs nothing. The monitor's fresh
variance is the unbiased one over the n = N·H·W values of a probe batch, BatchNorm's batch variance the biased
one: their ratio (n − 1)/n moves s by about 1/(2n) (10⁻⁶ for the study's probe of 512 images of 32 × 32).

**The mean lag** (:func:`mean_lag_sigma`, the monitor's ``lag_sigma`` column since its first version):
(μ_r − μ_f) / σ_f, in fresh σ (now with the layer's eps): the opposite sign of d and another unit,
lag = −d / s. It reads the mean alone: in the frozen-backbone rows with BatchNorm in training mode the running
σ moved and the running mean barely did (``results/reference/frozen/frozen.md``), which E sees and the lag
cannot.

**The rule** (:class:`Thresholds`): when the monitor calls statistics stale. Its defaults were fixed on the
suite's synthetic reference runs only, by the method of
:mod:`bnrotation.study.analysis.tables.calibration` (``make calibrate``, ``results/reference/calibration.md``), before
any out-of-sample run was looked at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

__all__ = ["Thresholds", "ChannelSignals", "channel_signals", "sigma", "mean_lag_sigma", "warmup_steps",
           "in_warmup"]


def _log(x):
    """Natural log of a torch tensor (its own ``log``, on its device) or of a numpy array/scalar."""
    return x.log() if hasattr(x, "log") else np.log(x)


def sigma(var, eps: float):
    """The σ a normalisation layer divides by: ``sqrt(var + eps)``, per channel (C,), in the input's units.

    Args:
        var: (C,) variances (>= 0); eps: the layer's ``eps`` (``nn.BatchNorm2d(eps=...)``, 1e-5 by default).
    """
    return (var + eps) ** 0.5


def mean_lag_sigma(running_mean, fresh_mean, fresh_var, eps: float):
    """The running-mean lag per channel, ``(running_mean - fresh_mean) / sigma(fresh_var, eps)``, in fresh σ
    (the monitor's ``lag_sigma``). Shapes (C,)."""
    return (running_mean - fresh_mean) / sigma(fresh_var, eps)


class ChannelSignals(NamedTuple):
    """Per channel (C,) of one layer (see the module docstring): ``lag_sigma`` (μ_r − μ_f)/σ_f,
    ``mean_shift_sigma`` d = (μ_f − μ_r)/σ_r, ``log_std_ratio`` log(σ_f/σ_r), and ``eval_error_sigma`` E, the
    RMS error of the evaluation-mode normalised activation against the training-mode one, in σ_r."""

    lag_sigma: object
    mean_shift_sigma: object
    log_std_ratio: object
    eval_error_sigma: object


def channel_signals(running_mean, running_var, fresh_mean, fresh_var, eps: float) -> ChannelSignals:
    """The lag, d, log s and E of every channel of one layer (the module docstring derives E).

    Args:
        running_mean, running_var: (C,) the layer's running statistics (float64 where precision matters).
        fresh_mean, fresh_var: (C,) the mean and variance of the layer's input under the current weights.
        eps: the layer's ``eps`` (a number, or an array of the channels' when they come from several layers):
            every σ is ``sqrt(var + eps)``.

    Returns:
        A :class:`ChannelSignals` of (C,) arrays of the inputs' kind. NaN wherever an input is NaN (a layer
        without running statistics); finite for any finite inputs with ``eps > 0``.
    """
    s_run, s_fresh = sigma(running_var, eps), sigma(fresh_var, eps)
    d = (fresh_mean - running_mean) / s_run
    s = s_fresh / s_run
    var_f = fresh_var + eps
    rho = fresh_var / (var_f + (var_f == 0))  # v_f / σ_f²; 0 for a channel without spread and eps = 0
    e = (d * d + rho * (s - 1) ** 2) ** 0.5
    return ChannelSignals(mean_lag_sigma(running_mean, fresh_mean, fresh_var, eps), d, _log(s), e)


def warmup_steps(momenta, remaining: float = 0.01) -> int:
    """Steps until running statistics kept with these momenta hold less than ``remaining`` of their initial
    values: ``ceil(ln(remaining) / ln(1 - m))`` for the smallest momentum m (an exponential average keeps
    ``(1 - m)**t`` of its start after t updates); 1 for ``None`` (PyTorch's cumulative average, which replaces
    them at the first batch) or m outside (0, 1); 0 for no momenta. 44 at PyTorch's default m = 0.1.

    Args:
        momenta: the BatchNorm layers' ``momentum`` values (floats or None), e.g. read back from a run's
            ``run.json``.
    """
    steps = [1 if m is None or not 0 < m < 1 else math.ceil(math.log(remaining) / math.log1p(-m)) for m in momenta]
    return max(steps, default=0)


def in_warmup(step, warmup: int):
    """Whether ``step`` (optimizer steps, a number or an array / pandas column of them) is inside the warm-up of
    ``warmup`` steps (:func:`warmup_steps`), where the rule's verdict is held back: ``step < warmup``, so the step
    equal to ``warmup`` is the first judged. One place for the boundary: the monitor's ``warming_up`` and the
    calibration's (:mod:`bnrotation.study.analysis.tables.calibration`) both call it. A bool, or a bool array of
    ``step``'s shape."""
    return step < warmup


@dataclass(frozen=True)
class Thresholds:
    """When :class:`bnrotation.monitor.StalenessMonitor` warns: the mode gap at or above :attr:`mode_gap`, and
    a layer's statistics off: the worst layer's median E at or above :attr:`eval_error_sigma`, or its median
    |mean lag| at or above :attr:`lag_sigma`.

    Attributes:
        mode_gap: training-mode minus evaluation-mode accuracy on the probe batch (with labels), or the
            share of probe samples whose predicted class differs between the two modes (without), as a
            fraction. Default 0.05. The share of changed predictions is at least the accuracy gap, and much
            larger where both modes are often wrong (an untrained model): without labels the rule is
            stricter, and on the same model can warn where it would not with labels.
        eval_error_sigma: the largest, over layers, median over channels of E (the RMS error of the
            evaluation-mode normalised activation against the training-mode one, in running σ: the module
            docstring), which sees a moved running variance as well as a moved mean.
        lag_sigma: the largest, over layers, median |running-mean lag| in fresh σ: the rule's signal before E,
            kept for the callers that measure the lag alone (:func:`bnrotation.check.check_checkpoint`, the
            gated re-estimation's choice of layers). ``math.inf`` leaves it out of the rule.

    The defaults of ``mode_gap`` and ``eval_error_sigma`` were fixed on the suite's synthetic reference runs
    only, before any out-of-sample run; ``lag_sigma`` keeps its earlier default (0.1σ), whose counts against the
    earlier truth are in ``results/reference/monitor.md``. What the rule is worth as it ships (its gap on the
    monitor's probe batch) is measured on runs of other tasks and networks: the first staleness zoo, looked at
    since, and a second one none of this was chosen on. The recall, false alarms and lead time on each, where they
    were measured, and what the rule does not do (it detects staleness that already costs accuracy; it does not
    forecast it) are in ``docs/monitor.md`` ("What the rule is worth", generated by ``make calibrate``) and
    ``results/reference/calibration.md`` (:mod:`bnrotation.study.analysis.tables.calibration`).

    Raises:
        ValueError: for a threshold that is NaN or below 0 (``lag_sigma`` or ``eval_error_sigma`` may be
            ``math.inf``, not both: the rule could never fire), or a ``mode_gap`` that is not a finite fraction in
            [0, 1].
    """

    mode_gap: float = 0.05
    lag_sigma: float = 0.1
    eval_error_sigma: float = 0.069

    def __post_init__(self) -> None:
        for key in ("mode_gap", "lag_sigma", "eval_error_sigma"):
            value = getattr(self, key)
            finite = isinstance(value, (int, float)) and (math.isfinite(value) or (key != "mode_gap"
                                                                                   and value == math.inf))
            if isinstance(value, bool) or not finite or value < 0:
                allowed = "a finite number >= 0" if key == "mode_gap" else "a number >= 0 or math.inf"
                raise ValueError(f"Thresholds.{key}: expected {allowed}, got {value!r}")
        if self.lag_sigma == math.inf and self.eval_error_sigma == math.inf:  # the gap alone never fires the rule
            raise ValueError("Thresholds.eval_error_sigma: infinite, and lag_sigma too: both infinite (math.inf, inf on "
                             "the command line) leave the rule nothing to fire on (it needs the gap and one of them): "
                             "keep one finite (0 fires on the gap alone)")
        if self.mode_gap > 1:  # a gap is a difference of two fractions: the rule could never fire
            raise ValueError(f"Thresholds.mode_gap: expected a fraction in [0, 1] (a gap cannot exceed 1), got "
                             f"{self.mode_gap!r}")

    def crossed(self, mode_gap: float, lag_sigma: float = math.nan, eval_error_sigma: float = math.nan) -> bool:
        """The rule: ``mode_gap`` (fraction) at least :attr:`mode_gap`, and ``eval_error_sigma`` (the worst
        layer's median E, σ) at least :attr:`eval_error_sigma` or ``lag_sigma`` (the worst layer's median
        |lag|, σ) at least :attr:`lag_sigma`. NaN never crosses: a caller that measures only the lag gets the
        rule on the lag alone."""
        return bool(self.warns(mode_gap, lag_sigma, eval_error_sigma))

    def warns(self, mode_gap, lag_sigma, eval_error_sigma):
        """:meth:`crossed` elementwise, on numbers or arrays of one shape (the analysis scores it on every check
        at once): a bool or a bool array."""
        with np.errstate(invalid="ignore"):
            return np.greater_equal(mode_gap, self.mode_gap) & self.off(lag_sigma, eval_error_sigma)

    def off(self, lag_sigma, eval_error_sigma):
        """The rule's second half, elementwise: the statistics do not fit the weights, the worst layer's median E
        (σ) at least :attr:`eval_error_sigma` or its median |lag| (σ) at least :attr:`lag_sigma`. Where it is
        False the statistics fit (both under their thresholds, or NaN). A bool or a bool array."""
        with np.errstate(invalid="ignore"):
            return np.greater_equal(eval_error_sigma, self.eval_error_sigma) | np.greater_equal(lag_sigma,
                                                                                               self.lag_sigma)

    def short_of(self, mode_gap: float, lag_sigma: float = math.nan, eval_error_sigma: float = math.nan) -> str:
        """Why a verdict of "not stale" stands though one of its signals is at or over its threshold, in words: which
        signals are over (the mode gap, the worst median E or |lag|, as :meth:`crossed` reads them) and which half of
        the rule is missing, so that "not stale" never reads as "every signal under its threshold". "" when no
        signal is at or over its threshold, or when the rule fires."""
        if self.crossed(mode_gap, lag_sigma, eval_error_sigma):
            return ""
        over = [name for name, value, threshold in (("the worst median E", eval_error_sigma, self.eval_error_sigma),
                                                   ("the worst median |lag|", lag_sigma, self.lag_sigma))
                if value >= threshold]
        if over:
            plural = len(over) > 1
            named = " and ".join(over).replace("E and the worst median ", "E and ")
            return (f"{named} {'are' if plural else 'is'} over {'their' if plural else 'its'} threshold{'s' * plural}, "
                    "but the mode gap is under its own: the statistics are off without changing enough predictions on "
                    "these batches, and the rule warns only when the gap shows it too")
        if mode_gap >= self.mode_gap:
            read = [name for name, threshold in (("the worst median E", self.eval_error_sigma),
                                                 ("the worst median |lag|", self.lag_sigma))
                    if math.isfinite(threshold)]
            neither = (f"{read[0]} is not" if len(read) == 1 else
                       f"neither {read[0]} nor {read[1].removeprefix('the worst median ')} is")
            return (f"the mode gap is over its threshold, but {neither} over its own: no layer's running statistics "
                    "are off enough to account for the gap, so the rule does not lay it to them")
        return ""
