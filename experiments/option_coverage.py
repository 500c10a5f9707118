"""Which test sets each option, config field and key field at a value other than its default (issue 33's rule).

    python -m experiments.option_coverage            # seconds; writes experiments/results/option_coverage.{md,json}
    python -m experiments.option_coverage --collect  # first runs every command on tiny inputs (about a minute) and
                                                     # records the columns of each table it writes (output_columns.json)

Four lists, each row with the tests that cover it, found in the test sources (tests/**/*.py) by what they write:

* every option of every command (the config dataclasses of probe/config.py, probe/commands/analyze.py and
  report.py; the batch runner takes ScoreVocabConfig's): a test covers it where it passes the flag with a value
  other than the default (``"--shard-size", "200"``, ``--beta=0.5``; a boolean flag that flips the default) or the
  keyword (``shard_size=200``) with such a value;
* every config field a family's head reads (probe/models/families.py, probe/core/heads.py): a test covers it where
  it sets the field (``vhead_layer_type="linear"``, ``config.n_tasks = 1``, ``temperature=...``);
* every field of a batch job's key (``ScoreVocabConfig.job_key``): its option's tests;
* every column of every table a command writes (Parquet and CSV files, and the row lists of agreement.json and
  movers.json), as `collect_columns` read them off runs of each command on a tiny model and on fake runs: a test
  covers a column where it names it as a string (``row["rbo_bottom_p0.8"]``, ``"n_tokens"``). A generic name
  (``score``, ``n``) is named by many tests of other tables, so its row says little; a row without a test is a
  column no test reads. ``probe trace``'s tables are left out (rewritten with issue 46's trace part).

A row without a test is a hole. The finder reads text, so a match is a place to look, not a proof: each listed
test was written to assert something of that value (tests/unit/test_options.py holds those written for this list).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import MISSING, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
COLUMNS = RESULTS / "output_columns.json"

# the config fields the families' heads and readers read (probe/models/families.py, probe/core/heads.py), with the
# default each reader assumes when the checkpoint's config does not set it
FAMILY_FIELDS = {
    "vhead_layer_type": ("GRM", "mlp"), "vhead_num_neurons": ("GRM", 1024), "vhead_num_layers": ("GRM", 1),
    "score_dim": ("Beaver", 1), "bias": ("Beaver", False), "score_type": ("Beaver", "reward"),
    "do_normalize": ("Beaver", False), "mean": ("Beaver", 0.0), "var": ("Beaver", 1.0),
    "num_objectives": ("LDL", 220), "n_tasks": ("PairRM", 1), "drop_out": ("PairRM", 0.05),
    "num_quantiles": ("QRM gated head", None), "temperature": ("LDL gating", 1.0), "softmax": ("LDL gating", False),
    "final_logit_softcapping": ("Gemma 2/3 logits", None), "logit_scale": ("Cohere logits", None),
    "logits_scaling": ("Granite logits", None), "pad_token_id": ("pooling before the first pad", None),
}


def config_classes():
    from probe.commands.analyze import AnalysisConfig
    from probe.commands.explain import ExplainConfig
    from probe.commands.report import ReportConfig
    from probe.commands.trace import TraceConfig
    from probe.config import GCGConfig, ScoreVocabConfig, SocialConfig

    return {"probe score": ScoreVocabConfig, "probe gcg": GCGConfig, "probe social": SocialConfig,
            "probe analyze": AnalysisConfig, "probe report": ReportConfig, "probe trace": TraceConfig,
            "probe explain": ExplainConfig}


def test_functions() -> list[tuple[str, str]]:
    """(file::function, source) of every function of the test files (tests and their helpers), the fixtures, and
    tests/tiny.py's model builders (every tiny model the tests use), and each test file's module-level assignments
    (``file::<module>``); the other helpers (fake runs, real tokenizers) do not count."""
    out = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        text = path.read_text()
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    path.name.startswith("test_") or path.name in ("conftest.py", "tiny.py")
                    or any("fixture" in ast.unparse(d) for d in node.decorator_list)):
                src = ast.get_source_segment(text, node) or ""
                out.append((f"{path.relative_to(ROOT)}::{node.name}", src))
        # module-level tables (a test file's CASES) reach the tests that read them
        top = "\n".join(ast.get_source_segment(text, n) or "" for n in tree.body
                        if isinstance(n, (ast.Assign, ast.AnnAssign)))
        if top and path.name.startswith("test_"):
            out.append((f"{path.relative_to(ROOT)}::<module>", top))
    return out


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text.strip("'\"")


def _differs(value, default) -> bool:
    if isinstance(default, bool) or default is None or default is MISSING:
        return True
    try:
        return type(default)(value) != default
    except (TypeError, ValueError):
        return str(value) != str(default)


def covering(name: str, flag: str, default, sources: list[tuple[str, str]], boolean: bool) -> list[str]:
    """Tests that pass ``flag`` or ``name=`` with a value other than ``default``."""
    neg = "--no-" + flag[2:]
    pats = [re.compile(re.escape(f'"{flag}"') + r"\s*,\s*(\"[^\"]*\"|'[^']*'|[\w.\-]+)"),
            re.compile(r"(?<![\w])" + re.escape(name) + r":\s*([\w.\-:/]+)"),  # a YAML suite or job file
            re.compile(re.escape(flag) + r"=([\w.\-:/]+)"),
            re.compile(r"(?<![\w.])" + re.escape(name) + r"\s*=\s*(\"[^\"]*\"|'[^']*'|[\w.\-\[\]()]+)")]
    hits = []
    for test, src in sources:
        if boolean and (f'"{neg}"' in src or (f'"{flag}"' in src and default is False)):
            hits.append(test)
            continue
        for pat in pats:
            if any(_differs(_literal(m.group(1)), default) for m in pat.finditer(src)):
                hits.append(test)
                break
    return sorted(set(hits))


def option_rows(sources) -> list[dict]:
    rows = []
    for command, cls in config_classes().items():
        for f in fields(cls):
            md = f.metadata
            if command == "probe analyze" and f.name in ("analysis", "runs"):
                continue
            if command == "probe report" and f.name == "run":
                continue
            default = f.default if f.default is not MISSING else (
                f.default_factory() if f.default_factory is not MISSING else MISSING)
            flag = md.get("flag", "--" + f.name.replace("_", "-"))
            boolean = isinstance(default, bool)
            tests = covering(f.name, flag, default, sources, boolean)
            rows.append({"list": "option", "command": command, "name": f.name, "flag": flag,
                         "default": repr(default), "tests": tests})
    return rows


def family_rows(sources) -> list[dict]:
    rows = []
    for name, (family, default) in FAMILY_FIELDS.items():
        pats = [re.compile(r"(?<![\w.])" + name + r"\s*=\s*(?!None)"), re.compile(r"\." + name + r"\s*(=\s*(?!None)|,)"),
                re.compile(rf"[\"']{name}[\"']\s*:")]
        tests = sorted({t for t, src in sources if any(p.search(src) for p in pats)})
        rows.append({"list": "family field", "command": family, "name": name, "flag": "", "default": repr(default),
                     "tests": tests})
    return rows


def key_rows(options: list[dict]) -> list[dict]:
    from probe.config import JOB_FIELDS

    by_name = {r["name"]: r for r in options if r["command"] == "probe score"}
    extra = ("responses", "response_column", "ref", "beta", "reference_response", "principle")
    return [{"list": "batch job key", "command": "probe batch", "name": n, "flag": by_name[n]["flag"],
             "default": by_name[n]["default"], "tests": by_name[n]["tests"]} for n in (*JOB_FIELDS, *extra)]


def _table_name(f: Path) -> str | None:
    """A table's name without its run-specific parts (``<run>__<prompt>__best.csv`` -> ``*__*__best.csv``)."""
    if f.name.startswith("shared_vocabulary__") or "checkpoints" in f.parts:
        return None  # one column per run compared, named after the runs
    parts = f.name.split("__")
    if len(parts) == 2:  # moved__<prompt>.csv
        return f"{parts[0]}__*{f.suffix}"
    return "__".join(["*"] * (len(parts) - 1) + [parts[-1]])  # <run>__<prompt>__best.csv


def _columns_of(folder: Path) -> dict[str, list[str]]:
    import polars as pl

    out: dict[str, list[str]] = {}
    for f in sorted(folder.rglob("*")):
        name = _table_name(f)
        if name is None or f.suffix not in (".parquet", ".csv", ".json"):
            continue
        if f.suffix == ".parquet":
            out.setdefault(name, list(pl.read_parquet_schema(f)))
        elif f.suffix == ".csv":
            out.setdefault(name, pl.read_csv(f, n_rows=1).columns)
        elif f.name == "agreement.json":  # per prompt: its pairwise rows
            out.setdefault("agreement.json pairwise", list(next(iter(json.loads(f.read_text()).values()))["pairwise"][0]))
        elif f.name == "movers.json":  # per cell: the strings rising and falling most
            out.setdefault("movers.json up/down", list(next(iter(json.loads(f.read_text()).values()))["up"][0]))
    return out


def collect_columns(tmp: Path) -> dict[str, dict[str, list[str]]]:
    """Every command run on tiny inputs in ``tmp`` (a tiny Llama reward model and language model on the tests'
    tokenizer, fake sweeps of real words, the social data slices beside the checkout), and the columns of each table
    it writes: command -> table -> columns."""
    import sys

    sys.path.insert(0, str(ROOT))
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification

    from probe.commands.analyze import main as analyze
    from probe.commands.gcg import main as gcg
    from probe.commands.score import main as score
    from probe.commands.social import main as social
    from tests import tiny
    from tests.fake_runs import hashed_score, write_fake_run

    tok = tiny.make_tokenizer("llama3")
    models = {}
    for name, cls in (("rm", LlamaForSequenceClassification), ("lm", LlamaForCausalLM)):
        tiny.build(cls, tiny.llama_config(tok)).save_pretrained(tmp / name)
        tok.save_pretrained(tmp / name)
        models[name] = str(tmp / name)
    prompt, common = "What, in one word, is the greatest thing ever?", ["--device", "cpu", "--no-progress"]
    (tmp / "r.txt").write_text("Love\nWar\nThe sea\nGold\n")
    (tmp / "s.yaml").write_text("pirate: You are a pirate.\nplain:\n")
    from probe.social.dataroot import social_data_root

    social_data = social_data_root()
    runs = {
        "probe score": (score, ["--rm", models["lm"], "--score", "logprob", "--prompt", prompt, "--limit", "40"]),
        "probe score --responses": (score, ["--rm", models["rm"], "--allow-random-head", "--responses",
                                            str(tmp / "r.txt"), "--prompt", prompt]),
        "probe score --systems": (score, ["--rm", models["lm"], "--score", "logprob", "--prompt", prompt, "--systems",
                                          str(tmp / "s.yaml"), "--control", "plain", "--limit", "40"]),
        "probe gcg": (gcg, ["--rm", models["rm"], "--allow-random-head", "--length", "2", "--steps", "2",
                            "--search-width", "8", "--topk", "4"]),
        "probe gcg --beam": (gcg, ["--rm", models["rm"], "--allow-random-head", "--beam", "2", "--length", "2"]),
        "probe social": (social, ["--rm", models["rm"], "--rm", models["lm"], "--allow-random-head", "--dataset", "bbq",
                                  "--data", str(social_data / "bbq" / "Age.jsonl"), "--bbq-metadata",
                                  str(social_data / "bbq" / "additional_metadata.csv"), "--dataset", "crows_pairs",
                                  "--data", str(social_data / "crows_pairs" / "crows_pairs_anonymized.csv"),
                                  "--limit", "12"]),
    }
    out = {}
    for command, (main, args) in runs.items():
        folder = tmp / command.replace(" ", "_")
        assert main([*args, *common, "--output", str(folder)]) == 0, command
        out[command] = _columns_of(folder)
    words = (ROOT / "tests" / "testdata" / "top3000_en.txt").read_text().split()[:300]
    prompts = {"greatest": prompt}
    fake = [str(write_fake_run(tmp / "fake", f"org{i}/m{i}", words, prompts,
                               lambda k, t, i=i: hashed_score(f"{k}{i}", t)).path) for i in range(3)]
    lm = str(write_fake_run(tmp / "fake", "org0/m0-base", words, prompts, mode="logprob").path)
    paper = str(write_fake_run(tmp / "fake", "org0/m0", words, prompts, input_method="paper").path)
    (grid,) = (tmp / "probe_score_--systems").glob("*/*_*")
    for analysis, args in (("top", fake), ("agreement", fake), ("framing", fake[:1]), ("exposure", fake[:1]),
                           ("contrast", [lm, fake[0]]), ("input-method", [paper, fake[0]]),
                           ("misalignment", fake[:1]), ("personas", [str(grid)])):
        folder = tmp / "analyze" / analysis
        assert analyze([analysis, *args, "--out", str(folder), "--permutations", "20"]) == 0, analysis
        out[f"probe analyze {analysis}"] = _columns_of(folder)
    release = ROOT.parent / "shared" / "data" / "values-release"
    if release.is_dir():
        folder = tmp / "analyze" / "values"
        if analyze(["values", str(release / "big2_nouns"), "--dictionary", str(release / "dict_big2_nouns.csv"),
                    "--out", str(folder), "--permutations", "20"]) == 0:
            out["probe analyze values"] = _columns_of(folder)
    return out


def column_rows(sources) -> list[dict]:
    """One row per (command, table, column) of `COLUMNS`: the tests that name the column as a string."""
    if not COLUMNS.is_file():
        return []
    rows = []
    for command, tables in json.loads(COLUMNS.read_text()).items():
        for table, columns in tables.items():
            for col in columns:
                # the fake runs' model names (m0_rank: f"{name}_rank") and RBO's p (rbo_top_p0.9: any p) vary
                col = re.sub(r"^m\d+(?=_)", "{model}", re.sub(r"(?<=_p)0\.9$", "{p}", col))
                text = re.escape(col).replace(r"\{model\}", r"(m\d+|\{[^}]+\})").replace(r"\{p\}", r"([\d.]+|\{[^}]+\})")
                pat = re.compile(r"[\"']" + text + r"[\"']")
                tests = sorted({t for t, src in sources if pat.search(src)})
                rows.append({"list": "output column", "command": f"{command}: {table}", "name": col, "flag": "",
                             "default": "", "tests": tests})
    return rows


def main() -> None:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--collect", action="store_true", help="rerun the commands to list their tables' columns")
    if parser.parse_args().collect:
        with tempfile.TemporaryDirectory() as tmp:
            RESULTS.mkdir(parents=True, exist_ok=True)
            COLUMNS.write_text(json.dumps(collect_columns(Path(tmp)), indent=1) + "\n")
    sources = test_functions()
    options = option_rows(sources)
    rows = options + family_rows(sources) + key_rows(options) + column_rows(sources)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "option_coverage.json").write_text(json.dumps(rows, indent=1) + "\n")
    holes = [r for r in rows if not r["tests"]]
    lines = ["# Options, family config fields and batch key fields: the tests that set each off its default; output "
             "columns: the tests that read each", "",
             "`python -m experiments.option_coverage` (found in the test sources by what they pass; see the script's "
             "docstring). A row without a test is a hole.", "",
             f"{len(rows)} rows, {len(rows) - len(holes)} covered, {len(holes)} holes"
             + (": " + ", ".join(f"{r['command']} {r['flag'] or r['name']}" for r in holes) if holes else "") + ".", "",
             "| list | command / family / table | option, field or column | default | tests (first 3) |",
             "|---|---|---|---|---|"]
    for r in rows:
        shown = ", ".join(f"`{t}`" for t in r["tests"][:3]) + (f" (+{len(r['tests']) - 3})" if len(r["tests"]) > 3
                                                               else "")
        lines.append(f"| {r['list']} | {r['command']} | `{r['flag'] or r['name']}` | `{r['default']}` | "
                     f"{shown or '**none**'} |")
    (RESULTS / "option_coverage.md").write_text("\n".join(lines) + "\n")
    print(f"{len(rows)} rows, {len(holes)} holes")
    for r in holes:
        print(f"  hole: {r['list']}: {r['command']} {r['flag'] or r['name']} (default {r['default']})")


if __name__ == "__main__":
    main()
