"""Benchmark kernels against their references: time and peak memory, side by side in one run.

    python -m experiments.bench_kernels                    # CPU, float32
    python -m experiments.bench_kernels --device cuda --dtype bfloat16

fused log-probabilities (kernels/fused_logprob.py) against full logits + log_softmax, for the LM-head shapes
of SmolLM2 (vocabulary 49,152) and Gemma-2-2B (256,000): rows x 2 positions, as a sweep's logprob head sees
them. On CPU each method runs in a fresh subprocess and its peak resident memory (ru_maxrss) is read; on GPU,
torch.cuda.max_memory_allocated. Writes experiments/results/bench_kernels.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch


from probe.kernels.fused_logprob import fused_token_logprobs, reference_token_logprobs

RESULTS = Path(__file__).resolve().parent / "results"
CASES = {"smollm2": dict(d=576, vocab=49152, rows=512), "gemma-2-2b": dict(d=2304, vocab=256000, rows=256)}


def make(case: dict, device, dtype):
    g = torch.Generator(device="cpu").manual_seed(0)
    hidden = (torch.randn(case["rows"] * 2, case["d"], generator=g)).to(device, dtype)
    weight = (torch.randn(case["vocab"], case["d"], generator=g) * 0.02).to(device, dtype)
    targets = torch.randint(0, case["vocab"], (case["rows"] * 2,), generator=g).to(device)
    cap = lambda x: torch.tanh(x / 30.0) * 30.0  # noqa: E731  (Gemma-2's final soft-cap)
    return hidden, weight, targets, cap


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak_rss() -> int:
    """Reset the peak resident set to the current one; return the current one in bytes."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS") * 1024


def child(case_name: str, method: str, device: str, dtype: str, repeats: int) -> dict:
    dev, dt = torch.device(device), getattr(torch, dtype)
    hidden, weight, targets, cap = make(CASES[case_name], dev, dt)
    base_rss = _reset_peak_rss()
    fn = (lambda: reference_token_logprobs(hidden, weight, targets, None, cap)) if method == "reference" else \
        (lambda: fused_token_logprobs(hidden, weight, targets, None, cap))
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        base_cuda = torch.cuda.memory_allocated(dev)
    out = fn()
    best = float("inf")
    for _ in range(repeats):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t = time.perf_counter()
        out = fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        best = min(best, time.perf_counter() - t)
    peak = ((torch.cuda.max_memory_allocated(dev) - base_cuda) if dev.type == "cuda" else
            _status_kib("VmHWM") * 1024 - base_rss)
    return {"seconds": best, "peak_extra_bytes": int(peak), "checksum": float(out.double().sum())}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", nargs=2, metavar=("CASE", "METHOD"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.device, args.dtype, args.repeats)))
        return {}
    results = {"device": args.device, "dtype": args.dtype, "threads": torch.get_num_threads(), "cases": {}}
    for name, case in CASES.items():
        entry = {"shape": case}
        for method in ("reference", "fused"):
            out = subprocess.run([sys.executable, __file__, "--child", name, method, "--device", args.device,
                                  "--dtype", args.dtype, "--repeats", str(args.repeats)],
                                 capture_output=True, text=True, check=True)
            entry[method] = json.loads(out.stdout.strip().splitlines()[-1])
        entry["time_ratio_fused_over_reference"] = entry["fused"]["seconds"] / entry["reference"]["seconds"]
        entry["memory_ratio_fused_over_reference"] = (entry["fused"]["peak_extra_bytes"] /
                                                       max(1, entry["reference"]["peak_extra_bytes"]))
        entry["same_result"] = abs(entry["fused"]["checksum"] - entry["reference"]["checksum"]) < \
            1e-3 * abs(entry["reference"]["checksum"])
        results["cases"][name] = entry
    RESULTS.mkdir(parents=True, exist_ok=True)
    tag = f"{args.device}_{args.dtype}"
    (RESULTS / f"bench_kernels_{tag}.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = ["| case | rows x positions | vocab | method | seconds | peak extra MiB |", "|---|---|---|---|---|---|"]
    for name, e in results["cases"].items():
        for m in ("reference", "fused"):
            lines.append(f"| {name} | {e['shape']['rows']} x 2 | {e['shape']['vocab']:,} | {m} | "
                         f"{e[m]['seconds']:.3f} | {e[m]['peak_extra_bytes'] / 2**20:.0f} |")
    (RESULTS / f"bench_kernels_{tag}.md").write_text(
        f"# Kernel benchmarks ({args.device}, {args.dtype}, {results['threads']} threads)\n\n" + "\n".join(lines) + "\n")
    for name, e in results["cases"].items():
        print(f"{name}: fused/reference time {e['time_ratio_fused_over_reference']:.2f}, peak memory "
              f"{e['memory_ratio_fused_over_reference']:.2f} ({e['reference']['peak_extra_bytes'] / 2**20:.0f} -> "
              f"{e['fused']['peak_extra_bytes'] / 2**20:.0f} MiB); same result: {e['same_result']}")
    return results


if __name__ == "__main__":
    main()
