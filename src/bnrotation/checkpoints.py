"""Saving and loading checkpoints: weights and buffers, never pickled code.

A checkpoint is a plain dict of tensors and simple values (``step``, ``row``,
``seed``, ``model``: a state dict), written atomically. Loading uses
``torch.load(weights_only=True)``, so a file that needs arbitrary code to
unpickle is refused instead of executed.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import torch

from .records import atomic_write_bytes


class UnsafeCheckpointError(ValueError):
    """A checkpoint holds objects that only arbitrary code could rebuild; it was not loaded."""


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
        UnsafeCheckpointError: naming the file, if unpickling it would need arbitrary code.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such checkpoint")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises UnpicklingError or RuntimeError here
        if "weights_only" in str(err) or "Unsupported global" in str(err):
            raise UnsafeCheckpointError(f"{path}: refused, it needs arbitrary code to load "
                                        f"(torch.load weights_only=True said: {str(err).splitlines()[0]})") from err
        raise
