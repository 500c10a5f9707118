"""Per family, on its real tokenizer and official template (tests/real_tokenizers.py): the template split, the
control tokens flagged, and what the paper's decode-render-re-tokenize route does to the whole vocabulary.

    python -m experiments.real_families            # writes experiments/results/real_families.{json,md}

Families: Llama 3.0, 3.1, 3.2, Gemma 2 (on Gemma 3's vocabulary), Gemma 3, Qwen 2.5, Qwen3 (the package's
template and the later official revision). Nothing here runs a model.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path


from probe.core.paper_method import PaperRows
from probe.core.prompts import PAPER_PROMPTS
from probe.core.template import response_conversation, split_template
from probe.core.vocab import control_token_ids
from tests import real_tokenizers

RESULTS = Path(__file__).resolve().parent / "results"


def family_row(family: str, folder: Path) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(real_tokenizers.build(family, folder))
    build = response_conversation(PAPER_PROMPTS["greatest"])
    split = split_template(tok, build)
    t0 = time.perf_counter()
    stats = PaperRows(tok, build, range(len(tok)), split).statistics
    added = getattr(tok, "added_tokens_decoder", {}) or {}
    return {"family": family, "vocabulary": len(tok), "prefix_tokens": len(split.prefix_ids),
            "prefix_tail": split.prefix_text[-48:], "suffix": split.suffix_text, "suffix_ids": list(split.suffix_ids),
            "bos_count": split.bos_count, "leading_space": split.leading_space, "date_sensitive": split.date_sensitive,
            "control_tokens_flagged": len(control_token_ids(tok)), "in_special_map": len(tok.all_special_ids),
            "added_tokens": len(added), "paper_route": stats, "seconds": round(time.perf_counter() - t0, 1)}


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in real_tokenizers.REAL:
            rows.append(family_row(family, Path(tmp) / family))
            print(family, rows[-1]["paper_route"]["slot_survives"], flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "real_families.json").write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    lines = ["# Real tokenizers: template split, control tokens, the paper's route", "",
             "`experiments/real_families.py`, prompt 'What, in one word, is the greatest thing ever?'. Slot survives: "
             "the fraction of the vocabulary whose response slot comes back as the id itself after the paper's "
             "decode -> template -> re-tokenize route.", "",
             "| family | vocabulary | prefix (ids, tail) | suffix | control tokens flagged (special map) | doubled BOS | "
             "slot survives | slot changed, by reason |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["paper_route"]
        why = "; ".join(f"{k}: {v['n']:,}" for k, v in s["slot_changed"].items())
        lines.append(f"| {r['family']} | {r['vocabulary']:,} | {r['prefix_tokens']}, `{r['prefix_tail']!r}` | "
                     f"`{r['suffix']!r}` | {r['control_tokens_flagged']:,} ({r['in_special_map']}) | "
                     f"{s['doubled_bos_fraction']:.0%} | {s['slot_survives']:.1%} | {why} |")
    (RESULTS / "real_families.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
