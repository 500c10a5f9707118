"""``probe --list-models [WORD ...]``: every reward-model family the registry reads (or those whose id, family or
reader contains each word), how, and where its input comes from.

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


def _matches(spec, words: tuple[str, ...]) -> bool:
    text = " ".join(str(t) for t in (spec.name, spec.family, _reader(spec)) if t).lower()
    return all(w.lower() in text for w in words)


def list_models(out: io.TextIOBase | None = None, width: int | None = None, words: tuple[str, ...] = ()) -> int:
    """Print every registry entry (with ``words``: those whose id, family or reader contains each word, case
    ignored); returns how many (the ``default`` entry last, as what an unknown model gets)."""
    from probe.errors import DataFormatError
    from probe.models.registry import REGISTRY

    out = sys.stdout if out is None else out
    width = width or max(60, min(120, shutil.get_terminal_size((100, 20)).columns))
    specs = sorted((s for s in REGISTRY.values() if s.name != "default"), key=lambda s: (s.unsupported is not None,
                                                                                         "/" not in s.name, s.name))
    shown = [s for s in [*specs, REGISTRY["default"]] if _matches(s, words)]
    if not shown:
        raise DataFormatError(f"--list-models {' '.join(words)}: no registry entry's id, family or reader contains "
                              f"{'that' if len(words) == 1 else 'those words'}; run probe --list-models for all "
                              f"(a model the registry does not name is read by the default entry)")
    wrap = textwrap.TextWrapper(width=width, initial_indent="    ", subsequent_indent="      ")
    for spec in shown:
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
    return len(shown)
