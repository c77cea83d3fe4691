"""Probes against closed forms, invariances and failure cases."""

from __future__ import annotations

import math

import pytest
import torch

from bnrotation.bnstats import batch_statistics
from bnrotation.study.config import ModelConfig
from bnrotation.study.model import build_network
from bnrotation import probes
from bnrotation.probes import (Scratch, accuracy, batch_statistics_pass, channel_norms, drift_sigma_per_step,
                               fresh_statistics, input_moments, lag_sigma, predicted_lag_sigma, rotation_deg,
                               turn_rows)


def rotated(w: torch.Tensor, angle_deg: torch.Tensor) -> torch.Tensor:
    """Rotate each row of w (C, D) by angle_deg in the plane of w and a fixed orthogonal direction."""
    w = w.double()
    g = torch.Generator().manual_seed(1)
    v = torch.randn(w.shape, generator=g, dtype=torch.float64)
    v = v - (v * w).sum(1, keepdim=True) / (w * w).sum(1, keepdim=True) * w
    v = v / v.norm(dim=1, keepdim=True) * w.norm(dim=1, keepdim=True)
    a = torch.deg2rad(angle_deg.double())[:, None]
    return torch.cos(a) * w + torch.sin(a) * v


@pytest.mark.parametrize("angle", [1e-4, 1e-3, 0.05, 0.46, 7.73, 24.29, 90.0, 179.0])
def test_rotation_of_a_known_angle(angle):
    w = torch.randn(64, 64 * 9, dtype=torch.float64)
    got = rotation_deg(w, rotated(w, torch.full((64,), angle)))
    assert torch.allclose(got, torch.full_like(got, angle), rtol=1e-6, atol=0)


def test_rotation_ignores_scale_and_is_per_channel():
    w = torch.randn(8, 3, 3, 3, dtype=torch.float64)
    angles = torch.linspace(0.01, 30, 8)
    w2 = rotated(w.reshape(8, -1), angles).reshape(w.shape) * torch.linspace(0.5, 7, 8)[:, None, None, None]
    assert torch.allclose(rotation_deg(w, w2), angles.double(), rtol=1e-6)
    assert torch.equal(rotation_deg(w, w), torch.zeros(8, dtype=torch.float64))


def test_rotation_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="shapes differ"):
        rotation_deg(torch.randn(4, 3), torch.randn(5, 3))


def test_arccos_of_float32_cannot_do_what_rotation_deg_does():
    """Why the protocol asks for atan2 in float64: float32 arccos rounds a 1e-3 degree turn to 0."""
    w = torch.randn(16, 576, dtype=torch.float64)
    w2 = rotated(w, torch.full((16,), 1e-3))
    a, b = w.float(), w2.float()
    naive = torch.rad2deg(torch.arccos(((a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))).clamp(-1, 1)))
    assert (naive - 1e-3).abs().max() > 1e-4
    assert torch.allclose(rotation_deg(w, w2), torch.full((16,), 1e-3, dtype=torch.float64), rtol=1e-6)


def _rotation_whole(w_before: torch.Tensor, w_after: torch.Tensor) -> torch.Tensor:
    """The protocol's formula on whole weights, each op once over all rows (rotation_deg before it took blocks)."""
    def unit(w):
        rows = w.reshape(w.shape[0], -1).double()
        return rows / rows.norm(dim=1, keepdim=True)
    a, b = unit(w_before), unit(w_after)
    return torch.rad2deg(2 * torch.atan2((a - b).norm(dim=1), (a + b).norm(dim=1)))


@pytest.mark.parametrize("block", [probes.ROW_BLOCK, 64, 1])
@pytest.mark.parametrize("shape", [(64, 3, 3, 3), (10, 512), (3, 200), (1, 7)])
def test_turn_rows_is_the_whole_weight_formula_by_row_blocks(monkeypatch, block, shape):
    """Norms and angles of :func:`turn_rows` (blocks of rows; one row, or rows of more values than a block) are
    the formula's on the whole weight, and its inputs are left as they were."""
    monkeypatch.setattr(probes, "ROW_BLOCK", block)
    g = torch.Generator().manual_seed(3)
    w0 = torch.randn(shape, generator=g)
    w1 = w0 + 0.01 * torch.randn(shape, generator=g)
    kept0, kept1 = w0.clone(), w1.clone()
    norms, none = turn_rows(None, w0)
    assert none is None and torch.allclose(norms, channel_norms(w0), rtol=1e-15, atol=0)
    norms, rot = turn_rows(w0, w1)
    assert torch.allclose(rot, _rotation_whole(w0, w1), rtol=1e-12, atol=1e-12)
    assert torch.allclose(norms, channel_norms(w1), rtol=1e-15, atol=0)
    assert torch.equal(w0, kept0) and torch.equal(w1, kept1)
    with pytest.raises(ValueError, match="shapes differ"):
        turn_rows(w0, torch.randn(shape[0] + 1, *shape[1:]))


def test_rotation_deg_is_the_monitors_arithmetic():
    """rotation_deg and the monitor's pass (turn_rows) compute the same values, bit for bit, on float32 and
    float64 weights."""
    for dtype in (torch.float32, torch.float64):
        w0, w1 = torch.randn(128, 64, 3, 3, dtype=dtype), torch.randn(128, 64, 3, 3, dtype=dtype)
        assert torch.equal(rotation_deg(w0, w1), turn_rows(w0, w1)[1])


def test_drift_and_lag_on_a_mean_drifting_at_a_known_rate():
    """An exponential average of a mean drifting at r sigma/step trails it by r (1-m)/m in steady state."""
    m, r, sigma, steps, interval = 0.03, 0.0074, 2.0, 2000, 100
    means = torch.arange(steps + 1, dtype=torch.float64) * r * sigma  # the true mean, drifting
    running = torch.zeros((), dtype=torch.float64)
    for t in range(steps + 1):
        running = (1 - m) * running + m * means[t]
    var = torch.tensor([sigma ** 2], dtype=torch.float64)
    drift = drift_sigma_per_step(means[-1:], means[-1 - interval:-interval], var, interval)
    assert torch.allclose(drift, torch.tensor([r], dtype=torch.float64), rtol=1e-12)
    lag = lag_sigma(running.reshape(1), means[-1:], var, eps=0.0)  # the closed form has no eps
    predicted = predicted_lag_sigma(drift, m)
    assert torch.allclose(-lag, predicted, rtol=1e-6)  # the running mean is behind: negative lag
    assert math.isclose(float(predicted), 0.0074 * 0.97 / 0.03, rel_tol=1e-12)  # the article's 0.24 sigma


def _trained_bn_model():
    torch.manual_seed(0)
    model = build_network(ModelConfig(channels_last=False), 10, seed=0)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(16, 3, 32, 32) * 2 + 1)
    return model


def _buffers(model):
    return {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}


def test_training_mode_check_leaves_every_buffer_bit_identical():
    model = _trained_bn_model()
    before = _buffers(model)
    x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))
    accuracy(model, x, y, "train")
    fresh_statistics(model, x)
    after = _buffers(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert model.training  # modes restored


def test_training_mode_uses_the_sets_own_batch_statistics():
    model = _trained_bn_model()
    x = torch.randn(32, 3, 32, 32) * 3 - 2
    reference = _trained_bn_model().train()
    for m in reference.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.track_running_stats = False  # pure batch statistics, no buffer
    with torch.no_grad(), batch_statistics(model):
        assert torch.allclose(model(x), reference(x), atol=1e-5)


def test_fresh_statistics_match_a_direct_computation():
    model = _trained_bn_model()
    x = torch.randn(40, 3, 32, 32)
    fresh = fresh_statistics(model, x)
    with torch.no_grad():
        z = model.conv1(x).double()
    assert torch.allclose(fresh["bn1"][0], z.mean((0, 2, 3)), atol=1e-6)
    assert torch.allclose(fresh["bn1"][1], z.var((0, 2, 3), unbiased=True), rtol=1e-5)


@pytest.mark.parametrize("shape", [(512, 64, 8, 8), (300, 16), (40, 8, 5), (6, 4, 3, 3, 3)])
@pytest.mark.parametrize("offset", [0.0, 30.0])
@pytest.mark.parametrize("channels_last", [False, True])
def test_input_moments_match_float64_for_every_input_shape(shape, offset, channels_last):
    """Against the float64 closed form: mean within 1e-6 σ and variance within 1e-5 relative (the tolerance
    the runner's tables are compared at is looser, 1e-4), also when |mean| is 30σ, where sums of squares
    without centring would lose every digit in float32."""
    g = torch.Generator().manual_seed(sum(shape))
    c = shape[1]
    spread = torch.rand(c, generator=g, dtype=torch.float64) + 0.1
    centre = offset * (torch.rand(c, generator=g, dtype=torch.float64) - 0.5) * 2
    z64 = torch.randn(shape, generator=g, dtype=torch.float64) * spread.view(1, c, *[1] * (len(shape) - 2)) \
        + centre.view(1, c, *[1] * (len(shape) - 2))
    z = z64.float()
    if channels_last and len(shape) == 4:
        z = z.contiguous(memory_format=torch.channels_last)
    dims = (0, *range(2, len(shape)))
    mean, var = input_moments(z)
    exact = z.double()  # the float32 values themselves, in float64
    assert mean.dtype == var.dtype == torch.float64 and mean.shape == var.shape == (c,)
    std = exact.var(dims, correction=1).sqrt()
    assert ((mean - exact.mean(dims)).abs() / std).max() < 1e-6
    assert ((var - exact.var(dims, correction=1)).abs() / std ** 2).max() < 1e-5


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "2d", "3d", "5d", "strided view", "half"])
def test_input_moments_through_a_scratch_buffer_are_the_same_values(layout):
    """The centred values in a shared buffer (:class:`Scratch`, as the training-mode pass lends it) give the
    moments bit for bit; a buffer grown for a larger input, or one that does not fit the layout, changes nothing."""
    g = torch.Generator().manual_seed(4)
    z = {"contiguous": lambda: torch.randn(64, 16, 6, 6, generator=g) * 3 + 20,
         "channels_last": lambda: (torch.randn(64, 16, 6, 6, generator=g) + 5).contiguous(
             memory_format=torch.channels_last),
         "2d": lambda: torch.randn(300, 16, generator=g) - 7,
         "3d": lambda: torch.randn(40, 8, 5, generator=g),
         "5d": lambda: torch.randn(6, 4, 3, 3, 3, generator=g).contiguous(memory_format=torch.channels_last_3d),
         "strided view": lambda: torch.randn(64, 32, 6, 6, generator=g)[:, ::2],
         "half": lambda: torch.randn(64, 16, 6, 6, generator=g).half()}[layout]()
    scratch = Scratch()
    for first in (torch.randn(4, 3, 2, 2), torch.randn(2000, 40)):  # a buffer too small, then one larger than z
        input_moments(first, scratch)
        for got, want in zip(input_moments(z, scratch), input_moments(z)):
            assert torch.equal(got, want)


def test_training_mode_pass_moments_are_each_layers_own():
    """batch_statistics_pass (one buffer for the whole pass) gives each layer the moments of its own input."""
    model = _trained_bn_model()
    x = torch.randn(40, 3, 32, 32)
    inputs = {}
    hooks = [m.register_forward_pre_hook(lambda mod, inp, name=name: inputs.__setitem__(name, inp[0].clone()))
             for name, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]
    with torch.no_grad(), batch_statistics(model):
        model(x)
    for h in hooks:
        h.remove()
    _, moments = batch_statistics_pass(model, x)
    assert set(moments) == set(inputs)
    for name, z in inputs.items():
        for got, want in zip(moments[name], input_moments(z)):
            assert torch.equal(got, want), name


def test_input_moments_need_a_channel_dim():
    with pytest.raises(ValueError, match="shape"):
        input_moments(torch.randn(10))


def test_eval_accuracy_does_not_depend_on_chunking():
    model = _trained_bn_model()
    x, y = torch.randn(50, 3, 32, 32), torch.randint(0, 10, (50,))
    assert accuracy(model, x, y, "eval", chunk=7) == accuracy(model, x, y, "eval", chunk=50)
    with pytest.raises(ValueError, match="mode"):
        accuracy(model, x, y, "test")
