"""How far a correct bf16 score moves by rounding alone: the measurement behind the self-check's half-precision
tolerance (probe/core/precision.py).

    python -m experiments.bf16_tolerance                  # tiny families + SmolLM2 + Gemma 3 270M, both kernel levels
    python -m experiments.bf16_tolerance --models tiny    # seconds

For each model and score head, on a random sample of single-token responses to the paper's first prompt:
the model's own forward in float32 (the truth here), the model's own bf16 forward (SDPA and eager attention), the
bf16 fast path (shared-prefix cache), and the *rounding noise* the self-check measures (the largest change of a
score when every module's output is moved by a random fraction of one unit roundoff, 4 seeds). Each model runs
twice, in a child process with this CPU's kernels and in one capped at AVX2 (``ATEN_CPU_CAPABILITY=avx2``), as
on the CPU where the first tolerance failed. Writes experiments/results/bf16_tolerance_cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT = "What, in one word, is the greatest thing ever?"
TINY = [("llama-rm", "reward"), ("gemma2-rm", "reward"), ("qwen2-rm", "reward"), ("qwen3-rm", "reward"),
        ("gemma3-rm", "reward"), ("llama-lm", "logprob"), ("gemma2-lm", "logprob"), ("qwen3-lm", "logprob"),
        ("gemma3-lm", "logprob"), ("llama-lm", "judge")]
REAL = [("smollm2", "logprob"), ("smollm2", "reward"), ("gemma3-270m", "logprob")]


def _tiny(name: str):
    from transformers import (Gemma2ForCausalLM, Gemma2ForSequenceClassification, Gemma3ForCausalLM,
                              Gemma3TextForSequenceClassification, LlamaForCausalLM, LlamaForSequenceClassification,
                              Qwen2ForSequenceClassification, Qwen3ForCausalLM, Qwen3ForSequenceClassification)

    from probe.models.loading import LoadedModel
    from probe.models.registry import DEFAULT
    from tests import tiny

    family, kind = name.rsplit("-", 1)
    tok = tiny.make_tokenizer({"llama": "llama3", "gemma2": "gemma", "gemma3": "gemma"}.get(family, "chatml"))
    classes = {("llama", "rm"): LlamaForSequenceClassification, ("llama", "lm"): LlamaForCausalLM,
               ("gemma2", "rm"): Gemma2ForSequenceClassification, ("gemma2", "lm"): Gemma2ForCausalLM,
               ("gemma3", "rm"): Gemma3TextForSequenceClassification, ("gemma3", "lm"): Gemma3ForCausalLM,
               ("qwen2", "rm"): Qwen2ForSequenceClassification, ("qwen3", "rm"): Qwen3ForSequenceClassification,
               ("qwen3", "lm"): Qwen3ForCausalLM}
    config = getattr(tiny, f"{family}_config")(tok)
    model = tiny.build(classes[family, kind], config)
    return LoadedModel(model, tok, DEFAULT, "reward" if kind == "rm" else "causal", name, name, None, "test")


def _real(name: str, mode: str):
    from probe.models.loading import load_model

    torch.manual_seed(0)  # the random reward head of SmolLM2-as-classifier
    return load_model(None if name == "smollm2" else name, kind="reward" if mode == "reward" else "causal",
                      device="cpu", allow_random_head=mode == "reward")


def measure(loaded, mode: str, n: int) -> dict:
    from probe.core.engine import FullSequenceScorer, PrefixScorer
    from probe.core.precision import rounding_noise
    from probe.core.scoring import ScoringOptions, TemplateRows, make_head, n_scorable, prompt_split

    half = replace(loaded, model=copy.deepcopy(loaded.model).to(torch.bfloat16))
    split = prompt_split(loaded, mode, PROMPT, None, ScoringOptions(), n_scorable(loaded))
    ids = np.random.default_rng(0).choice(n_scorable(loaded), size=n, replace=False)
    rows, lengths = TemplateRows(split).rows(ids.tolist())
    prefix = split.prefix_ids

    def own(lm):
        return FullSequenceScorer(lm.model, make_head(lm, mode), prefix).score(rows, lengths).cpu().numpy().astype(float)

    truth, own16 = own(loaded), own(half)
    fast16 = PrefixScorer(half.model, make_head(half, mode), prefix).score(rows, lengths).cpu().numpy().astype(float)
    noise = rounding_noise(half.model, lambda: own(half), own16)
    noise_few = rounding_noise(half.model, lambda: own(half)[:2], own16[:2])  # what the social check sees
    half.model.set_attn_implementation("eager")
    eager16 = own(half)
    dis = float(np.abs(fast16 - own16).max())
    return {
        "n": n, "score_mean_abs": float(np.abs(truth).mean()), "score_spread": float(np.ptp(truth)),
        "own_bf16_vs_float32": float(np.abs(own16 - truth).max()),
        "eager_bf16_vs_float32": float(np.abs(eager16 - truth).max()),
        "fast_bf16_vs_float32": float(np.abs(fast16 - truth).max()),
        "fast_vs_own_bf16": dis, "rounding_noise": noise, "rounding_noise_2_rows": noise_few,
        "ratio_fast_vs_own_to_noise": dis / noise, "ratio_own_error_to_noise": float(np.abs(own16 - truth).max()) / noise,
        "ratio_2_rows": float(np.abs(fast16 - own16)[:2].max()) / noise_few,
        "old_rule_tolerance": 0.05 * (1 + float(np.ptp(own16))),
    }


def child(names: list[str]) -> list[dict]:
    torch.set_num_threads(2)
    out = []
    for item in names:
        name, mode = item.split(":")
        tiny = name.endswith(("-rm", "-lm"))
        loaded = _tiny(name) if tiny else _real(name, mode)
        row = {"model": name, "mode": mode, "kernels": torch.backends.cpu.get_cpu_capability(),
               **measure(loaded, mode, 48 if tiny else 16)}
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def cuda(device: torch.device) -> list[dict]:
    """The tiny families on ``device``, 48 rows each: bf16_tolerance_cuda.{json,md} (no kernel levels to vary)."""
    import transformers

    rows = []
    for name, mode in TINY:
        loaded = _tiny(name)
        loaded.model.to(device)
        rows.append({"model": name, "mode": mode, "kernels": torch.cuda.get_device_name(device),
                     **measure(loaded, mode, 48)})
    meta = {"cpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
            "transformers": transformers.__version__, "command": f"python -m experiments.bf16_tolerance --device {device}"}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bf16_tolerance_cuda.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (RESULTS / "bf16_tolerance_cuda.md").write_text(markdown(rows, meta).replace("(CPU)", "(CUDA)"))
    print(markdown(rows, meta))
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# bf16 rounding noise and the self-check's tolerance (CPU)", "",
             f"`python -m experiments.bf16_tolerance` on {meta['cpu']}, torch {meta['torch']}, transformers "
             f"{meta['transformers']}. Single-token responses to the paper's first prompt, sampled at random "
             "(48 per tiny model, 16 per real one). All differences are the largest over the sample.", "",
             "| model | head | kernels | own bf16 vs fp32 | eager bf16 vs fp32 | fast bf16 vs fp32 | fast vs own (bf16) | "
             "rounding noise | fast-vs-own / noise | own error / noise | old rule's tolerance |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['mode']} | {r['kernels']} | {r['own_bf16_vs_float32']:.4g} | "
                     f"{r['eager_bf16_vs_float32']:.4g} | {r['fast_bf16_vs_float32']:.4g} | {r['fast_vs_own_bf16']:.4g} | "
                     f"{r['rounding_noise']:.4g} | {r['ratio_fast_vs_own_to_noise']:.2f} | "
                     f"{r['ratio_own_error_to_noise']:.2f} | {r['old_rule_tolerance']:.3g} |")
    ratio = [r["ratio_fast_vs_own_to_noise"] for r in rows]
    own = [r["ratio_own_error_to_noise"] for r in rows]
    two = [r["ratio_2_rows"] for r in rows]
    lines += ["", f"Disagreement of the fast path with the model's own bf16 forward, in units of the rounding noise "
              f"measured on the same rows: {min(ratio):.2f} to {max(ratio):.2f}; the model's own bf16 error against "
              f"float32: {min(own):.2f} to {max(own):.2f}; with the noise measured on 2 rows only (the social "
              f"benchmark's check): {min(two):.2f} to {max(two):.2f}. The tolerance is 2 x noise.", ""]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", choices=["tiny", "all"], default="all")
    ap.add_argument("--device", default="cpu", help="cpu (both kernel levels, in child processes) or cuda (the tiny "
                    "families on the GPU; the GPU kit runs this through experiments/gpu_bench.py)")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child)
        return
    if args.device != "cpu":
        cuda(torch.device(args.device))
        return
    cases = TINY + (REAL if args.models == "all" else [])
    rows = []
    for kernels in ("default", "avx2"):
        env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
        if kernels == "avx2":
            env["ATEN_CPU_CAPABILITY"] = "avx2"
        proc = subprocess.run([sys.executable, "-m", "experiments.bf16_tolerance", "--child",
                               *[f"{n}:{m}" for n, m in cases]], env=env, capture_output=True, text=True, check=True)
        rows += [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    import transformers

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    meta = {"cpu": cpu, "torch": torch.__version__, "transformers": transformers.__version__,
            "command": "python -m experiments.bf16_tolerance" + (" --models tiny" if args.models == "tiny" else "")}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bf16_tolerance_cpu.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (RESULTS / "bf16_tolerance_cpu.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))


if __name__ == "__main__":
    main()
