"""``python -m probe.exhaustive``: the exhaustive single-token sweep (probe/commands/score.py)."""

import sys

from probe.commands.score import main

if __name__ == "__main__":
    sys.exit(main())
