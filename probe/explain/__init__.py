"""`probe explain`: why a token wins, inside the model (probe/commands/explain.py is the command).

``model`` (the stack's parts and hooks), ``readers`` (how each head reads the normed state), ``direct`` (the
decomposition), ``patching``, ``ig`` (integrated gradients), ``explain`` and ``inputs`` (the work on a loaded model).
``probe.explain(...)`` is the Python API's function (probe/api.py); an ``import probe.explain`` would bind this
package to that name, so the package forwards calls to the function, as probe/trace.py does.
"""

from probe.commands.cli import forward_calls

forward_calls(__name__, "explain")
