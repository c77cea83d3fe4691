"""Projected Adam against its oracles: torch.optim.Adam (projection off) and adamp.AdamP (on)."""

from __future__ import annotations

import math

import pytest
import torch
from adamp import AdamP

from bnrotation.study.config import OPTIMIZERS, SCHEDULES, ModelConfig, OptimizerConfig, ScheduleConfig
from bnrotation.study.model import build_network
from bnrotation.study.names import OPTIMIZER_CLASSES, PROJECTION_MODES, SCHEDULE_CLASSES
from bnrotation.study.optim import ProjectedAdam, build_optimizer, build_schedule, project_tangential, radial_coefficient


def _net():
    return build_network(ModelConfig(channels_last=False), 10, seed=3)


def _steps(model, opt, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(16, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def _synthetic_steps(model, opt, n=8, seed=0):
    """Steps with fixed gradients, so that float rounding cannot be amplified through the network.

    Conv gradients are made orthogonal to each channel's weight, as behind BatchNorm.
    """
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        for name, p in model.named_parameters():
            grad = torch.randn(p.shape, generator=g) * 1e-2
            if name.startswith("conv"):
                grad = project_tangential(grad, p.detach())
            p.grad = grad
        opt.step()


def _same_params(a, b, **tol):
    return all(torch.allclose(pa, pb, **tol) for pa, pb in zip(a.parameters(), b.parameters()))


@pytest.mark.kernels
def test_projection_off_equals_torch_adam_step_for_step():
    a, b = _net(), _net()
    _steps(a, torch.optim.Adam(a.parameters(), lr=3e-3, foreach=False))
    _steps(b, ProjectedAdam(b.parameters(), lr=3e-3, projection="never"))
    assert all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters()))  # bit for bit


def test_projection_on_matches_adamp_with_its_test_switched_off():
    ours, ref = _net(), _net()
    conv = [p for n, p in ours.named_parameters() if n.startswith("conv")]
    rest = [p for n, p in ours.named_parameters() if not n.startswith("conv")]
    conv_r = [p for n, p in ref.named_parameters() if n.startswith("conv")]
    rest_r = [p for n, p in ref.named_parameters() if not n.startswith("conv")]
    _synthetic_steps(ours, ProjectedAdam([{"params": conv, "projection": "always"},
                                          {"params": rest, "projection": "never"}], lr=3e-3))
    # delta=inf: always project (channel view first); delta=0 on the other group: never project.
    _synthetic_steps(ref, AdamP([{"params": conv_r, "delta": float("inf")}, {"params": rest_r, "delta": 0.0}],
                      lr=3e-3, weight_decay=0))
    assert _same_params(ours, ref, rtol=1e-5, atol=1e-8)


def test_adamp_mode_matches_the_adamp_package_defaults():
    ours, ref = _net(), _net()
    _synthetic_steps(ours, ProjectedAdam(ours.parameters(), lr=3e-3, projection="adamp", delta=0.1,
                                         wd_ratio=0.1, weight_decay=1e-2))
    _synthetic_steps(ref, AdamP(ref.parameters(), lr=3e-3, delta=0.1, wd_ratio=0.1, weight_decay=1e-2))
    assert _same_params(ours, ref, rtol=1e-5, atol=1e-8)


def _leaning_gradient(w: torch.Tensor, cos: float, g: torch.Generator) -> torch.Tensor:
    """A gradient whose cosine with each output channel of ``w`` is exactly ``cos`` (same sign in every channel),
    the rest of it random and tangential; norm 1e-2 per channel."""
    u = w / w.flatten(1).norm(dim=1).view(-1, *[1] * (w.dim() - 1))
    t = project_tangential(torch.randn(w.shape, generator=g, dtype=w.dtype), w)
    t = t / t.flatten(1).norm(dim=1).view(-1, *[1] * (w.dim() - 1))
    return 1e-2 * (cos * u + math.sqrt(1 - cos ** 2) * t)


def _adamp_trajectory(opt_class, delta: float, steps: int = 6, **kw) -> list[torch.Tensor]:
    w = torch.nn.Parameter(torch.randn(4, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    opt = opt_class([w], lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, delta=delta, wd_ratio=0.5, **kw)
    g, out = torch.Generator().manual_seed(2), []
    for _ in range(steps):
        w.grad = _leaning_gradient(w.detach(), cos=0.1, g=g)
        opt.step()
        out.append(w.detach().clone())
    return out


def test_adamp_mode_follows_the_adamp_package_at_a_non_default_delta_step_by_step():
    """|cos(grad, w)| = 0.1 in every channel of 16 coordinates (and over the whole layer): AdamP projects
    when it is below delta / sqrt(dim), so with delta = 1.0 (threshold 0.25 per channel) it projects every
    step and with its default 0.1 (0.025 per channel, 0.0125 per layer) never. A ProjectedAdam that ignored
    delta would follow the default and part from the package at the first step."""
    ours = _adamp_trajectory(ProjectedAdam, delta=1.0, projection="adamp")
    ref = _adamp_trajectory(AdamP, delta=1.0)
    at_default = _adamp_trajectory(AdamP, delta=0.1)
    assert not torch.allclose(ref[0], at_default[0], rtol=1e-6, atol=1e-9)  # delta changes the decision
    for step, (a, b) in enumerate(zip(ours, ref)):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12), f"step {step + 1}"


def test_projected_update_is_orthogonal_to_each_channel():
    model = _net()
    opt = build_optimizer(OptimizerConfig(name="adam_projected", lr=3e-3), model)
    _steps(model, opt, n=3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _steps(model, opt, n=1, seed=9)
    for name in ("conv1.weight", "conv2.weight", "conv3.weight"):
        w, u = before[name].double(), (dict(model.named_parameters())[name].detach().double() - before[name].double())
        cos = (u * w).flatten(1).sum(1) / (u.flatten(1).norm(dim=1) * w.flatten(1).norm(dim=1))
        assert cos.abs().max() < 1e-4, name
    # and the non-conv parameters were not projected: their update is plain Adam's
    assert opt.param_groups[1]["projection"] == "never"


def test_project_tangential_closed_form():
    w = torch.tensor([[3.0, 4.0]])
    u = torch.tensor([[1.0, 0.0]])
    assert torch.allclose(radial_coefficient(u, w), torch.tensor([[3.0 / 25.0]]))
    assert torch.allclose(project_tangential(u, w), torch.tensor([[1 - 9 / 25, -12 / 25]]))
    with pytest.raises(ValueError):
        project_tangential(torch.randn(3), torch.randn(3))


def test_every_config_name_has_its_class_in_the_names_table():
    assert set(OPTIMIZER_CLASSES) == set(OPTIMIZERS) and set(SCHEDULE_CLASSES) == set(SCHEDULES)
    assert set(PROJECTION_MODES) <= set(OPTIMIZERS)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_factory_builds_the_class_the_names_table_says(name):
    """The analysis refuses a run whose run.json names another class (names.OPTIMIZER_CLASSES); the factory
    must build exactly that class, with the projection per param group that names.PROJECTION_MODES says."""
    opt = build_optimizer(OptimizerConfig(name=name, lr=0.01), _net())
    assert type(opt).__name__ == OPTIMIZER_CLASSES[name]
    assert [g["name"] for g in opt.param_groups] == ["conv", "other"]
    assert opt.param_groups[0]["param_names"] == ["conv1.weight", "conv2.weight", "conv3.weight"]
    assert tuple(g.get("projection") for g in opt.param_groups if "projection" in g) == PROJECTION_MODES.get(name, ())


@pytest.mark.parametrize("name", SCHEDULES)
def test_schedule_factory_builds_the_class_the_names_table_says(name):
    sched = build_schedule(ScheduleConfig(name=name), build_optimizer(OptimizerConfig(name="adam"), _net()), steps=10)
    assert (None if sched is None else type(sched).__name__) == SCHEDULE_CLASSES[name]


def test_cosine_schedule_reaches_zero_at_the_last_step():
    model = _net()
    opt = build_optimizer(OptimizerConfig(name="adam", lr=3e-3), model)
    sched = build_schedule(ScheduleConfig(name="cosine"), opt, steps=10)
    lrs = []
    for _ in range(10):
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert math.isclose(lrs[4], 3e-3 * 0.5 * (1 + math.cos(math.pi * 5 / 10)), rel_tol=1e-9)
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12)
    assert build_schedule(ScheduleConfig(name="constant"), opt, steps=10) is None
