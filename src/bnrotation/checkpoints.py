"""Saving and loading checkpoints: weights and buffers, never pickled code.

A checkpoint of the suite is a plain dict of tensors and simple values (``step``, ``row``, ``seed``, ``model``:
a state dict), written atomically. Loading uses ``torch.load(weights_only=True)``, so a file that needs
arbitrary code to unpickle is refused instead of executed; ``.safetensors`` files are read with the
``safetensors`` package (an optional dependency, imported only for them).

What other tools save is read too (:func:`state_dict_of`): a plain state dict; a dict holding it under
``"model"`` (the suite), ``"state_dict"`` (Lightning's ``.ckpt``, timm's training checkpoints, which also hold
the EMA copy under ``"state_dict_ema"``), or any entry named; and keys under a wrapper's prefix
(``module.`` of ``DistributedDataParallel``, ``model.`` or ``net.`` of a ``LightningModule`` attribute,
``_orig_mod.`` of ``torch.compile``), which :func:`strip_prefix` removes. What the averaging helpers save is read as
saved (:func:`read_weights`): ``torch.optim.swa_utils.AveragedModel``'s state dict (its module's keys under
``module.``, beside ``n_averaged``, with ``use_buffers`` or without), Lightning's ``WeightAveraging`` checkpoint (the
averaged copy under ``state_dict``, its ``n_averaged`` under ``averaging_state``, the raw model under
``current_model_state``), timm's ``ModelEmaV3`` state dict (its module's keys under ``module.``, stripped as a
wrapper's prefix).

Only torch is imported here (not pyarrow, not Hydra): the checkpoint check runs on the bare package.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pickle
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["BadCheckpointError", "UnsafeCheckpointError", "checkpoint_path", "save_checkpoint", "load_checkpoint",
           "state_dict_of", "state_of", "Checkpoint", "strip_prefix", "shared_prefixes", "few", "STATE_DICT_ENTRIES",
           "OTHER_COPIES", "SAFE_GLOBALS", "SavedWeights", "read_weights", "AVERAGED_COUNT", "AVERAGED_PREFIX",
           "RAW_OF_AVERAGED"]

# Entries that hold a model's state dict in the checkpoint dicts of common tools, in the order they are tried:
# the suite's own ("model"), Lightning's and timm's ("state_dict").
STATE_DICT_ENTRIES = ("model", "state_dict")
# Other copies of the weights a checkpoint may hold beside them (timm: the EMA of the weights), named in notes.
OTHER_COPIES = ("state_dict_ema", "model_ema")
# torch.optim.swa_utils.AveragedModel's state dict: its module's keys under AVERAGED_PREFIX, beside AVERAGED_COUNT, the
# number of averaging updates (a buffer). Lightning's WeightAveraging saves that count under "averaging_state" and the
# raw model's state dict under RAW_OF_AVERAGED, beside the averaged copy's under "state_dict".
AVERAGED_COUNT, AVERAGED_PREFIX, RAW_OF_AVERAGED = "n_averaged", "module.", "current_model_state"
# Plain containers of values that checkpoints of common tools pickle, rebuilt by the weights-only unpickler without
# running code: timm's training scripts save their arguments as an argparse.Namespace.
SAFE_GLOBALS = [argparse.Namespace]
_ZIP, _PICKLE = b"PK\x03\x04", b"\x80"  # torch.save's zip archive; its legacy format, a pickle (protocol >= 2)


class UnsafeCheckpointError(ValueError):
    """A checkpoint holds objects that only arbitrary code could rebuild; it was not loaded."""


class BadCheckpointError(ValueError):
    """A checkpoint file is truncated, corrupt or not a torch (or safetensors) checkpoint at all; or it holds
    no state dict where one was looked for."""


def few(items: Iterable, n: int = 3) -> str:
    """``'a', 'b', 'c' and 119 more``: a long list of names cut to its first ``n``, for one-line messages."""
    items = [str(i) for i in items]
    shown = ", ".join(repr(i) for i in items[:n])
    return shown + (f" and {len(items) - n} more" if len(items) > n else "")


def checkpoint_path(run_dir: str | os.PathLike, step: int) -> Path:
    """``<run_dir>/checkpoints/step=<step>.pt``."""
    return Path(run_dir) / "checkpoints" / f"step={step}.pt"


def save_checkpoint(path: str | os.PathLike, model: torch.nn.Module, **meta) -> None:
    """Write ``{"model": state_dict, **meta}`` atomically; ``meta`` holds ints, floats, strings."""
    from .records import atomic_write_bytes  # records imports pyarrow, which loading must not need

    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), **meta}, buf)
    atomic_write_bytes(path, buf.getvalue())


def _is_safetensors(head: bytes) -> bool:
    """A safetensors file: an 8-byte little-endian header length, then the JSON header, which opens with ``{``."""
    return len(head) >= 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < 100_000_000


def _not_a_checkpoint(path: Path, head: bytes) -> BadCheckpointError:
    try:
        text = head.decode("utf-8")
        looks = f"it begins like text: {text[:24]!r}" if text.isprintable() or "\n" in text else ""
    except UnicodeDecodeError:
        looks = ""
    return BadCheckpointError(f"{path}: unreadable checkpoint: not a torch (torch.save) or safetensors file"
                              + (f" ({looks})" if looks else ""))


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint: ``torch.load(weights_only=True)`` for a file ``torch.save`` wrote (with
    :data:`SAFE_GLOBALS` allowed), or ``safetensors.torch.load_file`` for a ``.safetensors`` file (told apart by
    their first bytes, not the name).

    Raises:
        FileNotFoundError: naming the file.
        UnsafeCheckpointError: naming the file and the object it would have to
            rebuild, if unpickling it would need arbitrary code.
        BadCheckpointError: naming the file, in one line, if it is truncated, not a torch or safetensors file
            (a text file, say), or a safetensors file while the ``safetensors`` package is not installed.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint")
    with open(path, "rb") as f:
        head = f.read(64)
    if _is_safetensors(head):
        return _load_safetensors(path, map_location)
    if not (head.startswith(_ZIP) or head.startswith(_PICKLE)):
        raise _not_a_checkpoint(path, head)
    try:
        with _safe_globals(SAFE_GLOBALS):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
        if "Weights only load failed" not in str(err) or not found:
            raise BadCheckpointError(f"{path}: unreadable checkpoint, truncated or corrupt "
                                     f"({_reason(err)})") from err
        raise UnsafeCheckpointError(
            f"{path}: refused: loading it would run arbitrary code (it pickles {found.group(1)}, not only tensors "
            "and plain values); checkpoints are loaded with torch.load(weights_only=True). Load it with "
            "weights_only=False yourself only if you trust where it came from") from None
    except (RuntimeError, EOFError, KeyError, ValueError, OSError) as err:  # what torch raises for a damaged file
        raise BadCheckpointError(f"{path}: unreadable checkpoint, truncated or not a torch file "
                                 f"({type(err).__name__}: {_reason(err)})") from err


def _safe_globals(allowed: list) -> contextlib.AbstractContextManager:
    """``torch.serialization.safe_globals(allowed)``: the classes ``torch.load(weights_only=True)`` may rebuild,
    for this load only. Torch 2.4 has no such context manager (it came with 2.5), only the process-wide
    ``add_safe_globals``, which this calls instead."""
    scoped = getattr(torch.serialization, "safe_globals", None)
    if scoped is not None:
        return scoped(allowed)
    torch.serialization.add_safe_globals(allowed)
    return contextlib.nullcontext()


def _reason(err: BaseException) -> str:
    """The first line of an error, without torch's advice to load with ``weights_only=False``."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    lines = [ln for ln in lines if "weights_only" not in ln and not ln.startswith(("Weights only load failed",
                                                                                    "(1)", "(2)", "Check the"))]
    return lines[0][:200] if lines else type(err).__name__


def _load_safetensors(path: Path, map_location: str | torch.device) -> dict:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise BadCheckpointError(f"{path}: a safetensors file; reading it needs the safetensors package "
                                 "(pip install safetensors)") from None
    try:
        return load_file(path, device=str(map_location))
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types for a damaged file
        raise BadCheckpointError(f"{path}: unreadable safetensors file ({type(err).__name__}: "
                                 f"{_reason(err)})") from err


# ----------------------------------------------------------------------------- the state dict inside
def _is_state_dict(obj) -> bool:
    return isinstance(obj, Mapping) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def state_dict_of(contents, key: str | None = None) -> tuple[dict[str, torch.Tensor], str]:
    """The state dict in a loaded checkpoint, and where it was found, for the report.

    Args:
        contents: what :func:`load_checkpoint` returned (or a model's ``state_dict()``).
        key: the entry that holds the state dict (``"state_dict_ema"`` for timm's EMA copy); None: the
            contents themselves when every value is a tensor, else the first of :data:`STATE_DICT_ENTRIES`.

    Returns:
        ``(state dict, description)``; the description reads ``"a state dict"`` or ``"a checkpoint dict, its
        'state_dict' entry"`` (the other copies of the weights it holds, :data:`OTHER_COPIES`, are named by the
        commands' reader, :func:`bnrotation.inputs.load_weights`, with the ``--weights-key`` that checks each).

    Raises:
        BadCheckpointError: in one line, when ``key`` is not an entry or holds no state dict, or when no state dict
            is found; naming a few of the entries there are.
    """
    if not isinstance(contents, Mapping):
        raise BadCheckpointError(f"holds a {type(contents).__name__}; expected a state dict (a dict of tensors) "
                                 "or a checkpoint dict holding one")
    if key is not None:
        if key not in contents:
            raise BadCheckpointError(f"has no entry {key!r}; its entries: {few(contents, 6)}")
        if not _is_state_dict(contents[key]):
            raise BadCheckpointError(f"its entry {key!r} is not a state dict (a dict of tensors): "
                                     f"{_describe(contents[key])}")
        return dict(contents[key]), f"a checkpoint dict, its {key!r} entry"
    if _is_state_dict(contents):
        return dict(contents), "a state dict"
    for entry in STATE_DICT_ENTRIES:
        if _is_state_dict(contents.get(entry)):
            return dict(contents[entry]), f"a checkpoint dict, its {entry!r} entry"
    raise BadCheckpointError(f"holds no state dict: a dict of {len(contents)} entries ({few(contents, 6)}), "
                             f"none of them {' or '.join(map(repr, STATE_DICT_ENTRIES))} holding one")


@dataclass(frozen=True)
class SavedWeights:
    """A model's state dict as a tool saved it, read (:func:`read_weights`).

    Attributes:
        state: the model's state dict (key -> tensor), an averaging wrapper's ``module.`` prefix and its
            ``n_averaged`` removed; otherwise :attr:`found`.
        found: the state dict as found in the file (:func:`state_dict_of`), for a prefix the user names
            (``--strip-prefix``), which applies to the keys as saved.
        kind: where :attr:`found` was, in words (:func:`state_dict_of`'s description: ``"a state dict"``).
        averaged: "" for a state dict no averaging helper wrote, else what wrote it and what was read, in words
            (``", torch AveragedModel's: its module's keys under 'module.', beside n_averaged 6"``), to follow
            :attr:`kind` in a report.
        removed: the prefix removed from :attr:`found`'s keys to give :attr:`state`'s (``"module."``), else "".
        updates: the averaging updates the helper made (``n_averaged``); None when no helper says.
        raw: the raw model's state dict that the file holds beside the averaged copy (Lightning's
            ``current_model_state``); None when it holds none.
    """

    state: dict[str, torch.Tensor]
    found: dict[str, torch.Tensor]
    kind: str
    averaged: str = ""
    removed: str = ""
    updates: int | None = None
    raw: dict[str, torch.Tensor] | None = None


def read_weights(contents, key: str | None = None) -> SavedWeights:
    """The state dict in a loaded checkpoint (:func:`state_dict_of`), read as the averaging helper that wrote it
    saved it, with no flag:

    * ``torch.optim.swa_utils.AveragedModel(...).state_dict()`` (with ``use_buffers=True`` or not: the same keys):
      every key but :data:`AVERAGED_COUNT` under :data:`AVERAGED_PREFIX`; :attr:`SavedWeights.state` is the
      module's keys, :attr:`SavedWeights.updates` the count;
    * a Lightning checkpoint written with the ``WeightAveraging`` callback: the averaged copy under
      ``state_dict`` (read by default, as any Lightning checkpoint is), ``averaging_state`` holding its
      ``n_averaged``, the raw model under :data:`RAW_OF_AVERAGED` (:attr:`SavedWeights.raw`);
    * anything else (timm's ``ModelEmaV3``'s state dict, whose ``module.`` prefix is a wrapper's prefix like
      ``DistributedDataParallel``'s, among them) as :func:`state_dict_of` finds it.

    Args:
        contents: what :func:`load_checkpoint` returned, or a model's ``state_dict()``.
        key: the entry that holds the state dict (:func:`state_dict_of`); the averaging helpers' layouts are read
            in that entry as in the file itself.

    Raises:
        BadCheckpointError: as :func:`state_dict_of`.
    """
    found, kind = state_dict_of(contents, key)
    state, averaged, removed, updates, raw = found, "", "", None, None
    rest = [k for k in found if k != AVERAGED_COUNT]
    if AVERAGED_COUNT in found and rest and all(k.startswith(AVERAGED_PREFIX) and len(k) > len(AVERAGED_PREFIX)
                                                for k in rest):
        updates, removed = int(found[AVERAGED_COUNT]), AVERAGED_PREFIX
        state = {k[len(AVERAGED_PREFIX):]: found[k] for k in rest}
        averaged = (f", torch AveragedModel's: its module's keys under {AVERAGED_PREFIX!r}, beside {AVERAGED_COUNT} "
                    f"{updates}")
    averaging = contents.get("averaging_state") if kind.endswith("'state_dict' entry") else None
    if isinstance(averaging, Mapping):
        count = averaging.get(AVERAGED_COUNT)
        updates = int(count) if isinstance(count, (torch.Tensor, int)) else None
        held = contents.get(RAW_OF_AVERAGED)
        raw = dict(held) if _is_state_dict(held) else None
        averaged = (", the averaged copy Lightning's WeightAveraging saves there"
                    + (f" ({AVERAGED_COUNT} {updates})" if updates is not None else "")
                    + (f"; the raw model is under {RAW_OF_AVERAGED!r} (--weights-key {RAW_OF_AVERAGED})"
                       if raw is not None else ""))
    return SavedWeights(state, found, kind, averaged, removed, updates, raw)


# A model, a state dict, or a checkpoint dict (:func:`save_checkpoint`'s, or another tool's: :func:`state_dict_of`).
Checkpoint = torch.nn.Module | Mapping


def state_of(checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    """The state dict of a model (its ``state_dict()``), of a state dict, or of a checkpoint dict (the entry
    :func:`state_dict_of` finds: ``"model"``, ``"state_dict"``).

    Raises:
        TypeError: for anything else, saying what it holds.
    """
    if isinstance(checkpoint, torch.nn.Module):
        return checkpoint.state_dict()
    try:
        return state_dict_of(checkpoint)[0]
    except BadCheckpointError as err:
        raise TypeError(f"cannot read a state dict from a {type(checkpoint).__name__}: it {err}; expected a model, "
                        "a state dict, or a checkpoint dict with a 'model' entry") from None


def _describe(obj) -> str:
    if isinstance(obj, Mapping):
        return f"a dict of {len(obj)} entries ({few(obj)})"
    return f"a {type(obj).__name__}"


def shared_prefixes(keys: Iterable[str]) -> list[str]:
    """The dotted prefixes every key starts with, shortest first: ``["module.", "module.net."]`` for keys
    ``module.net.conv.weight, module.net.bn.weight``; a prefix leaves a non-empty name of every key."""
    split = [k.split(".") for k in keys]
    if not split:
        return []
    out, depth = [], 0
    while all(len(parts) > depth + 1 for parts in split) and len({parts[depth] for parts in split}) == 1:
        depth += 1
        out.append(".".join(split[0][:depth]) + ".")
    return out


def strip_prefix(state: Mapping[str, torch.Tensor], prefix: str) -> tuple[dict[str, torch.Tensor], int]:
    """The entries of ``state`` whose key starts with ``prefix``, with it removed, and how many other entries
    were left out (a ``LightningModule``'s other attributes, a loss's buffers)."""
    kept = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix) and len(k) > len(prefix)}
    return kept, len(state) - len(kept)

