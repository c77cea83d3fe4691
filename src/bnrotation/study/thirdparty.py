"""Importing timm (and what else imports torchvision) beside a CPU-only torch.

PyPI's torchvision 0.28.0 wheel is a CUDA build whose C operators do not load beside the CPU-only torch 2.13
the suite pins: ``import torchvision`` (and so ``import timm``, Lightning's torchmetrics, transformers' image
code) then fails with ``RuntimeError: operator torchvision::nms does not exist`` while registering the Python
fallbacks of ``nms``. :func:`torchvision_shim` declares the two operators' schemas when, and only when, the C
operators did not load; nothing the suite runs calls them. Call it before the first import of torchvision:

    from bnrotation.study.thirdparty import torchvision_shim
    torchvision_shim()
    import timm

The study's zoo (:mod:`bnrotation.study.zoo`) and the tests (``tests/thirdparty.py``) import timm this way.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

__all__ = ["torchvision_shim"]

_library: torch.library.Library | None = None  # kept alive: dropping it would unregister the schemas


def torchvision_shim() -> None:
    """Declare ``torchvision::nms`` and ``torchvision::qnms`` when torchvision is installed but its C operators do
    not load (once per process); nothing when torchvision is absent or its C operators load (a build that matches
    torch).

    The C library is loaded first, as ``import torchvision`` would: declaring the schemas before a working
    library loads would make the library's own registration fail. Raises nothing.
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
