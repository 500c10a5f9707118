"""Golden ids of the dialogue families' model cards, each card's own code run under transformers 4.51.0 (the last
4.x line, RewardBench 0.1.4's pin; the slow ``LlamaTokenizer`` the UltraRM and Ziya cards name behaves there as in
the 4.3x releases of the cards' time). The texts are built here as each card builds them, not by rm-probe:

- openbmb/UltraRM-13b: ``ultrarm_template = "Human: {instruction}\\n\\nAssistant: {completion}"``,
  ``LlamaTokenizer.from_pretrained(path)``, ``tokenizer(text)``;
- PKU-Alignment/beaver-7b-*: ``'BEGINNING OF CONVERSATION: USER: {prompt} ASSISTANT:{response}'`` (safe-rlhf's
  PROMPT_BEGIN + PROMPT_USER + PROMPT_ASSISTANT), ``AutoTokenizer.from_pretrained(path)``, ``tokenizer(input)``;
- IDEA-CCNL/Ziya-LLaMA-7B-Reward: ``"Human:" + query + "\\n\\nAssistant:" + response``,
  ``LlamaTokenizer.from_pretrained(path, add_eos_token=True)``, ``tokenizer(text, truncation=True, max_length=1024)``;
- openbmb/Eurus-RM-7b: ``"[INST] " + prompt + " [/INST] " + response``: the card's format with its tag corrected, a
  deliberate deviation (its strings write ``[\\INST]``; the tag it names, Mistral-Instruct's, is used), ``AutoTokenizer.from_pretrained(path)``,
  ``tokenizer(text)``.

The slow ``LlamaTokenizer`` needs ``tokenizer.model``: on the ``tokenizer.json``-only layout the UltraRM and Ziya
cards cannot run, and no ids are written (their real checkpoints ship ``tokenizer.model``). Needs only
transformers 4.51.0, sentencepiece and protobuf:

    python -m tests.unit.test_card_inputs build /tmp/cardids               # the folders (this checkout's venv)
    python -m venv /tmp/tf451 && /tmp/tf451/bin/pip install transformers==4.51.0 sentencepiece protobuf
    /tmp/tf451/bin/python tests/testdata/card_ids_451.py /tmp/cardids tests/testdata/card_ids.json
"""

import json
import sys
from pathlib import Path

import tokenizers
import transformers
from transformers import AutoTokenizer, LlamaTokenizer

CARDS = {
    "ultrarm": (lambda p, r: "Human: {instruction}\n\nAssistant: {completion}".format(instruction=p, completion=r),
                lambda path: LlamaTokenizer.from_pretrained(path), {}),
    "beaver": (lambda p, r: "BEGINNING OF CONVERSATION: " + "USER: {input} ".format(input=p) + "ASSISTANT:" + r,
               lambda path: AutoTokenizer.from_pretrained(path), {}),
    "ziya": (lambda p, r: "Human:" + p + "\n\nAssistant:" + r,
             lambda path: LlamaTokenizer.from_pretrained(path, add_eos_token=True),
             dict(truncation=True, max_length=1024)),
    "eurus": (lambda p, r: "[INST] " + p + " [/INST] " + r, lambda path: AutoTokenizer.from_pretrained(path), {}),
}

root, out = Path(sys.argv[1]), Path(sys.argv[2])
cases = json.loads((root / "cases.json").read_text())
ids, classes = {}, {}
for layout in cases["layouts"]:
    for card, (text, load, kwargs) in CARDS.items():
        if not (root / layout / "tokenizer.model").exists() and card in ("ultrarm", "ziya"):
            continue  # the slow class needs tokenizer.model
        tok = load(root / layout)
        classes[card] = type(tok).__name__
        for i, r in enumerate(cases["responses"]):
            ids[f"{layout}|{card}|{i}"] = tok(text(cases["prompt"], r), **kwargs)["input_ids"]
out.write_text(json.dumps({"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                           "classes": classes, "ids": ids}, indent=0, ensure_ascii=False))
print(f"wrote {len(ids)} id lists with transformers {transformers.__version__} to {out}")
