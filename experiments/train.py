"""Train one row of the study at one seed (or a Hydra multirun sweep of them).

    python experiments/train.py experiment=adam seed=1
    python experiments/train.py -m experiment=sgd,adam seed=0,1,2 scale=quick

Parses the config and calls bnrotation.study.runner.run; nothing else lives here.
"""

import hydra
from omegaconf import DictConfig

from bnrotation.study.cli import finish_job, run_task, stop_on_unknown_keys
from bnrotation.study.config import RunConfig, register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    finish_job(run_task(cfg))


if __name__ == "__main__":
    stop_on_unknown_keys(RunConfig, groups=("experiment",))  # a misspelt key: one line, exit 2, before Hydra
    main()
