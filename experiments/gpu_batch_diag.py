"""Why a bf16 sweep's scores move with the batch size on the GPU: the first kit run (H200, run1) found Gemma-2-27b's
shared and cache paths at batch 256 off by up to 0.127 from batch 4096 on nearly every row (4,061 of 4,096 ranks
moved), where batch 1024 agreed to 7e-7. One suspect: PyTorch lets cuBLAS reduce bf16 GEMMs in reduced precision
(``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction``, on by default), which some kernels it picks
for some shapes (split-K) do. This script scores the same ids at several batch sizes with that switch on and off,
records each batch's largest difference against the first, the scores' spread (what a difference is measured
against), and the seconds of a timed sweep with each setting.

    python experiments/gpu_batch_diag.py --out diag.json [--shape gemma-2-27b] [--small --device cpu]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.gpu_common import PROMPT, random_model, scores_at  # noqa: E402

BATCHES = (4096, 2048, 1024, 512, 256, 128)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", action="append", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--ids", type=int, default=4096)
    ap.add_argument("--timed", type=int, default=16384)
    args = ap.parse_args(argv)

    from probe.core.engine import PrefixScorer
    from probe.core.heads import LinearRewardHead
    from probe.core.scoring import sweep_rows
    from probe.core.template import response_conversation, split_template

    device = torch.device(args.device)
    dtype = torch.bfloat16
    matmul = torch.backends.cuda.matmul
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "default_reduced_precision": matmul.allow_bf16_reduced_precision_reduction,
           "shapes": {}}
    for shape in args.shape or ["gemma-2-27b", "llama-3.1-8b"]:
        lm = random_model(shape, device, dtype, args.small)
        split = split_template(lm.tokenizer, response_conversation(PROMPT), n_verify=0)
        vocab = lm.model.get_input_embeddings().num_embeddings
        rows = sweep_rows(np.arange(vocab), split.suffix_ids).to(device)
        head = LinearRewardHead(lm.model, 0)
        res = {}
        for path in ("shared", "cache"):
            scorer = PrefixScorer(lm.model, head, split.prefix_ids, use_cache=True, shared_attention=path == "shared")
            for reduced in (True, False):
                matmul.allow_bf16_reduced_precision_reduction = reduced
                by = {b: scores_at(scorer.score, rows[: args.ids], b) for b in BATCHES}
                base = by[BATCHES[0]]
                timed = rows[: args.timed]
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                scores_at(scorer.score, timed, BATCHES[0])
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                seconds = time.perf_counter() - t0
                res[f"{path}/reduced={reduced}"] = {
                    "score_std": float(base.std()), "score_ptp": float(np.ptp(base)),
                    "score_mean_abs": float(np.abs(base).mean()),
                    "max_abs_diff": {b: float(np.abs(s - base).max()) for b, s in by.items()},
                    "rows_differing": {b: int(np.sum(s != base)) for b, s in by.items()},
                    "seconds_timed": seconds, "timed_rows": int(timed.shape[0])}
                print(shape, path, "reduced" if reduced else "full", json.dumps(res[f"{path}/reduced={reduced}"]),
                      flush=True)
            del scorer
        matmul.allow_bf16_reduced_precision_reduction = out["default_reduced_precision"]
        out["shapes"][shape] = res
        del lm, rows, head
        if device.type == "cuda":
            torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
