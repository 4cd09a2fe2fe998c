"""``python -m fxforge``: the same command line as the ``fxforge`` console script."""

import sys

from .entry.cli import main

if __name__ == "__main__":
    sys.exit(main())
