"""``python -m probe.trace``: per-token reward traces (probe/commands/trace.py).

``probe.trace(...)`` is the Python API's function (probe/api.py); an ``import probe.trace`` would bind this module to
that name, so the module forwards calls to the function, as probe/gcg.py does."""

import sys
import types

from probe.commands.trace import main


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from probe.api import trace

        return trace(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
