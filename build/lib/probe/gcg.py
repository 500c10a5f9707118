"""``python -m probe.gcg``: the multi-token search command (probe/commands/gcg.py).

``probe.gcg(...)`` is the Python API's function (probe/api.py). Running this file with ``-m`` never replaces it,
but an ``import probe.gcg`` would bind this module to that name, so the module forwards calls to the function.
"""

import sys
import types

from probe.commands.gcg import main


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from probe.api import gcg

        return gcg(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
