"""Train one row of the study at one seed (or a Hydra multirun sweep of them).

    python experiments/train.py experiment=adam seed=1
    python experiments/train.py -m experiment=sgd,adam seed=0,1,2 scale=quick

Parses the config and calls bnrotation.runner.run; nothing else lives here.
"""

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from bnrotation.cli import record_outcome, remove_unused_run_dir, run_task
from bnrotation.config import register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    outcome = run_task(cfg)
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        # A job does not exit: the sweep runs every job, then cli.SweepSummary reports and sets the exit status;
        # but a stop signal (Ctrl-C, preemption) stops the sweep too, once the run has saved its state.
        record_outcome(outcome, hc.runtime.output_dir)
        if outcome.status == "interrupted":
            sys.exit(outcome.exit_code)
    elif outcome.exit_code:
        if outcome.status in ("bad config", "refused"):  # nothing ran: no empty hydra/runs/<time>/ left behind
            remove_unused_run_dir(hc.runtime.output_dir, hc.job.name)
        sys.exit(outcome.exit_code)


if __name__ == "__main__":
    main()
