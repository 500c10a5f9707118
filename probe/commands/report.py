"""The auditors' report: one self-contained HTML file per sweep run, or one across several runs.

    python -m probe.report results/<model>/exhaustive_<time>/     # writes report.html inside the run
    python -m probe.report RUN_A RUN_B ... --out audit.html      # several models side by side (probe/report/multi.py)

Per prompt: the best and worst tokens (all tokens, or words only) with their flags, a search box over the whole
vocabulary (where does " love" rank?), filters (hide special/added tokens, non-words, tokens that do not
round-trip, byte fragments), the score distribution, and the run's provenance (model, template split, versions,
command). Filters can be preset from the address: ``report.html#prompt=worst&words=1&q=love``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from probe.commands.args import config_from_args
from probe.config import check_not_blank
from probe.runs.rundir import RunDir, atomic_write_bytes, writable_file


@dataclass(frozen=True)
class ReportConfig:
    run: tuple[str, ...] = field(default=(), metadata={})
    out: str | None = field(default=None, metadata={
        "help": "output file (default: <run>/report.html; for several runs results/report_<time>.html)"})
    rows: int = field(default=50, metadata={"help": "rows shown in each best/worst table (several runs: 25)"})
    dictionary: str | None = field(default=None, metadata={
        "help": "response runs: a value dictionary (Big Two nouns CSV or MFD 2.0 .dicx) whose categories' median "
                "ranks the page shows", "metavar": "FILE"})
    explain: str | None = field(default=None, metadata={
        "help": "one sweep: a probe explain folder of this run (probe explain --run RUN --out DIR) whose why "
                "section (parts by layer, top heads, prompt words, agreement with patching) the page adds",
        "metavar": "DIR"})

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise ValueError("--rows must be >= 1")
        check_not_blank(self, "out", "dictionary", "explain")


def main_from_args(ns: argparse.Namespace) -> int:
    from probe.report import single
    from probe.errors import ProbeError
    from probe.runs.rundir import utc_stamp

    ns.run = tuple(ns.run)
    cfg = config_from_args(ReportConfig, ns)
    if cfg.out:
        writable_file(cfg.out, "--out")
    runs = [RunDir(r) for r in cfg.run]
    kinds = {run.read_meta().get("experiment", "exhaustive") for run in runs}
    if kinds == {"responses"}:
        return _responses_report(cfg, runs, ns)
    if "responses" in kinds:
        raise ProbeError("response runs and token sweeps go on separate pages: give the runs of one kind")
    for run in runs:
        meta = run.read_meta()
        if meta.get("experiment", "exhaustive") != "exhaustive" or "prompts" not in meta:
            from probe.analysis.sweeps import other_run

            raise other_run(run.path, meta.get("experiment", "other"), "probe report shows sweeps and response runs")
        if meta.get("status") != "complete":
            raise ProbeError(f"{run.path}: the run is not complete; finish it with --resume first")
    if cfg.explain and len(runs) != 1:
        raise ProbeError("--explain: one sweep's page only (the explanation is of one run)")
    if len(runs) == 1:
        out = Path(cfg.out) if cfg.out else runs[0].path / "report.html"
        page = single.build(runs[0].path, cfg.rows, why=_why(cfg.explain, runs[0].path) if cfg.explain else "")
    else:
        from probe.report import multi as report_multi

        out = Path(cfg.out) if cfg.out else Path("results") / f"report_{utc_stamp()}.html"
        page = report_multi.build([r.path for r in runs], cfg.rows if "rows" in vars(ns) else 25)
    atomic_write_bytes(out, page.encode("utf-8"))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0


def _why(folder: str, run: Path) -> str:
    """The why section of ``folder``'s explain.json, refused in one line where it explains another run."""
    import json

    from probe.errors import ProbeError
    from probe.report.why import why_section

    path = Path(folder) / "explain.json"
    if not path.is_file():
        raise ProbeError(f"--explain {folder}: no explain.json (write one with probe explain --run RUN --out DIR)")
    result = json.loads(path.read_text())
    of = (result.get("run") or {}).get("folder")
    if of is None or Path(of).resolve() != Path(run).resolve():
        raise ProbeError(f"--explain {folder}: it explains {of or 'responses, not a run'}, not {run}: run probe "
                         f"explain --run {run}")
    return why_section(result)


def _responses_report(cfg: ReportConfig, runs: list[RunDir], ns: argparse.Namespace) -> int:
    from probe.errors import ProbeError
    from probe.report import responses
    from probe.runs.rundir import utc_stamp

    for run in runs:
        if run.read_meta().get("status") != "complete":
            raise ProbeError(f"{run.path}: the run is not complete; finish it with --resume first")
    if cfg.dictionary and not Path(cfg.dictionary).is_file():
        raise ProbeError(f"--dictionary {cfg.dictionary}: no such file")
    default = runs[0].path / "report.html" if len(runs) == 1 else Path("results") / f"report_{utc_stamp()}.html"
    out = Path(cfg.out) if cfg.out else default
    page = responses.build([r.path for r in runs], cfg.rows if "rows" in vars(ns) else 25, cfg.dictionary)
    atomic_write_bytes(out, page.encode("utf-8"))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")
    return 0


def make_parser(subparsers=None) -> argparse.ArgumentParser:
    from probe.commands.cli import command_parser

    return command_parser(subparsers, "report", "the auditors' HTML report of a run", "python -m probe.report",
                          __doc__, ReportConfig, main_from_args,
                          positional=(("run", {"nargs": "+", "help": "one or more complete run directories: token sweeps, or response "
                                                       "runs (probe score --responses)"}),),
                          verbose=False)


def main(argv: list[str] | None = None) -> int:
    from probe.commands.cli import run_command

    return run_command(make_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
