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

What it measures on those batches:

* per BatchNorm layer, the lag of the stored running mean behind the fresh one, ``(stored - fresh mean) /
  fresh std`` in σ (median |lag| over channels, and the worst channel), where the fresh statistics are those
  re-estimated on the batches (:func:`bnstats.reestimate` on a copy: the definition ``make diagnose``
  uses; on a single batch they equal the monitor's batch statistics of its probe);
* the mode gap (:func:`monitor.mode_check`): training-mode (each batch's own statistics) minus
  evaluation-mode accuracy with labels, else the share of samples whose predicted class differs between
  the modes;
* the evaluation-mode accuracy (or the mode gap) after re-estimation. Re-estimated and evaluated on the
  same batches, it is a diagnostic of the statistics, not a held-out score.

The statistics are stale when the monitor's rule (:class:`monitor.Thresholds`) fires on the mode gap and
the worst layer's median |lag|; the verdict is undetermined when, not stale, the gap or every lag is NaN
(activations that overflow). The exit status is the one every judging command shares
(:data:`helptext.EXIT_STATUS`, at the end of ``--help``): 0 not stale; 1 stale; 2 undetermined, or bad input,
one line naming the argument or file, before any measurement. Fewer samples than the mode-gap threshold needs
(one sample moves the gap by 1/N; :func:`monitor.smallest_probe`, 20 at the default 0.05) are still judged, with
one ``warning: --batches: ...`` line on stderr naming the smallest size and the argument that sets it.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import itertools
import json
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.nn as nn

from .helptext import EXIT_STATUS, EXIT_UNUSABLE, exit_status, plain
from .bnstats import NonFinite, nonfinite_state, reestimate, running_stat_layers, running_stats
from .checkpoints import (OTHER_COPIES, BadCheckpointError, UnsafeCheckpointError, few, load_checkpoint,
                          shared_prefixes, state_dict_of, strip_prefix)
from .study.interventions import layer_lags
from .monitor import Thresholds, evaluation_forward, find_pairs, mode_check, smallest_probe, split_probe
from .monitor import _check_probe as check_probe  # the monitor's validation of a probe, applied to every batch
from .probes import batch_statistics_pass

__all__ = ["CheckInputError", "CheckReport", "check_checkpoint", "format_report", "load_batches", "load_weights",
           "model_from_factory", "build_model", "pretrained_from_config", "probe_size_warning", "PRETRAINED_WEIGHTS",
           "main"]

DEFAULT_MAX_BATCHES = 100
# What a Hugging Face folder (save_pretrained, a Trainer's checkpoint-N/ or output folder) holds its weights in, in the
# order tried; each may be sharded, its shards listed in "<name>.index.json".
PRETRAINED_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")  # module:function
MESSAGE_CHARS = 300  # an error line is cut to this many characters


class CheckInputError(ValueError):
    """An argument of the check cannot be used; the message names it (``--model``, ``--weights``,
    ``--batches``) and what is wrong, in one line."""


# ----------------------------------------------------------------------------- inputs
def load_function(spec: str, argument: str):
    """The object named by ``module:function`` (a dotted attribute path after the colon), imported with the
    current directory on ``sys.path``.

    Raises:
        CheckInputError: naming ``argument`` when ``spec`` is not ``module:function``, the module does not
            import, it has no such attribute, or the attribute is not callable.
    """
    if not SPEC.fullmatch(spec or ""):
        raise CheckInputError(f"{argument} {spec!r}: expected module:function (e.g. mynets:make_net)")
    module_name, attribute = spec.split(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and module_name.split(".")[0] != err.name.split(".")[0]:
            raise CheckInputError(f"{argument} {spec}: {module_name!r} was found but failed while importing: "
                                  f"ModuleNotFoundError: {_first_line(err)}") from None
        raise CheckInputError(f"{argument} {spec}: cannot find {module_name!r} in the current directory or "
                              f"PYTHONPATH ({_first_line(err)})") from None
    except Exception as err:  # noqa: BLE001 - any import failure is the argument's problem
        raise CheckInputError(f"{argument} {spec}: {module_name!r} was found but failed while importing "
                              f"({type(err).__name__}: {_first_line(err)}; docs/troubleshooting.md)") from None
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise CheckInputError(f"{argument} {spec}: module {module_name!r} has no {attribute!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise CheckInputError(f"{argument} {spec}: {attribute!r} is a {type(obj).__name__}, not a function")
    return obj


def parse_model_kwargs(text: str | None) -> dict:
    """The keyword arguments of ``--model-kwargs``, a JSON object; ``{}`` for None.

    Raises:
        CheckInputError: naming ``--model-kwargs`` when the text is not JSON or not an object.
    """
    if text is None:
        return {}
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as err:
        raise CheckInputError(f"--model-kwargs {text!r}: not JSON ({err}); expected an object such as "
                              '\'{"num_classes": 10}\'') from None
    if not isinstance(kwargs, dict):
        raise CheckInputError(f"--model-kwargs {text!r}: a JSON {type(kwargs).__name__}; expected an object such "
                              'as \'{"num_classes": 10}\'')
    return kwargs


def model_from_factory(spec: str, kwargs: Mapping | None = None, weights=None) -> nn.Module:
    """Call the factory ``module:function`` (``timm:create_model``, ``mynets:make_net``) with ``kwargs``; or build a
    Hugging Face model class (``transformers:ResNetForImageClassification``) from its config (:func:`build_model`).

    Raises:
        CheckInputError: as :func:`build_model`.
    """
    return build_model(spec, kwargs, weights)[0]


def build_model(spec: str, kwargs: Mapping | None = None, weights=None) -> tuple[nn.Module, str]:
    """The model ``--model spec`` names, and how it was built for the report (``""`` for a factory): the factory
    ``module:function`` called with ``kwargs``, or a Hugging Face model class built from its config
    (:func:`pretrained_from_config`: the ``config.json`` of the ``weights`` folder if it holds one, ``kwargs`` as
    the config's settings).

    Raises:
        CheckInputError: naming ``--model`` for a factory that does not import, raises (a wrong keyword
            argument included), or returns anything but an ``nn.Module`` (a model without running statistics is
            refused by :func:`check_checkpoint`); naming ``--model-kwargs`` for a setting a config lacks.
    """
    factory = load_function(spec, "--model")
    if _pretrained_class(factory):
        return pretrained_from_config(spec, factory, kwargs, weights)
    try:
        model = factory(**dict(kwargs or {}))
    except Exception as err:  # noqa: BLE001 - the user's factory failed: its problem, reported in one line
        raise CheckInputError(f"--model {spec}: the factory raised {type(err).__name__}: {_first_line(err)}") from None
    if not isinstance(model, nn.Module):
        raise CheckInputError(f"--model {spec}: the factory returned a {type(model).__name__}, not a torch.nn.Module")
    return model, ""


def _pretrained_class(obj) -> bool:
    """Whether ``obj`` is a Hugging Face model class, built from a config rather than called with keywords: a
    ``PreTrainedModel`` subclass (its ``config_class``) or an Auto class (``from_config``)."""
    if not isinstance(obj, type):
        return False
    if issubclass(obj, nn.Module):
        return isinstance(getattr(obj, "config_class", None), type) and hasattr(obj, "from_pretrained")
    return hasattr(obj, "from_config") and hasattr(obj, "_model_mapping")


def _config_file(weights) -> Path | None:
    """The ``config.json`` of a ``weights`` folder, or beside a ``weights`` file; None when there is none."""
    if not isinstance(weights, (str, os.PathLike)):
        return None
    path = Path(weights)
    found = (path if path.is_dir() else path.parent) / "config.json"
    return found if found.is_file() else None


def pretrained_from_config(spec: str, cls: type, kwargs: Mapping | None = None, weights=None) -> tuple[nn.Module, str]:
    """A Hugging Face model of class ``cls`` built from its config, with random weights (to be replaced): the
    config is the ``config.json`` of the ``weights`` folder (or beside the ``weights`` file) when there is one,
    else the class's default config, with ``kwargs`` (``--model-kwargs``) as its settings. An Auto class
    (``AutoModelForImageClassification``) reads the config's ``model_type``. Nothing is downloaded.

    Returns:
        ``(model, where the config came from)``, the latter for the report: ``"built from out/config.json"``.

    Raises:
        CheckInputError: naming ``--model-kwargs`` for a setting the config does not have, ``--model`` for an Auto
            class without a ``model_type``, or for a config or model that cannot be built (in one line).
    """
    kwargs = dict(kwargs or {})
    found = _config_file(weights)
    try:
        settings = {**(json.loads(found.read_text()) if found is not None else {}), **kwargs}
    except (OSError, json.JSONDecodeError) as err:
        raise CheckInputError(f"--weights: {found}: not a readable config ({_first_line(err)})") from None
    where = f"built from {found}" if found is not None else "built from its default config"
    where += f" with --model-kwargs {', '.join(kwargs)}" if kwargs else ""
    auto = not issubclass(cls, nn.Module)
    try:
        if auto:
            from transformers import AutoConfig
            model_type = settings.pop("model_type", None)
            if model_type is None:
                raise CheckInputError(f"--model {spec}: an Auto class needs the config's model_type: a config.json "
                                      "beside --weights, or --model-kwargs '{\"model_type\": \"resnet\", ...}'")
            config_class = type(AutoConfig.for_model(model_type))
        else:
            config_class = cls.config_class
        default = config_class()
        unknown = [k for k in kwargs if k != "model_type" and not hasattr(default, k)]
        if unknown:
            raise CheckInputError(f"--model-kwargs: {unknown[0]!r} is not a setting of {config_class.__name__} "
                                  f"(--model {spec} takes the settings of its config)")
        config = config_class.from_dict(settings)
        model = cls.from_config(config) if auto else cls(config)
    except CheckInputError:
        raise
    except Exception as err:  # noqa: BLE001 - the config or the class refused: reported in one line
        raise CheckInputError(f"--model {spec}: building it from its config raised {type(err).__name__}: "
                              f"{_first_line(err)}") from None
    return model, where


def _pretrained_weights(folder: Path, device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], str]:
    """The state dict a Hugging Face folder holds (:data:`PRETRAINED_WEIGHTS`, its shards merged), and which file.

    Raises:
        CheckInputError: naming ``--weights`` for a folder that holds none, naming the ``checkpoint-N`` folders
            a Trainer's output folder holds; for a file that cannot be loaded.
    """
    for name in PRETRAINED_WEIGHTS:
        index = folder / f"{name}.index.json"
        if (folder / name).is_file():
            files, what = [folder / name], f"its {name}"
        elif index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
                raise CheckInputError(f"--weights {index}: not a shard index with a weight_map "
                                      f"({type(err).__name__}: {_first_line(err)})") from None
            files, what = [folder / f for f in shards], f"its {name} in {len(shards)} shards"
        else:
            continue
        state: dict[str, torch.Tensor] = {}
        for f in files:
            try:
                contents = load_checkpoint(f, map_location=device)
            except (FileNotFoundError, UnsafeCheckpointError, BadCheckpointError) as err:
                raise CheckInputError(f"--weights: {err}") from None
            state.update(contents if isinstance(contents, Mapping) else {})
        return state, what
    steps = sorted((p for p in folder.glob("checkpoint-*") if p.is_dir() and p.name[len("checkpoint-"):].isdigit()),
                   key=lambda p: int(p.name[len("checkpoint-"):]))  # checkpoint-<optimizer step>, the Trainer's names
    hint = (f"; it holds the Trainer checkpoints {few([p.name for p in steps])}: name one, e.g. --weights "
            f"{steps[-1]}" if steps else "")
    raise CheckInputError(f"--weights {folder}: a folder without {' or '.join(PRETRAINED_WEIGHTS)} (sharded or "
                          f"not){hint}")


def load_weights(model: nn.Module, weights, device: str | torch.device = "cpu", key: str | None = None,
                 prefix: str | None = None) -> str:
    """Load ``weights`` (a file, an already loaded state dict or checkpoint dict, or a model) into ``model``.

    Args:
        weights: a file (:func:`checkpoints.load_checkpoint`), or a Hugging Face folder (``save_pretrained``'s, a
            ``Trainer``'s ``checkpoint-N/`` or output folder: :data:`PRETRAINED_WEIGHTS`, sharded or not).
        key: the checkpoint entry that holds the state dict (:func:`checkpoints.state_dict_of`); None: the
            contents themselves, or their ``"model"`` or ``"state_dict"`` entry.
        prefix: keep only the keys under this prefix (``"net."``), stripped. None: a prefix shared by every key
            (``module.``, ``model.``) is stripped when the keys then match the model's exactly, or a prefix every
            key of the model shares is added when they then match (a model wrapped as ``ModelLogits`` wraps it),
            and the description says which.

    Returns:
        What the weights were, for the report: ``"a state dict"``, ``"a checkpoint dict, its 'model' entry"``,
        with the prefix stripped and the other copies it holds (``state_dict_ema``) named.

    Raises:
        CheckInputError: naming ``--weights`` and the file, in one line, for a missing, unreadable or unsafe file
            (:func:`checkpoints.load_checkpoint`), a folder without :data:`PRETRAINED_WEIGHTS` (naming the
            ``checkpoint-N`` folders it holds), contents that hold no state dict (naming ``--weights-key``),
            no key under ``prefix``, or weights that do not fit the model: the first missing and the first
            unexpected key, or the first key whose shape differs, and the ``--strip-prefix`` that would fit.
    """
    where = f"--weights {weights}" if isinstance(weights, (str, os.PathLike)) else "--weights"
    folder = ""
    if isinstance(weights, (str, os.PathLike)) and Path(weights).is_dir():
        weights, folder = _pretrained_weights(Path(weights), device)
    elif isinstance(weights, (str, os.PathLike)):
        try:
            weights = load_checkpoint(weights, map_location=device)
        except (FileNotFoundError, UnsafeCheckpointError, BadCheckpointError) as err:
            raise CheckInputError(f"--weights: {err}") from None
    if isinstance(weights, nn.Module):
        weights = weights.state_dict()
    try:
        state, kind = state_dict_of(weights, key)
    except BadCheckpointError as err:
        hint = "; --weights-key names the entry that holds the state dict" if isinstance(weights, Mapping) else ""
        raise CheckInputError(f"{where}: {err}{hint}") from None
    kind = f"{folder}: {kind}" if folder else kind
    if key is None and isinstance(weights, Mapping):
        kind += "".join(f"; it also holds {k!r} (--weights-key {k} checks that copy)" for k in OTHER_COPIES
                        if k in weights)
    wanted = set(model.state_dict())
    if prefix is not None:
        kept, dropped = strip_prefix(state, prefix)
        if not kept:
            raise CheckInputError(f"{where}: --strip-prefix {prefix}: no key starts with it; its keys: "
                                  f"{few(state)}")
        state = kept
        kind += f", its keys under {prefix!r}" + (f" ({dropped} other keys left out)" if dropped else "")
    elif set(state) != wanted:
        for shared in shared_prefixes(state):
            stripped, _ = strip_prefix(state, shared)
            if set(stripped) == wanted:
                state = stripped
                kind += f", the prefix {shared!r} stripped from its keys (as --strip-prefix {shared} does)"
                break
        else:
            for shared in shared_prefixes(wanted):
                if {shared + k for k in state} == wanted:
                    state = {shared + k: v for k, v in state.items()}
                    kind += f", the prefix {shared!r} added to its keys (the model's own keys all start with it)"
                    break
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:
        found = re.search(r"size mismatch for ([^:]+): (.*?)(?:\.\n|$)", str(err))
        what = f"key {found.group(1)!r}: {found.group(2)}" if found else _first_line(err)
        raise CheckInputError(f"{where}: does not fit the model: {what}") from None
    if missing or unexpected:
        parts = [f"{label} key {keys[0]!r}" + (f" (and {len(keys) - 1} more)" if len(keys) > 1 else "")
                 for label, keys in (("missing", missing), ("unexpected", unexpected)) if keys]
        hint = _prefix_hint(state, wanted) if prefix is None else ""
        raise CheckInputError(f"{where}: does not fit the model: " + "; ".join(parts) + hint)
    return kind


def _prefix_hint(state: Mapping[str, torch.Tensor], wanted: set[str]) -> str:
    """``; its keys under 'net.' fit the model: --strip-prefix net.`` when one first component does."""
    for first in dict.fromkeys(k.split(".")[0] + "." for k in state if "." in k):
        if wanted <= set(strip_prefix(state, first)[0]):
            return f"; its keys under {first!r} fit the model: --strip-prefix {first}"
    return ""


def _items(contents, spec: str) -> list:
    """The batches in a batch file's contents: a tuple, a tensor or a mapping is one batch, a list is batches."""
    if isinstance(contents, (torch.Tensor, tuple, Mapping)):
        return [contents]
    if isinstance(contents, list):
        return contents
    raise CheckInputError(f"--batches {spec}: holds a {type(contents).__name__}; expected a tensor (N, ...), an "
                          "(x, y) tuple, a dict, or a list of them")


def load_batches(batches, input_key: str = "input", target_key: str = "target",
                 max_batches: int = DEFAULT_MAX_BATCHES, device: str | torch.device = "cpu",
                 model: nn.Module | None = None) -> tuple[list[tuple[torch.Tensor, torch.Tensor | None]], bool]:
    """The batches to measure on, as ``(x (N, ...), y (N,) or None)``, and whether there were more than
    ``max_batches`` (only the first ``max_batches`` are kept; one more is drawn to tell).

    Args:
        batches: a file name, ``module:function`` (called without arguments, returning an iterable), or an
            iterable of batches (tensors, ``(x, y)`` tuples or lists, mappings).
        model: if given, every batch is validated against it as the monitor validates its probe
            (``monitor._check_probe``: floating-point, finite inputs the model runs on, outputs with a class
            dim, labels within them).

    Raises:
        CheckInputError: naming ``--batches`` for a file that is missing, unreadable or unsafe, a factory
            that does not import or returns no iterable, no batch at all, a batch it cannot read (naming
            its index; a dict without the input key says how many keys it has and shows a few), a batch of
            fewer than 2 samples, labels that are not class indices (N,) of the model's outputs, inputs the
            model cannot run on, or batches with labels mixed with batches without.
    """
    spec = batches if isinstance(batches, (str, os.PathLike)) else "(given)"
    if isinstance(batches, (torch.Tensor, tuple, Mapping)):
        batches = _items(batches, spec)
    elif isinstance(batches, (str, os.PathLike)):
        if Path(batches).exists() or not SPEC.fullmatch(str(batches)):
            try:
                batches = _items(load_checkpoint(batches, map_location="cpu"), spec)
            except FileNotFoundError:
                raise CheckInputError(f"--batches {spec}: no such file (nor module:function)") from None
            except (UnsafeCheckpointError, BadCheckpointError) as err:
                raise CheckInputError(f"--batches: {err}") from None
        else:
            loader = load_function(str(batches), "--batches")
            try:
                batches = loader()
                iter(batches)
            except TypeError:
                raise CheckInputError(f"--batches {spec}: returned a {type(batches).__name__}, not an iterable "
                                      "of batches") from None
            except Exception as err:  # noqa: BLE001 - the user's loader failed: reported in one line
                raise CheckInputError(f"--batches {spec}: raised {type(err).__name__}: {_first_line(err)}") from None
    drawn = list(itertools.islice(batches, max_batches + 1))
    more = len(drawn) > max_batches
    out = []
    for i, batch in enumerate(drawn[:max_batches]):
        if isinstance(batch, Mapping) and not isinstance(batch.get(input_key), torch.Tensor):
            looks = ("; it looks like a state dict (weights), not a batch" if batch and all(
                isinstance(v, torch.Tensor) for v in batch.values()) and any("." in str(k) for k in batch) else "")
            entries = "1 entry" if len(batch) == 1 else f"{len(batch)} entries"
            raise CheckInputError(f"--batches {spec}: batch {i}: a dict of {entries} ({few(batch)}) "
                                  f"without a tensor under the input key {input_key!r} (--input-key){looks}")
        try:
            x, y = split_probe(batch, input_key, target_key)
        except (TypeError, ValueError) as err:
            raise CheckInputError(f"--batches {spec}: batch {i}: {err}") from None
        if len(x) < 2:
            raise CheckInputError(f"--batches {spec}: batch {i} has {len(x)} sample(s); training mode (batch "
                                  "statistics) needs at least 2")
        if y is not None and (y.dim() != 1 or y.is_floating_point() or y.is_complex()):
            raise CheckInputError(f"--batches {spec}: batch {i}: labels must be class indices, integers of shape "
                                  f"(N,), got {y.dtype} {tuple(y.shape)}")
        x, y = x.to(device), y.to(device) if y is not None else None
        if model is not None:
            try:
                check_probe(model, x, y)
            except ValueError as err:
                raise CheckInputError(f"--batches {spec}: batch {i}: {_first_line(err)}") from None
        out.append((x, y))
    if not out:
        raise CheckInputError(f"--batches {spec}: no batches")
    if len({y is None for _, y in out}) > 1:
        raise CheckInputError(f"--batches {spec}: some batches have labels and some do not (the first without: "
                              f"batch {next(i for i, (_, y) in enumerate(out) if y is None)})")
    return out, more


def parse_device(name: str) -> torch.device:
    """``torch.device(name)``, refused when it names a CUDA device this machine does not have.

    Raises:
        CheckInputError: naming ``--device``.
    """
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise CheckInputError(f"--device {name}: {_first_line(err)}") from None
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        raise CheckInputError(f"--device {name}: torch sees {torch.cuda.device_count()} CUDA device(s) here")
    return device


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


def _one_line(text: str, limit: int = MESSAGE_CHARS) -> str:
    """``text`` as one line of at most ``limit`` characters (the rest cut, ending in "…")."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


# ----------------------------------------------------------------------------- the check
def probe_size_warning(samples: int, mode_gap: float, batches: int, truncated: bool) -> str | None:
    """One line when ``samples`` are too few for the mode-gap threshold ``mode_gap`` (a fraction): one sample
    moves the gap by 1/``samples``, and above the threshold one sample alone can cross it. It names the smallest
    size (:func:`monitor.smallest_probe`, what the monitor's construction warning names) and what sets the size:
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
    """What :func:`check_checkpoint` measured.

    Attributes:
        layers: one line per BatchNorm layer with running statistics, in the model's order:
            :func:`interventions.layer_lags`'s columns (``layer`` is the norm layer, ``median_abs_lag_sigma``,
            ``worst_channel``, ``worst_lag_sigma`` in σ, ...) and ``weight_layer``, the convolution or linear
            layer feeding it (:func:`monitor.find_pairs`; "" when unpaired).
        mode_gap: with the stored statistics, training- minus evaluation-mode accuracy, or without labels the
            share of samples predicted differently in the two modes (:func:`monitor.mode_check`), a fraction.
        acc_train_mode, acc_eval_mode: accuracies over all samples (fractions; NaN without labels); training
            mode normalises each batch with its own statistics.
        mode_gap_reestimated, acc_eval_mode_reestimated: the same after re-estimation on the same batches: a
            diagnostic of the statistics, not a held-out score.
        stale: whether the thresholds' rule fires on ``mode_gap`` and :attr:`worst_median_lag_sigma`, or a running
            statistic holds NaN or infinite values.
        thresholds: the :class:`monitor.Thresholds` used.
        batches, samples: how many were measured; truncated: whether more batches were offered (``max_batches``).
        labelled: whether the batches had labels.
        weights: what the weights loaded were (:func:`load_weights`); "" when none were given.
        nonfinite: the running statistics that hold NaN or infinite values (:class:`.bnstats.NonFinite`); their
            layers' lags are NaN.
        warnings: what makes the verdict less sure without making the input unusable, one line each, naming the
            argument to change (``bnrotation-check`` prints each on stderr as ``warning: ...``): batches too few
            for the mode-gap threshold (:func:`probe_size_warning`).
        output: ``""`` for a model that returns a tensor, else the line saying that its ``logits`` were read
            (:func:`evaluation.logits_note`).
    """

    layers: pd.DataFrame
    mode_gap: float
    acc_train_mode: float
    acc_eval_mode: float
    mode_gap_reestimated: float
    acc_eval_mode_reestimated: float
    stale: bool
    thresholds: Thresholds
    batches: int
    samples: int
    labelled: bool
    truncated: bool = False
    weights: str = ""
    nonfinite: NonFinite = NonFinite()
    warnings: tuple[str, ...] = ()
    output: str = ""

    @property
    def undetermined(self) -> bool:
        """Whether the rule cannot give a verdict: not :attr:`stale`, while the mode gap or every layer's lag is NaN
        (the batches' activations overflow, say, so the fresh statistics are not finite)."""
        return not self.stale and (math.isnan(self.mode_gap) or math.isnan(self.worst_median_lag_sigma))

    @property
    def worst_median_lag_sigma(self) -> float:
        """The largest, over layers, median |lag| in σ: the lag the rule reads."""
        return float(self.layers["median_abs_lag_sigma"].max())

    @property
    def worst_layer(self) -> str:
        """The layer of :attr:`worst_median_lag_sigma`; "" when no layer's lag is finite."""
        lag = self.layers["median_abs_lag_sigma"]
        return str(self.layers.loc[lag.idxmax(), "layer"]) if lag.notna().any() else ""

    @property
    def summary(self) -> str:
        """The verdict in one line, as the report ends: ``STALE: ...`` with the rule's two numbers against their
        thresholds and what to do, ``Not stale: ...``, or ``Undetermined: ...`` (:attr:`undetermined`)."""
        t = self.thresholds
        rule = (f"mode gap {self.mode_gap:.3f} {'≥' if self.mode_gap >= t.mode_gap else '<'} {t.mode_gap:g} and "
                f"worst median |lag| {self.worst_median_lag_sigma:.3f}σ ({self.worst_layer}) "
                f"{'≥' if self.worst_median_lag_sigma >= t.lag_sigma else '<'} {t.lag_sigma:g}σ")
        advice = "Re-estimate the running statistics (bnrotation.reestimate) before evaluating or saving this model."
        if self.nonfinite:
            return (f"STALE: NaN or infinite running statistics in {self.nonfinite} (evaluation mode is unusable); "
                    f"elsewhere, {rule}. {advice}")
        if self.stale:
            return f"STALE: {rule}. {advice}"
        if self.undetermined:
            nan = [what for what, value in (("the mode gap", self.mode_gap),
                                            ("every layer's median |lag|", self.worst_median_lag_sigma))
                   if math.isnan(value)]
            return (f"Undetermined: {' and '.join(nan)} {'is' if len(nan) == 1 else 'are'} NaN, which no threshold "
                    "judges; the batches' activations may overflow (fresh statistics that are not finite).")
        return f"Not stale: {rule} (both are needed to warn)."


@torch.no_grad()
def check_checkpoint(model: nn.Module, batches, *, weights=None, weights_key: str | None = None,
                     strip_prefix: str | None = None, thresholds: Thresholds = Thresholds(),
                     input_key: str = "input", target_key: str = "target", max_batches: int = DEFAULT_MAX_BATCHES,
                     device: str | torch.device = "cpu") -> CheckReport:
    """Measure how stale ``model``'s running statistics are on ``batches``.

    Args:
        model: any ``nn.Module`` with BatchNorm layers that keep running statistics; moved to ``device``.
            Its buffers, parameters and flags are left as they are (re-estimation runs on a copy).
        batches: a batch file, ``module:function``, or an iterable of batches (see :func:`load_batches`).
        weights: if given, a weights file, state dict or checkpoint dict loaded first (:func:`load_weights`).
        weights_key, strip_prefix: where in ``weights`` the state dict is, and the prefix of its keys to keep
            (:func:`load_weights`'s ``key`` and ``prefix``).
        thresholds: when the statistics count as stale (:class:`monitor.Thresholds`).
        input_key, target_key: where a mapping batch holds the inputs and labels.
        max_batches: read at most this many batches.

    Returns:
        A :class:`CheckReport`; its ``warnings`` say what makes the verdict less sure (fewer samples than
        :func:`monitor.smallest_probe` of the mode-gap threshold), which the command prints on stderr.

    Raises:
        CheckInputError: for inputs it cannot use, before any measurement (naming the argument): among them
            parameters that hold NaN or infinite values (a diverged model, which re-estimation cannot mend; such
            running statistics are measured, and reported as stale), and batches the monitor would refuse as a
            probe (labels outside the model's outputs, among others); also for a model that fails on a batch
            (naming the batch).
    """
    if not running_stat_layers(model):
        raise CheckInputError("--model: the model has no BatchNorm layer with running statistics "
                              "(track_running_stats=True): there are no running statistics to go stale")
    model.to(device)
    kind = load_weights(model, weights, device, weights_key, strip_prefix) if weights is not None else ""
    nonfinite = nonfinite_state(model)
    if nonfinite.parameters:
        raise CheckInputError(f"{'--weights' if weights is not None else '--model'}: NaN or infinite values in "
                              f"{', '.join(nonfinite.parameters)}: the model itself has diverged, which "
                              "re-estimating its statistics cannot mend")
    data, truncated = load_batches(batches, input_key, target_key, max_batches, device, model)
    output = check_probe(model, *data[0])  # validated already: what it returns, said once in the report
    pairing = find_pairs(model, data[0][0])
    feeding = {p.norm: p.weight or "" for p in pairing.pairs + pairing.unpaired}
    out_train, out_eval = [], []
    for i, (x, _) in enumerate(data):
        try:
            out_train.append(batch_statistics_pass(model, x, [], keep_frozen=True)[0])
            out_eval.append(evaluation_forward(model, x))
        except (RuntimeError, TypeError) as err:  # TypeError: an output without logits (read_logits)
            raise CheckInputError(f"--batches: the model fails on batch {i} of shape {tuple(x.shape)}: "
                                  f"{_first_line(err)}") from None
    fresh_model = copy.deepcopy(model)
    try:
        reestimate(fresh_model, [x for x, _ in data])
    except ValueError as err:  # an uninitialised lazy BatchNorm, named by reestimate
        raise CheckInputError(f"--model: {err}") from None
    out_fresh = [evaluation_forward(fresh_model, x) for x, _ in data]
    labelled = data[0][1] is not None
    y = torch.cat([y for _, y in data]) if labelled else None
    train = torch.cat(out_train)
    stored = mode_check(0, train, torch.cat(out_eval), y).iloc[0]
    fresh = mode_check(0, train, torch.cat(out_fresh), y).iloc[0]
    layers = layer_lags(running_stats(model), running_stats(fresh_model))
    layers.insert(1, "weight_layer", layers["layer"].map(feeding).fillna(""))
    gap = float(stored["mode_gap"])
    stale = thresholds.crossed(gap, float(layers["median_abs_lag_sigma"].max())) or bool(nonfinite)
    samples = int(stored["probe_size"])
    small = probe_size_warning(samples, thresholds.mode_gap, len(data), truncated)
    return CheckReport(layers, gap, float(stored["acc_train_mode"]), float(stored["acc_eval_mode"]),
                       float(fresh["mode_gap"]), float(fresh["acc_eval_mode"]), stale, thresholds, len(data),
                       samples, labelled, truncated, kind, nonfinite, (small,) if small else (), output)


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
           "Running-mean lag = (stored − fresh mean) / fresh std, in σ; fresh: re-estimated on these batches:",
           "| norm layer | after | channels | median abs lag (σ) | worst channel | its lag (σ) |",
           "|---|---|---:|---:|---:|---:|"]
    for _, s in r.layers.iterrows():
        out.append(f"| {s['layer']} | {s['weight_layer'] or '–'} | {s['channels']} | {s['median_abs_lag_sigma']:.3f} | "
                   f"{s['worst_channel']} | {s['worst_lag_sigma']:+.3f} |")
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
    p.add_argument("--batches", required=True, help="batch file, or module:function returning an iterable")
    p.add_argument("--input-key", default="input", help="input key of a dict batch (default: input)")
    p.add_argument("--target-key", default="target", help="label key of a dict batch (default: target)")
    p.add_argument("--max-batches", type=int, default=DEFAULT_MAX_BATCHES,
                   help=f"read at most this many batches (default {DEFAULT_MAX_BATCHES})")
    p.add_argument("--mode-gap", type=float, default=Thresholds().mode_gap,
                   help=f"mode gap threshold, a fraction (default {Thresholds().mode_gap:g})")
    p.add_argument("--lag-sigma", type=float, default=Thresholds().lag_sigma,
                   help=f"worst layer's median |lag| threshold, in σ (default {Thresholds().lag_sigma:g})")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, ...")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Print the report; the exit status of every judging command (:func:`helptext.exit_status`): 0 not stale, 1
    stale, 2 undetermined (:attr:`CheckReport.undetermined`) or bad input (one line on stderr). A warning
    (:attr:`CheckReport.warnings`: too few samples for the mode-gap threshold) is one line on stderr,
    ``warning: ...``, and changes neither the report nor the status."""
    args = parse_args(argv)
    try:
        if args.max_batches < 1:
            raise CheckInputError(f"--max-batches {args.max_batches}: expected a whole number >= 1")
        try:
            thresholds = Thresholds(mode_gap=args.mode_gap, lag_sigma=args.lag_sigma)
        except ValueError as err:
            raise CheckInputError(f"{'--mode-gap' if 'mode_gap' in str(err) else '--lag-sigma'}: {err}") from None
        device = parse_device(args.device)
        model, built = build_model(args.model, parse_model_kwargs(args.model_kwargs), args.weights)
        report = check_checkpoint(model, args.batches, weights=args.weights, weights_key=args.weights_key,
                                  strip_prefix=args.strip_prefix, thresholds=thresholds,
                                  input_key=args.input_key, target_key=args.target_key,
                                  max_batches=args.max_batches, device=device)
    except CheckInputError as err:
        print(f"error: {_one_line(str(err))}", file=sys.stderr)
        return EXIT_UNUSABLE
    for warning in report.warnings:  # the verdict stands; these say what makes it less sure
        print(f"warning: {_one_line(warning)}", file=sys.stderr)
    print(format_report(report, f"{args.model} ({built})" if built else args.model, args.weights, args.batches),
          end="")
    return exit_status(report.stale, report.undetermined)


if __name__ == "__main__":
    sys.exit(main())
