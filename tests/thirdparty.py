"""Third-party libraries for tests: import them the same way everywhere, skip with a stated reason when absent.

The torchvision shim that ``import timm`` needs beside the suite's CPU-only torch is the library's
(:func:`bnrotation.study.thirdparty.torchvision_shim`), imported here so that the tests' imports stay as they were.
"""

from __future__ import annotations

import importlib

import pytest

from bnrotation.study.thirdparty import torchvision_shim

__all__ = ["torchvision_shim", "import_optional", "import_timm"]


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
