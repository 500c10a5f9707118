"""The paper's whole study (its Table 1: ten reward models x three prompts, every token of each vocabulary) projected
from the first GPU run's measured rates (experiments/results/gpu/run1/bench.json, an H200 in bf16).

Each model's sweep costs its FLOPs (vocabulary x `flops_per_row` of its published shape, from its config on the meta
device, two new tokens per row for Llama's template and three for Gemma's, as the benchmark's rows) over the
measured matmul rate, divided by the fraction of the floor the benchmark reached on the same family's measured
shape (Llama-3.1-8B for every Llama, Gemma-2-27B for both Gemmas), per path. Loading weights is not counted.

    python experiments/project_paper_study.py   -> experiments/results/gpu/paper_study_projection.{json,md}
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.common import PAPER_RELEASE  # noqa: E402
from experiments.gpu_common import flops_per_row  # noqa: E402

BENCH = ROOT / "experiments" / "results" / "gpu" / "run1" / "bench.json"
TABLE = PAPER_RELEASE / "table_1_reward_models.csv"  # ($RM_PROBE_PAPER_RELEASE where set)
OUT = ROOT / "experiments" / "results" / "gpu" / "paper_study_projection"
PROMPTS = 3
MEASURED = {"llama": "llama-3.1-8b", "gemma2": "gemma-2-27b"}


def main(out_path: Path = OUT) -> int:
    from transformers import AutoModelForSequenceClassification

    from probe.models.shapes import PAPER_RM_SHAPES, SHAPES, config_for

    bench = json.loads(BENCH.read_text())
    rate = bench["matmul_flops_per_s"]
    sweeps = bench["results"]["sweep"]
    rows, totals = [], {"shared": 0.0, "uncached": 0.0}
    for rec in csv.DictReader(TABLE.open()):
        hub = next(k for k in PAPER_RM_SHAPES if k.split("/")[-1] == rec["Model Name"])
        shape = PAPER_RM_SHAPES[hub]
        cfg = config_for(shape)
        cfg.num_labels = 1
        with torch.device("meta"):
            model = AutoModelForSequenceClassification.from_config(cfg)
        family = "gemma2" if SHAPES[shape]["model_type"] == "gemma2" else "llama"
        ref = sweeps[MEASURED[family]]
        new = ref["new_tokens_per_row"]
        floor = cfg.vocab_size * flops_per_row(model, new) / rate
        row = {"model": rec["Model ID"], "hub_id": hub, "shape": shape, "vocab": cfg.vocab_size, "floor_s": floor}
        for path in totals:
            frac = ref["paths"][path]["fraction_of_floor"]
            row[f"{path}_s_per_prompt"] = floor / frac
            totals[path] += PROMPTS * floor / frac
        rows.append(row)
    out = {"source": str(BENCH.relative_to(ROOT)), "device": bench["device"], "prompts": PROMPTS, "rows": rows,
           "total_s": totals, "speedup": totals["uncached"] / totals["shared"]}
    out_path.with_suffix(".json").write_text(json.dumps(out, indent=1))
    lines = ["| model | shape | vocabulary | shared prefix s/prompt | uncached s/prompt |", "|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['shape']} | {r['vocab']:,} | {r['shared_s_per_prompt']:.1f} | "
              f"{r['uncached_s_per_prompt']:.1f} |" for r in rows]
    lines.append(f"\nTen models x {PROMPTS} prompts: shared prefix {totals['shared'] / 60:.1f} min, uncached (the paper's "
                 f"method) {totals['uncached'] / 3600:.2f} h ({out['speedup']:.1f}x), weights' loading not counted.")
    out_path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
