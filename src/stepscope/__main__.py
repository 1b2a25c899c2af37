"""``python -m stepscope``: the same command line as ``stepscope``."""

import sys

from stepscope.cli import main

if __name__ == "__main__":
    sys.exit(main())
