"""The frozen-backbone experiment (bnrotation.study.frozen): one run, or the resumable sweep of every mode and seed.

    python experiments/frozen.py run mode=bn_train seed=0 [key=value ...]
    python experiments/frozen.py sweep --jobs 2 results_root=results/reference/frozen
"""

import sys

from bnrotation.study.frozen import main

if __name__ == "__main__":
    sys.exit(main())
