"""Why a token wins, inside the model: the work behind `probe explain` (probe/commands/explain.py) and the Python
API's ``probe.explain(...)`` (probe/api.py).

``model`` (the stack's parts and hooks), ``readers`` (how each head reads the normed state), ``direct`` (the
decomposition), ``patching``, ``ig`` (integrated gradients), ``explain`` and ``inputs`` (the work on a loaded model).
Named apart from the API's function, so that importing it never rebinds ``probe.explain``.
"""
