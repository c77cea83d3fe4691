"""What each config name builds, read back by class name (no torch: the analysis imports this module).

``optimizer.name`` and ``schedule.name`` are config names
(:data:`bnrotation.study.config.OPTIMIZERS`, :data:`bnrotation.study.config.SCHEDULES`);
:func:`bnrotation.study.optim.build_optimizer` and :func:`bnrotation.study.optim.build_schedule`
build objects whose class names ``run.json`` records. The analysis compares
those records with these tables to refuse a run whose optimizer is not what its
row means (:func:`bnrotation.study.rows.check_against_row`); a test
builds every name and checks the class against them.
"""

from __future__ import annotations

# optimizer.name -> class name of the optimizer build_optimizer returns
OPTIMIZER_CLASSES = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "adam_projected": "ProjectedAdam",
                     "adamp": "ProjectedAdam"}
# optimizer.name -> the projection of each param group (conv, other) of a ProjectedAdam; none for the others
PROJECTION_MODES = {"adam_projected": ("always", "never"), "adamp": ("adamp", "adamp")}
# schedule.name -> class name of the scheduler build_schedule returns (None: no scheduler)
SCHEDULE_CLASSES = {"constant": None, "cosine": "CosineAnnealingLR"}
# model.arch -> class name of the network build_network returns
ARCH_CLASSES = {"convnet": "ConvNet", "resnet20": "ResNet20"}
