"""Each family's default input (its model card's) against ``--input-method rewardbench`` (RewardBench 0.1.4's): the
largest score difference and the Kendall tau between the two routes' rankings of one sweep.

    python -m experiments.rewardbench_route [--limit 8192]

Tiny random models built with each family's class (RewardBench's own where it has one) on real tokenizers: Llama
3.1's (a plain sequence classifier, read through RewardBenchPipeline, and GRM) and Mistral v0.1's SentencePiece file
for the Llama-2-era dialogue formats (UltraRM, Beaver reward and cost, Ziya). One sweep of the first `--limit` token
ids per route, the paper's first prompt. Writes experiments/results/rewardbench_route.{json,md}.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

PROMPT = "What, in one word, is the greatest thing ever?"
# family: (tokenizer, RewardBench module or None for transformers, class, registry spec, config fields, template)
FAMILIES = {
    "sequence classifier (RewardBenchPipeline)": ("llama3.1", None, "LlamaForSequenceClassification", None, {}, None),
    "GRM (GRMPipeline)": ("llama3.1", "grm", "GRewardModel", "Ray2333/GRM-llama3-8B-sftreg",
                          dict(vhead_layer_type="mlp", vhead_num_neurons=32, vhead_num_layers=2), None),
    "UltraRM (OpenBMBPipeline)": ("mistral", "openbmb", "LlamaRewardModel", "openbmb/UltraRM-13b", {}, "openbmb"),
    "Beaver reward (BeaverPipeline)": ("mistral", "beaver", "LlamaForScore", "PKU-Alignment/beaver-7b-v1.0-reward",
                                       dict(score_dim=1, bias=True, score_type="reward"), "pku-align"),
    "Beaver cost (BeaverCostPipeline)": ("mistral", "beaver", "LlamaForScore", "PKU-Alignment/beaver-7b-v1.0-cost",
                                         dict(score_dim=1, bias=False, score_type="cost"), "pku-align"),
    "Ziya (ZiyaPipeline)": ("mistral", None, "LlamaForSequenceClassification", "IDEA-CCNL/Ziya-LLaMA-7B-Reward", {},
                            "ziya"),
}


def build(name: str, folder: Path) -> str:
    import transformers
    from transformers import AutoTokenizer

    from tests import real_tokenizers, tiny
    from tests import rewardbench_code as rb

    tok_name, module, cls, _, fields, _ = FAMILIES[name]
    if tok_name == "mistral":
        real_tokenizers.mistral_v1(folder, None)
    else:
        real_tokenizers.build(tok_name, folder)
    tok = AutoTokenizer.from_pretrained(folder)
    # Llama-2-era configs pad with id 0 (<unk>); Llama 3.1 with its finetune pad token
    config = tiny.llama_config(tok, vocab_size=len(tok), pad_token_id=0 if tok_name == "mistral"
                               else tok.convert_tokens_to_ids("<|finetune_right_pad_id|>"))
    klass = getattr(transformers, cls) if module is None else getattr(rb.load(module), cls)
    model = tiny.family_model(klass, config, fields)
    model.save_pretrained(folder)
    return str(folder)


def compare(name: str, limit: int) -> dict:
    import numpy as np
    from scipy import stats

    import probe
    from probe.core.scoring import ScoringOptions, prompt_split

    _, _, _, spec, _, template = FAMILIES[name]
    with tempfile.TemporaryDirectory() as tmp:
        folder = build(name, Path(tmp) / "m")
        kw = dict(device="cpu", spec=spec, chat_template=template, allow_random_head=spec is None)
        lms = {route: probe.load(folder, input_method=route, **kw) for route in ("ids", "rewardbench")}
        splits = {r: prompt_split(lm, "reward", PROMPT, None, ScoringOptions(), len(lm.tokenizer))
                  for r, lm in lms.items()}
        sweeps = {r: probe.sweep(lm, None, PROMPT, limit=limit).sort("token_id") for r, lm in lms.items()}
        tok = lms["ids"].tokenizer
    a, b = (sweeps[r]["score"].to_numpy().astype(np.float64) for r in ("ids", "rewardbench"))
    s, t = splits["ids"], splits["rewardbench"]
    how = []
    if t.bos_count != s.bos_count:
        how.append(f"{t.bos_count} BOS instead of {s.bos_count}")
    extra = list(t.suffix_ids[len(s.suffix_ids):]) if t.suffix_ids[: len(s.suffix_ids)] == s.suffix_ids else None
    if extra:
        how.append(f"+ {tok.convert_ids_to_tokens(extra)} at the end")
    return {"family": name, "tokens": int(a.size), "ids_differ": " and ".join(how) or "none",
            "max_abs_diff": float(np.abs(a - b).max()), "score_sd": float(a.std()),
            "kendall_tau": float(stats.kendalltau(a, b).statistic)}


def main(argv=None) -> None:
    from experiments.common import write_results

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=8192)
    args = parser.parse_args(argv)
    rows = [compare(name, args.limit) for name in FAMILIES]
    print(write_results(
        "rewardbench_route", "The family's own input against RewardBench's (`--input-method rewardbench`)",
        f"`python -m experiments.rewardbench_route --limit {args.limit}`: tiny random models on real tokenizers, one "
        "sweep of the first token ids per route, the paper's first prompt.",
        [("family (RewardBench's pipeline)", lambda r: r["family"]), ("tokens", lambda r: f"{r['tokens']:,}"),
         ("how RewardBench's ids differ", lambda r: r["ids_differ"]),
         ("max abs diff", lambda r: f"{r['max_abs_diff']:.4f}"), ("score sd", lambda r: f"{r['score_sd']:.4f}"),
         ("Kendall tau", lambda r: f"{r['kendall_tau']:.4f}")],
        rows))


if __name__ == "__main__":
    main()
