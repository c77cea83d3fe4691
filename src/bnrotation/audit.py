"""Audit an averaged model: where its BatchNorm buffers come from, and whether they fit its own weights.

An EMA or SWA copy holds averaged weights; its running statistics are whatever the averaging library did with
the buffers, and the libraries disagree: ``torch.optim.swa_utils.AveragedModel`` copies them from the raw model
at every update by default (``use_buffers=False``) and averages them with ``use_buffers=True``; Lightning's
``WeightAveraging`` averages them by default; timm's ``ModelEmaV2`` averages every entry of the state dict,
``num_batches_tracked`` included (a float average written back into an integer, so the count trails the raw
model's), and ``ModelEmaV3`` averages the floating-point buffers and copies the integer ones (with
``exclude_buffers=True`` it copies them all); the suite's :class:`averaging.EMA` does what ``ModelEmaV3`` does.
A copy whose buffers are the raw model's describes the raw model's activations, not its own; a copy whose
wrapper stopped updating describes an older network still.

:func:`audit_averaged` compares the copy's buffers with the raw model's, layer by layer, and names the policy
they show (:data:`BUFFER_POLICIES`):

* ``copied``: the running mean and variance equal the raw model's bit for bit;
* ``averaged``: they differ from the raw model's while ``num_batches_tracked`` equals its count (the float
  buffers were averaged, the count copied), or the wrapper declares that it averages them;
* ``never updated``: at their initial values (mean 0, variance 1, count 0) while the raw model's have moved, or
  (for a wrapper that copies at each update) behind the raw model's count, with statistics that do not fit the
  copy's own weights: not updated since that count;
* ``re-estimated``: declared by the suite's provenance (:class:`averaging.BufferProvenance`, ``refresh``), or a
  count above the raw model's, which neither a copy nor an average of its buffers reaches, with statistics that
  fit the copy's own weights (the copy's median |lag| under the rule's ``lag_sigma``), whatever the wrapper
  declares: torch's SWA recipe after ``torch.optim.swa_utils.update_bn``, which resets the count to its number of
  batches;
* ``undetermined``: the buffers do not tell, said with the candidates: a count behind the raw model's with
  different statistics fits a copy frozen at that count, an average of the counts too, and a re-estimation on
  that many batches (with statistics that fit the copy's weights, a copying wrapper's trailing count leaves a
  re-estimation and a copy frozen while the weights hardly moved); a copy identical to the raw model shows no
  policy at all.

``num_batches_tracked`` is the witness: PyTorch adds one at each training-mode forward pass of a layer, so a copy
that holds a smaller count than the raw model last saw the raw model's statistics at that count. The audit
then measures the copy against its own weights with the staleness monitor (:class:`monitor.StalenessMonitor`,
the same mode gap and lag, and its rule): whatever the policy, that says whether the buffers can be used.

The command (``python -m bnrotation.audit raw.pt averaged.pt --model mynets:make_net --batches probe.pt``) exits
as every judging command does (:data:`helptext.EXIT_STATUS`, at the end of ``--help``): 0 when the copy is not
stale and one policy is named; 1 when the copy is stale, whatever its policy; 2 when, not stale, its policy is
undetermined (or mixed across layers), or on bad input, one line naming the argument or file.

Nothing here imports timm or Lightning: their wrappers are recognised by their class names and attributes.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn as nn

from .helptext import EXIT_STATUS, EXIT_UNUSABLE, exit_status, plain
from .averaging import BufferProvenance, EMA, compare_states
from .bnstats import running_stat_layers
from .inputs import (InputError, add_batch_arguments, batch_limit, load_probe, load_saved, model_from_factory,
                     one_line, parse_model_kwargs, thresholds_from)
from .checkpoints import (RAW_OF_AVERAGED, BadCheckpointError, SavedWeights, UnsafeCheckpointError, load_checkpoint,
                          read_weights, state_dict_of)
from .monitor import MonitorRecord, uncompiled
from .oneshot import measure_once, record_field
from .staleness import Thresholds

__all__ = ["BUFFER_POLICIES", "AveragedCopy", "AuditReport", "audit_averaged", "unwrap_averaged", "format_audit",
           "main"]

BUFFER_POLICIES = ("copied", "averaged", "never updated", "re-estimated", "undetermined")
# How the suite's averaging policies (averaging.POLICIES) read as buffer policies.
_SUITE_POLICY = {"copy": "copied", "average": "averaged", "mixture": "averaged", "refresh": "re-estimated"}
_COUNT = "num_batches_tracked"


# ----------------------------------------------------------------------------- what the wrapper says
@dataclass
class AveragedCopy:
    """An averaged model taken out of its wrapper.

    Attributes:
        module: the ``nn.Module`` that holds the averaged weights and its buffers.
        source: what it came from, in words (``torch AveragedModel(use_buffers=False)``).
        declared: the buffer policy the wrapper's code applies at each update (one of :data:`BUFFER_POLICIES`),
            None when nothing says (a plain module or state dict).
        updates: how many averaging updates the wrapper made (``AveragedModel.n_averaged``, ``EMA.updates``),
            None when unknown.
        count_may_trail: whether the copy's ``num_batches_tracked`` trails the raw model's without its buffers
            being frozen: the wrapper averages the count too, or (the suite's checkpoint averages) takes it from
            the newest constituent, which the raw model has trained past. Otherwise a count behind the raw
            model's means no update since.
    """

    module: nn.Module
    source: str
    declared: str | None = None
    updates: int | None = None
    count_may_trail: bool = False


def _class_names(obj) -> set[str]:
    return {k.__name__ for k in type(obj).__mro__}


def unwrap_averaged(averaged, model: nn.Module | None = None,
                    provenance: BufferProvenance | None = None) -> AveragedCopy:
    """The module an averaging wrapper holds, and the buffer policy its code declares.

    Recognises ``torch.optim.swa_utils.AveragedModel`` (``use_buffers``), timm's ``ModelEmaV2`` and ``ModelEmaV3``
    (``exclude_buffers``) and the deprecated ``ModelEma``, Lightning's ``WeightAveraging`` callback (its
    ``AveragedModel``), the suite's :class:`averaging.EMA`, a plain ``nn.Module``, and a state dict or checkpoint
    dict (an ``AveragedModel``'s, a Lightning ``.ckpt`` written with ``WeightAveraging``, whose ``state_dict`` is
    the averaged copy) loaded into a copy of ``model`` by the check's reader (:func:`inputs.load_saved`).

    Args:
        model: the architecture, needed when ``averaged`` is a state dict (not changed).
        provenance: the suite's record of the buffers (:meth:`averaging.EMA.averaged`,
            :func:`averaging.average_checkpoints`), which declares the policy.

    Raises:
        ValueError: for a Lightning callback before ``fit`` (no averaged model yet), a state dict without
            ``model``, or one that does not fit it (naming the first key).
        TypeError: for anything else.
    """
    names = _class_names(averaged)
    if isinstance(averaged, torch.optim.swa_utils.AveragedModel):
        policy = "averaged" if averaged.use_buffers else "copied"
        out = AveragedCopy(averaged.module, f"torch AveragedModel(use_buffers={averaged.use_buffers})", policy,
                           int(averaged.n_averaged), count_may_trail=averaged.use_buffers)
    elif "WeightAveraging" in names and hasattr(averaged, "_average_model"):
        if averaged._average_model is None:
            raise ValueError("averaged: the Lightning WeightAveraging callback holds no averaged model yet (it makes "
                             "one when fit starts)")
        inner = unwrap_averaged(averaged._average_model)
        out = AveragedCopy(inner.module, f"Lightning {type(averaged).__name__} ({inner.source})", inner.declared,
                           inner.updates, inner.count_may_trail)
    elif "ModelEmaV3" in names:
        excluded = bool(getattr(averaged, "exclude_buffers", False))
        out = AveragedCopy(averaged.module, f"timm ModelEmaV3(exclude_buffers={excluded})",
                           "copied" if excluded else "averaged")
    elif "ModelEmaV2" in names:
        out = AveragedCopy(averaged.module, "timm ModelEmaV2", "averaged", count_may_trail=True)
    elif "ModelEma" in names and isinstance(getattr(averaged, "ema", None), nn.Module):
        out = AveragedCopy(averaged.ema, "timm ModelEma", "averaged", count_may_trail=True)
    elif isinstance(averaged, EMA):
        out = AveragedCopy(averaged.module, f"bnrotation EMA(decay={averaged.decay})", "averaged", averaged.updates)
    elif isinstance(averaged, nn.Module):
        out = AveragedCopy(averaged, type(averaged).__name__)
    elif isinstance(averaged, Mapping):
        if model is None:
            raise ValueError("averaged: a state dict needs model= (the architecture to load it into)")
        module, saved = _loaded(model, averaged, "averaged")  # as the averaging helper saved it: the check's reader
        out = AveragedCopy(module, saved.kind, updates=saved.updates)
    else:
        raise TypeError(f"averaged: expected an AveragedModel, a timm ModelEmaV2/V3, a Lightning WeightAveraging "
                        f"callback, a bnrotation EMA, an nn.Module or a state dict; got {type(averaged).__name__}")
    if provenance is not None:  # what the suite did, in its words: it wins over what the buffers alone suggest
        out.declared = _SUITE_POLICY.get(provenance.policy, out.declared)
        out.count_may_trail = out.count_may_trail or provenance.policy in ("average", "mixture")
        out.source += f"; provenance: {provenance.source}"
    return out


def _raw_module(raw, template: nn.Module, averaged) -> nn.Module:
    """The raw model as a module: itself, or ``template``'s architecture holding ``raw``'s state (or, for
    ``raw=None``, the raw state a Lightning ``WeightAveraging`` checkpoint keeps as ``current_model_state``)."""
    if raw is None:
        raw = _raw_of(averaged)
        if raw is None:
            raise ValueError("raw: None is only for a Lightning WeightAveraging checkpoint, which holds the raw "
                             f"model under {RAW_OF_AVERAGED!r}")
    if isinstance(raw, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        raw = raw.module
    if isinstance(raw, nn.Module):
        return uncompiled(raw)
    if not isinstance(raw, Mapping):
        raise TypeError(f"raw: expected an nn.Module or a state dict, got {type(raw).__name__}")
    held = _raw_of(raw)  # a WeightAveraging checkpoint: its raw model
    return _loaded(template, raw if held is None else held, "raw")[0]


def _raw_of(contents) -> dict[str, torch.Tensor] | None:
    """The raw model's state dict that a checkpoint holds beside its averaged copy (Lightning's
    ``WeightAveraging``: :attr:`checkpoints.SavedWeights.raw`), or None when it holds none."""
    if not isinstance(contents, Mapping):
        return None
    try:
        return read_weights(contents).raw
    except BadCheckpointError:
        return None


def _loaded(template: nn.Module, contents: Mapping, argument: str) -> tuple[nn.Module, SavedWeights]:
    """A copy of ``template`` holding ``contents`` and what was read (:func:`inputs.load_saved`, the check's reader:
    checkpoint entries, averaging helpers' layouts, wrapper prefixes, one-line errors), its errors
    (:class:`inputs.InputError`) naming ``argument``."""
    module = copy.deepcopy(template)
    try:
        saved = load_saved(module, contents)
    except InputError as err:
        raise InputError(argument, err.message) from None
    return module, saved


# ----------------------------------------------------------------------------- the evidence, layer by layer
def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes, dtypes and values, NaN equal to NaN (a diverged raw model copied is still copied)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    b = b.to(a.device)
    return bool(((a == b) | (a.isnan() & b.isnan())).all()) if a.is_floating_point() else torch.equal(a, b)


def _at_initial_values(m: nn.Module) -> bool:
    """Running mean 0, running variance 1 and count 0 (or none): what ``reset_running_stats`` leaves."""
    count = getattr(m, _COUNT, None)
    return (bool((m.running_mean == 0).all()) and bool((m.running_var == 1).all())
            and (count is None or int(count) == 0))


def _layer_evidence(raw: nn.Module, avg: nn.Module) -> tuple[str, tuple[str, ...], str]:
    """(policy, candidates, reason) that one layer's buffers show, before any declaration is read."""
    c_raw, c_avg = getattr(raw, _COUNT, None), getattr(avg, _COUNT, None)
    c_raw = None if c_raw is None else int(c_raw)
    c_avg = None if c_avg is None else int(c_avg)
    if _same_bits(avg.running_mean, raw.running_mean) and _same_bits(avg.running_var, raw.running_var):
        return "copied", (), "running mean and variance equal the raw model's bit for bit"
    if _at_initial_values(avg) and not _at_initial_values(raw):
        return "never updated", (), (f"at their initial values (mean 0, variance 1, count 0) while the raw model's "
                                     f"have moved (count {c_raw})")
    if c_raw is not None and c_raw == c_avg:
        return "averaged", (), (f"differ from the raw model's with the same count {c_raw}: the statistics were "
                                "averaged and the count copied")
    if c_raw is None or c_avg is None:
        return "undetermined", ("averaged", "never updated"), ("differ from the raw model's, and no "
                                                               "num_batches_tracked says since when")
    if c_avg < c_raw:
        return "undetermined", ("never updated", "averaged", "re-estimated"), (
            f"differ from the raw model's and hold count {c_avg} against its {c_raw}: frozen since the raw model's "
            f"batch {c_avg}, averaged with their counts, or re-estimated on {c_avg} batch{'es' * (c_avg != 1)}")
    return "undetermined", ("re-estimated",), (f"hold count {c_avg}, more than the raw model's {c_raw}: the raw model "
                                               "is not their source, or they were re-estimated")


def _resolve(observed: str, candidates: tuple[str, ...], declared: str | None,
             count_may_trail: bool, fit: str = "") -> tuple[str, tuple[str, ...], str]:
    """The layer's policy once the wrapper's declaration is read, the candidates left when it is ``undetermined``,
    and what the declaration adds to the reason.

    ``fit``: "" when the copy's statistics do not fit its own weights, else the evidence that they do (its median
    |lag| under the rule's threshold, in words). A copy that holds a count the raw model's buffers never had, yet
    fits its own weights, was re-estimated after its last update, as ``torch.optim.swa_utils.update_bn`` does
    (it resets the count to its number of batches): its count alone then reads like a frozen copy's.
    """
    update_bn = "as torch.optim.swa_utils.update_bn leaves them"
    if observed == "copied" and declared not in (None, "copied"):
        return "copied", candidates, f"; the wrapper declares {declared!r}, yet these are the raw model's"
    if observed in ("copied", "never updated"):
        return observed, candidates, ""
    if candidates == ("re-estimated",) and fit:  # whatever the wrapper declares: neither a copy nor an average of
        # the raw model's buffers can hold a count above its own
        return "re-estimated", candidates, f"; they {fit}: re-estimated after the last averaging update ({update_bn})"
    if declared is None:
        return observed, candidates, ""
    if declared == "copied":
        copies = "; the wrapper copies rather than averages them"
        if observed == "averaged":  # the raw model's count, other statistics: not a copy, and the wrapper averages none
            if fit:
                return "re-estimated", (), (f"{copies}, and they {fit}: re-estimated after its last update on as many "
                                            f"batches as the raw model saw ({update_bn})")
            return "undetermined", ("re-estimated",), (f"{copies}: re-estimated on as many batches as the raw model "
                                                       "saw, or not this raw model's copy")
        if "never updated" in candidates and fit:  # what the fit leaves of the count's three readings
            return "undetermined", ("re-estimated", "never updated"), (
                f"{copies}, and they {fit}: re-estimated on these weights after its last update ({update_bn}), or "
                "frozen since that count while the weights hardly moved")
        if "never updated" in candidates:
            return "never updated", candidates, ("; the wrapper copies the buffers at each update: they were not "
                                                 "updated since its last one")
        return "undetermined", candidates, "; the wrapper declares 'copied', yet they differ from the raw model's"
    if declared == "averaged" and not count_may_trail and "never updated" in candidates:
        return "never updated", candidates, ("; the wrapper copies num_batches_tracked at each update: it has made "
                                             "none since that count")
    if declared == "averaged" and (observed == "averaged" or (count_may_trail and "averaged" in candidates)):
        return "averaged", candidates, ("; the wrapper averages the buffers"
                                        + (", its count trails" if count_may_trail else ""))
    if declared == "re-estimated":
        return "re-estimated", candidates, "; the provenance records a re-estimation on these weights"
    return "undetermined", candidates, f"; the wrapper declares {declared!r}, which the buffers do not show"


# ----------------------------------------------------------------------------- the report
@dataclass
class AuditReport:
    """What :func:`audit_averaged` found.

    Attributes:
        policy: the buffer policy of the whole copy, one of :data:`BUFFER_POLICIES`, or ``mixed`` when its layers
            differ (see :attr:`layers`).
        candidates: for ``undetermined``, the policies the buffers fit.
        since_count: for ``never updated``, the copy's ``num_batches_tracked`` (the smallest over its layers): its
            buffers were last the raw model's at that count of the raw model's training-mode passes (0: never).
        reason: the evidence, one sentence.
        source: what was audited, and what its wrapper declares.
        declared: the policy the wrapper's code declares, None when nothing does.
        updates: the wrapper's number of averaging updates, None when unknown.
        same_weights: whether the copy's parameters equal the raw model's (then no policy shows: ``undetermined``).
        layers: one line per BatchNorm layer: ``norm_layer``, ``policy``, ``count_raw``, ``count_copy``,
            ``same_as_raw`` (bit for bit), ``lag_median_abs_sigma`` and ``lag_max_abs_sigma`` of the copy against
            its own weights, ``lag_median_abs_sigma_raw`` of the raw model against its own (σ).
        copy, raw: the monitor's records (:class:`monitor.MonitorRecord`) of the copy and of the raw model on the
            probe, each against its own weights.
        thresholds: the rule that judged them.

    ``stale``, ``mode_gap``, ``acc_eval_mode`` and ``lag_sigma`` (its ``worst_median_lag_sigma``) read
    :attr:`copy` (:func:`oneshot.record_field`).
    """

    policy: str
    candidates: tuple[str, ...]
    since_count: int | None
    reason: str
    source: str
    declared: str | None
    updates: int | None
    same_weights: bool
    layers: pd.DataFrame
    copy: MonitorRecord
    raw: MonitorRecord
    thresholds: Thresholds

    stale = record_field("copy", "stale", bool)  # the monitor's rule on the copy: its buffers do not fit its weights
    mode_gap = record_field("copy", "mode_gap")
    acc_eval_mode = record_field("copy", "acc_eval_mode")
    lag_sigma = record_field("copy", "worst_median_lag_sigma")  # the copy's lag against its own weights
    undetermined = record_field("copy", "undetermined")  # why the rule could not judge the copy, or ""

    @property
    def judged(self) -> bool:
        """Whether the audit could name one policy (not ``undetermined`` or ``mixed``)."""
        return self.policy in BUFFER_POLICIES and self.policy != "undetermined"


def _grouped(reasons: list[str], names: list[str], shown: int = 3) -> str:
    """The audit's reason: the one reason every layer gives, or each distinct reason once, after the layers that
    give it (the first ``shown`` named, then how many more)."""
    groups: dict[str, list[str]] = {}
    for name, why in zip(names, reasons):
        groups.setdefault(why, []).append(name)
    if len(groups) == 1:
        return reasons[0]

    def named(layers: list[str]) -> str:
        more = f" and {len(layers) - shown} more" if len(layers) > shown else ""
        return f"layer{'s' * (len(layers) > 1)} {', '.join(layers[:shown])}{more}"

    return f"{len(names)} layers: " + "; ".join(f"{named(layers)}: {why}" for why, layers in groups.items())


def _whole(policies: list[str], candidates: list[tuple[str, ...]]) -> tuple[str, tuple[str, ...]]:
    kinds = set(policies)
    if len(kinds) == 1:
        policy = kinds.pop()
        shared = tuple(c for c in candidates[0] if all(c in other for other in candidates))
        return policy, shared if policy == "undetermined" else ()
    return "mixed", ()


# The lint's line when its only finding on the copy is frozen-weights-training-bn (bnrotation.lint.findings_line):
# true of every averaged copy, whose parameters no optimizer steps, so the audit does not warn of it.
COPY_IS_FROZEN = r"(?s)BatchNorm settings: \d+ finding\(s\) under 1 rule\(s\).*\[frozen-weights-training-bn\]"


@torch.no_grad()
def audit_averaged(raw, averaged, probe, *, model: nn.Module | None = None,
                   provenance: BufferProvenance | None = None, thresholds: Thresholds = Thresholds(),
                   input_key: str | None = "input", target_key: str = "target") -> AuditReport:
    """Which buffer policy an averaged copy holds, and its own mode gap and lag against its own weights.

    Args:
        raw: the raw (trained) model: an ``nn.Module`` or a state dict / checkpoint dict of ``averaged``'s
            architecture; None for a Lightning ``WeightAveraging`` checkpoint, which holds it.
        averaged: the copy: a ``torch.optim.swa_utils.AveragedModel``, timm ``ModelEmaV2``/``ModelEmaV3``, a
            Lightning ``WeightAveraging`` callback, a :class:`averaging.EMA`, an ``nn.Module``, or a state dict or
            checkpoint dict (:func:`unwrap_averaged`).
        probe: the batch to measure on, as :class:`monitor.StalenessMonitor` takes it (a tensor (N, ...),
            ``(x, y)``, a mapping, several of them, or a :class:`.probe_batch.CheckedProbe`), from the training
            distribution; with labels the mode gap is an accuracy gap.
        model: the architecture, when both ``raw`` and ``averaged`` are state dicts.
        provenance: the suite's record of the copy's buffers, which declares its policy.
        thresholds: the monitor's rule (:class:`monitor.Thresholds`).

    Returns:
        An :class:`AuditReport`. Neither model is changed: the monitor leaves every buffer, parameter and flag
        as it found them.

    Raises:
        ValueError: for inputs :func:`unwrap_averaged` refuses, a raw model whose BatchNorm layers are not the
            copy's (naming the first one missing), or a probe the monitor refuses.
        TypeError: for a raw model or copy of another kind.
    """
    template = model
    if isinstance(raw, Mapping) and isinstance(averaged, Mapping) and model is None:
        raise ValueError("model: two state dicts need the architecture to load them into (model=)")
    if template is None and isinstance(raw, nn.Module):
        template = raw
    held = unwrap_averaged(averaged, template, provenance)
    raw_model = _raw_module(raw, held.module, averaged)
    raw_layers = dict(running_stat_layers(raw_model))
    avg_layers = running_stat_layers(held.module)
    missing = [name for name, _ in avg_layers if name not in raw_layers]
    if missing or not avg_layers:
        raise ValueError(f"raw: no BatchNorm layer named {missing[0]!r} with running statistics, as the copy has"
                         if missing else "averaged: the copy has no BatchNorm layer with running statistics")
    diff = compare_states(raw_model.state_dict(), held.module.state_dict(), held.module)
    same_weights = diff.same_parameters
    # an averaged copy's parameters are frozen by construction, not a mistake: the lint's line on that is not shown
    # one measurement of each, at no step of a training run: no warm-up
    rec_copy = measure_once(held.module, probe, thresholds=thresholds, input_key=input_key, target_key=target_key,
                            warmup_steps=0, quiet=COPY_IS_FROZEN)
    rec_raw = measure_once(raw_model, probe, thresholds=thresholds, input_key=input_key, target_key=target_key,
                           warmup_steps=0)
    lag_copy = rec_copy.layers.set_index("norm_layer")
    lag_raw = rec_raw.layers.set_index("norm_layer")["lag_median_abs_sigma"]
    rows, policies, candidates, reasons = [], [], [], []
    for name, m in avg_layers:
        r = raw_layers[name]
        observed, cands, why = _layer_evidence(r, m)
        lag = float(lag_copy.loc[name, "lag_median_abs_sigma"])  # each layer's own is in report.layers
        fit = (f"fit the copy's own weights (median |lag| under the rule's {thresholds.lag_sigma:g}σ)"
               if provenance is None and math.isfinite(thresholds.lag_sigma) and lag < thresholds.lag_sigma else "")
        # (the suite's provenance records what was done to the buffers: no later re-estimation to read from the fit)
        policy, cands, more = _resolve(observed, cands, held.declared, held.count_may_trail, fit)
        policies.append(policy)
        candidates.append(cands if policy == "undetermined" else ())
        reasons.append(why + more)
        count = getattr(m, _COUNT, None)
        count_raw = getattr(r, _COUNT, None)
        rows.append({"norm_layer": name, "policy": policy,
                     "count_raw": -1 if count_raw is None else int(count_raw),
                     "count_copy": -1 if count is None else int(count), "same_as_raw": observed == "copied",
                     "lag_median_abs_sigma": float(lag_copy.loc[name, "lag_median_abs_sigma"]),
                     "lag_max_abs_sigma": float(lag_copy.loc[name, "lag_max_abs_sigma"]),
                     "lag_median_abs_sigma_raw": float(lag_raw.loc[name])})
    layers = pd.DataFrame(rows)
    policy, cands = _whole(policies, candidates)
    reason = _grouped(reasons, [n for n, _ in avg_layers])
    if same_weights and not diff.buffers:
        policy, cands = "undetermined", ()
        reason = ("the copy's weights and buffers equal the raw model's: no averaging step has moved it yet, so "
                  "no buffer policy shows")
    since = None
    if policy == "never updated":
        since = int(layers["count_copy"].clip(lower=0).min())
    return AuditReport(policy, cands, since, reason, held.source, held.declared, held.updates, same_weights, layers,
                       rec_copy, rec_raw, thresholds)


def format_audit(report: AuditReport, averaged: str = "", raw: str = "") -> str:
    """The printed audit (``averaged``, ``raw``: how to name them): the policy and its evidence, one line per layer,
    the copy's mode gap and lag, the verdict."""
    r, t = report, report.thresholds
    what = r.policy + (f" (candidates: {', '.join(r.candidates)})" if r.candidates else "")
    what += f", since count {r.since_count}" if r.since_count is not None else ""
    named = f"{averaged}: {r.source}" if averaged else r.source
    out = [f"Audited {named}" + (f" against {raw}" if raw else "")
           + (f", {r.updates} averaging updates" if r.updates is not None else "") + ".",
           f"Buffer policy: {what}: {r.reason}.", "",
           "| norm layer | policy | count raw | count copy | copy's median abs lag (σ) | raw's (σ) |",
           "|---|---|---:|---:|---:|---:|"]
    for _, s in r.layers.iterrows():
        out.append(f"| {s['norm_layer']} | {s['policy']} | {s['count_raw']} | {s['count_copy']} | "
                   f"{s['lag_median_abs_sigma']:.3f} | {s['lag_median_abs_sigma_raw']:.3f} |")
    c = r.copy.checks.iloc[0]
    modes = (f"training mode {c['acc_train_mode']:.1%}, evaluation mode {c['acc_eval_mode']:.1%}"
             if not math.isnan(c["acc_eval_mode"]) else f"{1 - c['mode_agreement']:.1%} of predictions change")
    out += ["", f"The copy on the probe ({int(c['probe_size'])} samples): {modes}; mode gap {r.mode_gap:.3f}, worst "
            f"median |lag| {r.lag_sigma:.3f}σ, worst median E {r.copy.worst_median_eval_error_sigma:.3f}σ (rule: "
            f"{t.mode_gap:g} and {t.eval_error_sigma:g}σ of E or {t.lag_sigma:g}σ of lag)."]
    if r.stale:
        out.append("STALE: the copy's buffers do not fit its weights; re-estimate them "
                   "(bnrotation.reestimate_if_stale) before evaluating or saving it.")
    elif r.undetermined:
        out.append(f"Undetermined: {r.undetermined}; whether the copy's buffers fit its weights is not judged.")
    else:  # "fit" only where E and |lag| are under their thresholds; a signal over its own is named, and why
        err = r.copy.worst_median_eval_error_sigma
        why = t.short_of(r.mode_gap, r.lag_sigma, err)
        if t.off(r.lag_sigma, err):
            out.append(f"Not stale: {why}.")
        else:
            out.append("Not stale: the copy's buffers fit its weights on this probe" + (f"; {why}." if why else "."))
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- the command line
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bnrotation.audit", description=plain(__doc__), epilog=EXIT_STATUS,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("raw", help="the raw model's weights (state dict or checkpoint file)")
    p.add_argument("averaged", help="the averaged copy's weights: a state dict, an AveragedModel's, a timm "
                   "checkpoint (--averaged-key state_dict_ema), a Lightning .ckpt written with WeightAveraging")
    p.add_argument("--model", required=True, help="module:function returning the nn.Module (timm:create_model)")
    p.add_argument("--model-kwargs", metavar="JSON", help="keyword arguments of the factory, a JSON object")
    p.add_argument("--raw-key", metavar="KEY", help="the raw file's entry holding its state dict")
    p.add_argument("--averaged-key", metavar="KEY", help="the averaged file's entry holding its state dict "
                   "(state_dict_ema: timm's EMA copy)")
    add_batch_arguments(p, "probe file (a tensor, an (x, y) tuple, a dict, or a list of them), or module:function "
                        "returning an iterable of batches; every batch read is the probe, pooled as re-estimation "
                        "pools them")
    return p.parse_args(argv)


def _read(path: str, key: str | None, argument: str):
    try:
        contents = load_checkpoint(path, map_location="cpu")
        if key is not None:
            contents, _ = state_dict_of(contents, key)
    except (FileNotFoundError, UnsafeCheckpointError, BadCheckpointError) as err:
        raise InputError(argument, f": {err}") from None
    return contents


def _named(err: ValueError | TypeError) -> InputError:
    """``err`` as an :class:`inputs.InputError`: itself, or its message split at the argument it starts with
    (``raw``, ``averaged``, ``model``, ``probe``)."""
    if isinstance(err, InputError):
        return err
    argument, colon, rest = str(err).partition(":")
    return InputError(argument, colon + rest) if colon else InputError("", str(err))


def main(argv: list[str] | None = None) -> int:
    """Print the audit; the exit status of every judging command (:func:`helptext.exit_status`): 0 when the copy is
    not stale and one policy was named (:attr:`AuditReport.judged`), 1 when the copy is stale
    (:attr:`AuditReport.stale`), 2 when its buffers do not tell the policy (``undetermined`` or ``mixed``), when the
    rule cannot judge the copy (:attr:`AuditReport.undetermined`: a probe too small for the gap threshold, say) or on
    bad input (one line on stderr, before any measurement)."""
    args = parse_args(argv)
    try:
        max_batches, thresholds = batch_limit(args), thresholds_from(args)
        model = model_from_factory(args.model, parse_model_kwargs(args.model_kwargs))
        raw = _read(args.raw, args.raw_key, "raw")
        averaged = _read(args.averaged, args.averaged_key, "averaged")
        try:
            raw_model = _raw_module(raw, model, averaged)
        except (ValueError, TypeError) as err:
            raise _named(err) from None
        probe, _ = load_probe(args.batches, raw_model, args.input_key, args.target_key, max_batches, "cpu")
        try:
            report = audit_averaged(raw_model, averaged, probe, model=model, thresholds=thresholds)
        except (ValueError, TypeError) as err:
            raise _named(err) from None
    except InputError as err:
        print(f"error: {one_line(str(err))}", file=sys.stderr)
        return EXIT_UNUSABLE
    def named(path: str, key: str | None) -> str:
        return f"{path} (entry {key!r})" if key else path

    print(format_audit(report, named(args.averaged, args.averaged_key), named(args.raw, args.raw_key)), end="")
    return exit_status(report.stale, not report.judged or bool(report.undetermined))


if __name__ == "__main__":
    sys.exit(main())
