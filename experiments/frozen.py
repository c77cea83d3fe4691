"""The frozen-backbone experiment (bnrotation.study.frozen): one BatchNorm mode and seed, or a Hydra multirun sweep of
them.

    python experiments/frozen.py mode=norm_eval seed=1 finetune.steps=100 results_root=/tmp/f
    python experiments/frozen.py -m $(python -m bnrotation.study.frozen) hydra/launcher=joblib hydra.launcher.n_jobs=2  # make frozen

Parses the config and calls bnrotation.study.frozen.run_task; nothing else lives here.
"""

import hydra
from omegaconf import DictConfig

from bnrotation.study.cli import finish_job, stop_on_unknown_keys
from bnrotation.study.frozen import FrozenConfig, register_frozen_config, run_task

register_frozen_config()


@hydra.main(version_base="1.3", config_path="../conf", config_name="frozen")
def main(cfg: DictConfig) -> None:
    finish_job(run_task(cfg))


if __name__ == "__main__":
    stop_on_unknown_keys(FrozenConfig)
    main()
