"""Where the bench and the checkout it belongs to are (the defaults for the
work dir and results, the birch build to measure)."""

import os

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_DIR = os.path.dirname(BENCH_DIR)
