"""The BatchNorm lint (:func:`bnrotation.lint.lint_batchnorm`): each rule on a model built to break it, with the
effect the rule names shown to happen (frozen buffers, buffers that move under frozen weights, an evaluation
that depends on the batch), and no finding on clean models, ours and timm's (random weights), in both modes.
Freezing as third-party code does it: ``timm.utils.freeze``, ``requires_grad_(False)`` on a stage, Lightning's
``BaseFinetuning.freeze``; and a model converted to ``SyncBatchNorm``."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from bnrotation.lint import INVERTED_MOMENTUM, RULES, Finding, findings_line, lint_batchnorm
from bnrotation.monitor import MonitorSetupWarning, StalenessMonitor
from thirdparty import import_optional, import_timm

torch.set_num_threads(1)


class Net(nn.Module):
    """conv1 -> bn1 -> ReLU -> conv2 -> bn2 -> ReLU -> pool -> head: two pairs that fx traces."""

    def __init__(self, bn2: nn.Module | None = None):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6)
        self.conv2, self.bn2 = nn.Conv2d(6, 6, 3, padding=1, bias=False), bn2 or nn.BatchNorm2d(6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        x = F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))
        return self.head(x.mean((2, 3)))


def batch(seed: int = 0, n: int = 16) -> torch.Tensor:
    return torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


def buffers(m: _BatchNorm) -> tuple[torch.Tensor, torch.Tensor]:
    return m.running_mean.clone(), m.running_var.clone()


def rules(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.rule, f.layer) for f in findings]


@pytest.fixture(scope="module")
def resnet18():
    """timm's resnet18 with random weights, in training mode; deep-copy it before changing it."""
    timm = import_timm()
    torch.manual_seed(0)
    return timm.create_model("resnet18", pretrained=False, num_classes=4).train()


def stage_norms(model: nn.Module, prefixes: tuple[str, ...]) -> set[str]:
    return {n for n, m in model.named_modules() if isinstance(m, _BatchNorm) and n.startswith(prefixes)}


# ----------------------------------------------------------------------------- clean models
def test_a_clean_model_has_no_finding_in_either_mode():
    model = Net()
    assert lint_batchnorm(model) == []
    assert lint_batchnorm(model.eval()) == []
    model.train().bn1.momentum = INVERTED_MOMENTUM - 0.01  # just below the rule
    model.bn2.momentum = 0.01  # timm's and the study's range
    assert lint_batchnorm(model) == []
    assert lint_batchnorm(nn.Sequential(nn.Linear(3, 3), nn.GroupNorm(1, 3))) == []  # no BatchNorm at all


def test_timm_models_with_random_weights_have_no_finding(resnet18):
    timm = import_timm()
    mobilenet = timm.create_model("mobilenetv3_small_100", pretrained=False, num_classes=4)  # BatchNormAct2d
    others = [timm.create_model(name, pretrained=False, num_classes=4) for name in ("efficientnet_b0", "densenet121")]
    for model in (resnet18, mobilenet, nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(resnet18)), *others):
        assert lint_batchnorm(model.train()) == [], type(model).__name__
        assert lint_batchnorm(copy.deepcopy(model).eval()) == []
    assert lint_batchnorm(mobilenet.eval(), torch.randn(2, 3, 32, 32)) == []


# ----------------------------------------------------------------------------- momentum
def test_momentum_zero_is_flagged_and_the_statistics_really_stand_still():
    model = Net()
    model.bn2.momentum = 0.0
    findings = lint_batchnorm(model)
    assert rules(findings) == [("momentum-zero", "bn2")]
    assert "restore the momentum" in findings[0].message
    assert rules(lint_batchnorm(model.eval())) == [("momentum-zero", "bn2")]  # it bites when training resumes
    before1, before2 = buffers(model.bn1), buffers(model.bn2)
    model.train()(batch())
    assert all(torch.equal(a, b) for a, b in zip(before2, buffers(model.bn2)))  # what the finding says
    assert not torch.equal(before1[0], model.bn1.running_mean)  # while a layer with a momentum moves


def test_cumulative_momentum_is_flagged_only_in_training_mode():
    """momentum=None: after k batches the running mean is the plain mean of the k batch means (PyTorch's
    cumulative average), so batch 1 weighs as much as batch k. Evaluation-mode layers are not flagged: nothing
    updates them, and re-estimation uses None on purpose."""
    model = Net()
    model.bn1.momentum = None
    assert rules(lint_batchnorm(model)) == [("momentum-cumulative", "bn1")]
    assert lint_batchnorm(copy.deepcopy(model).eval()) == []
    frozen = copy.deepcopy(model)
    frozen.bn1.eval()  # frozen inside a training model
    assert lint_batchnorm(frozen) == []
    batch_means = []
    with torch.no_grad():
        for k in range(3):
            x = batch(k)
            batch_means.append(model.conv1(x).mean((0, 2, 3)))
            model(x)
    torch.testing.assert_close(model.bn1.running_mean, torch.stack(batch_means).mean(0))  # float32 sums of 3


@pytest.mark.parametrize("momentum", [0.5, 0.9, 0.99, 1.0])
def test_momentum_of_a_half_or_more_is_flagged_as_tensorflows_convention(momentum):
    model = Net()
    model.bn1.momentum = momentum
    findings = lint_batchnorm(model)
    assert rules(findings) == [("momentum-inverted", "bn1")]
    assert f"PyTorch's {1 - momentum:.3g}" in findings[0].message


# ----------------------------------------------------------------------------- track_running_stats=False
def test_an_untracked_layer_among_tracked_ones_is_flagged_and_its_evaluation_depends_on_the_batch():
    model = Net(bn2=nn.BatchNorm2d(6, track_running_stats=False))
    assert rules(lint_batchnorm(model)) == [("untracked-mixed", "bn2")]
    assert rules(lint_batchnorm(model.eval())) == [("untracked-mixed", "bn2")]
    x = batch()
    with torch.no_grad():
        alone, together = model(x[:2]), model(x)[:2]  # the same two samples, in evaluation mode
    assert (alone - together).abs().max() > 1e-3  # bn2 normalised with each batch's statistics
    everywhere = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, track_running_stats=False))
    assert lint_batchnorm(everywhere) == []  # batch statistics throughout: a choice, not a mix


def test_lightnings_freeze_without_bn_training_keeps_buffers_it_no_longer_updates():
    """``BaseFinetuning.freeze(train_bn=False)`` switches ``track_running_stats`` off and keeps the buffers:
    training then normalises with batch statistics and evaluation with the kept ones."""
    finetuning = import_optional("lightning.pytorch.callbacks.finetuning")
    model = Net()
    finetuning.BaseFinetuning.freeze(nn.ModuleList([model.conv1, model.bn1]), train_bn=False)
    assert rules(lint_batchnorm(model)) == [("untracked-kept-buffers", "bn1")]
    before = buffers(model.bn1)
    x = batch()
    with torch.no_grad():
        train_out = model(x)
        eval_out = model.eval()(x)
    assert all(torch.equal(a, b) for a, b in zip(before, buffers(model.bn1)))
    assert (train_out - eval_out).abs().max() > 1e-3
    trainable_bn = Net()
    finetuning.BaseFinetuning.freeze(nn.ModuleList([trainable_bn.conv1, trainable_bn.bn1]))  # train_bn=True
    assert lint_batchnorm(trainable_bn) == []  # bn1's own parameters still train


# ----------------------------------------------------------------------------- frozen weights, training BatchNorm
def test_a_frozen_pair_in_training_mode_is_flagged_and_its_buffers_move_under_still_weights():
    model = Net()
    model.conv1.requires_grad_(False)
    model.bn1.requires_grad_(False)
    findings = lint_batchnorm(model)
    assert rules(findings) == [("frozen-weights-training-bn", "bn1")]
    assert "conv1 and bn1 are frozen" in findings[0].message and ".eval()" in findings[0].message
    frozen = {k: v.clone() for k, v in model.named_parameters() if not v.requires_grad}
    before = buffers(model.bn1)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    F.cross_entropy(model(batch()), torch.arange(16) % 3).backward()
    optimizer.step()
    assert all(torch.equal(v, dict(model.named_parameters())[k]) for k, v in frozen.items())
    assert not torch.equal(before[0], model.bn1.running_mean)  # the finding's claim
    model.bn1.eval()
    assert lint_batchnorm(model) == []  # the fix
    half = Net()
    half.conv1.requires_grad_(False)  # bn1's affine parameters still train
    assert lint_batchnorm(half) == []


def test_timms_freeze_without_frozen_batchnorm_is_flagged_and_with_it_is_not(resnet18):
    timm = import_timm()
    stage = ("bn1", "layer1.")
    model = copy.deepcopy(resnet18)
    timm.utils.freeze(model, ["conv1", "bn1", "layer1"], include_bn_running_stats=False)
    findings = lint_batchnorm(model.train())
    assert {f.layer for f in findings} == stage_norms(model, stage)
    assert {f.rule for f in findings} == {"frozen-weights-training-bn"}
    converted = copy.deepcopy(resnet18)
    timm.utils.freeze(converted, ["conv1", "bn1", "layer1"])  # BatchNorm2d -> FrozenBatchNorm2d
    assert lint_batchnorm(converted.train()) == []


def test_a_stage_frozen_with_requires_grad_is_flagged_also_after_syncbatchnorm_conversion(resnet18):
    for model in (copy.deepcopy(resnet18), nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(resnet18))):
        model.layer2.requires_grad_(False)
        findings = lint_batchnorm(model.train())
        assert {f.layer for f in findings} == stage_norms(model, ("layer2.",))  # downsample.1 included
        assert "layer2.0.downsample.1" in {f.layer for f in findings}
        model.layer2.eval()
        assert lint_batchnorm(model) == []
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(resnet18))
    synced.layer3[1].bn2.momentum = 0.9  # conversion keeps each layer's momentum
    assert rules(lint_batchnorm(synced)) == [("momentum-inverted", "layer3.1.bn2")]


# ----------------------------------------------------------------------------- inputs and the monitor
class Untraceable(Net):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: fx cannot trace it
            x = -x
        return super().forward(x)


def test_a_model_that_does_not_trace_needs_a_probe_for_the_frozen_rule():
    model = Untraceable()
    assert lint_batchnorm(model.eval()) == []  # nothing in training mode: no pairing needed
    model.train().conv2.requires_grad_(False)
    model.bn2.requires_grad_(False)
    with pytest.raises(ValueError, match="does not trace with torch.fx.*pass a probe input"):
        lint_batchnorm(model)
    assert rules(lint_batchnorm(model, batch())) == [("frozen-weights-training-bn", "bn2")]
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module"):
        lint_batchnorm(model.state_dict())


def test_the_monitor_names_the_findings_in_one_construction_warning():
    x = batch(n=32)
    model = Net()
    model.bn1.momentum = 0.0
    model.bn2.momentum = 0.99
    with pytest.warns(MonitorSetupWarning, match=r"BatchNorm settings: 2 finding\(s\) under 2 rule\(s\)") as caught:
        monitor = StalenessMonitor(model, x)
    setup = [str(w.message) for w in caught if issubclass(w.category, MonitorSetupWarning)]
    assert len(setup) == 1 and max(len(line) for line in setup[0].splitlines()) <= 200
    assert "[momentum-zero] 1 layer: bn1\n    bn1: momentum=0: training never" in setup[0]
    assert "[momentum-inverted] 1 layer: bn2\n    bn2: momentum=0.99: each batch" in setup[0]
    assert setup[0] == findings_line(monitor.findings) and rules(monitor.findings) == [("momentum-zero", "bn1"),
                                                                                      ("momentum-inverted", "bn2")]
    with warnings.catch_warnings():
        warnings.simplefilter("error", MonitorSetupWarning)
        assert StalenessMonitor(Net(), x).findings == []


def test_every_rule_is_listed_and_documented():
    import bnrotation.lint as lint
    assert len(set(RULES)) == len(RULES)
    assert all(f"``{rule}``" in lint.__doc__ for rule in RULES)
