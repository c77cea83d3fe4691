"""Tables and figures: the per-run measures over seeds, as the files ``make table`` and ``make figures`` write
(layer 2 of :mod:`bnrotation.study.analysis`; no torch).

- :mod:`.table`: ``table.md`` and ``table.csv`` (``python -m bnrotation.study.analysis.tables.table``), and the other
  reports beside them: :mod:`.lag_report` (``lag.md``), :mod:`.averaging_report` (``averaging.md``: averaged
  weights under each BatchNorm buffer policy of :mod:`bnrotation.averaging`), :mod:`.monitor_report`
  (``monitor.md``: the warning rule of :mod:`bnrotation.monitor` on the runs' checks);
- :mod:`.figures`: every figure (``python -m bnrotation.study.analysis.tables.figures``).
"""
