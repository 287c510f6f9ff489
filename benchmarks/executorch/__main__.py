"""Entry point of ``python -m benchmarks.executorch``."""

import sys

from benchmarks.executorch.cli import main

sys.exit(main())
