"""Third-party libraries for tests: import them the same way everywhere, skip with a stated reason when absent.

PyPI's torchvision 0.28.0 wheel is a CUDA build whose C operators do not load beside the CPU-only torch 2.13
the suite pins: ``import torchvision`` (and so ``import timm``) then fails with ``RuntimeError: operator
torchvision::nms does not exist`` while registering the Python fallbacks of ``nms``. :func:`torchvision_shim`
declares the two operators' schemas when, and only when, the C operators did not load; no test calls them.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest
import torch

_library: torch.library.Library | None = None  # kept alive: dropping it would unregister the schemas


def torchvision_shim() -> None:
    """Declare ``torchvision::nms`` and ``torchvision::qnms`` when torchvision is installed but its C operators do
    not load (once); nothing when torchvision is absent or its C operators load (a build that matches torch).

    The C library is loaded first, as ``import torchvision`` would: declaring the schemas before a working
    library loads would make the library's own registration fail.
    """
    global _library
    spec = importlib.util.find_spec("torchvision")
    if spec is None or _library is not None:
        return
    try:
        for lib in Path(spec.origin).parent.glob("_C*.so"):
            torch.ops.load_library(str(lib))
        torch.ops.torchvision.nms  # noqa: B018 - resolves only when the C operators loaded
        return
    except (OSError, AttributeError, RuntimeError):
        pass
    _library = torch.library.Library("torchvision", "DEF")
    _library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def import_optional(name: str):
    """The module ``name`` (``timm``, ``lightning.pytorch``, ``safetensors.torch``, ...), after
    :func:`torchvision_shim` (timm and Lightning import torchvision); the calling test is skipped, saying why,
    when it is not installed (``make install`` installs them all from ``requirements/lock.txt``)."""
    torchvision_shim()
    try:
        return importlib.import_module(name)
    except ImportError as err:
        pytest.skip(f"{name} is not installed ({err}); make install, or pip install -e '.[test]'")


def import_timm():
    """``timm`` (:func:`import_optional`)."""
    return import_optional("timm")
