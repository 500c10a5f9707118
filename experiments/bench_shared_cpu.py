"""A run that shares the CPU with another torch process: before and after rm-probe's OpenMP settings.

    python -m experiments.bench_shared_cpu

A BBQ run (200 examples of the real Age slice, 600 responses) of a tiny Llama reward model, timed alone and
beside an rm-probe sweep of the embedded SmolLM2 on the same cores, with GNU OpenMP's default spin
(``GOMP_SPINCOUNT=300000``, what every run had before) and with the commands' own settings
(probe/runs/cpu.py: ``GOMP_SPINCOUNT=10000``, threads from the usable CPUs). The neighbour runs with the same
setting as the measured run. Writes experiments/results/bench_shared_cpu.{json,md}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from probe.social.dataroot import social_data_root

RESULTS = Path(__file__).resolve().parent / "results"
SOCIAL = social_data_root()  # $RM_PROBE_SOCIAL_DATA, else ../shared/data/social beside the checkout
SETTINGS = {"before (GNU OpenMP's default spin)": {"GOMP_SPINCOUNT": "300000"}, "after (probe/runs/cpu.py)": {}}


def tiny_rm(folder: Path) -> str:
    from transformers import LlamaForSequenceClassification

    from tests import tiny

    tok = tiny.make_tokenizer("llama3")
    tiny.build(LlamaForSequenceClassification, tiny.llama_config(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def timed_social(rm: str, out: Path, env: dict) -> float:
    cmd = [sys.executable, "-m", "probe.social", "--rm", rm, "--dataset", "bbq", "--data", str(SOCIAL / "bbq" / "Age.jsonl"),
           "--limit", "200", "--output", str(out), "--no-progress"]
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return time.perf_counter() - t


def main() -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    base["HF_HUB_OFFLINE"] = "1"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rm = tiny_rm(Path(tmp) / "tiny-rm")
        for name, extra in SETTINGS.items():
            env = {**base, **extra}
            alone = timed_social(rm, Path(tmp) / "alone", env)
            neighbour = subprocess.Popen([sys.executable, "-m", "probe.exhaustive", "--prompt", "What is best?",
                                          "--limit", "20000", "--output", str(Path(tmp) / "sweep"), "--no-progress"],
                                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                time.sleep(15)  # loaded and sweeping
                beside = timed_social(rm, Path(tmp) / "beside", env)
            finally:
                neighbour.kill()
                neighbour.wait()
            rows.append({"setting": name, "env": extra, "alone_s": round(alone, 2), "beside_a_sweep_s": round(beside, 2),
                         "slowdown": round(beside / alone, 2)})
            print(rows[-1], flush=True)
    meta = {"command": "python -m experiments.bench_shared_cpu", "cpus": len(os.sched_getaffinity(0)),
            "workload": "probe.social --dataset bbq (Age.jsonl, --limit 200: 600 responses) on a tiny Llama RM; "
                        "neighbour: probe.exhaustive on the embedded SmolLM2 (--limit 20000)"}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_shared_cpu.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = ["# A run sharing the CPU with another torch process", "", f"`{meta['command']}` on {meta['cpus']} CPUs. "
             f"{meta['workload']}. Wall seconds of the BBQ run.", "",
             "| setting | alone (s) | beside a sweep (s) | slowdown |", "|---|---|---|---|"]
    lines += [f"| {r['setting']} | {r['alone_s']} | {r['beside_a_sweep_s']} | {r['slowdown']}x |" for r in rows]
    (RESULTS / "bench_shared_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
