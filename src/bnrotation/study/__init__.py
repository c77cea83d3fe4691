"""bnrotation.study: the replication, built on the library.

The tasks (:mod:`bnrotation.study.task`, :mod:`bnrotation.study.fashion_mnist`), the networks
(:mod:`bnrotation.study.model`), projected Adam (:mod:`bnrotation.study.optim`), the typed configs
(:mod:`bnrotation.study.config`), what each row of the table means (:mod:`bnrotation.study.rows`), the
training loop and its helpers (:mod:`bnrotation.study.runner`, ``rundir``, ``runtime``, ``ensemble``,
``interventions``), the frozen-backbone and zoo experiments, the commands, and the analysis
(:mod:`bnrotation.study.analysis`: parquet in; tables, figures and claims out; never torch).

The study imports the library (:mod:`bnrotation`); the library never imports the study
(``tests/test_layout.py``).
"""
