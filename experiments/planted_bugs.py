"""Plant the bugs a careful reader would plant (issue 28's list and a few more) on a copy of the repository, one at a
time, and check that the tests named beside each fail on it.

    python -m experiments.planted_bugs          # about 2 minutes; writes experiments/results/planted_bugs.md

Each row: the bug, the file, the line as it is, the line as planted, and the tests that must fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
SHARED = ROOT.parent / "shared" / "data"

MUTS = [
  ("rank ordinal (scores.parquet)", "probe/core/sweep.py", 'rank(method="min"', 'rank(method="ordinal"', "tests/unit/test_sweep.py -k tied"),
  ("rank ordinal (responses)", "probe/core/responses.py", 'rank(method="min"', 'rank(method="ordinal"', "tests/unit/test_responses.py -k tied"),
  ("descending_ranks min ties", "probe/analysis/stats.py", 'method="average"', 'method="min"', "tests/unit/test_stats.py -k descending"),
  ("welch population variance", "probe/analysis/stats.py", "a.var(ddof=1) / a.size + b.var(ddof=1) / b.size", "a.var() / a.size + b.var() / b.size", "tests/unit/test_stats.py -k welch"),
  ("welch pooled", "probe/analysis/stats.py", "se = np.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)", "sp = ((a.size - 1) * a.var(ddof=1) + (b.size - 1) * b.var(ddof=1)) / (a.size + b.size - 2); se = np.sqrt(sp / a.size + sp / b.size)", "tests/unit/test_stats.py -k welch"),
  ("bbq tie picks first", "probe/social/metrics.py", "return int(top[0]) if top.size == 1 else None", "return int(top[0])", "tests/unit/test_social_real.py -k tie_at_the_top"),
  ("trailing probe copies leading", "probe/core/template.py", 'word=probes[0][0], side="trail")', 'word=probes[0][0], side="lead")', "tests/unit/test_template.py -k one_side"),
  ("contrast top-k off by one", "probe/analysis/contrast.py", 'np.argsort(ra, kind="stable")[:kk]', 'np.argsort(ra, kind="stable")[:kk - 1]', "tests/unit/test_analysis.py -k by_hand_top_k"),
  ("contrast bottom-k off by one", "probe/analysis/contrast.py", 'np.argsort(-rb, kind="stable")[:kk]', 'np.argsort(-rb, kind="stable")[:kk + 1]', "tests/unit/test_analysis.py -k by_hand_top_k"),
  ("rank_change sign flipped", "probe/analysis/contrast.py", 'pl.Series("rank_change", rb - ra)', 'pl.Series("rank_change", ra - rb)', "tests/unit/test_analysis.py -k by_hand_top_k"),
  ("head always reads column 0", "probe/core/heads.py", "self.weight = head.weight[label_index].detach()", "self.weight = head.weight[0].detach()", "tests/unit/test_more_families.py -k label"),
  ("mean logprob over padded length", "probe/core/heads.py", 'return total / (lengths.float() + self.k_fixed) if self.reduce == "mean" else total', 'return total / cont.shape[1] if self.reduce == "mean" else total', "tests/unit/test_more_families.py -k mean"),
  ("cohere logit_scale dropped", "probe/core/heads.py", "            logits = logits * scale\n", "            logits = logits\n", "tests/unit/test_more_families.py -k 'cohere'"),
  ("granite logits_scaling dropped", "probe/core/heads.py", "            logits = logits / divide\n", "            logits = logits\n", "tests/unit/test_more_families.py -k 'granite'"),
  ("kernel softmax over bf16 scores", "kernels/prefix_attention.py", "    query, key, value = _working(query), _working(key), _working(value)\n", "", "tests/unit/test_half_precision.py -k accumulates"),
  ("tolerance back to the spread rule", "probe/core/precision.py", "return np.maximum(floor, HALF_TOLERANCE * noise)", "return np.full_like(ref, 0.05 * (1 + float(ref.max() - ref.min())))", "tests/unit/test_half_precision.py -k 'tolerance_rules or command_passes'"),
  ("welch t sign flipped", "probe/analysis/stats.py", "return float((a.mean() - b.mean()) / se) if se > 0 else 0.0", "return float((b.mean() - a.mean()) / se) if se > 0 else 0.0", "tests/unit/test_stats.py -k welch"),
  ("contrast top-k, b side", "probe/analysis/contrast.py", 'np.argsort(rb, kind="stable")[:kk]', 'np.argsort(rb, kind="stable")[:kk - 1]', "tests/unit/test_analysis.py -k by_hand_top_k"),
  ("contrast top-k k+1 both sides", "probe/analysis/contrast.py", '[:kk]) & set(np.argsort(rb, kind="stable")[:kk])', '[:kk + 1]) & set(np.argsort(rb, kind="stable")[:kk + 1])', "tests/unit/test_analysis.py -k by_hand_top_k"),
  ("social accuracy counts ties as wins", "probe/social/metrics.py", "wins = [s[it.pair[0]] > s[it.pair[1]]", "wins = [s[it.pair[0]] >= s[it.pair[1]]", "tests/unit/test_social.py"),
  ("report percentile off", "probe/report/multi.py", "- 1) / max(1, wide.height - 1)", ") / max(1, wide.height)", "tests/unit/test_report_numbers.py"),
  ("identity rank max not min", "probe/report/tables.py", 'pl.col("rank").min()', 'pl.col("rank").max()', "tests/unit/test_report_numbers.py"),
  ("GOMP spin not set", "probe/runs/cpu.py", '"GOMP_SPINCOUNT": SPINCOUNT}', '}', "tests/unit/test_cpu_threads.py"),
  ("float64 called half precision", "probe/models/loading.py", "double precision runs at half", "half-precision matmuls run at half", "tests/unit/test_cli_errors.py -k dtype_warning"),
]


def plant(copy: Path, path: str, old: str, new: str) -> bool:
    f = copy / path
    text = f.read_text()
    if old not in text:
        return False
    f.write_text(text.replace(old, new, 1))
    return True


def main() -> int:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RM_PROBE_SOCIAL_DATA": os.environ.get("RM_PROBE_SOCIAL_DATA", str(SHARED / "social")),
           "RM_PROBE_PAPER_RELEASE": os.environ.get("RM_PROBE_PAPER_RELEASE", str(SHARED / "paper-release"))}
    rows, missed = [], 0
    for name, path, old, new, tests in MUTS:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "repo"
            shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".venv", ".git", "results", "__pycache__", "figures"))
            (copy / "probe" / "kernels").symlink_to(copy / "kernels")  # the installed layout of probe.kernels
            if not plant(copy, path, old, new):
                rows.append((name, path, tests, "the line to change is not there: update this list"))
                missed += 1
                continue
            proc = subprocess.run(f"{sys.executable} -m pytest -q -x -p no:cacheprovider {tests}", shell=True, cwd=copy,
                                  env={**env, "PYTHONPATH": str(copy)}, capture_output=True, text=True)
            last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()[-200:]
            caught = proc.returncode == 1 and " failed" in last and "error" not in last
            missed += not caught
            rows.append((name, path, tests, ("caught: " if caught else "NOT CAUGHT: ") + last))
            print(" | ".join(rows[-1]), flush=True)
    lines = ["# Planted bugs and the tests that catch them", "", "`python -m experiments.planted_bugs`: each bug "
             "planted alone on a copy of the repository, the named tests run on it.", "",
             "| bug | file | tests | result |", "|---|---|---|---|"]
    lines += [f"| {n} | `{p}` | `{t}` | {r} |" for n, p, t, r in rows]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "planted_bugs.md").write_text("\n".join(lines) + "\n")
    print(f"{len(rows) - missed} of {len(rows)} caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
