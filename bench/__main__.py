"""`python -m bench`: the benchmark report (bench/run.py)."""

import sys

from bench.run import main

sys.exit(main())
