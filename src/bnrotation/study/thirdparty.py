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

``make install`` ends with ``python -m bnrotation.study.thirdparty`` (:func:`main`): it imports what the install
put there that imports torchvision (:data:`MODULES`) in a fresh interpreter; where they fail on ``torchvision::nms``,
it installs :class:`ImportHook` into the virtual environment (a copy of this file and a ``.pth`` file that loads it
at start-up, :func:`install_hook`), so that ``import torchvision`` and ``import timm`` work there without the call
above, says so in one line, and imports them again; any other failure stops the install in one line.

This file imports nothing of the suite and imports torch only when the shim runs: it is copied as it is.
"""

from __future__ import annotations

import sys

# Everything else is imported where it is used: an interpreter of an environment with the hook imports this file at
# start-up (a few milliseconds, sys alone).
__all__ = ["torchvision_shim", "ImportHook", "install_hook", "main"]

_library = None  # torch.library.Library, kept alive: dropping it would unregister the schemas
NMS = "operator torchvision::nms does not exist"  # the error of a torchvision built for another torch
MODULES = ("torchvision", "timm", "lightning", "transformers")  # those of the lock that import torchvision
HOOK = "_bnrotation_torchvision_shim"  # the copy's module name in site-packages, and its .pth file's
TROUBLESHOOTING = "docs/troubleshooting.md, \"operator torchvision::nms does not exist\""


def _declared() -> bool:
    """Whether ``torchvision::nms`` resolves: the C operators loaded, or the schemas are declared already."""
    import torch

    try:
        torch.ops.torchvision.nms  # noqa: B018 - resolves only when the operator exists
        return True
    except (AttributeError, RuntimeError):
        return False


def torchvision_shim() -> None:
    """Declare ``torchvision::nms`` and ``torchvision::qnms`` when torchvision is installed but its C operators do
    not load (once per process); nothing when torchvision is absent or its C operators load (a build that matches
    torch).

    The C library is loaded first, as ``import torchvision`` would: declaring the schemas before a working
    library loads would make the library's own registration fail. Raises nothing.
    """
    global _library
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("torchvision")
    if spec is None or _library is not None or _declared():
        return
    import torch

    try:
        for lib in Path(spec.origin).parent.glob("_C*.so"):
            torch.ops.load_library(str(lib))
    except (OSError, RuntimeError):
        pass
    if _declared():
        return
    _library = torch.library.Library("torchvision", "DEF")
    _library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


class ImportHook:
    """A meta-path finder that runs :func:`torchvision_shim` on the first ``import torchvision`` of a process, then
    steps aside (it finds nothing itself: the import goes on as usual). :func:`install_hook` puts it at the start
    of every interpreter of a virtual environment."""

    @classmethod
    def find_spec(cls, name: str, path=None, target=None):
        if name == "torchvision" and cls in sys.meta_path:
            sys.meta_path.remove(cls)
            torchvision_shim()
        return None

    @classmethod
    def install(cls) -> None:
        """Put the hook first in ``sys.meta_path`` (once)."""
        if cls not in sys.meta_path:
            sys.meta_path.insert(0, cls)


def install_hook(site_packages):
    """Copy this file into ``site_packages`` as ``<HOOK>.py`` and write ``<HOOK>.pth``, whose line installs
    :class:`ImportHook` when an interpreter of that environment starts (``site`` runs a ``.pth`` line that starts
    with ``import``). ``site_packages``: a :class:`pathlib.Path`; returns the ``.pth`` file's. Costs an
    interpreter's start-up the import of this small module."""
    import shutil

    shutil.copyfile(__file__, site_packages / f"{HOOK}.py")
    pth = site_packages / f"{HOOK}.pth"
    pth.write_text(f"import {HOOK}; {HOOK}.ImportHook.install()\n")
    return pth


def import_error(modules: tuple[str, ...] = MODULES) -> str | None:
    """The last line of what ``import <modules>`` prints in a fresh interpreter of this environment (those of
    ``modules`` that are installed), or None when they import."""
    import importlib.util
    import subprocess

    names = [m for m in modules if importlib.util.find_spec(m) is not None]
    done = subprocess.run([sys.executable, "-c", f"import {', '.join(names)}"], capture_output=True, text=True,
                          timeout=600)
    lines = done.stderr.strip().splitlines()
    return None if done.returncode == 0 else (lines[-1] if lines else f"exit status {done.returncode}")


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def main() -> int:
    """``make install``'s last check (see the module's docstring). Exit status 0 when :data:`MODULES` import,
    with the hook installed where it was needed (one line says so); 1 with one line naming the fix otherwise."""
    import sysconfig
    from pathlib import Path

    site = Path(sysconfig.get_paths()["purelib"])
    if (site / f"{HOOK}.pth").exists():  # installed before: brought up to this file
        install_hook(site)
    error = import_error()
    if error is None:
        return 0
    if NMS not in error:
        print(f"make install: the installed packages do not import: {error}", file=sys.stderr)
        return 1
    pth = install_hook(site)
    torch, vision = _version("torch"), _version("torchvision")
    error = import_error()
    if error is not None:
        print(f"make install: torchvision {vision} is a build for another torch than {torch} and the shim did not "
              f"help ({error}); install the torchvision built for torch {torch} ({TROUBLESHOOTING})", file=sys.stderr)
        return 1
    print(f"make install: torchvision {vision} is a build for another torch than {torch} (its C operators do not "
          f"load); {pth} declares torchvision::nms and qnms without kernels on torchvision's first import, so that "
          f"{', '.join(MODULES)} import (torchvision.ops.nms cannot run; {TROUBLESHOOTING})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
