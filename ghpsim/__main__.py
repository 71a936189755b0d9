"""`python -m ghpsim ...`: the same as the `ghpsim` command."""

import sys

from ghpsim.cli import main

if __name__ == "__main__":
    sys.exit(main())
