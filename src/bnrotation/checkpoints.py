"""Saving and loading checkpoints: weights and buffers, never pickled code.

A checkpoint is a plain dict of tensors and simple values (``step``, ``row``,
``seed``, ``model``: a state dict), written atomically. Loading uses
``torch.load(weights_only=True)``, so a file that needs arbitrary code to
unpickle is refused instead of executed.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from pathlib import Path

import torch

from .records import atomic_write_bytes


class UnsafeCheckpointError(ValueError):
    """A checkpoint holds objects that only arbitrary code could rebuild; it was not loaded."""


class BadCheckpointError(ValueError):
    """A checkpoint file is truncated, corrupt or not a torch checkpoint at all."""


def checkpoint_path(run_dir: str | os.PathLike, step: int) -> Path:
    """``<run_dir>/checkpoints/step=<step>.pt``."""
    return Path(run_dir) / "checkpoints" / f"step={step}.pt"


def save_checkpoint(path: str | os.PathLike, model: torch.nn.Module, **meta) -> None:
    """Write ``{"model": state_dict, **meta}`` atomically; ``meta`` holds ints, floats, strings."""
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), **meta}, buf)
    atomic_write_bytes(path, buf.getvalue())


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint with ``torch.load(weights_only=True)``.

    Raises:
        FileNotFoundError: naming the file.
        UnsafeCheckpointError: naming the file and the object it would have to
            rebuild, if unpickling it would need arbitrary code.
        BadCheckpointError: naming the file, if it is truncated or not a checkpoint.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such checkpoint")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        # "Unsupported operand": not a pickle stream at all (a text or random file), not code to refuse
        if "Weights only load failed" not in str(err) or "Unsupported operand" in str(err):
            raise BadCheckpointError(f"{path}: unreadable checkpoint ({str(err).splitlines()[0]})") from err
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
        what = found.group(1) if found else "an object that is not a tensor or a plain value"
        raise UnsafeCheckpointError(
            f"{path}: refused: loading it would run arbitrary code (it pickles {what}, not only tensors and "
            "plain values); checkpoints are loaded with torch.load(weights_only=True). Load it with "
            "weights_only=False yourself only if you trust where it came from") from None
    except (RuntimeError, EOFError, KeyError, ValueError, OSError) as err:  # what torch raises for a damaged file
        raise BadCheckpointError(f"{path}: unreadable checkpoint, truncated or not a torch file "
                                 f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from err
