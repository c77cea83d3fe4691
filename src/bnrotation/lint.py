"""Lint a model's BatchNorm settings: the configurations that leave the running statistics frozen, averaged over
the whole run, replaced at each batch, or moving under weights that no longer train.

PyTorch's convention, which every rule depends on (``torch.nn.modules.batchnorm._BatchNorm``): in training mode a
layer that tracks running statistics updates them as ``running = (1 - m) * running + m * batch`` with momentum m,
or as the cumulative average over the batches seen since the last reset with ``momentum=None``; in evaluation mode
it normalises with them and changes nothing. TensorFlow/Keras's ``BatchNormalization(momentum=d)`` keeps ``d`` of
the running value instead, so its 0.99 is PyTorch's 0.01 (Ioffe & Szegedy 2015, arXiv:1502.03167, for the running
averages themselves).

The rules (:data:`RULES`), each on every ``_BatchNorm`` subclass of any package (timm's ``BatchNormAct2d``,
``SyncBatchNorm``):

- ``momentum-zero``: a layer that tracks running statistics with momentum 0: they never change, whatever the
  weights do (a momentum set to 0 to back the statistics up and never restored);
- ``momentum-cumulative``: ``momentum=None`` in a layer that is in training mode: the running statistics become
  the average over every batch since the start (or the last reset), and so describe the mean of all the weights
  the run went through, not the current ones;
- ``momentum-inverted``: momentum at least 0.5: each batch replaces at least half of the running value, most
  likely TensorFlow's convention (``1 - m``) written into PyTorch's;
- ``untracked-mixed``: ``track_running_stats=False`` (so no running statistics) in a model whose other BatchNorm
  layers track: that layer normalises with the batch's own statistics in evaluation mode too, so a prediction
  depends on the rest of its batch;
- ``untracked-kept-buffers``: ``track_running_stats`` switched off after construction, the buffers kept (Lightning's
  ``BaseFinetuning.freeze(train_bn=False)`` does this): training normalises with batch statistics and never
  updates the running ones, evaluation normalises with them, so the two modes normalise differently;
- ``frozen-weights-training-bn``: every parameter of a BatchNorm layer and of the convolution or linear layer
  feeding it (:func:`bnrotation.monitor.find_pairs`) frozen (``requires_grad=False``) while the BatchNorm layer
  is in training mode: the weights stand still while the buffers move to the new data's statistics (a frozen
  backbone left in training mode by ``model.train()``).

Nothing here changes the model (:func:`lint_batchnorm` reads flags and settings; the pairing runs two probe
samples with every buffer restored).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from .bnstats import running_stat_layers
from .pairing import TEXT_WIDTH, Pairing, examples, find_pairs

__all__ = ["lint_batchnorm", "Finding", "RULES", "INVERTED_MOMENTUM", "findings_line"]

# The rule ids; the module docstring states each.
RULES = ("momentum-zero", "momentum-cumulative", "momentum-inverted", "untracked-mixed", "untracked-kept-buffers",
         "frozen-weights-training-bn")

# From this momentum on, each batch outweighs everything the running value held before it: far above PyTorch's
# default 0.1 and the study's rows (0.03, and 0.3 in its window test), while TensorFlow's usual 0.9 to 0.999 (a
# kept fraction) all land above it once copied unchanged.
INVERTED_MOMENTUM = 0.5


@dataclass(frozen=True)
class Finding:
    """One BatchNorm setting that will let the running statistics describe other weights or other data.

    Attributes:
        rule: one of :data:`RULES`.
        layer: the BatchNorm layer's name (``model.named_modules()``).
        message: one line: what is wrong, and the fix.
    """

    rule: str
    layer: str
    message: str

    def __str__(self) -> str:
        return f"{self.layer}: [{self.rule}] {self.message}"


def _momentum_findings(name: str, m: _BatchNorm) -> list[Finding]:
    """The three momentum rules for one layer that tracks running statistics."""
    momentum = m.momentum
    if momentum is None:
        if not m.training:
            return []
        return [Finding("momentum-cumulative", name, "momentum=None in training mode: the running statistics "
                        "average every batch since the start, from weights long gone; set a momentum (PyTorch's "
                        "default 0.1), or keep None only for re-estimation after training")]
    if momentum == 0:
        return [Finding("momentum-zero", name, "momentum=0: training never updates the running statistics, "
                        "whatever the weights do; restore the momentum (PyTorch's default 0.1) if it was set to 0 "
                        "to back them up (a layer meant to stay frozen belongs in eval(), its momentum kept)")]
    if momentum >= INVERTED_MOMENTUM:
        return [Finding("momentum-inverted", name, f"momentum={momentum:g}: each batch replaces {momentum:.0%} of "
                        "the running statistics; PyTorch's momentum is TensorFlow's 1 - momentum, so a Keras "
                        f"momentum of {momentum:g} is PyTorch's {1 - momentum:.3g}")]
    return []


def _untracked_finding(name: str, m: _BatchNorm) -> Finding:
    """The finding for a layer with ``track_running_stats=False``: ``untracked-kept-buffers`` when it still holds
    running statistics, else ``untracked-mixed``."""
    if m.running_mean is not None:
        return Finding("untracked-kept-buffers", name, "track_running_stats=False on a layer that kept its running "
                       "statistics: training normalises with batch statistics and never updates them, evaluation "
                       "normalises with them; to freeze the layer put it in eval() after model.train() (or use "
                       "FrozenBatchNorm2d), else set track_running_stats=True again")
    return Finding("untracked-mixed", name, "track_running_stats=False while other BatchNorm layers track: this "
                   "one normalises with each batch's own statistics in evaluation mode too, so a prediction depends "
                   "on the rest of its batch; construct it with track_running_stats=True like the others")


def _frozen_findings(model: nn.Module, pairing: Pairing) -> list[Finding]:
    """``frozen-weights-training-bn`` for every paired BatchNorm layer in training mode whose own parameters and
    weight layer's parameters are all frozen."""
    modules = dict(model.named_modules())
    found = []
    for pair in pairing.pairs:
        norm = modules[pair.norm]  # after a concatenation, every segment's weight layer (NormPair.weights)
        params = [*norm.parameters(), *(p for w in pair.weights for p in modules[w].parameters())]
        moving = isinstance(norm, _BatchNorm) and norm.track_running_stats and norm.training
        if not moving or not params or any(p.requires_grad for p in params):
            continue
        found.append(Finding("frozen-weights-training-bn", pair.norm, f"{pair.weight} and {pair.norm} are frozen "
                             "(requires_grad=False) but the BatchNorm layer is in training mode: its running "
                             "statistics keep moving to the new data while the weights stand still; call .eval() on "
                             "the frozen part after every model.train() (or replace it with FrozenBatchNorm2d)"))
    return found


def lint_batchnorm(model: nn.Module, x=None, *, pairing: Pairing | None = None) -> list[Finding]:
    """The BatchNorm settings of ``model`` that break its running statistics, one :class:`Finding` per rule and
    layer (the rules of :data:`RULES`, stated in this module's docstring), in the order of ``named_modules()``
    (the frozen-weights rule after the others, in forward order). An empty list: nothing to report.

    The rules read the model as it is now: its training flags (``momentum-cumulative`` and the frozen-weights
    rule judge only layers in training mode, so lint the model after ``model.train()`` or your own freezing code,
    where training would start), settings and ``requires_grad`` flags. Only BatchNorm layers (``_BatchNorm``
    subclasses from any package) are judged; ``FrozenBatchNorm2d`` (torchvision, timm) is not one, as it holds no
    momentum and updates nothing.

    Args:
        model: any ``nn.Module``.
        x: probe inputs (N >= 2, ...) for :func:`bnrotation.monitor.find_pairs`, needed only when the model does not
            trace with ``torch.fx`` and some layer tracks running statistics.
        pairing: a :class:`bnrotation.pairing.Pairing` already found for ``model`` (the monitor's), instead of
            ``x``. Unpaired layers are not judged by the frozen-weights rule.

    Raises:
        TypeError: when ``model`` is not an ``nn.Module``.
        ValueError: from :func:`bnrotation.monitor.find_pairs`, when the pairs are needed, the model does not trace
            and no ``x`` is given, or it cannot run on ``x``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    norms = [(n, m) for n, m in model.named_modules() if isinstance(m, _BatchNorm)]
    tracked = running_stat_layers(model)
    findings = []
    for name, m in norms:
        if m.track_running_stats:
            findings += _momentum_findings(name, m)
        elif tracked or m.running_mean is not None:
            findings.append(_untracked_finding(name, m))
    if tracked and any(m.training for _, m in tracked):
        findings += _frozen_findings(model, pairing if pairing is not None else find_pairs(model, x))
    return findings


def findings_line(findings: list[Finding]) -> str:
    """The findings in a few short lines, for a log or a warning, whatever the model's size: a first line with
    their count and rules; then per rule (in the order of :data:`RULES`) its count and a few of its layers
    ("… and N more"), and the first of them with its message (what is wrong, and the fix), wrapped. The list
    itself (``lint_batchnorm``'s return, the monitor's ``monitor.findings``) holds every one. "" for none.

    ``BatchNorm settings: 2 finding(s) under 2 rule(s) ...`` / ``  [momentum-zero] 1 layer: bn1`` /
    ``    bn1: momentum=0: training never updates ...``.
    """
    if not findings:
        return ""
    by_rule: dict[str, list[Finding]] = {}
    for f in sorted(findings, key=lambda f: RULES.index(f.rule) if f.rule in RULES else len(RULES)):
        by_rule.setdefault(f.rule, []).append(f)
    lines = [f"BatchNorm settings: {len(findings)} finding(s) under {len(by_rule)} rule(s), from "
             "bnrotation.lint_batchnorm (every one in its list, or in monitor.findings):"]
    for rule, found in by_rule.items():
        lines.append(f"  [{rule}] {len(found)} layer{'s' * (len(found) > 1)}: {examples([f.layer for f in found])}")
        lines += textwrap.wrap(f"{found[0].layer}: {found[0].message}", TEXT_WIDTH - 40, initial_indent="    ",
                               subsequent_indent="    ")
    return "\n".join(lines)
