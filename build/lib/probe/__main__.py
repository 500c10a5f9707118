"""``python -m probe``: the ``probe`` console script."""

import sys

from probe.commands.cli import main

if __name__ == "__main__":
    sys.exit(main())
