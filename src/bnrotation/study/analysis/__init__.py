"""The analysis: parquet results in, table, figures and claims out (no torch, never reruns training).

Three layers, each importing only those below it:

1. :mod:`.measures`: per-run measures, numbers from one run's tables;
2. :mod:`.tables`: tables and figures, those measures over seeds as ``table.md``, ``lag.md``, ``averaging.md``,
   ``monitor.md`` and the figures;
3. :mod:`.claims`: each of the article's claims weighed, ``claims.md`` and ``claims.json``.

Beneath them: :mod:`.results` (reading and checking runs), :mod:`.stats` (statistics over seeds, Spearman's ρ)
and :mod:`.formatting` (how every number is printed). Above them: :mod:`.webpage`, the write-up page that puts
the three together (``make report``).
"""
