"""bnrotation: do a model's BatchNorm running statistics still describe its weights?

The public API, importable from the package itself::

    from bnrotation import StalenessMonitor, reestimate, check_checkpoint

- the staleness monitor (:mod:`bnrotation.monitor`): :class:`StalenessMonitor`, :class:`Thresholds`,
  :class:`MonitorRecord`, :func:`find_pairs`, :class:`StaleStatisticsWarning`;
- re-estimation of the running statistics (:mod:`bnrotation.bnstats`): :func:`reestimate`,
  :class:`ReestimationReport`, :class:`SavedBuffers` (puts the previous ones back); and only when the monitor
  finds them stale (:mod:`bnrotation.refresh`): :func:`reestimate_if_stale`, :class:`GatedReestimation`;
- the check of a saved checkpoint (:mod:`bnrotation.check`): :func:`check_checkpoint`, :class:`CheckReport`;
- weight averaging with a declared BatchNorm buffer policy (:mod:`bnrotation.averaging`): :class:`EMA`,
  :func:`average_checkpoints`, :func:`compare_states`,
  :class:`BufferProvenance`, :data:`POLICIES`;
- the BatchNorm settings lint (:mod:`bnrotation.lint`): :func:`lint_batchnorm`, :class:`Finding`;
- the agreement of running statistics across ``torch.distributed`` ranks (:mod:`bnrotation.distributed`):
  :func:`ranks_agree`, :class:`RankAgreement`.
- the audit of an averaged model (:mod:`bnrotation.audit`): :func:`audit_averaged`, :class:`AuditReport`,
  :data:`BUFFER_POLICIES`.

Each name is imported on first use (PEP 562), so ``import bnrotation`` itself loads none of the suite's stack
(Hydra, pyarrow, matplotlib, seaborn), nor torch.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "monitor": ("StalenessMonitor", "Thresholds", "MonitorRecord", "find_pairs", "StaleStatisticsWarning"),
    "bnstats": ("reestimate", "ReestimationReport", "SavedBuffers"),
    "refresh": ("reestimate_if_stale", "GatedReestimation"),
    "check": ("check_checkpoint", "CheckReport"),
    "averaging": ("EMA", "average_checkpoints", "compare_states", "BufferProvenance",
                  "POLICIES"),
    "lint": ("lint_batchnorm", "Finding"),
    "distributed": ("ranks_agree", "RankAgreement"),
    "audit": ("audit_averaged", "AuditReport", "BUFFER_POLICIES"),
}
_HOME = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    """The public name ``name``, imported from its module on first use (PEP 562).

    Raises:
        AttributeError: for a name that is not part of the public API (nor a submodule).
    """
    if name not in _HOME:
        raise AttributeError(f"module 'bnrotation' has no attribute {name!r}; its public names: {', '.join(__all__)}")
    value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
