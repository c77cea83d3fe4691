"""What the Hydra entry points do with a composed config: validate, run, report.

Kept out of ``experiments/`` so that it can be tested without a subprocess.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback

from omegaconf import DictConfig

from .config import ConfigError, to_run_config

log = logging.getLogger("bnrotation")


def run_task(cfg: DictConfig, multirun: bool = False) -> int:
    """Validate ``cfg``, train the run, and return an exit status.

    A bad config is reported as one line naming the key (exit 2), before any
    work. A run that diverged (non-finite loss) is a finished run: reported as
    ``diverged`` with its step, status 0. In a multirun a crashing run is reported and the sweep goes on
    (status 0, the run's folder has no ``DONE`` and will be rerun); in a
    single run the error is reported and the status is 1.
    """
    try:
        run_cfg = to_run_config(cfg)
    except ConfigError as err:
        print(f"error: bad config: {err}", file=sys.stderr)
        return 2
    from .runner import RunExistsError, run  # torch is imported only once the config is valid

    try:
        out = run(run_cfg)
    except RunExistsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 0 if multirun else 2
    except Exception as err:  # noqa: BLE001 - a sweep must outlive one crashing run
        where = f"{run_cfg.row} seed={run_cfg.seed}"
        print(f"error: run {where} failed: {type(err).__name__}: {err}", file=sys.stderr)
        log.debug("".join(traceback.format_exception(err)))
        if not multirun:
            return 1
        return 0
    if out is None:
        print(f"skip: {run_cfg.row} seed={run_cfg.seed} is finished with the same config "
              f"(force=true reruns it)", file=sys.stderr)
    elif (step := json.loads((out / "run.json").read_text()).get("diverged_at_step")) is not None:
        print(f"diverged: {run_cfg.row} seed={run_cfg.seed} at step {step} (non-finite loss); the rows "
              f"logged before it are kept -> {out}", file=sys.stderr)
    else:
        print(f"done: {run_cfg.row} seed={run_cfg.seed} -> {out}", file=sys.stderr)
    return 0
