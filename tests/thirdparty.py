"""Third-party libraries for tests: import them the same way everywhere, skip with a stated reason when absent.

PyPI's torchvision 0.28.0 wheel is a CUDA build whose C operators do not load beside the CPU-only torch 2.13
the suite pins: ``import torchvision`` (and so ``import timm``) then fails with ``RuntimeError: operator
torchvision::nms does not exist`` while registering the Python fallbacks of ``nms``. :func:`torchvision_shim`
declares the two operators' schemas when, and only when, the C operators did not load; no test calls them.
"""

from __future__ import annotations

import importlib

import pytest
import torch

_library: torch.library.Library | None = None  # kept alive: dropping it would unregister the schemas


def torchvision_shim() -> None:
    """Declare ``torchvision::nms`` and ``torchvision::qnms`` if torchvision's C operators are not loaded (once)."""
    global _library
    if _library is not None:
        return
    try:
        torch.ops.torchvision.nms  # noqa: B018 - resolves only when the C operators loaded
        return
    except (AttributeError, RuntimeError):
        pass
    _library = torch.library.Library("torchvision", "DEF")
    _library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def import_timm():
    """``timm``, after :func:`torchvision_shim`; the calling test is skipped, saying why, when timm is not
    installed (``pip install timm==1.0.31 torchvision==0.28.0``)."""
    torchvision_shim()
    try:
        return importlib.import_module("timm")
    except ImportError as err:
        pytest.skip(f"timm is not installed ({err}); pip install timm==1.0.31 torchvision==0.28.0")
