"""``python -m bnrotation.study.analysis.claims``: ``make claims`` (:func:`.command.main`)."""

import sys

from .command import main

sys.exit(main())
