"""rm-probe: x-ray reward models by their optimal and pessimal responses.

The Python API (probe/api.py), on a model and tokenizer you hold or one ``probe.load`` loads:

    import probe
    lm = probe.load("smollm2")                                   # a Hugging Face id, folder or packaged model
    df = probe.sweep(lm.model, lm.tokenizer, "What, in one word, is the greatest thing ever?")
    probe.score_responses(lm.model, lm.tokenizer, "What is the greatest thing ever?", ["Love", "Black people"])
    probe.gcg(lm.model, lm.tokenizer, "What is the greatest thing ever?", length=3, steps=20)

The layout: ``probe.core`` (template split, vocabulary, heads, engine, sweep, GCG, responses), ``probe.models``
(registry, loading, packaged models, memory plan), ``probe.runs`` (run folders, metadata, timing),
``probe.analysis`` (statistics over saved runs), ``probe.social`` (the social-preference benchmark),
``probe.report`` (the auditors' pages), ``probe.commands`` (the ``probe`` console script), ``probe.kernels``
(fast paths beside their references). Importing ``probe`` imports none of them: the API loads on first use.
"""

from __future__ import annotations

__all__ = ["load", "sweep", "score_responses", "trace", "gcg", "explain"]


def __getattr__(name: str):
    if name in __all__:
        from probe import api

        return getattr(api, name)
    raise AttributeError(f"module 'probe' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
