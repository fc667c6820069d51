"""`python3 -m harness ARGS` (what bench/run executes)."""

import sys

from harness.runner import main

sys.exit(main(sys.argv[1:]))
