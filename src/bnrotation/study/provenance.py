"""Provenance: what a run actually built and ran with, read back from the objects, not from the config.

``run.json`` holds it (:mod:`bnrotation.study.runner`); ``make table`` compares it with what the run's row means
(:func:`bnrotation.study.rows.check_against_row`), and the runner does the same before its first step. Where a
compiled run caches its code (:func:`compile_cache_per_kernel_path`) follows the same CPU kernel path. The study's:
the library keeps no run records.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

PACKAGES = ("torch", "numpy", "pandas", "pyarrow", "hydra-core", "omegaconf", "bnrotation")
# The environment variables that cap which CPU kernels torch's own (ATen) and oneDNN's code paths dispatch to.
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


def cpu_kernels() -> dict:
    """Which vector kernels this process's CPU operators run: ``capability``, torch's choice
    (``torch.backends.cpu.get_cpu_capability()``: ``DEFAULT``, ``AVX2``, ``AVX512``, ...; the machine's best
    unless ``ATEN_CPU_CAPABILITY`` lowers it), and the values of :data:`KERNEL_ENV` (None where unset).

    Float sums run in another order on another kernel path, so float32 results agree across paths only to
    rounding; bit-identity (a rerun, a resume after a stop signal) holds on one machine and one path."""
    return {"capability": torch.backends.cpu.get_cpu_capability(), **{k: os.environ.get(k) for k in KERNEL_ENV}}


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``'s ``model name`` on Linux, else :func:`platform.processor`), or None
    where neither says: beside :func:`cpu_kernels`, what tells two machines apart. The same kernel path on another
    CPU model may still sum in another order (the committed reference runs, made on an AMD EPYC, and the condition
    map's, made on an Intel Xeon, both under AVX-512, part within 100 steps)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def compile_cache_per_kernel_path() -> str:
    """Point ``torch.compile``'s on-disk cache (``TORCHINDUCTOR_CACHE_DIR``) at a folder of this process's kernel
    path, unless the variable names a folder of the user's; returns the folder.

    The cache does not tell kernel paths apart: code compiled under one (AVX-512, say) is handed to a process on
    another (``ATEN_CPU_CAPABILITY=avx2`` or ``default``), which then aborts in the compiled call or fails to
    compile it and falls back to eager. Seen here with torch 2.13 on an AVX-512 machine. Torch's own default
    folder (``torch._inductor.runtime.cache_dir_utils.default_cache_dir``) gets one subfolder per path, named
    from :func:`cpu_kernels`.

    Torch writes its default folder into ``TORCHINDUCTOR_CACHE_DIR`` itself, at the first ``torch.compile`` of
    the process (``cache_dir_utils.cache_dir``), so a value equal to that default is torch's, not the user's,
    and is replaced too; the in-memory caches that hold paths under the old folder are then cleared
    (``torch._inductor.utils.clear_caches``, as torch's own ``temporary_cache_dir`` does).
    """
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # torch's own choice of folder
    set_to = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if set_to and os.path.abspath(set_to) != os.path.abspath(default_cache_dir()):
        return set_to
    kernels = cpu_kernels()
    name = "-".join([kernels["capability"]] + [f"{k}={v}" for k in KERNEL_ENV if (v := kernels[k])])
    folder = os.path.join(default_cache_dir(), "".join(c if c.isalnum() or c in "-=_." else "_" for c in name))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    if set_to:  # torch has used its default folder in this process already
        from torch._inductor.utils import clear_caches
        clear_caches()
    return folder


def git_state() -> dict:
    """The checkout's commit and whether tracked files differ from it (None where git cannot tell)."""
    root = Path(__file__).resolve().parents[3]  # the checkout: src/bnrotation/study/provenance.py
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {"commit": commit, "dirty": dirty}


def versions() -> dict:
    """Python's and each of :data:`PACKAGES`' installed version (None where not installed)."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def describe_built(model: nn.Module, optimizer: torch.optim.Optimizer, schedule, device: torch.device) -> dict:
    """What actually runs, read back from the built objects (not from the config): the optimizer's class and
    param groups (learning rate, weight decay, projection, ...), the schedule, every normalisation layer's
    class, momentum and eps, the model's class and size, device, dtype, memory format, threads, CPU kernels
    (:func:`cpu_kernels`), versions and the git state. ``run.json`` stores it."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups = []
    for g in optimizer.param_groups:
        settings = {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()
                    if k not in ("params", "param_names")}
        settings["lr"] = g.get("initial_lr", g["lr"])
        settings["params"] = [names[id(p)] for p in g["params"]]
        groups.append(settings)
    dims = {n: p.dim() for n, p in model.named_parameters()}
    # ProjectedAdam never projects a parameter of fewer than 2 dims (norm affine, biases)
    projected = [n for g in groups if g.get("projection") in ("always", "adamp") for n in g["params"] if dims[n] >= 2]
    norms = {}
    for name, m in model.named_modules():
        if isinstance(m, _BatchNorm):
            norms[name] = {"class": type(m).__name__, "momentum": m.momentum, "eps": m.eps,
                           "track_running_stats": m.track_running_stats}
        elif isinstance(m, torch.nn.GroupNorm):
            norms[name] = {"class": type(m).__name__, "num_groups": m.num_groups, "eps": m.eps}
    weight = next((p for p in model.parameters() if p.dim() == 4), next(model.parameters()))  # a conv weight
    return {
        "model": {"class": type(model).__name__, "parameters": sum(p.numel() for p in model.parameters())},
        "optimizer": {"class": type(optimizer).__name__, "param_groups": groups},
        "projection": {"on": bool(projected), "params": projected,
                       "mode": sorted({g.get("projection") for g in groups if g.get("projection")})},
        "schedule": None if schedule is None else {"class": type(schedule).__name__,
                                                    **{k: v for k, v in vars(schedule).items()
                                                       if k in ("T_max", "eta_min")}},
        "norm_layers": norms,
        "device": str(device),
        "dtype": str(weight.dtype).replace("torch.", ""),
        "memory_format": "channels_last" if weight.is_contiguous(memory_format=torch.channels_last)
        and not weight.is_contiguous() else "contiguous",
        "threads": torch.get_num_threads(),
        "cpu_kernels": cpu_kernels(),
        "versions": versions(),
        "git": git_state(),
        "host": platform.node(),
        "cpu": cpu_model(),
    }
