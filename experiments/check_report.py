"""Check an auditors' report in headless Chromium: it renders, and each filter and the search give exactly the
rows that the same filter computed in Python gives.

    python -m experiments.check_report results/<model>/exhaustive_<time>/report.html [--screenshot out.png]
    python -m experiments.check_report audit.html --runs RUN_A RUN_B ...     # a multi-model report (probe report A B)

Needs Debian's chromium (``apt-get install chromium``). Filters are preset through the page address
(``#words=1&q=love``), the page is loaded with ``--dump-dom``, and the rendered tables are parsed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise SystemExit("chromium not found: apt-get install chromium")
    return exe


def dump_dom(report: Path, fragment: str = "") -> str:
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=10000",
                              "--dump-dom", f"{report.resolve().as_uri()}#{fragment}"],
                             capture_output=True, text=True, timeout=120)
    if out.returncode != 0 or "<table" not in out.stdout:
        raise RuntimeError(f"chromium failed to render {report}: {out.stderr[-500:]}")
    return out.stdout


class Tables(HTMLParser):
    """Rows (lists of cell texts) of every table that has an id."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._table = None
        self._row = None
        self._cell = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and attrs.get("id"):
            self._table = attrs["id"]
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = ""

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        elif tag == "tr" and self._row is not None:
            if self._row:
                self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "td" and self._cell is not None:
            self._row.append(self._cell)
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def rendered(report: Path, fragment: str = "") -> tuple[dict[str, list[list[str]]], str]:
    dom = dump_dom(report, fragment)
    parser = Tables()
    parser.feed(dom)
    info = re.search(r'id="matchInfo"[^>]*>([^<]*)<', dom)
    return parser.tables, info.group(1) if info else ""


def expected(run_dir: Path, prompt: str, rows: int, keep, query: str | None = None):
    """(best ids, worst ids, match ids, total matches) computed from the run's tables in Python."""
    import polars as pl

    scores = pl.read_parquet(run_dir / "scores.parquet").filter(pl.col("prompt_key") == prompt).sort("rank", "token_id")
    kept = [r for r in scores.iter_rows(named=True) if keep(r)]
    side = min(rows, len(kept) // 2)  # fewer than 2 x rows: half a side, as the page shows them (never one in both)
    best = [r["token_id"] for r in kept[:side]]
    worst = [r["token_id"] for r in kept[::-1][:side]]
    matches = [r["token_id"] for r in kept if query and query.lower() in r["decoded"].lower()]
    return best, worst, matches[:200], len(matches)


CASES = {
    "": lambda r: True,
    "words=1": lambda r: r["is_word"],
    "special=1": lambda r: not (r["is_special"] or r["is_added"]),
    "roundtrip=1&utf8=1": lambda r: r["roundtrips"] and r["valid_utf8"],
}


def check(report: Path, run_dir: Path, prompt: str, rows: int = 50, query: str = "love") -> list[str]:
    done = []
    for preset, keep in CASES.items():
        fragment = f"prompt={prompt}&q={query}" + (f"&{preset}" if preset else "")
        tables, info = rendered(report, fragment)
        best, worst, matches, total = expected(run_dir, prompt, rows, keep, query)
        got = {k: [int(r[3]) for r in v] for k, v in tables.items()}
        assert got["best"] == best, f"{fragment}: best table differs"
        assert got["worst"] == worst, f"{fragment}: worst table differs"
        assert got["matches"] == matches, f"{fragment}: search results differ"
        assert info.startswith(f"{total} tokens contain"), f"{fragment}: match count {info!r}, expected {total}"
        done.append(f"#{fragment}: {len(best)} best, {len(worst)} worst, {total} matches as computed in Python")
    return done


def check_multi(report: Path, run_dirs: list[Path], rows: int = 25) -> list[str]:
    """The multi-model report: for every shared prompt and both views (all tokens, words only), each model's best
    and worst tables in the browser equal the lists computed in Python from the runs' saved scores."""
    from probe.analysis.sweeps import load_sweep
    from probe.report.multi import best_worst, shared_prompts

    sweeps = [load_sweep(p) for p in run_dirs]
    done = []
    for prompt, keys in shared_prompts(sweeps).items():
        for view, preset in (("all", ""), ("words", "&words=1")):
            tables, _ = rendered(report, f"prompt={prompt}{preset}")
            for i, (sweep, key) in enumerate(zip(sweeps, keys)):
                expect = best_worst(sweep.prompt(key), rows)[view]
                for side in ("best", "worst"):
                    got = [int(r[2]) for r in tables[f"{side}-{i}"]]
                    assert got == [r[2] for r in expect[side]], f"{prompt} {view} model {i}: {side} table differs"
                    scores = [r[1] for r in tables[f"{side}-{i}"]]
                    assert scores == [f"{r[1]:.4f}" for r in expect[side]], f"{prompt} {view} model {i}: scores"
            assert f"identity-{prompt}" in tables and f"agreement-{prompt}" in tables
            done.append(f"{prompt} ({view}): {len(sweeps)} models' best and worst tables as computed in Python")
    return done


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path)
    parser.add_argument("--prompt", default=None, help="prompt key (default: the run's first)")
    parser.add_argument("--query", default="love")
    parser.add_argument("--rows", type=int, default=None,
                        help="rows per table the report was built with (default 50; multi-model: 25)")
    parser.add_argument("--runs", type=Path, nargs="+", default=None,
                        help="the run directories of a multi-model report, in the order given to probe report")
    parser.add_argument("--screenshot", type=Path, default=None)
    args = parser.parse_args(argv)
    import json

    if args.runs:
        lines = check_multi(args.report, args.runs, args.rows or 25)
    else:
        run_dir = args.report.parent
        prompt = args.prompt or next(iter(json.loads((run_dir / "meta.json").read_text())["prompts"]))
        lines = check(args.report, run_dir, prompt, args.rows or 50, args.query)
    for line in lines:
        print("ok", line)
    if args.screenshot:
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1400,2200",
                            f"--screenshot={args.screenshot}", args.report.resolve().as_uri()], capture_output=True,
                           timeout=120, check=True)
        print("screenshot", args.screenshot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
