"""``python -m probe.social``: the social-preference benchmark command (probe/commands/social.py)."""

import sys

from probe.commands.social import main

if __name__ == "__main__":
    sys.exit(main())
