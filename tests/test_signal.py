"""The variance-aware staleness signal (bnrotation.staleness): d, log s and E against closed forms, a real
BatchNorm layer, a Monte Carlo estimate on non-Gaussian inputs, near-constant channels and invariances; the
monitor's records of it, and its rule firing on a moved variance that the mean lag cannot see."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
import torch.nn as nn

from bnrotation.monitor import StalenessMonitor, Thresholds
from bnrotation.probes import lag_sigma
from bnrotation.staleness import channel_signals, mean_lag_sigma, sigma, warmup_steps


def _w2(sig):
    """sqrt(d² + (s - 1)²): the 2-Wasserstein distance of the two Gaussians in running σ."""
    return np.sqrt(sig.mean_shift_sigma ** 2 + (np.exp(sig.log_std_ratio) - 1) ** 2)


# ----------------------------------------------------------------------------- closed forms
def test_closed_form_without_eps():
    # running N(1, 2²), fresh N(2, 3²): d = (2 - 1) / 2, s = 3 / 2, E = sqrt(0.25 + 0.25), lag = (1 - 2) / 3
    sig = channel_signals(np.array([1.0]), np.array([4.0]), np.array([2.0]), np.array([9.0]), eps=0.0)
    assert sig.mean_shift_sigma[0] == pytest.approx(0.5, rel=1e-15)
    assert sig.log_std_ratio[0] == pytest.approx(math.log(1.5), rel=1e-15)
    assert sig.eval_error_sigma[0] == pytest.approx(math.sqrt(0.5), rel=1e-15)
    assert sig.lag_sigma[0] == pytest.approx(-1 / 3, rel=1e-15)


def test_closed_form_with_eps_weights_the_scale_part_by_the_fresh_variance_share():
    eps = 0.5
    rm, rv, fm, fv = 1.0, 4.0, 2.0, 9.0
    sr, sf = math.sqrt(rv + eps), math.sqrt(fv + eps)
    want = math.sqrt(((fm - rm) / sr) ** 2 + fv / (fv + eps) * (sf / sr - 1) ** 2)
    sig = channel_signals(np.array([rm]), np.array([rv]), np.array([fm]), np.array([fv]), eps)
    assert sig.eval_error_sigma[0] == pytest.approx(want, rel=1e-14)
    assert sig.lag_sigma[0] == pytest.approx((rm - fm) / sf, rel=1e-14)
    # E lies between |d| and the 2-Wasserstein distance, which it equals only without eps
    assert abs(sig.mean_shift_sigma[0]) < sig.eval_error_sigma[0] < _w2(sig)[0]


def test_torch_and_numpy_inputs_give_the_same_numbers():
    g = np.random.default_rng(0)
    rm, fm = g.normal(size=16), g.normal(size=16)
    rv, fv = g.gamma(2.0, size=16), g.gamma(2.0, size=16)
    a = channel_signals(rm, rv, fm, fv, 1e-5)
    b = channel_signals(*(torch.from_numpy(v) for v in (rm, rv, fm, fv)), 1e-5)
    for x, y in zip(a, b):
        assert isinstance(y, torch.Tensor)
        np.testing.assert_array_equal(x, y.numpy())
    np.testing.assert_array_equal(lag_sigma(torch.from_numpy(rm), torch.from_numpy(fm), torch.from_numpy(fv),
                                            1e-5).numpy(), mean_lag_sigma(rm, fm, fv, 1e-5))


# ----------------------------------------------------------------------------- the RMS error it claims to be
def _rms_train_against_eval(x: torch.Tensor, bn: nn.BatchNorm2d) -> float:
    """RMS over every value of (N, C, H, W) float64 inputs of the training-mode minus evaluation-mode normalised
    activation (affine off), computed by the layer itself."""
    bn.train()
    saved = (bn.running_mean.clone(), bn.running_var.clone())
    t = bn(x)
    bn.running_mean.copy_(saved[0])  # the training-mode call updated them
    bn.running_var.copy_(saved[1])
    bn.eval()
    e = bn(x)
    return float((e - t).square().mean().sqrt())


def test_E_is_the_rms_error_of_a_real_batchnorm_layer_on_student_t_inputs():
    # The identity is exact for the batch's own (biased) moments, whatever the distribution: float64 rounding is
    # the only error, ~1e-16 relative per operation over 3 * 10^4 values, so 1e-10 relative leaves a wide margin.
    torch.manual_seed(0)
    for eps in (1e-5, 0.3):  # torch refuses eps = 0 in training mode
        bn = nn.BatchNorm2d(1, eps=eps, affine=False).double()
        x = 2.0 + 1.5 * torch.distributions.StudentT(5.0).sample((30_000, 1, 1, 1)).double()
        bn.running_mean.fill_(1.4)
        bn.running_var.fill_(5.0)
        mean, var = x.mean(), x.var(unbiased=False)
        sig = channel_signals(bn.running_mean.clone(), bn.running_var.clone(), mean.view(1), var.view(1), eps)
        assert float(sig.eval_error_sigma[0]) == pytest.approx(_rms_train_against_eval(x, bn), rel=1e-10), eps


@pytest.mark.parametrize("dist", ["student_t5", "exponential"])
def test_E_against_monte_carlo_on_non_gaussian_inputs(dist):
    """E² = E[(e - t)²] for x of known population moments; the tolerance is 4 Monte Carlo standard errors of the
    mean of q = (α u + δ)², with u = x - μ_f, α = 1/σ_r - 1/σ_f, δ = d, derived from the population's central
    moments v, μ3, μ4: Var q = α⁴ (μ4 - v²) + 4 α³ δ μ3 + 4 α² δ² v (a failure by chance: ~6e-5)."""
    n, eps = 200_000, 1e-2
    rng = np.random.default_rng(1)
    if dist == "student_t5":  # t with 5 degrees of freedom: variance 5/3, μ3 = 0, kurtosis 3 + 6/(5 - 4) = 9
        v, mu3, mu4 = 5 / 3, 0.0, 9 * (5 / 3) ** 2
        u = rng.standard_t(5, size=n)
    else:  # Exp(1), centred: variance 1, μ3 = 2, μ4 = 9
        v, mu3, mu4 = 1.0, 2.0, 9.0
        u = rng.exponential(size=n) - 1.0
    mu_f, mu_r, var_r = 0.7, 0.2, 2.5
    s_f, s_r = math.sqrt(v + eps), math.sqrt(var_r + eps)
    x = mu_f + u
    q = ((x - mu_r) / s_r - (x - mu_f) / s_f) ** 2  # evaluation- minus training-mode, squared
    alpha, delta = 1 / s_r - 1 / s_f, (mu_f - mu_r) / s_r
    se = math.sqrt((alpha ** 4 * (mu4 - v ** 2) + 4 * alpha ** 3 * delta * mu3 + 4 * alpha ** 2 * delta ** 2 * v) / n)
    e = channel_signals(np.array([mu_r]), np.array([var_r]), np.array([mu_f]), np.array([v]), eps).eval_error_sigma[0]
    assert abs(q.mean() - e ** 2) <= 4 * se, (q.mean(), e ** 2, se)


# ----------------------------------------------------------------------------- invariances and failure cases
def test_E_is_zero_when_running_equals_fresh():
    g = np.random.default_rng(2)
    m, v = g.normal(size=8), g.gamma(2.0, size=8)
    for eps in (0.0, 1e-5):
        sig = channel_signals(m, v, m, v, eps)
        assert np.all(sig.eval_error_sigma == 0) and np.all(sig.mean_shift_sigma == 0)
        assert np.all(sig.log_std_ratio == 0) and np.all(sig.lag_sigma == 0)


def test_scaling_and_shifting_the_input_changes_nothing():
    g = np.random.default_rng(3)
    rm, fm = g.normal(size=8), g.normal(size=8)
    rv, fv = g.gamma(2.0, size=8), g.gamma(2.0, size=8)
    base = channel_signals(rm, rv, fm, fv, 1e-3)
    c, b = 7.0, -3.0  # x -> c x + b: means c μ + b, variances c² v, and a layer whose eps scales with them
    moved = channel_signals(c * rm + b, c * c * rv, c * fm + b, c * c * fv, 1e-3 * c * c)
    for x, y in zip(base, moved):
        np.testing.assert_allclose(y, x, rtol=1e-12, atol=1e-13)
    # a negative scale flips the mean shift and the lag, not E or the scale ratio
    flipped = channel_signals(-rm, rv, -fm, fv, 1e-3)
    np.testing.assert_allclose(flipped.mean_shift_sigma, -base.mean_shift_sigma, rtol=1e-14)
    np.testing.assert_array_equal(flipped.eval_error_sigma, base.eval_error_sigma)


def test_nan_statistics_give_nan_not_an_error():
    nan = np.array([math.nan])
    sig = channel_signals(nan, nan, np.array([0.0]), np.array([1.0]), 1e-5)
    assert all(np.isnan(v[0]) for v in sig)


def test_sigma_includes_eps():
    assert sigma(np.array([0.0]), 1e-4)[0] == pytest.approx(1e-2, rel=1e-15)


def test_warmup_steps():
    assert warmup_steps([0.1]) == 44 and warmup_steps([0.1, 0.03]) == math.ceil(math.log(0.01) / math.log(0.97))
    assert warmup_steps([None]) == 1 and warmup_steps([]) == 0


# ----------------------------------------------------------------------------- the monitor's records
def _net(channels: int = 6) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 5))


def _fresh_into_running(net: nn.Sequential, x: torch.Tensor) -> dict:
    """Set the BatchNorm's running statistics to the probe's fresh ones (as the monitor measures them)."""
    record = StalenessMonitor(net, x, warn=False, warmup_steps=0)(0)
    bn = net[1]
    with torch.no_grad():
        bn.running_mean.copy_(torch.from_numpy(record.channels["fresh_mean"].to_numpy()))
        bn.running_var.copy_(torch.from_numpy(record.channels["fresh_var"].to_numpy()))
    return record


def test_the_monitor_records_the_signal_as_the_formula_gives_it_from_its_own_columns():
    net, x = _net(), torch.randn(64, 3, 8, 8)
    for _ in range(3):  # move the running statistics away from the fresh ones
        net.train()(torch.randn(64, 3, 8, 8) * 2 + 1)
    record = StalenessMonitor(net, x, warn=False)(5)
    ch, eps = record.channels, net[1].eps
    want = channel_signals(*(ch[k].to_numpy() for k in ("running_mean", "running_var", "fresh_mean", "fresh_var")),
                           eps)
    np.testing.assert_allclose(ch["eval_error_sigma"], want.eval_error_sigma, rtol=1e-12)
    np.testing.assert_allclose(ch["mean_shift_sigma"], want.mean_shift_sigma, rtol=1e-12)
    np.testing.assert_allclose(ch["log_std_ratio"], want.log_std_ratio, rtol=1e-12)
    np.testing.assert_allclose(ch["lag_sigma"], want.lag_sigma, rtol=1e-12)
    line = record.layers.iloc[0]
    assert line["eval_error_median_sigma"] == pytest.approx(float(np.median(want.eval_error_sigma)), rel=1e-12)
    assert line["eval_error_max_sigma"] == pytest.approx(float(want.eval_error_sigma.max()), rel=1e-12)
    assert line["log_std_ratio_max_abs"] == pytest.approx(float(np.abs(want.log_std_ratio).max()), rel=1e-12)
    assert line["mean_shift_median_abs_sigma"] == pytest.approx(float(np.median(np.abs(want.mean_shift_sigma))),
                                                                 rel=1e-12)
    assert record.worst_median_eval_error_sigma == line["eval_error_median_sigma"]
    assert "E median" in record.summary


def test_a_near_constant_channel_gives_finite_small_numbers():
    """A channel whose input is constant (zero weights, a bias): its fresh variance is 0, the running one tiny,
    and the running mean off by 1e-4. Without eps the lag is ±inf (or 10⁶σ for a variance of 1e-14); with the
    layer's eps every σ is at least sqrt(eps) and every number is finite and about 1e-4 / sqrt(1e-5) = 0.03."""
    net, x = _net(), torch.randn(64, 3, 8, 8)
    conv, bn = net[0], net[1]
    with torch.no_grad():
        conv.weight[2].zero_()
        conv.bias[2] = 0.4
    _fresh_into_running(net, x)
    with torch.no_grad():
        bn.running_mean[2] = 0.4 + 1e-4
        bn.running_var[2] = 1e-12
    record = StalenessMonitor(net, x, warn=False, warmup_steps=0)(1)
    ch = record.channels.set_index("channel")
    assert ch.loc[2, "fresh_var"] < 1e-12
    without_eps = (ch.loc[2, "running_mean"] - ch.loc[2, "fresh_mean"]) / math.sqrt(ch.loc[2, "fresh_var"])
    assert abs(without_eps) > 1e3  # what the lag was before it took eps
    expected = 1e-4 / math.sqrt(bn.eps)
    for key in ("lag_sigma", "mean_shift_sigma", "eval_error_sigma"):
        assert abs(ch.loc[2, key]) == pytest.approx(expected, rel=0.01), key  # rel: float32 running buffers
    assert np.isfinite(record.channels.select_dtypes("number").drop(columns=["rotation_deg", "update_cos",
                                                                             "rotation_deg_per_100",
                                                                             "drift_sigma_per_step",
                                                                             "predicted_lag_sigma"])).all().all()
    assert abs(ch.loc[2, "log_std_ratio"]) < 1e-6  # both σ are sqrt(eps) to within 1e-7 relative


def test_the_rule_fires_on_a_moved_running_variance_that_the_lag_cannot_see():
    net, x = _net(), torch.randn(128, 3, 8, 8)
    _fresh_into_running(net, x)
    rule = Thresholds(mode_gap=0.0, eval_error_sigma=0.25)  # E = 0.5 crosses it, a lag of 0 not the lag's 0.1σ
    quiet = StalenessMonitor(net, x, warn=False, warmup_steps=0, thresholds=rule)(1)
    assert quiet.worst_median_eval_error_sigma < 1e-3 and not quiet.stale  # running == fresh: silent
    with torch.no_grad():
        net[1].running_var.mul_(4.0)  # running σ doubled, mean untouched: s = 1/2, E = 1/2 where ρ = 1
    loud = StalenessMonitor(net, x, warn=False, warmup_steps=0, thresholds=rule)(1)
    assert loud.worst_median_lag_sigma < 1e-3
    assert loud.worst_median_eval_error_sigma == pytest.approx(0.5, rel=1e-3)
    assert loud.stale
    assert not Thresholds(mode_gap=0.0, eval_error_sigma=math.inf).crossed(
        loud.mode_gap, loud.worst_median_lag_sigma, loud.worst_median_eval_error_sigma)  # the lag alone: silent


def test_thresholds_rule_and_validation():
    t = Thresholds(mode_gap=0.05, lag_sigma=0.1, eval_error_sigma=0.2)
    assert t.crossed(0.05, math.nan, 0.2) and t.crossed(0.05, 0.1)  # E, or the lag alone where E is not measured
    assert t.crossed(0.05, 0.0, 0.2) and t.crossed(0.05, 0.1, 0.0)  # either one
    assert not t.crossed(0.05, 0.099, 0.199) and not t.crossed(math.nan, 1.0, 1.0)
    assert not t.crossed(0.049, 1.0, 1.0)
    np.testing.assert_array_equal(t.warns(np.array([0.05, 0.05, 0.0]), np.array([0.0, math.nan, 1.0]),
                                          np.array([0.2, 0.1, 1.0])), [True, False, False])
    assert Thresholds(lag_sigma=math.inf).lag_sigma == math.inf
    assert Thresholds(lag_sigma=math.inf, eval_error_sigma=0.0).eval_error_sigma == 0.0  # the other one: the boundary
    with pytest.raises(ValueError, match="both infinite .* leave the rule nothing to fire on"):
        Thresholds(lag_sigma=math.inf, eval_error_sigma=math.inf)
    for bad in ({"eval_error_sigma": math.nan}, {"eval_error_sigma": -0.1}, {"mode_gap": math.inf},
                {"lag_sigma": True}):
        with pytest.raises(ValueError, match=f"Thresholds.{next(iter(bad))}"):
            Thresholds(**bad)


def test_e_weights_the_variance_part_by_the_fresh_variance_share_also_where_sigma_squared_is_one():
    """E = sqrt(d² + ρ (s - 1)²) with ρ = v_f / (v_f + eps). The guard against 0 / 0 (a channel without spread at
    eps = 0) must touch only σ_f² = 0: at σ_f² = 1 exactly (v_f = eps = 0.5) ρ is 0.5, so with s = 0.5 (running
    σ 2, fresh σ 1) and d = 0, E = sqrt(0.5 · 0.25); and at σ_f² = 0, ρ is 0 and E is |d| (issue 52, a boundary a
    mutant of make mutants crossed unseen)."""
    e = channel_signals(np.array([0.0]), np.array([3.5]), np.array([0.0]), np.array([0.5]), 0.5).eval_error_sigma
    assert e[0] == pytest.approx(math.sqrt(0.5 * 0.25), rel=1e-12)
    flat = channel_signals(np.array([0.0]), np.array([1.0]), np.array([0.3]), np.array([0.0]), 0.0).eval_error_sigma
    assert flat[0] == pytest.approx(0.3, rel=1e-12)


@pytest.mark.parametrize("key, value, allowed", [
    ("mode_gap", math.inf, "a finite number >= 0"), ("mode_gap", -0.1, "a finite number >= 0"),
    ("mode_gap", math.nan, "a finite number >= 0"), ("mode_gap", True, "a finite number >= 0"),
    ("lag_sigma", -1.0, "a number >= 0 or math.inf"), ("eval_error_sigma", math.nan, "a number >= 0 or math.inf"),
    ("eval_error_sigma", "0.1", "a number >= 0 or math.inf")])
def test_thresholds_refuse_each_key_with_what_that_key_allows(key, value, allowed):
    """Each key's refusal names the key and what that key allows: the gap must be finite, a σ threshold may be
    math.inf (that condition off); the column beside: infinity is accepted for the σ keys, refused for the gap
    (issue 52: make mutants' survivors in Thresholds.__post_init__)."""
    with pytest.raises(ValueError, match=rf"^Thresholds\.{key}: expected {re.escape(allowed)}, got "):
        Thresholds(**{key: value})


def test_thresholds_take_infinity_for_a_sigma_key_only():
    assert Thresholds(lag_sigma=math.inf).lag_sigma == math.inf
    assert Thresholds(eval_error_sigma=math.inf).eval_error_sigma == math.inf
    with pytest.raises(ValueError, match="mode_gap"):
        Thresholds(mode_gap=math.inf)
