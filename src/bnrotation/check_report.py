"""What the checkpoint check (:mod:`bnrotation.check`) reports: :class:`CheckReport`, its verdict and its words,
the warnings on the batches it was given, and the printed report (:func:`format_report`).

The measurements are the monitor's (:class:`bnrotation.monitor.MonitorRecord`, before and after re-estimation); this
module reads them, and nothing here measures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .monitor import MonitorRecord
from .oneshot import record_field
from .probe_batch import smallest_probe
from .staleness import Thresholds

__all__ = ["CheckReport", "format_report", "probe_size_warning", "one_class_warning", "against", "INPUT_SCALE_RATIO",
           "ONE_CLASS"]

# The first BatchNorm layer's batch σ against its running σ beyond which the check asks whether its batches are scaled
# as the training inputs were (CheckReport.input_scale): pixels in 0-255 against inputs normalised to unit σ differ
# by about 60x; the statistics of a trained network whose weights rotated on differ by tens of percent.
INPUT_SCALE_RATIO = 10.0
ONE_CLASS = "--batches: every labelled sample is of class"  # how one_class_warning's line starts


def probe_size_warning(samples: int, mode_gap: float, batches: int, truncated: bool) -> str | None:
    """One line when ``samples`` are too few for the mode-gap threshold ``mode_gap`` (a fraction): one sample
    moves the gap by 1/``samples``, and above the threshold one sample alone can cross it. It names the smallest
    size (:func:`probe_batch.smallest_probe`, what the monitor's construction warning names) and what sets the size:
    ``--max-batches`` when it cut the ``batches`` read short (``truncated``), else the batches given. None when
    the size is enough."""
    smallest = smallest_probe(mode_gap)
    if samples >= smallest:
        return None
    more = (f"raise --max-batches (it stopped at {batches})" if truncated
            else "give more or larger batches in --batches")
    return (f"--batches: the mode gap is measured on {samples} samples, so one sample moves it by {1 / samples:.1%}, "
            f"more than the --mode-gap threshold of {mode_gap:g}: one sample alone can cross it; use at least "
            f"{smallest} samples ({more})")


@dataclass
class CheckReport:
    """What :func:`check_checkpoint` measured: two records of the monitor (:class:`monitor.MonitorRecord`), one
    with the stored running statistics and one after re-estimation, and the check's verdict on the first.

    Attributes:
        before: the monitor's record of the model as loaded, on every batch (the probe, pooled as
            :func:`bnstats.reestimate` pools them): its ``layers`` and ``channels`` in the monitor's column
            schema (``norm_layer`` the BatchNorm layer, ``layer`` the convolution or linear layer feeding it, ""
            when unpaired; ``lag_median_abs_sigma``, ``eval_error_median_sigma``, ...), its ``checks`` the mode
            gap and accuracies, its ``stale`` the monitor's rule (:class:`monitor.Thresholds`).
        after: the same monitor's record once the running statistics were re-estimated on the same batches (at
            step 1; the model's own statistics are put back after): a diagnostic of the statistics, not a held-out
            score.
        thresholds: the :class:`monitor.Thresholds` used.
        batches, samples: how many were measured; truncated: whether more batches were offered (``max_batches``).
        labelled: whether the batches had labels.
        weights: what the weights loaded were (:func:`inputs.load_weights`); "" when none were given.
        warnings: what makes the verdict less sure without making the input unusable, one line each, naming the
            argument to change (``bnrotation-check`` prints each on stderr as ``warning: ...``): batches too few
            for the mode-gap threshold (:func:`probe_size_warning`), labelled samples all of one class
            (:func:`one_class_warning`).
        output: ``""`` for a model that returns a tensor, else the line saying that its ``logits`` were read
            (:func:`evaluation.logits_note`).
        first_norm_layer: the BatchNorm layer the forward pass reached first (the monitor's fresh statistics are
            kept in that order), which :attr:`input_scale` reads; "" when none was reached.

    The numbers are the records' own (:func:`oneshot.record_field`): ``layers``, ``nonfinite``, ``stale``,
    ``mode_gap``, ``acc_eval_mode``, ``worst_median_lag_sigma`` and ``worst_median_eval_error_sigma`` read
    :attr:`before`; ``mode_gap_reestimated`` and ``acc_eval_mode_reestimated`` read :attr:`after`.
    """

    before: MonitorRecord
    after: MonitorRecord
    thresholds: Thresholds
    batches: int
    samples: int
    labelled: bool
    truncated: bool = False
    weights: str = ""
    warnings: tuple[str, ...] = ()
    output: str = ""
    first_norm_layer: str = ""

    layers = record_field("before", "layers")  # one line per BatchNorm layer in the model's order
    nonfinite = record_field("before", "nonfinite")
    stale = record_field("before", "stale", bool)  # the monitor's rule, with NaN or infinite statistics as stale
    mode_gap = record_field("before", "mode_gap")
    acc_eval_mode = record_field("before", "acc_eval_mode")
    mode_gap_reestimated = record_field("after", "mode_gap")  # after re-estimation on the same batches
    acc_eval_mode_reestimated = record_field("after", "acc_eval_mode")
    worst_median_lag_sigma = record_field("before", "worst_median_lag_sigma")
    worst_median_eval_error_sigma = record_field("before", "worst_median_eval_error_sigma")

    @property
    def acc_train_mode(self) -> float:
        """Training-mode accuracy over all samples (each batch's own statistics), a fraction; NaN without labels."""
        return float(self.before.checks["acc_train_mode"].iloc[0])

    @property
    def worst_layer(self) -> str:
        """The norm layer of :attr:`worst_median_lag_sigma`; "" when no layer's lag is finite."""
        lag = self.layers["lag_median_abs_sigma"]
        return str(self.layers.loc[lag.idxmax(), "norm_layer"]) if lag.notna().any() else ""

    @property
    def undetermined(self) -> str:
        """Why the rule cannot give a verdict, or "" when it can: the monitor's own reason
        (:attr:`monitor.MonitorRecord.undetermined`: a probe smaller than :func:`probe_batch.smallest_probe`, a mode gap
        that is NaN, no finite lag or E, a probe the model does not classify), or, not :attr:`stale`, every layer's
        lag NaN (the batches' activations overflow, say, so the fresh statistics are not finite) or batches that look
        like another scale than the training inputs (:attr:`input_scale`)."""
        if self.stale:
            return ""
        if self.before.undetermined:
            return self.before.undetermined
        if math.isnan(self.worst_median_lag_sigma):
            return "every layer's median |lag| is NaN; the batches' activations may overflow"
        if self.input_scale:  # the rule measured the batches' scale, not the statistics' staleness
            return self.input_scale
        return ""

    @property
    def input_scale(self) -> str:
        """A sentence when the model's first BatchNorm layer sees a batch σ more than :data:`INPUT_SCALE_RATIO`
        times its running σ, or less than its inverse (the median over channels of the fresh against the running
        σ): batches on another scale than the training inputs (pixels in 0-255 against normalised ones, say), which
        the rule reads as stale and a re-estimation on them would make worse; else "". Statistics that weight
        rotation left behind differ by a few tens of percent."""
        channels, name = self.before.channels, self.first_norm_layer
        if not name:
            return ""
        log_ratio = channels.loc[channels["norm_layer"] == name, "log_std_ratio"].median()
        if not math.isfinite(log_ratio) or abs(log_ratio) <= math.log(INPUT_SCALE_RATIO):
            return ""
        ratio = math.exp(abs(log_ratio))
        how = f"{ratio:,.0f}× its running σ" if log_ratio > 0 else f"1/{ratio:,.0f} of its running σ"
        return (f"The first BatchNorm layer ({name}) sees a batch σ {how}: are these batches scaled as the training "
                "inputs were (pixels in 0-255 against normalised ones, say, or features in other units)? If they are "
                "not, the rule measured the scale, not staleness, and re-estimating on them would fit the statistics "
                "to it.")

    @property
    def summary(self) -> str:
        """The verdict in one line, as the report ends: ``STALE: ...`` with the rule's numbers against their
        thresholds and what to do, ``Not stale: ...`` naming a signal over its threshold and why it is not enough
        (:meth:`staleness.Thresholds.short_of`), or ``Undetermined: ...`` (:attr:`undetermined`). Batches on another
        scale (:attr:`input_scale`) are never "not stale", and a stale verdict on them asks about the scale first."""
        t = self.thresholds
        lag, err = self.worst_median_lag_sigma, self.worst_median_eval_error_sigma
        rule = (f"mode gap {against(self.mode_gap, t.mode_gap, '')} and "
                f"(worst median E {against(err, t.eval_error_sigma, 'σ')} or "
                f"worst median |lag| {against(lag, t.lag_sigma, 'σ', f' ({self.worst_layer})')})")
        advice = "Re-estimate the running statistics (bnrotation.reestimate) before evaluating or saving this model."
        if any(w.startswith(ONE_CLASS) for w in self.warnings):  # the warning line says why
            advice = advice[:-1] + ", on batches of every class as in training, not these."
        if self.input_scale:
            advice = self.input_scale + " If they are: r" + advice[1:]
        if self.nonfinite:
            return (f"STALE: NaN or infinite running statistics in {self.nonfinite} (evaluation mode is unusable); "
                    f"elsewhere, {rule}. {advice}")
        if self.stale:
            return f"STALE: {rule}. {advice}"
        if self.undetermined:
            return f"Undetermined: {self.undetermined}; no verdict. Measured: {rule}."
        why = t.short_of(self.mode_gap, lag, err) or "the gap and one of the others are needed to warn"
        return f"Not stale: {rule} ({why})."


def against(value: float, threshold: float, unit: str, where: str = "") -> str:
    """One of the rule's numbers against its threshold (``0.120σ (bn1) ≥ 0.1σ``), or ``not measured (NaN)``: a
    comparison with NaN is no comparison, and the line says so rather than print ``nanσ < 0.1σ``."""
    if math.isnan(value):
        return "not measured (NaN)"
    return f"{value:.3f}{unit}{where} {'≥' if value >= threshold else '<'} {threshold:g}{unit}"


def one_class_warning(labels: list[torch.Tensor | None]) -> str | None:
    """One line when every labelled sample of the batches (labels (N_b,) each, None when unlabelled) is of one
    class: their gap cannot show an evaluation mode that collapses to that class, and statistics re-estimated on them
    describe that class alone. None otherwise, and without labels."""
    if not labels or any(y is None for y in labels):
        return None
    classes = torch.cat([y.flatten() for y in labels]).unique()
    if classes.numel() != 1:
        return None
    return (f"{ONE_CLASS} {int(classes[0])}: the mode gap cannot show an evaluation "
            "mode that predicts that class alone, and statistics re-estimated on these batches describe that class "
            "alone; give batches of every class, as in training")


# ----------------------------------------------------------------------------- the report
def format_report(report: CheckReport, model: str = "the model", weights: str = "", batches: str = "") -> str:
    """The printed report: what was read (``model``, ``weights``, ``batches``: how to name them), one line per
    layer, the mode gap and accuracies, the verdict (:attr:`CheckReport.summary`)."""
    r = report
    head = (f"Checked {model}" + (f" with {weights} ({r.weights})" if weights else "")
            + (f" on {batches}" if batches else ""))
    out = [f"{head}: {r.batches} batch{'es' * (r.batches != 1)}, {r.samples:,} samples, "
           + ("with labels" if r.labelled else "without labels")
           + (f" (stopped after the first {r.batches}: --max-batches)" if r.truncated else "") + ".",
           *([f"Note: {r.output}."] if r.output else []),
           "",
           "Running-mean lag = (stored − fresh mean) / fresh σ; E = RMS error of the evaluation-mode normalised "
           "activation, in running σ; fresh: the batch statistics of these batches, pooled as re-estimation pools "
           "them:",
           "| norm layer | after | channels | median abs lag (σ) | median E (σ) | worst channel | its lag (σ) |",
           "|---|---|---:|---:|---:|---:|---:|"]
    channels = r.before.channels
    for _, s in r.layers.iterrows():
        mine = channels[channels["norm_layer"] == s["norm_layer"]]
        worst = int(s["worst_channel"])
        lag = float(mine["lag_sigma"].iloc[worst]) if worst >= 0 else math.nan
        out.append(f"| {s['norm_layer']} | {s['layer'] or '–'} | {len(mine)} | {s['lag_median_abs_sigma']:.3f} | "
                   f"{s['eval_error_median_sigma']:.3f} | {worst} | {lag:+.3f} |")
    out.append("")
    if r.labelled:
        out += [f"Mode gap on these batches: training mode {r.acc_train_mode:.1%} (each batch's own statistics), "
                f"evaluation mode {r.acc_eval_mode:.1%}: gap {r.mode_gap:.3f}.",
                f"After re-estimation: evaluation mode {r.acc_eval_mode_reestimated:.1%} (gap "
                f"{r.mode_gap_reestimated:.3f}). Re-estimated and evaluated on the same batches: a diagnostic of the "
                "statistics, not a held-out score."]
    else:
        out += [f"Mode gap on these batches (no labels): {r.mode_gap:.1%} of the samples are predicted differently in "
                "training mode (each batch's own statistics) and evaluation mode.",
                f"After re-estimation: {r.mode_gap_reestimated:.1%}. Re-estimated and evaluated on the same batches: "
                "a diagnostic of the statistics, not a held-out score."]
    out.append(r.summary)
    return "\n".join(out) + "\n"
