"""``probe --list-models``: every reward-model family the registry reads, how, and where its input comes from.

Reads the registry only (no model, no torch): one block per entry (a Hugging Face id, or a class name that matches
checkpoints under any other name), its reader, family, whether it needs remote code, its input source, and, for
an entry rm-probe refuses, why.
"""

from __future__ import annotations

import io
import shutil
import sys
import textwrap


def _reader(spec) -> str:
    detail = spec.layout or spec.pairwise or spec.auto_class
    return spec.reader + (f" ({detail})" if detail else "")


def list_models(out: io.TextIOBase | None = None, width: int | None = None) -> int:
    """Print every registry entry; returns how many (the ``default`` entry last, as what an unknown model gets)."""
    from probe.models.registry import REGISTRY

    out = sys.stdout if out is None else out
    width = width or max(60, min(120, shutil.get_terminal_size((100, 20)).columns))
    specs = sorted((s for s in REGISTRY.values() if s.name != "default"), key=lambda s: (s.unsupported is not None,
                                                                                         "/" not in s.name, s.name))
    wrap = textwrap.TextWrapper(width=width, initial_indent="    ", subsequent_indent="      ")
    for spec in [*specs, REGISTRY["default"]]:
        kind = "class name" if "/" not in spec.name and spec.name != "default" else ""
        tags = [t for t in (spec.family, kind, "remote code" if spec.trust_remote_code else "",
                            "REFUSED" if spec.unsupported else "") if t]
        print(f"{spec.name}  [{_reader(spec)}{'; ' + ', '.join(tags) if tags else ''}]", file=out)
        if spec.unsupported:
            print(wrap.fill("refused: " + spec.unsupported), file=out)
        elif spec.name == "default":
            print(wrap.fill("any other model: " + spec.notes + " (an encoder by its config reads (prompt, response) "
                            "as a text pair; a checkpoint with a regression layer and a gating network, the gated "
                            "reader); the fallback is logged"), file=out)
        else:
            print(wrap.fill("input: " + spec.input_source), file=out)
    return len(specs) + 1
