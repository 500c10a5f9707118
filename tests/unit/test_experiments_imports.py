"""experiments/ without import circles (issue 75): the GPU kit's variants and bench each in their own module, the
pieces they share in experiments/gpu_common.py below both."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU_MODULES = ("gpu_common", "gpu_variants", "time_to_result", "gpu_bench")


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The experiments modules ``path`` imports anywhere in it (inside functions too: an import there closes a
    circle as soon as the function runs)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "experiments":
                found |= {a.name for a in node.names}
            elif node.module.startswith("experiments."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("experiments.")}
    return found & modules


def test_no_experiments_module_imports_itself_through_others():
    modules = {p.stem for p in (ROOT / "experiments").glob("*.py")}
    graph = {m: _imports(ROOT / "experiments" / f"{m}.py", modules) for m in modules}
    circles = []
    for start in sorted(modules):
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        if start in seen:
            circles.append(start)
    assert not circles, f"in an import circle: {circles}"
    assert graph["gpu_common"] <= {"bench_sweep"}  # below the bench and the variants: it imports neither
    assert "gpu_bench" not in graph["gpu_variants"] and "gpu_common" in graph["gpu_variants"]


def test_each_gpu_kit_module_imports_alone_in_a_fresh_interpreter():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    procs = {m: subprocess.Popen([sys.executable, "-c", f"import experiments.{m}"], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for m in GPU_MODULES}
    failed = {}
    for m, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            failed[m] = (err or out).strip().splitlines()[-1:]
    assert not failed


def test_the_names_scripts_and_tests_import_from_the_bench_are_still_there():
    from experiments import gpu_bench, gpu_common

    for name in ("batch_invariance", "invariance_batches", "random_model", "scores_at", "flops_per_row", "PROMPT",
                 "SHAPES", "sync", "say"):
        assert getattr(gpu_bench, name) is getattr(gpu_common, name)
