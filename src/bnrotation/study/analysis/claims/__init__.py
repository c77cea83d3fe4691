"""The claims: each of the article's claims weighed against the runs (layer 3 of :mod:`bnrotation.study.analysis`; no torch).

- :mod:`.kinds`: the kinds of claim; each declared kind judges numbers (:meth:`~.kinds.Claim.judge`) and one
  template per kind writes them (:meth:`~.kinds.Claim.words`);
- :mod:`.registry`: every claim, declared once (:data:`~.registry.CLAIMS`, :data:`~.registry.TABLE_CELLS`), and
  the reason a failing one fails; :mod:`.carryover`: the ResNet-20 checks;
- :mod:`.evidence`: the per-run values they weigh; :mod:`.findings`: the open questions, measured;
- :mod:`.report`: ``claims.md``; :mod:`.command`: ``make claims`` (``python -m bnrotation.study.analysis.claims``),
  whose functions this package re-exports.
"""

from .command import (BLOCK, README, TABLES, build_report, fill_readme, main, readme_blocks, verdicts, verdicts_json,
                      weigh, write_claims)

__all__ = ["BLOCK", "README", "TABLES", "build_report", "fill_readme", "main", "readme_blocks", "verdicts",
           "verdicts_json", "weigh", "write_claims"]
