"""``--input-method rewardbench`` writes the ids RewardBench 0.1.4's run script gives under its pinned transformers
4.51.0, not what the installed transformers rebuilds (issue 44): for a dialogue family (a tokenizer without a chat
template) run_rm.py sets ``add_eos_token = True``; 4.51's Llama tokenizer then gives BOS, the text and EOS on either
layout of a Llama-2-era checkpoint, ``tokenizer.model`` or ``tokenizer.json``, whatever its ``legacy`` flag.
transformers 5 keeps the BOS on the first layout and drops it on the second. The golden ids
(tests/testdata/rewardbench_ids.json) are 4.51.0's own, written by tests/testdata/rewardbench_ids_451.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from probe.core.template import render, response_conversation
from probe.models.chat_templates import chat_template_text
from probe.models.loading import _set_input_call, load_tokenizer
from probe.models.registry import REGISTRY
from tests.real_tokenizers import mistral_v1, mistral_v1_json

GOLDEN = Path(__file__).resolve().parents[1] / "testdata" / "rewardbench_ids.json"
PROMPT = "What, in one word, is the greatest thing ever?"
RESPONSES = ["Love", " leading space", "café au lait", "line\nbreak", "</s> as text", "🎉 joy"]
# each shipped dialogue format and a family that reads it through RewardBench's run script
FORMATS = {"openbmb": "openbmb/UltraRM-13b", "pku-align": "PKU-Alignment/beaver-7b-v1.0-reward",
           "ziya": "IDEA-CCNL/Ziya-LLaMA-7B-Reward"}
LAYOUTS = {f"{kind}-{legacy}": (build, legacy) for kind, build in (("model", mistral_v1), ("json", mistral_v1_json))
           for legacy in (None, True, False)}


def build_cases(root: Path) -> dict:
    """The tokenizer folders (one per layout x legacy) and the dialogue texts, as `rewardbench_ids_451.py` reads."""
    texts = {}
    for name, (make, legacy) in LAYOUTS.items():
        make(root / name, legacy)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(root / "model-None")
    for fmt in FORMATS:
        for i, r in enumerate(RESPONSES):
            conv = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": r}]
            texts[f"{fmt}|{i}"] = tok.apply_chat_template(conv, tokenize=False, chat_template=chat_template_text(fmt))
    cases = {"layouts": list(LAYOUTS), "texts": texts}
    (root / "cases.json").write_text(json.dumps(cases, ensure_ascii=False))
    return cases


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("rbids")
    return root, build_cases(root)


def test_golden_ids_are_transformers_451s_bos_text_eos(cases):
    golden = json.loads(GOLDEN.read_text())
    assert golden["transformers"] == "4.51.0" and golden["class"] == "LlamaTokenizerFast"
    assert len(golden["ids"]) == len(LAYOUTS) * len(FORMATS) * len(RESPONSES)
    assert all(v[0] == 1 and v[-1] == 2 and v.count(1) == 1 for v in golden["ids"].values())  # <s> .. </s>


# Where the text's own ids differ from 4.51's, and why. A double space on the tokenizer.model layout: transformers 5
# rebuilds the tokenizer's pipeline ("▁▁" one id; 4.51: "▁" then "▁leading"); rm-probe's text ids follow the installed
# transformers. A control token written inside a message ("</s>" in a response): rm-probe encodes it as text on every
# route (probe/core/control_tokens.py), where RewardBench's tokenizer(text) makes it the control token.
TEXT_DIFFERS = {("model", " leading space"), ("model", "</s> as text"), ("json", "</s> as text")}


def _route_ids(root: Path, layout: str, fmt: str) -> dict[str, list[int]]:
    tok = load_tokenizer(str(root / layout), None, False, family_template=fmt)
    _set_input_call(tok, REGISTRY[FORMATS[fmt]], "reward", "rewardbench")
    build = response_conversation(PROMPT)
    return {r: render(tok, build, r) for r in RESPONSES}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_the_route_writes_rewardbench_ids_on_every_layout(cases, layout, fmt):
    """rm-probe's rendering on the route, through its own loader, equals 4.51.0's ids: BOS, the text, EOS on both
    layouts and every legacy setting (transformers 5's own add_eos_token drops the BOS of the tokenizer.json
    layout); the text's own ids wherever transformers 5 encodes it as 4.51 did, and otherwise only there."""
    root, _ = cases
    golden = json.loads(GOLDEN.read_text())["ids"]
    kind = layout.split("-")[0]
    for i, (r, ids) in enumerate(_route_ids(root, layout, fmt).items()):
        want = golden[f"{layout}|{fmt}|{i}"]
        assert ids[0] == want[0] == 1 and ids[-1] == want[-1] == 2, (layout, fmt, r)
        if (kind, r) in TEXT_DIFFERS:
            assert ids != want, f"transformers now encodes {r!r} as 4.51 did: drop it from TEXT_DIFFERS"
        else:
            assert ids == want, (layout, fmt, r)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "build":  # see tests/testdata/rewardbench_ids_451.py
    build_cases(Path(sys.argv[2]))
