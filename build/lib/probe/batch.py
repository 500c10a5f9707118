"""``python -m probe.batch``: many sweeps from one job file (probe/commands/batch.py)."""

import sys

from probe.commands.batch import main

if __name__ == "__main__":
    sys.exit(main())
