#!/usr/bin/env python3
"""Rebuild a run's report.md and plots from its results.json, without root:
    python3 bench/report.py bench/results/<run>/
(The report builder itself is harness/report.py.)"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness.report import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
