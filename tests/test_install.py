"""What ``make install`` installed imports: torchvision and timm in a fresh interpreter of the environment, with no
shim called first (issue 51: the lock's torchvision 0.28.0 is a CUDA build beside the CPU torch 2.13.0)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig

import pytest

from bnrotation.study import thirdparty


def _run(code: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, timeout=300)


def test_the_environment_imports_torchvision_and_timm_with_nothing_called_first():
    """A user's ``.venv/bin/python -c 'import timm'`` after ``make install``: it imports (the install's last step,
    ``python -m bnrotation.study.thirdparty``, put the hook in where the C operators do not load)."""
    done = _run("import torchvision, timm")
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1:]
    assert thirdparty.import_error() is None


def test_the_hook_makes_a_torchvision_for_another_torch_import(tmp_path):
    """The hook alone, in an interpreter that reads no .pth file but those of ``tmp_path`` (``-S``, the
    environment's packages put on the path by hand): without it the import fails on ``torchvision::nms`` where the
    wheels do not match; with it, torchvision and timm import, and ``nms`` is declared, not run."""
    packages = sysconfig.get_paths()["purelib"]
    bare = f"import sys; sys.path.append({packages!r}); "
    without = _run(bare + "import torchvision, timm", "-S")
    if without.returncode == 0:
        pytest.skip("torchvision's C operators load beside this torch: there is nothing for the hook to do")
    assert thirdparty.NMS in without.stderr
    thirdparty.install_hook(tmp_path)
    assert (tmp_path / f"{thirdparty.HOOK}.py").read_text() == open(thirdparty.__file__).read()
    hooked = _run(bare + f"import site; site.addsitedir({str(tmp_path)!r}); import torchvision, timm; "
                  "import torch; print(torch.ops.torchvision.nms.default._schema)", "-S")
    assert hooked.returncode == 0, hooked.stderr[-2000:]
    assert "nms(Tensor dets, Tensor scores, float iou_threshold)" in hooked.stdout


def test_the_shim_twice_and_from_two_copies_declares_once():
    """The hook's copy and the suite's module each keep their own state: the second call finds the operator
    declared and does nothing (a second declaration would raise)."""
    code = (f"import importlib.util, sys; sys.path.insert(0, {str(sysconfig.get_paths()['purelib'])!r}); "
            f"spec = importlib.util.spec_from_file_location('copy', {thirdparty.__file__!r}); "
            "copy = importlib.util.module_from_spec(spec); spec.loader.exec_module(copy); copy.torchvision_shim(); "
            "from bnrotation.study.thirdparty import torchvision_shim; torchvision_shim(); torchvision_shim(); "
            "import timm")
    done = _run(code)
    assert done.returncode == 0, done.stderr[-2000:]
