"""CPU cost of the hybrid linear-attention and state-space decoders (and the newer ones on the plain cache path),
relative to a Llama of the same width and depth, on the engine's own paths (issue 71).

Each architecture is its tests' tiny layout (tests/tiny_hybrid.py) widened 4x (hidden 256, MLP 512, heads doubled and
twice as wide, every ratio kept), float32, on the tests' 1,500-token ChatML tokenizer; its Llama has the same hidden
size, MLP width, depth and attention heads. Measured: a sweep (512 rows of one token and the template's 5 closing ids
on a 64-id prefix, batches of 256, the log-probability head) and whole responses (64 responses of 4 to 24 ids, each
length its own forward), each the least of ``--repeats`` runs with the three models taken in turn, one thread, MKL's
strict mode; the Llama is timed on its default path (the shared-prefix attention) and on the plain cache path, as the
hybrids run.

    python -m experiments.bench_hybrid_cpu [--repeats 3] [--only qwen3_5 jamba]   (--only: those rows again)

writes experiments/results/bench_hybrid_cpu.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from pathlib import Path

os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SWEEP_ROWS, RESPONSES = 512, 64
WIDER = ("hidden_size", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
         "shared_intermediate_size", "intermediate_size_mlp", "mamba_d_ssm", "moe_shared_expert_intermediate_size")
TWICE = ("head_dim", "linear_key_head_dim", "linear_value_head_dim", "mamba_head_dim", "mamba_d_head", "linear_head_dim",
         "v_head_dim", "qk_nope_head_dim", "qk_rope_head_dim", "kv_lora_rank", "hidden_size_per_layer_input",
         "num_attention_heads", "num_key_value_heads", "linear_num_key_heads", "linear_num_value_heads",
         "linear_num_heads", "mamba_num_heads", "mamba_n_heads", "n_mamba_heads", "num_heads")


def widened(name: str, tokenizer):
    """The tests' tiny config of ``name`` with the sizes its builder sets widened 4x (`WIDER`) and its head counts and
    head widths doubled (`TWICE`): every ratio of the layout kept, derived sizes derived again."""
    from unittest import mock

    from tests import tiny_hybrid

    make = tiny_hybrid.ARCHS[name][0]
    with mock.patch.object(tiny_hybrid, "_make", lambda config_name, tok, over, **fields: fields):
        fields = make(tokenizer)
    scaled = {k: v * (4 if k in WIDER else 2) for k, v in fields.items() if k in WIDER + TWICE and isinstance(v, int)}
    return make(tokenizer, **scaled)


def llama_like(config, tokenizer):
    """A Llama of ``config``'s width, MLP, depth and attention heads."""
    from transformers import LlamaConfig

    from tests import tiny

    text = config.get_text_config()
    heads = getattr(text, "num_attention_heads", None) or 8
    return LlamaConfig(**tiny._common(tokenizer, hidden_size=text.hidden_size,
                                      intermediate_size=getattr(text, "intermediate_size", None) or 4 * text.hidden_size,
                                      num_hidden_layers=text.num_hidden_layers, num_attention_heads=heads,
                                      num_key_value_heads=getattr(text, "num_key_value_heads", None) or heads))


def _model(config, causal_class: str):
    import transformers

    torch.manual_seed(0)
    return getattr(transformers, causal_class)(config).float().eval().requires_grad_(False)


def _workload(model, tokenizer, shared: bool = True):
    """(sweep, responses) as two functions on ``model``'s scorer, and the scorer."""
    from probe.core.engine import PrefixScorer
    from probe.core.heads import LogprobHead
    from probe.core.scoring import AdaptiveBatcher

    rng = random.Random(0)
    vocab = len(tokenizer)
    prefix = [rng.randrange(3, vocab) for _ in range(64)]
    suffix = [rng.randrange(3, vocab) for _ in range(5)]
    sweep = torch.tensor([[t % vocab, *suffix] for t in range(SWEEP_ROWS)])
    responses = [[rng.randrange(3, vocab) for _ in range(rng.randint(4, 24))] for _ in range(RESPONSES)]
    scorer = PrefixScorer(model, LogprobHead(model, fused=True), prefix, shared_attention=shared)

    def run_sweep():
        AdaptiveBatcher(256).run(scorer.score, sweep)

    def run_responses():
        for s in range(0, len(responses), 64):
            scorer.score(responses[s : s + 64])

    return run_sweep, run_responses, scorer


def measure(models: dict, tokenizer, repeats: int) -> dict:
    """Each model's sweep and responses, the least of ``repeats`` runs, the models taken in turn within each repeat
    (a shared machine's load then weighs on all of them alike)."""
    work = {k: _workload(m, tokenizer, shared) for k, (m, shared) in models.items()}
    for sweep, responses, _ in work.values():  # warm-up: first-call allocations, lazy imports
        sweep()
        responses()
    best = {k: {"sweep_s": float("inf"), "responses_s": float("inf")} for k in work}
    for _ in range(repeats):
        for k, (sweep, responses, _) in work.items():
            for key, fn in (("sweep_s", sweep), ("responses_s", responses)):
                t = time.perf_counter()
                fn()
                best[k][key] = min(best[k][key], time.perf_counter() - t)
    return {k: {**best[k], "path": "shared" if s.shared is not None else "cache", "continuation": s.reuse.to_json().get("continuation"),
                "parameters": sum(p.numel() for p in s.model.parameters())} for k, (_, _, s) in work.items()}


def main(argv=None) -> dict:
    from tests import tiny, tiny_hybrid

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    tok = tiny.make_tokenizer("chatml")
    names = [n for n in (args.only or tiny_hybrid.ARCHS) if n != "deepseek_v32" and tiny_hybrid.available(n)]
    out = {"machine": {"cpu": platform.processor() or platform.machine(), "threads": 1,
                       "torch": torch.__version__, "transformers": __import__("transformers").__version__,
                       "capability": torch.backends.cpu.get_cpu_capability()},
           "rows": {}}
    if args.only and (RESULTS / "bench_hybrid_cpu.json").is_file():  # the other rows kept, these measured again
        out["rows"] = json.loads((RESULTS / "bench_hybrid_cpu.json").read_text())["rows"]
    for name in names:
        config = widened(name, tok)
        llama = _model(llama_like(config, tok), "LlamaForCausalLM")
        got = measure({"arch": (_model(config, tiny_hybrid.ARCHS[name][3]), True), "llama": (llama, True),
                       "llama_cache": (llama, False)}, tok, args.repeats)
        arch, base, base_cache = got["arch"], got["llama"], got["llama_cache"]
        text = config.get_text_config()
        row = {"arch": arch, "llama": base, "llama_cache": base_cache, "layers": text.num_hidden_layers,
               "hidden": text.hidden_size}
        out["rows"][name] = row
        print(f"{name:18s} sweep {arch['sweep_s']:.2f}s vs llama {base['sweep_s']:.2f}s ({base_cache['sweep_s']:.2f}s "
              f"cache); responses {arch['responses_s']:.2f}s vs {base['responses_s']:.2f}s "
              f"({base_cache['responses_s']:.2f}s)", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_hybrid_cpu.json").write_text(json.dumps(out, indent=1) + "\n")
    (RESULTS / "bench_hybrid_cpu.md").write_text(table(out))
    return out


def table(out: dict) -> str:
    m = out["machine"]
    lines = ["# CPU cost of the hybrid and newer decoders, relative to a Llama of the same size", "",
             f"Written by `experiments/bench_hybrid_cpu.py` ({m['cpu']}, {m['capability']}, {m['threads']} thread, "
             f"torch {m['torch']}, transformers {m['transformers']}, float32, MKL strict). Each model: the tests' "
             "tiny layout widened 4x (hidden 256); its Llama: the same hidden size, MLP, depth and heads. Sweep: 512 "
             "rows (1 token + 5 closing ids on a 64-id prefix, batches of 256); responses: 64 of 4-24 ids; the "
             "log-probability head; least of the repeats, the three models in turn. 'x Llama': the model's time over the Llama's on "
             "its default path (shared-prefix attention); 'x Llama cache': over the Llama's plain cache path, the "
             "path every hybrid takes. Times are of one shared 2-core machine: ratios within a row are what to read.",
             "", "| model | layers | parameters | path | sweep s | x Llama | x Llama cache | responses s | x Llama | "
                 "x Llama cache |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in out["rows"].items():
        a, b, c = r["arch"], r["llama"], r["llama_cache"]
        path = a["path"] + (f" ({a['continuation']})" if a.get("continuation") else "")
        lines.append(f"| {name} | {r['layers']} | {a['parameters'] / 1e6:.1f} M | {path} | {a['sweep_s']:.2f} | "
                     f"{a['sweep_s'] / b['sweep_s']:.2f} | {a['sweep_s'] / c['sweep_s']:.2f} | {a['responses_s']:.2f} | "
                     f"{a['responses_s'] / b['responses_s']:.2f} | {a['responses_s'] / c['responses_s']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
