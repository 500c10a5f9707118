"""The Python API equals the commands; the package's layout keeps its promises (no import cycles, one top-level
package in the wheel, ``--help`` without torch)."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

import probe
from probe.commands.score import ScoreVocabConfig, run

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "What, in one word, is the greatest thing ever?"


@pytest.mark.parity
def test_sweep_equals_the_command(tiny_dirs, tmp_path):
    cli = run(ScoreVocabConfig(rm=tiny_dirs["rm"], prompt=(PROMPT,), device="cpu", output=str(tmp_path), limit=300,
                               progress=False, batch_size=64)).read_table("scores.parquet")
    lm = probe.load(tiny_dirs["rm"], device="cpu")
    api = probe.sweep(lm, None, PROMPT, limit=300, batch_size=64)
    assert api.columns == cli.columns and api.height == 300
    assert api.select("prompt_key", "token_id", "rank").equals(cli.select("prompt_key", "token_id", "rank"))
    np.testing.assert_array_equal(api["score"].to_numpy(), cli["score"].to_numpy())
    # the caller's own model and tokenizer (no LoadedModel) give the same table
    raw = probe.sweep(lm.model, lm.tokenizer, PROMPT, limit=300, batch_size=64)
    assert raw.equals(api)
    assert api["score"].dtype == pl.Float32 and {"decoded", "is_special", "is_word", "roundtrips"} <= set(api.columns)


def test_sweep_runs_the_self_check(tiny_dirs, monkeypatch):
    """The API checks its fast path against the model's own forward, as the command does: a wrong reader fails."""
    from probe.core import heads
    from probe.errors import ProbeError

    lm = probe.load(tiny_dirs["rm"], device="cpu")
    original = heads.LinearRewardHead.score

    def shifted(self, *a, **k):
        return original(self, *a, **k) + 1.0  # the cached path only: the reference uses the model's own forward

    monkeypatch.setattr(heads.LinearRewardHead, "score", shifted)
    with pytest.raises(ProbeError, match="self-check failed"):
        probe.sweep(lm, None, PROMPT, limit=50)


@pytest.mark.parity
def test_score_responses_equals_the_models_own_forward(tiny_dirs):
    lm = probe.load(tiny_dirs["rm"], device="cpu")
    responses = ["Love", "Black people", "The Beatles", "self-sacrifice", "café au lait", "🎉 joy", "a b c d e f g"]
    df = probe.score_responses(lm, None, PROMPT, responses, batch_size=3)
    assert df.columns[:5] == ["prompt_key", "response", "n_tokens", "score", "rank"]
    assert sorted(df["response"].to_list()) == sorted(responses) and df["rank"].min() == 1
    tok, model = lm.tokenizer, lm.model
    for row in df.iter_rows(named=True):
        ids = tok.apply_chat_template([{"role": "user", "content": PROMPT}, {"role": "assistant",
                                                                            "content": row["response"]}],
                                      tokenize=True, return_dict=False, date_string="26 Jul 2024")
        with torch.inference_mode():
            ref = float(model(torch.tensor([ids])).logits[0, 0])
        assert row["score"] == pytest.approx(ref, abs=1e-4 * (1 + abs(ref)))
        assert row["slot_text"] == row["response"] and row["change"] is None
    ranked = df.sort("score", descending=True)["response"].to_list()
    assert df.sort("rank")["response"].to_list() == ranked


@pytest.mark.parity
def test_gcg_api_reports_the_own_forward_score(tiny_dirs):
    lm = probe.load(tiny_dirs["rm"], device="cpu")
    res = probe.gcg(lm, None, PROMPT, length=2, steps=2, search_width=8, topk=4)
    assert len(res.best_ids) == 2
    assert res.best_score == pytest.approx(res.search_score, abs=1e-3 * (1 + abs(res.best_score)))
    import probe.gcg as module  # binds the command's shim module to the name: it still calls the API

    assert callable(module) and module(lm, None, PROMPT, length=1, steps=1, search_width=4, topk=2).best_ids


def test_api_refuses_a_mode_the_model_cannot_give(tiny_dirs):
    from probe.errors import ProbeError

    lm = probe.load(tiny_dirs["rm"], device="cpu")
    with pytest.raises(ProbeError, match="causal language model"):
        probe.sweep(lm.model, lm.tokenizer, PROMPT, score="logprob", limit=10)


# --- the layout -------------------------------------------------------------------------------------------------
def _module_imports(path: Path, package_root: Path, inside_functions: bool = False) -> set[str]:
    """Modules of ``probe`` imported by the file at ``path``: at module level, or anywhere (``inside_functions``:
    the lazy imports of functions too)."""
    tree = ast.parse(path.read_text())
    name = ".".join(path.relative_to(package_root).with_suffix("").parts)
    out = set()
    for node in (ast.walk(tree) if inside_functions else tree.body):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = name.split(".")[: -node.level] if not path.name == "__init__.py" else name.split(".")
                mod = ".".join(base + ([mod] if mod else []))
            if mod.startswith("probe"):
                out.add(mod)
                out.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("probe"))
    return out


@pytest.mark.parametrize("inside_functions", [False, True])
def test_no_import_cycles(inside_functions):
    """Not at module level, and not through the imports functions make lazily either: a piece two modules share
    lives below both. (The package's own ``__init__``, which loads the API on first use, is left out of the lazy
    graph: every module is below it.)"""
    root = ROOT
    modules = {}
    for path in sorted((root / "probe").rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    if inside_functions:
        modules.pop("probe")
    graph = {m: {d for d in _module_imports(p, root, inside_functions) if d in modules and d != m}
             for m, p in modules.items()}
    # a module importing ``probe.x.y`` also runs the packages above it
    for m in graph:
        for d in list(graph[m]):
            parts = d.split(".")
            graph[m].update(".".join(parts[:k]) for k in range(1, len(parts)) if ".".join(parts[:k]) in modules
                            and not m.startswith(".".join(parts[:k])))
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert "probe.report.single" in graph and "probe.report.multi" in graph


@pytest.mark.parametrize("argv", [["--help"], ["score", "--help"], ["gcg", "--help"], ["social", "--help"],
                                  ["analyze", "--help"], ["report", "--help"], ["batch", "--help"]])
def test_help_imports_neither_torch_nor_transformers(argv):
    code = ("import sys, contextlib, io\nfrom probe.commands.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    try:\n        main(sys.argv[1:])\n    except SystemExit as e:\n        assert e.code == 0, e.code\n"
            "assert 'usage' in out.getvalue()\n"
            "print(sorted(m for m in ('torch', 'transformers', 'scipy', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_the_wheel_installs_one_top_level_package_with_its_data(tmp_path):
    import shutil

    src = tmp_path / "src"  # a copy of the tracked files: building in the checkout would leave build/ there
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                          str(tmp_path), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    (wheel,) = tmp_path.glob("rm_probe-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"probe"}
    for needed in ("probe/kernels/prefix_attention.py", "probe/kernels/fused_logprob.py",
                   "probe/data/chat_templates/llama3.1.jinja", "probe/data/identity_terms.csv",
                   "probe/report/templates/single.html", "probe/report/templates/multi.html", "probe/api.py"):
        assert needed in names, needed
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry).decode()
    assert "rm-probe = probe.commands.cli:main" in scripts and "probe = probe.commands.cli:main" in scripts


def test_a_random_head_is_drawn_from_the_seed_whatever_the_global_state(tiny_dirs):
    """``allow_random_head`` (probe.load, probe score, probe gcg, probe social, trace: all load through
    load_for_config): the head a checkpoint lacks is drawn from the run's seed (0 for probe.load), so two loads
    give one head whatever the global random state before each, and the caller's random state is left as it was.
    Old code: the head followed the global state (probe score and the API were never seeded)."""
    import torch

    heads = []
    for noise in (1, 2):
        torch.manual_seed(noise)
        before = torch.random.get_rng_state()
        lm = probe.load(tiny_dirs["lm"], device="cpu", allow_random_head=True)
        assert torch.equal(torch.random.get_rng_state(), before)
        heads.append(lm.model.score.weight.detach().clone())
    assert torch.equal(heads[0], heads[1]) and heads[0].abs().sum() > 0
