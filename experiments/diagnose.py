"""Diagnose a run from its checkpoint or its logged interventions (see bnrotation.study.diagnose).

    python experiments/diagnose.py run=results/runs/adam/seed=0 step=4500
    python experiments/diagnose.py run=results/runs/adam/seed=0

Parses the arguments and calls bnrotation.study.diagnose.main; nothing else lives here.
"""

import sys

from bnrotation.study.diagnose import main

if __name__ == "__main__":
    sys.exit(main())
