r"""Are a saved model's BatchNorm running statistics stale? The monitor's measurements on a checkpoint.

    bnrotation-check --model mynets:make_net --weights net.pt --batches batches.pt
    bnrotation-check --model timm:create_model --model-kwargs '{"model_name": "resnet18", "num_classes": 10}' \
        --weights last.pth.tar --weights-key state_dict_ema --batches batches.pt
    bnrotation-check --model transformers:ResNetForImageClassification --weights out/checkpoint-500 \
        --batches batches.pt --input-key pixel_values --target-key labels
    python -m bnrotation.check ...        (the same command)
    make check MODEL=mynets:make_net WEIGHTS=net.pt BATCHES=batches.pt

Works on any model (:mod:`bnrotation.monitor`'s semantics; nothing here knows the suite's network):

* ``--model module:function``: a factory, imported from the current directory or ``PYTHONPATH``, that
  returns the ``nn.Module``, called with the keyword arguments of ``--model-kwargs`` (a JSON object), if any.
  A Hugging Face model class (``transformers:ResNetForImageClassification``, or an ``AutoModelFor...`` class) is
  built from its config, with random weights that ``--weights`` then replaces: the ``config.json`` of the folder
  ``--weights`` names (or holds the ``--weights`` file), else the default config, with ``--model-kwargs`` as
  settings of the config
  (``'{"num_labels": 10}'``; an Auto class without a ``config.json`` needs ``model_type``). Nothing is
  downloaded;
* ``--weights file``: a ``torch.save`` file, loaded with ``torch.load(weights_only=True)``, or a
  ``.safetensors`` file (:func:`checkpoints.load_checkpoint`): a plain state dict, or a checkpoint dict holding
  it under ``"model"`` (the suite's) or ``"state_dict"`` (Lightning's ``.ckpt``, timm's training checkpoints),
  or under the entry ``--weights-key`` names (``state_dict_ema``: timm's EMA copy). A folder is read as
  ``save_pretrained`` and a Hugging Face ``Trainer`` write one (``checkpoint-500/``, or the output folder after
  ``trainer.save_model()``): its ``model.safetensors`` or ``pytorch_model.bin``, sharded or not. Keys under a
  wrapper's prefix (``module.`` of DDP, ``model.`` or ``net.`` of a LightningModule or of a model wrapped for a
  ``Trainer``) are stripped, saying so, when the rest then matches the model, and a prefix the model's own keys
  all share is added when the keys then match; ``--strip-prefix net.`` keeps only the keys under ``net.``,
  stripped;
* ``--batches``: a file (``torch.load(weights_only=True)``) holding one batch (a tensor (N, ...), an
  ``(x, y)`` tuple, or a dict with the input under ``--input-key`` and the labels under ``--target-key``) or a
  list of such batches; or ``module:function`` returning an iterable of them (a ``DataLoader``). Labels
  (class indices, (N,), within the model's outputs: the monitor's own validation of a probe) are optional, but
  all batches have them or none does. At most ``--max-batches`` are read, so an endless loader stops.

A model whose output is a mapping or a transformers ``ModelOutput`` is read through its ``logits``
(:func:`evaluation.read_logits`), and the report says so.

What it measures on those batches: it asks the monitor (:class:`monitor.StalenessMonitor`, the batches as its
probe, their fresh statistics pooled as :func:`bnstats.reestimate` pools them), re-estimates the running
statistics, asks the same monitor again, and puts the stored statistics back (:class:`CheckReport`'s ``before``
and ``after`` records, in the monitor's column schema):

* per BatchNorm layer (``norm_layer``; ``layer`` is the weight layer feeding it), the lag of the stored running
  mean behind the fresh one, ``(stored - fresh mean) / fresh σ`` (median |lag| over channels, and the worst
  channel), and E, the RMS error of the evaluation-mode normalised activation (:mod:`bnrotation.staleness`);
  every σ is the layer's own sqrt(var + eps);
* the mode gap (:func:`monitor.mode_check`): training-mode (each batch's own statistics) minus
  evaluation-mode accuracy with labels, else the share of samples whose predicted class differs between
  the modes;
* the evaluation-mode accuracy (or the mode gap) after re-estimation. Re-estimated and evaluated on the
  same batches, it is a diagnostic of the statistics, not a held-out score.

The statistics are stale when the monitor's rule (:class:`monitor.Thresholds`, the one every tool applies) fires:
the mode gap, and the worst layer's median E or median |lag|. The verdict is undetermined when the rule cannot
judge (:attr:`monitor.MonitorRecord.undetermined`): fewer samples than the mode-gap threshold needs (one sample
moves the gap by 1/N; :func:`probe_batch.smallest_probe`, 20 at the default 0.05), with one ``warning: --batches:
...`` line on stderr naming the smallest size and the argument that sets it; or, not stale, a gap or every lag
that is NaN (activations that overflow), or labelled batches the model does not classify (training-mode accuracy
within the gap threshold of a constant guess of their largest class), or batches on another scale than the
training inputs (:attr:`CheckReport.input_scale`). The exit status is the one every judging command shares
(:data:`helptext.EXIT_STATUS`, at the end of ``--help``): 0 not stale; 1 stale; 2 undetermined, or bad input,
one line naming the argument or file, before any measurement. Everything is measured in float32 whatever
autocast context :func:`check_checkpoint` is called in.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn as nn

from .helptext import EXIT_STATUS, EXIT_UNUSABLE, exit_status, plain
from .bnstats import SavedBuffers, nonfinite_state, running_stat_layers
from .evaluation import without_autocast
from .inputs import (DEFAULT_MAX_BATCHES, MESSAGE_CHARS, PRETRAINED_WEIGHTS, CheckInputError, InputError,
                     add_batch_arguments, batch_limit, build_user_model, first_line, load_batches, load_function,
                     load_probe, load_weights, model_from_factory, one_line, parse_device, parse_model_kwargs,
                     pretrained_from_config, thresholds_from)
from .monitor import MonitorRecord
from .oneshot import measure_reestimated, one_shot_monitor, record_field
from .probe_batch import smallest_probe
from .staleness import Thresholds

# The loaders live in bnrotation.inputs; these names are re-exported for the code and tests that import them from here.
__all__ = ["CheckInputError", "InputError", "CheckReport", "check_checkpoint", "format_report", "load_batches",
           "load_weights", "load_function", "model_from_factory", "build_user_model", "pretrained_from_config",
           "parse_device", "parse_model_kwargs", "probe_size_warning", "PRETRAINED_WEIGHTS", "DEFAULT_MAX_BATCHES",
           "MESSAGE_CHARS", "INPUT_SCALE_RATIO", "main"]

# The first BatchNorm layer's batch σ against its running σ beyond which the check asks whether its batches are scaled
# as the training inputs were (CheckReport.input_scale): pixels in 0-255 against inputs normalised to unit σ differ
# by about 60x; the statistics of a trained network whose weights rotated on differ by tens of percent.
INPUT_SCALE_RATIO = 10.0
ONE_CLASS = "--batches: every labelled sample is of class"  # how one_class_warning's line starts


# ----------------------------------------------------------------------------- the check
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
        rule = (f"mode gap {_against(self.mode_gap, t.mode_gap, '')} and "
                f"(worst median E {_against(err, t.eval_error_sigma, 'σ')} or "
                f"worst median |lag| {_against(lag, t.lag_sigma, 'σ', f' ({self.worst_layer})')})")
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


def _against(value: float, threshold: float, unit: str, where: str = "") -> str:
    """One of the rule's numbers against its threshold (``0.120σ (bn1) ≥ 0.1σ``), or ``not measured (NaN)``: a
    comparison with NaN is no comparison, and the line says so rather than print ``nanσ < 0.1σ``."""
    if math.isnan(value):
        return "not measured (NaN)"
    return f"{value:.3f}{unit}{where} {'≥' if value >= threshold else '<'} {threshold:g}{unit}"


@torch.no_grad()
def check_checkpoint(model: nn.Module, batches, *, weights=None, weights_key: str | None = None,
                     strip_prefix: str | None = None, thresholds: Thresholds = Thresholds(),
                     input_key: str = "input", target_key: str = "target", max_batches: int = DEFAULT_MAX_BATCHES,
                     device: str | torch.device = "cpu") -> CheckReport:
    """Measure how stale ``model``'s running statistics are on ``batches``: load, ask the monitor, re-estimate,
    ask the same monitor again (:func:`oneshot.measure_reestimated`), put the stored statistics back.

    Args:
        model: any ``nn.Module`` with BatchNorm layers that keep running statistics; moved to ``device``.
            Its buffers, parameters and flags are left as they are (the running statistics re-estimated for
            ``after`` are put back: :class:`bnstats.SavedBuffers`).
        batches: a batch file, ``module:function``, or an iterable of batches (see :func:`inputs.load_batches`).
        weights: if given, a weights file, state dict or checkpoint dict loaded first (:func:`inputs.load_weights`).
        weights_key, strip_prefix: where in ``weights`` the state dict is, and the prefix of its keys to keep
            (:func:`inputs.load_weights`'s ``key`` and ``prefix``).
        thresholds: the monitor's rule (:class:`monitor.Thresholds`).
        input_key, target_key: where a mapping batch holds the inputs and labels.
        max_batches: read at most this many batches.

    Returns:
        A :class:`CheckReport`; its ``warnings`` say what makes the verdict less sure (fewer samples than
        :func:`probe_batch.smallest_probe` of the mode-gap threshold), which the command prints on stderr.

    Raises:
        InputError: (:mod:`bnrotation.inputs`) for inputs it cannot use, before any measurement (naming the
            argument): among them parameters that hold NaN or infinite values (a diverged model, which
            re-estimation cannot mend; such running statistics are measured, and reported as stale), and batches
            the monitor would refuse as a probe (labels outside the model's outputs, among others); also for a
            model that fails on the batches.
    """
    if not running_stat_layers(model):
        raise InputError("--model", ": the model has no BatchNorm layer with running statistics "
                         "(track_running_stats=True): there are no running statistics to go stale")
    model.to(device)
    kind = load_weights(model, weights, device, weights_key, strip_prefix) if weights is not None else ""
    nonfinite = nonfinite_state(model)
    if nonfinite.parameters:
        raise InputError("--weights" if weights is not None else "--model", ": NaN or infinite values in "
                         f"{', '.join(nonfinite.parameters)}: the model itself has diverged, which "
                         "re-estimating its statistics cannot mend")
    probe, truncated = load_probe(batches, model, input_key, target_key, max_batches, device)  # read, checked once
    try:
        with without_autocast(model):  # float32 whatever autocast context the caller is in
            # the report words what the monitor would warn about (its setup warnings too: pairing, lint, probe size)
            monitor = one_shot_monitor(model, probe, thresholds=thresholds, warmup_steps=0, quiet=True)
            with SavedBuffers(monitor.model):  # the model's own running statistics are back after the block
                before, after, _ = measure_reestimated(monitor, [x for x, _ in probe.batches])
    except (RuntimeError, TypeError) as err:  # TypeError: an output without logits (read_logits)
        raise InputError("--batches", f": the model fails on the batches: {first_line(err)}") from None
    except ValueError as err:  # an uninitialised lazy BatchNorm, named by the monitor or reestimate
        raise InputError("--model", f": {err}") from None
    samples = int(before.checks["probe_size"].iloc[0])
    count = len(probe.batches)
    small = probe_size_warning(samples, thresholds.mode_gap, count, truncated)
    one = one_class_warning([y for _, y in probe.batches])
    first = next(iter(monitor.last_fresh or {}), "")  # the fresh statistics, in the order the forward pass reached them
    return CheckReport(before, after, thresholds, count, samples, probe.batches[0][1] is not None, truncated, kind,
                       tuple(w for w in (small, one) if w), probe.output_note, first)


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


# ----------------------------------------------------------------------------- the command line
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bnrotation-check", description=plain(__doc__), epilog=EXIT_STATUS,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="module:function returning the nn.Module (timm:create_model), or "
                   "a Hugging Face model class (transformers:ResNetForImageClassification), built from its config")
    p.add_argument("--model-kwargs", metavar="JSON", help="keyword arguments of the factory, a JSON object: "
                   '\'{"model_name": "resnet18", "num_classes": 10}\'; of a Hugging Face class, settings of its '
                   "config")
    p.add_argument("--weights", required=True, help="state dict or checkpoint file: torch.save (weights only), "
                   "Lightning .ckpt, timm checkpoint, .safetensors; or a Hugging Face folder (save_pretrained, a "
                   "Trainer's checkpoint-N/ or output folder)")
    p.add_argument("--weights-key", metavar="KEY", help="the checkpoint entry holding the state dict (default: the "
                   "file itself, or its 'model' or 'state_dict' entry); state_dict_ema: timm's EMA copy")
    p.add_argument("--strip-prefix", metavar="PREFIX", help="keep only the keys under this prefix, stripped (net., "
                   "module.); by default a prefix every key shares is stripped when the rest fits the model")
    add_batch_arguments(p, "batch file, or module:function returning an iterable")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, ...")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Print the report; the exit status of every judging command (:func:`helptext.exit_status`): 0 not stale, 1
    stale, 2 undetermined (:attr:`CheckReport.undetermined`) or bad input (one line on stderr). A warning
    (:attr:`CheckReport.warnings`: too few samples for the mode-gap threshold, which also makes the verdict
    undetermined) is one line on stderr, ``warning: ...``, naming what sets the size."""
    args = parse_args(argv)
    try:
        max_batches, thresholds = batch_limit(args), thresholds_from(args)
        device = parse_device(args.device)
        model, built = build_user_model(args.model, parse_model_kwargs(args.model_kwargs), args.weights)
        report = check_checkpoint(model, args.batches, weights=args.weights, weights_key=args.weights_key,
                                  strip_prefix=args.strip_prefix, thresholds=thresholds,
                                  input_key=args.input_key, target_key=args.target_key,
                                  max_batches=max_batches, device=device)
    except InputError as err:
        print(f"error: {one_line(str(err))}", file=sys.stderr)
        return EXIT_UNUSABLE
    for warning in report.warnings:  # the verdict stands; these say what makes it less sure
        print(f"warning: {one_line(warning)}", file=sys.stderr)
    print(format_report(report, f"{args.model} ({built})" if built else args.model, args.weights, args.batches),
          end="")
    return exit_status(report.stale, bool(report.undetermined))


if __name__ == "__main__":
    sys.exit(main())
