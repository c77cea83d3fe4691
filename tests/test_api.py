"""The declared public API: what `bnrotation/__init__.py` re-exports exists, is the object its module defines, and
`import bnrotation` loads none of the suite's stack; every `__all__` in the package lists only names that exist."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys

import pytest

import bnrotation

STACK = ("hydra", "omegaconf", "pyarrow", "matplotlib", "seaborn", "submitit")


def _loaded_after(code: str) -> dict[str, bool]:
    """Which of :data:`STACK` (and torch) a fresh interpreter has imported after running ``code``."""
    probe = f"import sys, json\n{code}\nprint(json.dumps({{m: m in sys.modules for m in {[*STACK, 'torch']!r}}}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_every_public_name_imports_from_the_package_and_is_its_modules():
    assert set(bnrotation.__all__) >= {"StalenessMonitor", "Thresholds", "MonitorRecord", "find_pairs",
                                       "StaleStatisticsWarning", "reestimate", "check_checkpoint", "EMA",
                                       "average_checkpoints", "reestimate_if_stale", "GatedReestimation",
                                       "SavedBuffers", "audit_averaged", "AuditReport", "BUFFER_POLICIES"}
    assert set(bnrotation.__all__) >= {"lint_batchnorm", "Finding", "ranks_agree", "RankAgreement"}
    for module, names in bnrotation._PUBLIC.items():
        mod = importlib.import_module(f"bnrotation.{module}")
        for name in names:
            assert getattr(bnrotation, name) is getattr(mod, name), name
    assert set(dir(bnrotation)) >= set(bnrotation.__all__)


def test_an_unknown_name_raises_attribute_error_naming_the_public_ones():
    with pytest.raises(AttributeError, match="no attribute 'StaleMonitor'.*StalenessMonitor"):
        bnrotation.StaleMonitor  # noqa: B018 (a misspelt name must fail, not return None)
    assert not hasattr(bnrotation, "build_model")


def test_import_bnrotation_is_light():
    loaded = _loaded_after("import bnrotation")
    assert not any(loaded.values()), loaded  # not even torch: every name is imported on first use


@pytest.mark.slow
def test_the_monitor_and_reestimation_need_none_of_the_suites_stack():
    """Beyond what torch, numpy and pandas load themselves (pandas 3 imports pyarrow when it is installed)."""
    baseline = _loaded_after("import torch, numpy, pandas")
    loaded = _loaded_after("from bnrotation import StalenessMonitor, Thresholds, MonitorRecord, find_pairs, "
                           "StaleStatisticsWarning, reestimate, reestimate_if_stale, audit_averaged, "
                           "lint_batchnorm, ranks_agree")
    assert loaded["torch"]
    assert not [m for m in STACK if loaded[m] and not baseline[m]], loaded


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(bnrotation.__path__, "bnrotation.")
                  if not m.name.endswith(".__main__"))  # a command's entry point runs when imported


@pytest.mark.parametrize("name", _modules())
def test_every_all_lists_only_names_that_exist(name):
    mod = importlib.import_module(name)
    declared = getattr(mod, "__all__", [])
    assert len(declared) == len(set(declared)), f"{name}: a name listed twice"
    assert not [n for n in declared if not hasattr(mod, n)], name


def test_the_public_modules_declare_all():
    for name in ("bnrotation", "bnrotation.averaging", "bnrotation.audit", "bnrotation.bnstats"):
        assert importlib.import_module(name).__all__, name
