"""Benchmark the exhaustive sweep against the paper's method and against no cache, with the floor.

    python -m experiments.bench_sweep --model smollm2 --tokens 1024            # the real SmolLM2 (CPU)
    python -m experiments.bench_sweep --model llama-3.1-8b --layers 1,2        # random weights, published shape
    python -m experiments.bench_sweep --model gemma-2-2b --device cuda --dtype bfloat16 --layers full

In one process, on the same tokens and prompts, it times
  1. the paper's method: decode each id, render the chat template as a string, re-tokenize the batch with
     padding, and run the model's own forward (probe/paper_method.py: naive_scores);
  2. full-sequence scoring of raw ids without a cache (the prefix recomputed for every row);
  3. rm-probe's cached sweep (prefix once, then [token, *suffix] rows on its KV cache);
  4. the same with shared-prefix attention (kernels/prefix_attention.py: the prefix K/V read once per batch);
and measures the matmul rate (float32 GEMM of 2048^3 on CPU, bf16 8192^3 on GPU) in the same run. The floor
is the FLOPs the sweep must do (2 x non-embedding parameters x new tokens per row, plus the score head) over
that rate; each method reports the fraction of the floor it reaches (floor time / its time).

Random-weight models have the exact published widths, heads and vocabulary, but on CPU only 1 and 2 layers:
time(L) = fixed + L * per_layer is fitted from the two and extrapolated to the real depth (said so in the
output). Results go to experiments/results/bench_sweep_<model>_<device>.json and the table
experiments/results/bench_sweep.md is rebuilt from all result files.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch


from probe.core.engine import PrefixScorer
from probe.core.heads import LinearRewardHead
from probe.models.loading import LoadedModel
from probe.models.registry import DEFAULT
from probe.core.paper_method import naive_scores, paper_texts
from probe.core.prompts import PAPER_PROMPTS
from probe.core.scoring import sweep_rows
from probe.core.template import response_conversation, split_template

RESULTS = Path(__file__).resolve().parent / "results"
FAMILY_TEMPLATE = {"gemma-2-2b": "gemma", "gemma-2-27b": "gemma", "llama-3.2-3b": "llama3", "llama-3.1-8b": "llama3",
                   "llama-3-8b": "llama3", "llama-3.2-1b": "llama3", "gemma-3-270m": "gemma", "qwen3-0.6b": "chatml",
                   "qwen3-8b": "chatml"}


def matmul_rate(device: torch.device, dtype: torch.dtype, n: int, repeats: int = 5) -> float:
    """Best-of-``repeats`` GEMM rate in FLOP/s for an n x n x n product."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 1):
        _sync(device)
        t = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def non_embedding_params(model) -> int:
    emb = model.get_input_embeddings().weight.numel()
    out = model.get_output_embeddings()
    head = 0 if out is None or out.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr() else out.weight.numel()
    return sum(p.numel() for p in model.parameters()) - emb - head


def timed(fn, device, repeats: int) -> float:
    fn()  # warm-up (allocator, kernels)
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def load_model_for(name: str, layers: int | None, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    from transformers import AutoModelForSequenceClassification

    if name == "smollm2":
        from probe.models.loading import load_model

        torch.manual_seed(0)
        return load_model(None, kind="reward", device=str(device), dtype=str(dtype).split(".")[1],
                          allow_random_head=True)
    from probe.models.shapes import config_for
    from tests.tiny import make_tokenizer

    tok = make_tokenizer(FAMILY_TEMPLATE[name])
    overrides = {} if layers is None else {"num_hidden_layers": layers}
    if "gemma" in name and layers is not None:
        overrides["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if name.startswith("qwen3") and layers is not None:
        overrides["layer_types"] = ["full_attention"] * layers
    cfg = config_for(name, **overrides)
    cfg.pad_token_id = tok.pad_token_id
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForSequenceClassification.from_config(cfg, dtype=dtype)
    model.eval().requires_grad_(False)
    return LoadedModel(model, tok, DEFAULT, "reward", f"random:{name}", "random", None, "benchmark")


def run_methods(lm: LoadedModel, prompts: dict[str, str], n_tokens: int, batch: int, repeats: int,
                methods: list[str]) -> dict:
    device = lm.device
    rng = np.random.default_rng(0)
    # a random-weight model's ids need no tokenizer (its tiny one only renders the template): its whole embedding
    # matrix, unless the paper's method decodes each id to text
    rows = lm.model.get_input_embeddings().num_embeddings
    vocab = rows if lm.path == "random" and "paper" not in methods else min(len(lm.tokenizer), rows)
    if n_tokens > vocab:
        raise SystemExit(f"--tokens {n_tokens}: this run can score {vocab:,} ids"
                         + (" (the paper's method decodes each id with the tiny tokenizer: drop 'paper' from --methods "
                            "to sweep the model's whole vocabulary)" if "paper" in methods and rows > vocab else ""))
    ids = np.sort(rng.choice(vocab, size=n_tokens, replace=False))
    head = LinearRewardHead(lm.model, 0)
    out = {m: 0.0 for m in methods}
    shapes = {}
    for key, text in prompts.items():
        build = response_conversation(text)
        split = split_template(lm.tokenizer, build, n_verify=8)
        rows = sweep_rows(ids, split.suffix_ids)
        shapes[key] = {"prefix": len(split.prefix_ids), "new_tokens": rows.shape[1]}
        cached = PrefixScorer(lm.model, head, split.prefix_ids, shared_attention=False)
        shared = PrefixScorer(lm.model, head, split.prefix_ids, shared_attention=True)
        uncached = PrefixScorer(lm.model, head, split.prefix_ids, use_cache=False)
        texts = paper_texts(lm.tokenizer, build, ids) if "paper" in methods else None

        def sweep(scorer):
            def go():
                for s in range(0, rows.shape[0], batch):
                    scorer.score(rows[s : s + batch])
            return go

        fns = {"cached": sweep(cached), "shared": sweep(shared), "uncached": sweep(uncached),
               "paper": lambda: naive_scores(lm.model, lm.tokenizer, texts, batch)}
        for m in methods:
            out[m] += timed(fns[m], device, repeats)
    return {"seconds": out, "shapes": shapes, "n_tokens_per_prompt": n_tokens}


def flops_per_row(lm: LoadedModel, new_tokens: int) -> float:
    """2 x non-embedding parameters x new tokens, plus the linear score head on one position."""
    return 2 * non_embedding_params(lm.model) * new_tokens + 2 * lm.model.config.hidden_size


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma-2-2b, llama-3.2-3b, llama-3.1-8b, ...")
    ap.add_argument("--tokens", type=int, default=1024, help="token ids per prompt (a fixed random sample)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats (best is kept) after one warm-up")
    ap.add_argument("--layers", default="1,2", help="random-weight models: 'full' or two layer counts to fit")
    ap.add_argument("--methods", default="paper,uncached,cached,shared",
                    help="paper, uncached, cached (plain prefix cache), shared (cache + shared-prefix attention)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--profile", action="store_true", help="print a torch.profiler table of one cached batch")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    methods = args.methods.split(",")
    gemm = 2048 if device.type == "cpu" else 8192
    rate_before = matmul_rate(device, dtype, gemm)
    result = {"model": args.model, "device": str(device), "dtype": args.dtype, "threads": torch.get_num_threads(),
              "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "batch": args.batch, "prompts": list(PAPER_PROMPTS), "methods": {}}
    layer_runs = [None] if args.model == "smollm2" or args.layers == "full" else [int(x) for x in args.layers.split(",")]
    fits = {}
    for layers in layer_runs:
        lm = load_model_for(args.model, layers, device, dtype)
        res = run_methods(lm, PAPER_PROMPTS, args.tokens, args.batch, args.repeats, methods)
        new = res["shapes"]["greatest"]["new_tokens"]
        fits[layers] = {"seconds": res["seconds"], "flops_per_row": flops_per_row(lm, new), "shapes": res["shapes"],
                        "layers": lm.model.config.num_hidden_layers}
        if args.profile:
            _profile(lm, args.batch)
        del lm
    # the GEMM rate of a shared machine drifts: measure it before and after, keep the best (a conservative floor)
    rate = max(rate_before, matmul_rate(device, dtype, gemm))
    result["matmul_flops_per_s"] = rate
    result["matmul_flops_per_s_before_after"] = [rate_before, rate]
    full_layers = None
    if len(layer_runs) == 2:
        from probe.models.shapes import SHAPES

        full_layers = SHAPES[args.model]["num_hidden_layers"]
        (l1, a), (l2, b) = list(fits.items())
        per_layer = {m: (b["seconds"][m] - a["seconds"][m]) / (l2 - l1) for m in methods}
        fixed = {m: a["seconds"][m] - l1 * per_layer[m] for m in methods}
        seconds = {m: fixed[m] + full_layers * per_layer[m] for m in methods}
        flops_layer = (b["flops_per_row"] - a["flops_per_row"]) / (l2 - l1)
        flops_row = a["flops_per_row"] - l1 * flops_layer + full_layers * flops_layer
        result["extrapolated"] = {"from_layers": [l1, l2], "to_layers": full_layers, "per_layer_s": per_layer,
                                  "fixed_s": fixed, "note": "time(L) = fixed + L * per_layer fitted on two depths"}
    else:
        (only,) = fits.values()
        seconds, flops_row = only["seconds"], only["flops_per_row"]
    rows_total = args.tokens * len(PAPER_PROMPTS)
    floor_s = rows_total * flops_row / rate
    for m in methods:
        result["methods"][m] = {"seconds": seconds[m], "tokens_per_s": rows_total / seconds[m],
                                "fraction_of_floor": floor_s / seconds[m]}
    if "paper" in methods:
        for m in methods:
            result["methods"][m]["speedup_vs_paper"] = seconds["paper"] / seconds[m]
    result.update(rows=rows_total, flops_per_row=flops_row, floor_s=floor_s, layers=full_layers or
                  next(iter(fits.values()))["layers"], shapes=next(iter(fits.values()))["shapes"],
                  command=" ".join(sys.argv))
    name = f"bench_sweep_{args.model}_{device.type}{'' if args.dtype == 'float32' else '_' + args.dtype}.json"
    path = Path(args.out) if args.out else RESULTS / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    write_table()
    _print(result)
    return result


def _profile(lm: LoadedModel, batch: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    split = split_template(lm.tokenizer, response_conversation(PAPER_PROMPTS["greatest"]), n_verify=0)
    scorer = PrefixScorer(lm.model, LinearRewardHead(lm.model, 0), split.prefix_ids)
    rows = sweep_rows(np.arange(batch), split.suffix_ids)
    scorer.score(rows)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if lm.device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        scorer.score(rows)
    print(prof.key_averages().table(sort_by="self_cpu_time_total" if lm.device.type == "cpu" else
                                    "self_cuda_time_total", row_limit=18))


def _print(r: dict) -> None:
    print(f"{r['model']} on {r['device']} ({r['dtype']}, {r['threads']} threads): matmul {r['matmul_flops_per_s'] / 1e9:.1f} "
          f"GFLOP/s; floor {r['floor_s']:.2f} s for {r['rows']} rows x {r['flops_per_row'] / 1e9:.3f} GFLOP")
    if "extrapolated" in r:
        e = r["extrapolated"]
        print(f"  (extrapolated from {e['from_layers']} layers to {e['to_layers']})")
    for m, v in r["methods"].items():
        extra = f", {v['speedup_vs_paper']:.2f}x the paper's method" if "speedup_vs_paper" in v else ""
        print(f"  {m:>9}: {v['seconds']:8.2f} s  {v['tokens_per_s']:9.1f} tokens/s  "
              f"{100 * v['fraction_of_floor']:5.1f}% of floor{extra}")


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"  # the paper's method not run in that benchmark


def write_table() -> None:
    rows = []
    for path in sorted(RESULTS.glob("bench_sweep_*.json")):
        r = json.loads(path.read_text())
        for m, v in r["methods"].items():
            rows.append(f"| {r['model']} | {r['device']} {r['dtype']} ({r['threads']} thr) | {r['layers']}"
                        f"{' (extrap.)' if 'extrapolated' in r else ''} | {m} | {v['seconds']:.2f} | "
                        f"{v['tokens_per_s']:.1f} | {_ratio(v.get('speedup_vs_paper'))} | "
                        f"{100 * v['fraction_of_floor']:.1f}% | {r['matmul_flops_per_s'] / 1e9:.0f} |")
    head = ("# Sweep benchmarks\n\nRegenerated by `experiments/bench_sweep.py` from the JSON files beside it. Times are "
            "for the paper's three prompts x the sampled tokens; 'floor' = FLOPs the sweep must do / the GEMM rate "
            "measured in the same run. Ratios compare methods only within one model's run (one process, one load "
            "on the host); '-': the paper's method was not run. Extrapolated rows are fitted from 1 and 2 layers, "
            "so their noise is multiplied by the depth.\n\n| model | device | layers | method | seconds | tokens/s | x paper | "
            "of floor | GEMM GFLOP/s |\n|---|---|---|---|---|---|---|---|---|\n")
    (RESULTS / "bench_sweep.md").write_text(head + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
