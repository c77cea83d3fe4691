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
import sys

import torch
import torch.nn as nn

from .helptext import EXIT_STATUS, EXIT_UNUSABLE, exit_status, plain
from .bnstats import SavedBuffers, nonfinite_state, running_stat_layers
from .evaluation import without_autocast
from .inputs import (DEFAULT_MAX_BATCHES, MESSAGE_CHARS, PRETRAINED_WEIGHTS, CheckInputError, InputError,
                     add_batch_arguments, batch_limit, build_user_model, first_line, load_batches, load_function,
                     load_probe, load_weights, model_from_factory, one_line, parse_device, parse_model_kwargs,
                     pretrained_from_config, thresholds_from)
from .check_report import (INPUT_SCALE_RATIO, ONE_CLASS, CheckReport, format_report, one_class_warning,
                           probe_size_warning)
from .oneshot import measure_reestimated, one_shot_monitor
from .probe_batch import smallest_probe
from .staleness import Thresholds

# The loaders live in bnrotation.inputs; these names are re-exported for the code and tests that import them from here.
__all__ = ["CheckInputError", "InputError", "CheckReport", "check_checkpoint", "format_report", "load_batches",
           "load_weights", "load_function", "model_from_factory", "build_user_model", "pretrained_from_config",
           "parse_device", "parse_model_kwargs", "probe_size_warning", "PRETRAINED_WEIGHTS", "DEFAULT_MAX_BATCHES",
           "MESSAGE_CHARS", "INPUT_SCALE_RATIO", "ONE_CLASS", "one_class_warning", "main"]


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
