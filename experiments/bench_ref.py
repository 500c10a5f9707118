"""An implicit-reward sweep (``--ref``) of the embedded SmolLM2 against a plain one, side by side on this machine.

    python -m experiments.bench_ref [--limit 4096]

No second packaged model shares SmolLM2's tokenizer, so the reference is a copy of SmolLM2 with every weight
moved by 1% Gaussian noise (seeded), saved to a temporary folder: what a DPO policy and its SFT reference are
to each other in kind (one vocabulary, nearby weights). Each sweep runs as the command does, in its own process,
the first `--limit` token ids of the paper's first prompt; the seconds are those the run itself records for
sweeping (load and self-check apart). Writes experiments/results/bench_ref_smollm2_cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT = "What, in one word, is the greatest thing ever?"


def perturbed_copy(folder: Path, scale: float = 0.01) -> str:
    import torch

    from probe.models.loading import load_model

    lm = load_model(None, kind="causal", device="cpu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in lm.model.parameters():
            p.mul_(1 + scale * torch.randn(p.shape, generator=g))
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return str(folder)


def sweep(args: list[str], out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "probe.exhaustive", *args, "--output", str(out), "--no-progress",
                    "--top", "5"], check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True)
    (run,) = sorted(out.glob("*/exhaustive_*"))[-1:]
    meta = json.loads((run / "meta.json").read_text())
    timing = meta["timing"]["prompts"]["greatest"] if "greatest" in meta["timing"]["prompts"] else \
        next(iter(meta["timing"]["prompts"].values()))
    return {"run": str(run), "sweep_s": timing.get("sweep_s") or timing.get("seconds"), "timing": timing,
            "self_check": meta["self_check"]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=4096)
    args = ap.parse_args(argv)
    common = ["--prompt", PROMPT, "--limit", str(args.limit), "--device", "cpu"]
    with tempfile.TemporaryDirectory() as tmp:
        ref = perturbed_copy(Path(tmp) / "smollm2-perturbed")
        plain = sweep(common, Path(tmp) / "plain")
        implicit = sweep(["--ref", ref, "--beta", "0.1", *common], Path(tmp) / "ref")
        import polars as pl

        top = pl.read_parquet(Path(implicit["run"]) / "scores.parquet").sort("rank").head(5)
        best = list(zip(top["decoded"].to_list(), [round(float(x), 4) for x in top["score"]]))
    ratio = implicit["sweep_s"] / plain["sweep_s"]
    result = {"command": "python -m experiments.bench_ref" + (f" --limit {args.limit}" if args.limit != 4096 else ""),
              "tokens": args.limit, "plain": plain, "implicit": implicit, "ratio": ratio, "best_implicit": best}
    for r in (result["plain"], result["implicit"]):
        r.pop("run")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_ref_smollm2_cpu.json").write_text(json.dumps(result, indent=1) + "\n")
    md = ["# Implicit-reward sweep (--ref) against a plain sweep, SmolLM2 on this CPU", "",
          f"`{result['command']}`: the first {args.limit:,} token ids of the paper's first prompt, float32, "
          "2 cores; the reference is SmolLM2 with every weight moved by 1% noise; --beta 0.1.", "",
          "| sweep | seconds sweeping | self-check largest difference (tolerance) |", "|---|---|---|"]
    for name, r in (("plain (logprob)", plain), ("--ref (implicit reward)", implicit)):
        check = next(iter(r["self_check"].values()))
        md.append(f"| {name} | {r['sweep_s']:.1f} | {check['max_abs_diff']:.2g} ({check['tolerance']:.2g}) |")
    md += ["", f"Ratio: {ratio:.2f}x (two models' forwards per row). Best implicit-reward tokens: {best}.", ""]
    (RESULTS / "bench_ref_smollm2_cpu.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
