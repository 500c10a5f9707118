"""GRM's input with two BOS (its training code's and cards' `tokenizer(apply_chat_template(..., tokenize=False))`,
rm-probe's default for GRM) against one BOS (the chat template's ids alone): how far scores and rankings move.

    python -m experiments.grm_bos [--limit 16384]

A tiny GRM (RewardBench's own GRewardModel class: Llama backbone with an MLP v_head, and Gemma 2 backbone with a
linear v_head, random weights, heads spread as the tests spread them) on the real tokenizers and official templates
of Llama 3.1 and Gemma 2 (tests/real_tokenizers.py). One sweep of the first `--limit` token ids per route and
family, the paper's first prompt. Writes experiments/results/grm_bos.{json,md}. Random weights say how much the
extra token can move a score through the model's arithmetic, not how a trained GRM reacts to it.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

PROMPT = "What, in one word, is the greatest thing ever?"
FAMILIES = {"llama3.1": ("llama", dict(vhead_layer_type="mlp", vhead_num_neurons=32, vhead_num_layers=2),
                         "Ray2333/GRM-llama3-8B-sftreg"),
            "gemma2": ("gemma2", dict(vhead_layer_type="linear"), "Ray2333/GRM-Gemma2-2B-sftreg")}


def tiny_grm(family: str, folder: Path) -> str:
    from transformers import AutoTokenizer

    from tests import real_tokenizers, tiny
    from tests import rewardbench_code as rb

    kind, fields, _ = FAMILIES[family]
    real_tokenizers.build(family, folder)
    tok = AutoTokenizer.from_pretrained(folder)
    config = (tiny.gemma2_config if kind == "gemma2" else tiny.llama_config)(tok, vocab_size=len(tok))
    tiny.family_model(rb.load("grm").GRewardModel, config, fields).save_pretrained(folder)
    return str(folder)


def compare(family: str, limit: int) -> dict:
    import numpy as np
    from scipy import stats

    import probe

    with tempfile.TemporaryDirectory() as tmp:
        folder = tiny_grm(family, Path(tmp) / family)
        lm = probe.load(folder, device="cpu", spec=FAMILIES[family][2])
        two = probe.sweep(lm, None, PROMPT, limit=limit).sort("token_id")
        lm.tokenizer.rm_probe_input_call = "chat_template"  # the template's ids alone: one BOS
        one = probe.sweep(lm, None, PROMPT, limit=limit).sort("token_id")
    a, b = two["score"].to_numpy().astype(np.float64), one["score"].to_numpy().astype(np.float64)
    diff = np.abs(a - b)
    top = lambda x: set(np.argsort(-x)[:100].tolist())  # noqa: E731
    return {"family": family, "tokens": int(a.size), "max_abs_diff": float(diff.max()),
            "mean_abs_diff": float(diff.mean()), "score_sd_two_bos": float(a.std()),
            "kendall_tau": float(stats.kendalltau(a, b).statistic),
            "spearman": float(stats.spearmanr(a, b).statistic), "top100_overlap": len(top(a) & top(b))}


def main(argv=None) -> None:
    from experiments.common import write_results

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=16384)
    args = parser.parse_args(argv)
    rows = [compare(f, args.limit) for f in FAMILIES]
    print(write_results(
        "grm_bos", "GRM: two BOS (training code, cards, rm-probe's default) against one BOS",
        f"`python -m experiments.grm_bos --limit {args.limit}`; tiny random GRewardModel on the real tokenizer and "
        "template; the first ids of the vocabulary as one-token responses to the paper's first prompt.",
        [("tokenizer", lambda r: r["family"]), ("tokens", lambda r: f"{r['tokens']:,}"),
         ("max abs diff", lambda r: f"{r['max_abs_diff']:.4f}"), ("mean abs diff", lambda r: f"{r['mean_abs_diff']:.4f}"),
         ("score sd", lambda r: f"{r['score_sd_two_bos']:.4f}"), ("Kendall tau", lambda r: f"{r['kendall_tau']:.4f}"),
         ("Spearman", lambda r: f"{r['spearman']:.4f}"), ("top-100 overlap", lambda r: str(r["top100_overlap"]))],
        rows))


if __name__ == "__main__":
    main()
