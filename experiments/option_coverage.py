"""Which test sets each option, config field and key field at a value other than its default (issue 33's rule).

    python -m experiments.option_coverage     # seconds; writes experiments/results/option_coverage.{md,json}

Three lists, each row with the tests that cover it, found in the test sources (tests/**/*.py) by what they write:

* every option of every command (the config dataclasses of probe/config.py, probe/commands/analyze.py and
  report.py; the batch runner takes ScoreVocabConfig's): a test covers it where it passes the flag with a value
  other than the default (``"--shard-size", "200"``, ``--beta=0.5``; a boolean flag that flips the default) or the
  keyword (``shard_size=200``) with such a value;
* every config field a family's head reads (probe/models/families.py, probe/core/heads.py): a test covers it where
  it sets the field (``vhead_layer_type="linear"``, ``config.n_tasks = 1``, ``temperature=...``);
* every field of a batch job's key (``ScoreVocabConfig.job_key``): its option's tests.

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
    from probe.commands.report import ReportConfig
    from probe.commands.trace import TraceConfig
    from probe.config import GCGConfig, ScoreVocabConfig, SocialConfig

    return {"probe score": ScoreVocabConfig, "probe gcg": GCGConfig, "probe social": SocialConfig,
            "probe analyze": AnalysisConfig, "probe report": ReportConfig, "probe trace": TraceConfig}


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
    extra = ("responses", "response_column", "ref", "beta", "reference_response")
    return [{"list": "batch job key", "command": "probe batch", "name": n, "flag": by_name[n]["flag"],
             "default": by_name[n]["default"], "tests": by_name[n]["tests"]} for n in (*JOB_FIELDS, *extra)]


def main() -> None:
    sources = test_functions()
    options = option_rows(sources)
    rows = options + family_rows(sources) + key_rows(options)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "option_coverage.json").write_text(json.dumps(rows, indent=1) + "\n")
    holes = [r for r in rows if not r["tests"]]
    lines = ["# Options, family config fields and batch key fields: the tests that set each off its default", "",
             "`python -m experiments.option_coverage` (found in the test sources by what they pass; see the script's "
             "docstring). A row without a test is a hole.", "",
             f"{len(rows)} rows, {len(rows) - len(holes)} covered, {len(holes)} holes"
             + (": " + ", ".join(f"{r['command']} {r['flag'] or r['name']}" for r in holes) if holes else "") + ".", "",
             "| list | command / family | option or field | default | tests (first 3) |", "|---|---|---|---|---|"]
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
