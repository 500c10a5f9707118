"""``python -m probe.analyze``: the analyses of saved runs (probe/commands/analyze.py)."""

import sys

from probe.commands.analyze import main

if __name__ == "__main__":
    sys.exit(main())
