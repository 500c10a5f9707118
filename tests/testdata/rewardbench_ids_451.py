"""Golden ids of RewardBench 0.1.4's run script (run_rm.py), written under its pinned transformers 4.51.0.

For a tokenizer without a chat template the run script renders fastchat's dialogue text, sets
``tokenizer.add_eos_token = True`` and its pipeline encodes the text with ``tokenizer(text)``. This script does
exactly that on the folders `tests.unit.test_rewardbench_ids` builds (a Llama-2-era tokenizer in its two layouts,
each ``legacy`` setting) and writes the ids. It needs only transformers 4.51.0, sentencepiece and protobuf:

    python -m tests.unit.test_rewardbench_ids build /tmp/rbids          # the folders and texts (this checkout's venv)
    python -m venv /tmp/tf451 && /tmp/tf451/bin/pip install transformers==4.51.0 sentencepiece protobuf
    /tmp/tf451/bin/python tests/testdata/rewardbench_ids_451.py /tmp/rbids tests/testdata/rewardbench_ids.json
"""

import json
import sys
from pathlib import Path

import tokenizers
import transformers
from transformers import AutoTokenizer

root, out = Path(sys.argv[1]), Path(sys.argv[2])
cases = json.loads((root / "cases.json").read_text())
ids = {}
for layout in cases["layouts"]:
    tok = AutoTokenizer.from_pretrained(root / layout)  # what run_rm.py's AutoTokenizer.from_pretrained gives
    tok.add_eos_token = True  # run_rm.py, for a tokenizer without a chat template
    for key, text in cases["texts"].items():
        ids[f"{layout}|{key}"] = tok(text)["input_ids"]
out.write_text(json.dumps({"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                           "class": type(tok).__name__, "ids": ids}, indent=0, ensure_ascii=False))
print(f"wrote {len(ids)} id lists with transformers {transformers.__version__} to {out}")
