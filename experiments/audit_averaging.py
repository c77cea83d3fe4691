"""Train one row with weight averaging on, and audit every averaged copy it evaluates (bnrotation.audit).

    python experiments/audit_averaging.py experiment=adam scale=quick results_root=/tmp/audit-run threads=1

The run is the one ``experiments/train.py`` trains (``runner.run``, the same config); at each averaging
evaluation the copies the ``averaging`` table scores (each EMA and the tail average under each buffer policy,
built by the suite's own ``EMA.averaged`` and ``average_checkpoints``) are also audited against the live model,
from their buffers alone and with the provenance the suite records, on the first 500 held-out samples.
Writes ``audit.csv`` beside the run's tables and prints the last evaluation's verdicts.
"""

import math
import sys

import hydra
import pandas as pd
from omegaconf import DictConfig

from bnrotation import averaging

from bnrotation.study import runner
from bnrotation.audit import audit_averaged
from bnrotation.study.config import register_configs, to_run_config

register_configs()
PROBE = 500
ROWS: list[dict] = []


class AuditedAverages(averaging.RunAverages):
    """The runner's averages; :meth:`evaluate` also audits each copy it scores."""

    def evaluate(self, model, step, x, y, probe_x, batches, *args, **kwargs):
        table = super().evaluate(model, step, x, y, probe_x, batches, *args, **kwargs)
        probe = (x[:PROBE], y[:PROBE])
        copies = [("ema", ema.decay, policy, *ema.averaged(policy, model, batches if policy == "refresh" else None))
                  for ema in self.emas for policy in averaging.EMA_POLICIES]
        states = [s for t, s in self.snapshots if t > step - self.cfg.tail_steps]
        copies += [("tail", math.nan, policy, *averaging.average_checkpoints(
            model, states, policy=policy, batches=batches if policy == "refresh" else None))
            for policy in (averaging.POLICIES if states else ())]
        for average, decay, policy, held, provenance in copies:
            alone = audit_averaged(model, held, probe)
            declared = audit_averaged(model, held, probe, provenance=provenance)
            ROWS.append({"step": step, "average": average, "decay": decay, "policy": policy,
                         "verdict_buffers": alone.policy, "candidates": ", ".join(alone.candidates),
                         "verdict_provenance": declared.policy, "stale": alone.stale,
                         "mode_gap": alone.mode_gap, "acc_eval_mode_probe": alone.acc_eval_mode,
                         "lag_sigma": alone.lag_sigma})
        return table


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    run_cfg = to_run_config(cfg)
    if not run_cfg.averaging.enabled:
        sys.exit("averaging.enabled=false: there is nothing to audit")
    runner.RunAverages = AuditedAverages  # the runner builds its averages from this name
    folder = runner.run(run_cfg)
    if folder is None:
        sys.exit("the run was skipped (finished already): force=true reruns it")
    audit = pd.DataFrame(ROWS)
    audit.to_csv(folder / "audit.csv", index=False)
    scored = pd.read_parquet(folder / "averaging.parquet")
    last = audit[audit["step"] == audit["step"].max()].merge(
        scored[["step", "average", "decay", "policy", "acc_eval_mode"]], on=["step", "average", "decay", "policy"],
        how="left")
    print(last.to_string(index=False))


if __name__ == "__main__":
    main()
