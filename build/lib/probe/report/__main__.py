"""``python -m probe.report RUN [RUN ...]``: the auditors' HTML report (probe/commands/report.py)."""

import sys

from probe.commands.report import main

if __name__ == "__main__":
    sys.exit(main())
