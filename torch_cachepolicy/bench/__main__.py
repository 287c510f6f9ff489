"""Entry point of ``python -m torch_cachepolicy.bench``."""

import sys

from torch_cachepolicy.bench.cli import main

sys.exit(main())
