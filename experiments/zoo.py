"""The staleness zoo (bnrotation.study.zoo): one timm architecture, optimizer and seed on Fashion-MNIST, or a Hydra
multirun sweep of them.

    python experiments/zoo.py arch=lcnet_050 optimizer=adam seed=0
    python experiments/zoo.py -m $(python -m bnrotation.study.zoo) hydra/launcher=joblib hydra.launcher.n_jobs=2  # make zoo

Parses the config and calls bnrotation.study.zoo.run_task; nothing else lives here.
"""

import hydra
from omegaconf import DictConfig

from bnrotation.study.cli import finish_job, stop_on_unknown_keys
from bnrotation.study.zoo import ZooConfig, register_zoo_config, run_task

register_zoo_config()


@hydra.main(version_base="1.3", config_path="../conf", config_name="zoo")
def main(cfg: DictConfig) -> None:
    finish_job(run_task(cfg))


if __name__ == "__main__":
    stop_on_unknown_keys(ZooConfig)
    main()
