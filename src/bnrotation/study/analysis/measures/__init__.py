"""Per-run measures: numbers from one run's tables, and their closed forms (layer 1 of :mod:`bnrotation.study.analysis`;
no torch, no text).

- :mod:`.metrics`: the table's per-run values (rotation, norm growth, accuracies, failing checks, ...);
- :mod:`.lag`: the lag of a running average in closed form, and each run's measured and predicted lag;
- :mod:`.dense`: drift and lag at every step of the dense windows; :mod:`.depth`: lag against depth;
- :mod:`.midrun`: checks against the learning rate; :mod:`.theory`: the rotational-equilibrium prediction;
- :mod:`.intervention_log`: reading the ``interventions`` table the runner logs (the interventions themselves are
  :mod:`bnrotation.study.interventions`).
"""
