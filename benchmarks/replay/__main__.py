"""Entry point of ``python -m benchmarks.replay``."""

import sys

from benchmarks.replay.cli import main

sys.exit(main())
