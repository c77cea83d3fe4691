"""Train one row with weight averaging on, and audit every averaged copy it evaluates (bnrotation.audit).

    python experiments/audit_averaging.py experiment=adam scale=quick results_root=/tmp/audit-run threads=1

The run is the one ``experiments/train.py`` trains (``runner.run``, the same config), given its averages as an
argument (``runner.run(cfg, averages=...)``); at each averaging evaluation every copy the ``averaging`` table
scores (each EMA and the tail average under each buffer policy) is handed to ``RunAverages.after_scoring``, which
here audits it against the live model, from its buffers alone and with the provenance the suite records, on the
first 500 held-out samples.
Writes ``audit.csv`` beside the run's tables and prints the last evaluation's verdicts.
"""

import functools
import sys
from pathlib import Path

import hydra
import pandas as pd
from omegaconf import DictConfig

from bnrotation.audit import audit_averaged
from bnrotation.study import runner
from bnrotation.study.cli import stop_on_unknown_keys
from bnrotation.study.config import RunConfig, register_configs, to_run_config
from bnrotation.study.run_averages import RunAverages

register_configs()
PROBE = 500


class AuditedAverages(RunAverages):
    """The runner's averages; each copy it scores is also audited, one row per copy into ``rows``."""

    def __init__(self, cfg, model, rows: list[dict]):
        super().__init__(cfg, model)
        self.rows = rows

    def after_scoring(self, model, step, x, y, averaged, provenance, *, average, decay, policy):
        probe = (x[:PROBE], y[:PROBE])
        alone = audit_averaged(model, averaged, probe)
        declared = audit_averaged(model, averaged, probe, provenance=provenance)
        self.rows.append({"step": step, "average": average, "decay": decay, "policy": policy,
                          "verdict_buffers": alone.policy, "candidates": ", ".join(alone.candidates),
                          "verdict_provenance": declared.policy, "stale": alone.stale,
                          "mode_gap": alone.mode_gap, "acc_eval_mode_probe": alone.acc_eval_mode,
                          "lag_sigma": alone.lag_sigma})


def audit_run(run_cfg: RunConfig) -> tuple[Path, pd.DataFrame] | None:
    """Train ``run_cfg`` with :class:`AuditedAverages` as the runner's averages (``runner.run(averages=...)``) and
    write ``audit.csv`` in its folder; returns the folder and the audit (one row per copy and evaluation step), or
    None when the run was skipped (finished already)."""
    rows: list[dict] = []
    folder = runner.run(run_cfg, averages=functools.partial(AuditedAverages, rows=rows))
    if folder is None:
        return None
    audit = pd.DataFrame(rows)
    audit.to_csv(folder / "audit.csv", index=False)
    return folder, audit


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    run_cfg = to_run_config(cfg)
    if not run_cfg.averaging.enabled:
        sys.exit("averaging.enabled=false: there is nothing to audit")
    done = audit_run(run_cfg)
    if done is None:
        sys.exit("the run was skipped (finished already): force=true reruns it")
    folder, audit = done
    scored = pd.read_parquet(folder / "averaging.parquet")
    last = audit[audit["step"] == audit["step"].max()].merge(
        scored[["step", "average", "decay", "policy", "acc_eval_mode"]], on=["step", "average", "decay", "policy"],
        how="left")
    print(last.to_string(index=False))


if __name__ == "__main__":
    stop_on_unknown_keys(RunConfig, groups=("experiment",))  # a misspelt key: one line, exit 2, before Hydra
    main()
