"""What the commands read: a model from a factory, its weights, and batches, each refused in one line naming it.

The loaders of :mod:`bnrotation.check` and :mod:`bnrotation.audit` (and of any command built the same way):

* :func:`build_user_model` and :func:`model_from_factory`: ``module:function`` called with keyword arguments
  (:func:`parse_model_kwargs`), or a Hugging Face model class built from its config
  (:func:`pretrained_from_config`; nothing is downloaded);
* :func:`load_weights`: a ``torch.save`` or ``.safetensors`` file, a checkpoint dict, a Hugging Face folder,
  wrapper prefixes stripped or added (:mod:`bnrotation.checkpoints`);
* :func:`load_batches`: a batch file, ``module:function`` returning an iterable, or batches, each validated as
  the monitor validates its probe (:func:`bnrotation.probe_batch.check_probe`); :func:`load_probe`: the same, read
  and checked once, as the probe the monitor takes as it is (:class:`bnrotation.probe_batch.CheckedProbe`);
* :func:`parse_device`.

Every refusal is an :class:`InputError`, a ``ValueError`` that carries the argument it names as a field, so that
each command prints it under its own name for that argument (:meth:`InputError.named`), in one line
(:func:`one_line`).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn

from .checkpoints import (OTHER_COPIES, BadCheckpointError, SavedWeights, UnsafeCheckpointError, few, load_checkpoint,
                          read_weights, shared_prefixes, strip_prefix)
from .probe_batch import CheckedProbe, check_probe, split_probe
from .staleness import Thresholds

__all__ = ["InputError", "CheckInputError", "load_function", "parse_model_kwargs", "model_from_factory",
           "build_user_model", "pretrained_from_config", "load_weights", "load_saved", "load_batches", "load_probe",
           "parse_device", "one_line",
           "first_line", "add_batch_arguments", "batch_limit", "thresholds_from", "PRETRAINED_WEIGHTS",
           "DEFAULT_MAX_BATCHES", "MESSAGE_CHARS"]

DEFAULT_MAX_BATCHES = 100
# What a Hugging Face folder (save_pretrained, a Trainer's checkpoint-N/ or output folder) holds its weights in, in the
# order tried; each may be sharded, its shards listed in "<name>.index.json".
PRETRAINED_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")  # module:function
MESSAGE_CHARS = 300  # an error line is cut to this many characters



class InputError(ValueError):
    """An input cannot be used: which argument (:attr:`argument`) and what is wrong with it (:attr:`message`).

    Attributes:
        argument: the argument, by the check's flag (``--model``, ``--model-kwargs``, ``--weights``,
            ``--batches``, ``--device``, ...): the same input under every command; a command that names it
            otherwise (the audit's ``raw`` and ``averaged``) prints :meth:`named` with its own name.
        message: what is wrong, starting with the value when there is one and then ``": "``, as the line
            continues after the argument (``" net.pt: no such file"``, ``": no batches"``).

    ``str(err)`` is the line ``argument + message`` (``--weights net.pt: no such file``).
    """

    def __init__(self, argument: str, message: str):
        self.argument, self.message = argument, message
        super().__init__(argument + message)

    def named(self, name: str) -> str:
        """The line with the argument called ``name`` (a command's own flag for it)."""
        return name + self.message


CheckInputError = InputError  # the name the check and its callers have used


def load_function(spec: str, argument: str):
    """The object named by ``module:function`` (a dotted attribute path after the colon), imported with the
    current directory on ``sys.path``.

    Raises:
        InputError: naming ``argument`` when ``spec`` is not ``module:function``, the module does not
            import, it has no such attribute, or the attribute is not callable.
    """
    if not SPEC.fullmatch(spec or ""):
        raise InputError(argument, f" {spec!r}: expected module:function (e.g. mynets:make_net)")
    module_name, attribute = spec.split(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and module_name.split(".")[0] != err.name.split(".")[0]:
            raise InputError(argument, f" {spec}: {module_name!r} was found but failed while importing: "
                                  f"ModuleNotFoundError: {first_line(err)}") from None
        raise InputError(argument, f" {spec}: cannot find {module_name!r} in the current directory or "
                              f"PYTHONPATH ({first_line(err)})") from None
    except Exception as err:  # noqa: BLE001 - any import failure is the argument's problem
        raise InputError(argument, f" {spec}: {module_name!r} was found but failed while importing "
                              f"({type(err).__name__}: {first_line(err)}; docs/troubleshooting.md)") from None
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise InputError(argument, f" {spec}: module {module_name!r} has no {attribute!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise InputError(argument, f" {spec}: {attribute!r} is a {type(obj).__name__}, not a function")
    return obj


def parse_model_kwargs(text: str | None) -> dict:
    """The keyword arguments of ``--model-kwargs``, a JSON object; ``{}`` for None.

    Raises:
        InputError: naming ``--model-kwargs`` when the text is not JSON or not an object.
    """
    if text is None:
        return {}
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError("--model-kwargs", f" {text!r}: not JSON ({err}); expected an object such as "
                              '\'{"num_classes": 10}\'') from None
    if not isinstance(kwargs, dict):
        raise InputError("--model-kwargs", f" {text!r}: a JSON {type(kwargs).__name__}; expected an object such "
                              'as \'{"num_classes": 10}\'')
    return kwargs


def model_from_factory(spec: str, kwargs: Mapping | None = None, weights=None) -> nn.Module:
    """Call the factory ``module:function`` (``timm:create_model``, ``mynets:make_net``) with ``kwargs``; or build a
    Hugging Face model class (``transformers:ResNetForImageClassification``) from its config (:func:`build_user_model`).

    Raises:
        InputError: as :func:`build_user_model`.
    """
    return build_user_model(spec, kwargs, weights)[0]


def build_user_model(spec: str, kwargs: Mapping | None = None, weights=None) -> tuple[nn.Module, str]:
    """The model ``--model spec`` names, and how it was built for the report (``""`` for a factory): the factory
    ``module:function`` called with ``kwargs``, or a Hugging Face model class built from its config
    (:func:`pretrained_from_config`: the ``config.json`` of the ``weights`` folder if it holds one, ``kwargs`` as
    the config's settings).

    Raises:
        InputError: naming ``--model`` for a factory that does not import, raises (a wrong keyword
            argument included), or returns anything but an ``nn.Module`` (a model without running statistics is
            refused by :func:`check_checkpoint`); naming ``--model-kwargs`` for a setting a config lacks.
    """
    factory = load_function(spec, "--model")
    if _pretrained_class(factory):
        return pretrained_from_config(spec, factory, kwargs, weights)
    try:
        model = factory(**dict(kwargs or {}))
    except Exception as err:  # noqa: BLE001 - the user's factory failed: its problem, reported in one line
        raise InputError("--model", f" {spec}: the factory raised {type(err).__name__}: {first_line(err)}") from None
    if not isinstance(model, nn.Module):
        raise InputError("--model", f" {spec}: the factory returned a {type(model).__name__}, not a torch.nn.Module")
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
        InputError: naming ``--model-kwargs`` for a setting the config does not have, ``--model`` for an Auto
            class without a ``model_type``, or for a config or model that cannot be built (in one line).
    """
    kwargs = dict(kwargs or {})
    found = _config_file(weights)
    try:
        settings = {**(json.loads(found.read_text()) if found is not None else {}), **kwargs}
    except (OSError, json.JSONDecodeError) as err:
        raise InputError("--weights", f": {found}: not a readable config ({first_line(err)})") from None
    where = f"built from {found}" if found is not None else "built from its default config"
    where += f" with --model-kwargs {', '.join(kwargs)}" if kwargs else ""
    auto = not issubclass(cls, nn.Module)
    try:
        if auto:
            from transformers import AutoConfig
            model_type = settings.pop("model_type", None)
            if model_type is None:
                raise InputError("--model", f" {spec}: an Auto class needs the config's model_type: a config.json "
                                      "beside --weights, or --model-kwargs '{\"model_type\": \"resnet\", ...}'")
            config_class = type(AutoConfig.for_model(model_type))
        else:
            config_class = cls.config_class
        default = config_class()
        unknown = [k for k in kwargs if k != "model_type" and not hasattr(default, k)]
        if unknown:
            raise InputError("--model-kwargs", f": {unknown[0]!r} is not a setting of {config_class.__name__} "
                                  f"(--model {spec} takes the settings of its config)")
        config = config_class.from_dict(settings)
        model = cls.from_config(config) if auto else cls(config)
    except CheckInputError:
        raise
    except Exception as err:  # noqa: BLE001 - the config or the class refused: reported in one line
        raise InputError("--model", f" {spec}: building it from its config raised {type(err).__name__}: "
                              f"{first_line(err)}") from None
    return model, where


def _pretrained_weights(folder: Path, device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], str]:
    """The state dict a Hugging Face folder holds (:data:`PRETRAINED_WEIGHTS`, its shards merged), and which file.

    Raises:
        InputError: naming ``--weights`` for a folder that holds none, naming the ``checkpoint-N`` folders
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
                raise InputError("--weights", f" {index}: not a shard index with a weight_map "
                                      f"({type(err).__name__}: {first_line(err)})") from None
            files, what = [folder / f for f in shards], f"its {name} in {len(shards)} shards"
        else:
            continue
        state: dict[str, torch.Tensor] = {}
        for f in files:
            try:
                contents = load_checkpoint(f, map_location=device)
            except (FileNotFoundError, UnsafeCheckpointError, BadCheckpointError) as err:
                raise InputError("--weights", f": {err}") from None
            state.update(contents if isinstance(contents, Mapping) else {})
        return state, what
    steps = sorted((p for p in folder.glob("checkpoint-*") if p.is_dir() and p.name[len("checkpoint-"):].isdigit()),
                   key=lambda p: int(p.name[len("checkpoint-"):]))  # checkpoint-<optimizer step>, the Trainer's names
    hint = (f"; it holds the Trainer checkpoints {few([p.name for p in steps])}: name one, e.g. --weights "
            f"{steps[-1]}" if steps else "")
    raise InputError("--weights", f" {folder}: a folder without {' or '.join(PRETRAINED_WEIGHTS)} (sharded or "
                          f"not){hint}")


def load_weights(model: nn.Module, weights, device: str | torch.device = "cpu", key: str | None = None,
                 prefix: str | None = None) -> str:
    """Load ``weights`` into ``model`` (:func:`load_saved`), and say what they were: :func:`load_saved`'s ``kind``.

    Raises:
        InputError: as :func:`load_saved`.
    """
    return load_saved(model, weights, device, key, prefix).kind


def load_saved(model: nn.Module, weights, device: str | torch.device = "cpu", key: str | None = None,
               prefix: str | None = None) -> SavedWeights:
    """Load ``weights`` (a file, an already loaded state dict or checkpoint dict, or a model) into ``model``, read as
    the tool that wrote them saved them (:func:`checkpoints.read_weights`: torch's ``AveragedModel`` state dict,
    Lightning's ``WeightAveraging`` checkpoint, timm's ``ModelEmaV3`` state dict, without a flag); the one reader of
    the check (:func:`load_weights`) and the audit.

    Args:
        weights: a file (:func:`checkpoints.load_checkpoint`), or a Hugging Face folder (``save_pretrained``'s, a
            ``Trainer``'s ``checkpoint-N/`` or output folder: :data:`PRETRAINED_WEIGHTS`, sharded or not).
        key: the checkpoint entry that holds the state dict (:func:`checkpoints.state_dict_of`); None: the
            contents themselves, or their ``"model"`` or ``"state_dict"`` entry.
        prefix: keep only the keys under this prefix (``"net."``), stripped, of the keys as saved (an
            ``AveragedModel``'s ``module.`` too); ``""`` keeps every key as saved. None: an averaging helper's
            layout is read (:func:`checkpoints.read_weights`) unless the keys as saved are the model's own; then a
            prefix shared by every key (``module.``, ``model.``) is stripped when the keys then match the model's
            exactly, or a prefix every key of the model shares is added when they then match (a model wrapped as
            ``ModelLogits`` wraps it), and the description says which.

    Returns:
        What was read (:class:`checkpoints.SavedWeights`: the averaging helper's update count and the raw model it
        holds, if any), its ``kind`` what the weights were, for the report: ``"a state dict"``, ``"a checkpoint
        dict, its 'model' entry"``, with the averaging helper that wrote them, the prefix stripped and the other
        copies it holds (``state_dict_ema``) named.

    Raises:
        InputError: naming ``--weights`` and the file, in one line, for a missing, unreadable or unsafe file
            (:func:`checkpoints.load_checkpoint`), a folder without :data:`PRETRAINED_WEIGHTS` (naming the
            ``checkpoint-N`` folders it holds), contents that hold no state dict (naming ``--weights-key``),
            no key under ``prefix``, or weights that do not fit the model: the first missing and the first
            unexpected key, or the first key whose shape differs, and the ``--strip-prefix`` that would fit.
    """
    where = f" {weights}" if isinstance(weights, (str, os.PathLike)) else ""  # after --weights in a message
    folder = ""
    if isinstance(weights, (str, os.PathLike)) and Path(weights).is_dir():
        weights, folder = _pretrained_weights(Path(weights), device)
    elif isinstance(weights, (str, os.PathLike)):
        try:
            weights = load_checkpoint(weights, map_location=device)
        except (FileNotFoundError, UnsafeCheckpointError, BadCheckpointError) as err:
            raise InputError("--weights", f": {err}") from None
    if isinstance(weights, nn.Module):
        weights = weights.state_dict()
    try:
        saved = read_weights(weights, key)
    except BadCheckpointError as err:
        hint = "; --weights-key names the entry that holds the state dict" if isinstance(weights, Mapping) else ""
        raise InputError("--weights", f"{where}: {err}{hint}") from None
    kind = f"{folder}: {saved.kind}" if folder else saved.kind
    wanted = set(model.state_dict())
    # as the averaging helper saved it, unless a prefix is named or the keys as saved are the model's own; removed: what
    # --strip-prefix names before a prefix stripped below
    unwrap = bool(saved.removed) and prefix is None and set(saved.found) != wanted
    state, removed = (saved.state, saved.removed) if unwrap else (saved.found, "")
    kind += saved.averaged if unwrap or not saved.removed else ""
    if key is None and isinstance(weights, Mapping):
        kind += "".join(f"; it also holds {k!r} (--weights-key {k} checks that copy)" for k in OTHER_COPIES
                        if k in weights)
    if prefix is not None:
        kept, dropped = strip_prefix(state, prefix)
        if not kept:
            raise InputError("--weights", f"{where}: --strip-prefix {prefix}: no key starts with it; its keys: "
                                  f"{few(state)}")
        state = kept
        kind += (f", its keys under {prefix!r}" if prefix else ", its keys as saved (--strip-prefix '')") + (
            f" ({dropped} other keys left out)" if dropped else "")
    elif set(state) != wanted:
        for shared in shared_prefixes(state):
            stripped, _ = strip_prefix(state, shared)
            if set(stripped) == wanted:
                state = stripped
                kind += f", the prefix {shared!r} stripped from its keys (as --strip-prefix {removed}{shared} does)"
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
        what = f"key {found.group(1)!r}: {found.group(2)}" if found else first_line(err)
        raise InputError("--weights", f"{where}: does not fit the model: {what}") from None
    if missing or unexpected:
        parts = [f"{label} key {keys[0]!r}" + (f" (and {len(keys) - 1} more)" if len(keys) > 1 else "")
                 for label, keys in (("missing", missing), ("unexpected", unexpected)) if keys]
        hint = _prefix_hint(state, wanted, removed) if prefix is None else ""
        raise InputError("--weights", f"{where}: does not fit the model: " + "; ".join(parts) + hint)
    return replace(saved, state=state, kind=kind)


def _prefix_hint(state: Mapping[str, torch.Tensor], wanted: set[str], removed: str = "") -> str:
    """``; its keys under 'net.' fit the model: --strip-prefix net.`` when one first component does; ``removed``: the
    prefix already taken from the keys as saved (an ``AveragedModel``'s ``module.``), which the flag names too."""
    for first in dict.fromkeys(k.split(".")[0] + "." for k in state if "." in k):
        if wanted <= set(strip_prefix(state, first)[0]):
            return f"; its keys under {removed + first!r} fit the model: --strip-prefix {removed}{first}"
    return ""


def _items(contents, spec: str) -> list:
    """The batches in a batch file's contents: a tuple, a tensor or a mapping is one batch, a list is batches."""
    if isinstance(contents, (torch.Tensor, tuple, Mapping)):
        return [contents]
    if isinstance(contents, list):
        return contents
    raise InputError("--batches", f" {spec}: holds a {type(contents).__name__}; expected a tensor (N, ...), an "
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
            (:func:`.probe_batch.check_probe`: floating-point, finite inputs the model runs on, outputs with a class
            dim, labels within them).

    Raises:
        InputError: naming ``--batches`` for a file that is missing, unreadable or unsafe, a factory
            that does not import, returns no iterable or raises (when called, or while its batches are drawn:
            naming the batch), no batch at all, a batch it cannot read (naming
            its index; a dict without the input key says how many keys it has and shows a few), a batch of
            fewer than 2 samples, labels that are not class indices (N,) of the model's outputs, inputs the
            model cannot run on, or batches with labels mixed with batches without.
    """
    out, _, more = _read_batches(batches, input_key, target_key, max_batches, device, model)
    return out, more


def load_probe(batches, model: nn.Module, input_key: str = "input", target_key: str = "target",
               max_batches: int = DEFAULT_MAX_BATCHES,
               device: str | torch.device = "cpu") -> tuple[CheckedProbe, bool]:
    """:func:`load_batches` with ``model``, its batches held as the probe checked on ``model``
    (:class:`.probe_batch.CheckedProbe`, which :class:`.monitor.StalenessMonitor` takes without reading or checking it
    again), and whether there were more than ``max_batches``.

    Raises:
        InputError: as :func:`load_batches`, naming ``--batches``.
    """
    out, notes, more = _read_batches(batches, input_key, target_key, max_batches, device, model)
    return CheckedProbe(tuple(out), notes[0], model), more


def _read_batches(batches, input_key: str, target_key: str, max_batches: int, device: str | torch.device,
                  model: nn.Module | None) -> tuple[list[tuple[torch.Tensor, torch.Tensor | None]], list[str], bool]:
    """:func:`load_batches`'s batches, each one's :func:`.probe_batch.check_probe` line (none without ``model``),
    and whether there were more."""
    spec = batches if isinstance(batches, (str, os.PathLike)) else "(given)"
    loader = None
    if isinstance(batches, (torch.Tensor, tuple, Mapping)):
        batches = _items(batches, spec)
    elif isinstance(batches, (str, os.PathLike)):
        if Path(batches).exists() or not SPEC.fullmatch(str(batches)):
            try:
                batches = _items(load_checkpoint(batches, map_location="cpu"), spec)
            except FileNotFoundError:
                raise InputError("--batches", f" {spec}: no such file (nor module:function)") from None
            except (UnsafeCheckpointError, BadCheckpointError) as err:
                raise InputError("--batches", f": {err}") from None
        else:
            loader = load_function(str(batches), "--batches")
            try:
                batches = loader()
                iter(batches)
            except TypeError:
                raise InputError("--batches", f" {spec}: returned a {type(batches).__name__}, not an iterable "
                                      "of batches") from None
            except Exception as err:  # noqa: BLE001 - the user's loader failed: reported in one line
                raise InputError("--batches", f" {spec}: raised {type(err).__name__}: {first_line(err)}") from None
    drawn: list = []
    try:
        drawn.extend(itertools.islice(batches, max_batches + 1))
    except Exception as err:  # noqa: BLE001 - the user's loader (a generator) failed while drawn from: one line
        if loader is None:
            raise
        raise InputError("--batches", f" {spec}: batch {len(drawn)}: raised {type(err).__name__}: "
                              f"{first_line(err)}") from None
    more = len(drawn) > max_batches
    out, notes = [], []
    for i, batch in enumerate(drawn[:max_batches]):
        if isinstance(batch, Mapping) and not isinstance(batch.get(input_key), torch.Tensor):
            looks = ("; it looks like a state dict (weights), not a batch" if batch and all(
                isinstance(v, torch.Tensor) for v in batch.values()) and any("." in str(k) for k in batch) else "")
            entries = "1 entry" if len(batch) == 1 else f"{len(batch)} entries"
            raise InputError("--batches", f" {spec}: batch {i}: a dict of {entries} ({few(batch)}) "
                                  f"without a tensor under the input key {input_key!r} (--input-key){looks}")
        try:
            x, y = split_probe(batch, input_key, target_key)
        except (TypeError, ValueError) as err:
            raise InputError("--batches", f" {spec}: batch {i}: {err}") from None
        if len(x) < 2:
            raise InputError("--batches", f" {spec}: batch {i} has {len(x)} sample(s); training mode (batch "
                                  "statistics) needs at least 2")
        if y is not None and (y.dim() != 1 or y.is_floating_point() or y.is_complex()):
            raise InputError("--batches", f" {spec}: batch {i}: labels must be class indices, integers of shape "
                                  f"(N,), got {y.dtype} {tuple(y.shape)}")
        x, y = x.to(device), y.to(device) if y is not None else None
        if model is not None:
            try:
                notes.append(check_probe(model, x, y))
            except ValueError as err:
                raise InputError("--batches", f" {spec}: batch {i}: {first_line(err)}") from None
        out.append((x, y))
    if not out:
        raise InputError("--batches", f" {spec}: no batches")
    if len({y is None for _, y in out}) > 1:
        raise InputError("--batches", f" {spec}: some batches have labels and some do not (the first without: "
                              f"batch {next(i for i, (_, y) in enumerate(out) if y is None)})")
    return out, notes, more


def add_batch_arguments(p: argparse.ArgumentParser, batches_help: str) -> None:
    """The flags every judging command shares (``bnrotation-check``, ``python -m bnrotation.audit``): the batches
    to measure on (``--batches`` with ``batches_help``, ``--input-key``, ``--target-key``, ``--max-batches``) and
    the monitor's rule (``--mode-gap``, ``--lag-sigma``, ``--eval-error-sigma``: :class:`staleness.Thresholds`,
    its defaults shown). Read them back with :func:`batch_limit` and :func:`thresholds_from`."""
    t = Thresholds()
    p.add_argument("--batches", required=True, help=batches_help)
    p.add_argument("--input-key", default="input", help="input key of a dict batch (default: input)")
    p.add_argument("--target-key", default="target", help="label key of a dict batch (default: target)")
    p.add_argument("--max-batches", type=int, default=DEFAULT_MAX_BATCHES,
                   help=f"read at most this many batches (default {DEFAULT_MAX_BATCHES})")
    p.add_argument("--mode-gap", type=float, default=t.mode_gap,
                   help=f"mode gap threshold, a fraction (default {t.mode_gap:g})")
    p.add_argument("--lag-sigma", type=float, default=t.lag_sigma,
                   help=f"worst layer's median |lag| threshold, in σ (default {t.lag_sigma:g})")
    p.add_argument("--eval-error-sigma", type=float, default=t.eval_error_sigma,
                   help=f"worst layer's median E threshold, in σ (default {t.eval_error_sigma:g})")


def batch_limit(args: argparse.Namespace) -> int:
    """``--max-batches`` of :func:`add_batch_arguments`.

    Raises:
        InputError: naming ``--max-batches`` when it is below 1.
    """
    if args.max_batches < 1:
        raise InputError("--max-batches", f" {args.max_batches}: expected a whole number >= 1")
    return args.max_batches


def thresholds_from(args: argparse.Namespace) -> Thresholds:
    """The monitor's rule from the flags of :func:`add_batch_arguments`.

    Raises:
        InputError: naming the flag (``--mode-gap``, ``--lag-sigma``, ``--eval-error-sigma``) whose value
            :class:`staleness.Thresholds` refuses, with its reason.
    """
    try:
        return Thresholds(mode_gap=args.mode_gap, lag_sigma=args.lag_sigma, eval_error_sigma=args.eval_error_sigma)
    except ValueError as err:
        key = str(err).split(":")[0].removeprefix("Thresholds.")
        raise InputError("--" + key.replace("_", "-"), f": {err}") from None


def parse_device(name: str) -> torch.device:
    """``torch.device(name)``, refused when it names a CUDA device this machine does not have.

    Raises:
        InputError: naming ``--device``.
    """
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise InputError("--device", f" {name}: {first_line(err)}") from None
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        raise InputError("--device", f" {name}: torch sees {torch.cuda.device_count()} CUDA device(s) here")
    return device


def first_line(err: BaseException) -> str:
    """The first line of ``str(err)`` ("" for an empty message): what a one-line refusal quotes of an error."""
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


def one_line(text: str, limit: int = MESSAGE_CHARS) -> str:
    """``text`` as one line of at most ``limit`` characters (the rest cut, ending in "…"): how the commands
    (``bnrotation-check``, ``python -m bnrotation.audit``) print an error."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"
