"""Rebuild every figure from saved results: ``make figures`` or ``python -m experiments.make_figures``.

Each group of figures is drawn from the runs it is given, never from whatever lies under results/ (a five-response
run made to try a prompt would become the paper's EloEverything figure). The sweep figures (1, A1, 2a-c, 3a-d, 4)
use the whole-vocabulary runs named with --runs; the EloEverything figures for the user's own models (5b, 5c, A5,
in <out>/responses/) the response runs named with --response-runs, each of which scored every item of an
EloEverything table under its prompt (``probe score --responses elo_greatest_ever.csv --response-column name
--prompt "..."``). Without --runs (--response-runs), a group is drawn again from the runs <out>/MANIFEST.json
names for it, the ones its committed figures came from, where they are on this machine; else its figures are kept
as they are, and said so. A named run that is missing, unfinished, of part of the vocabulary or of part of a
table is refused in one line (exit 2) before any figure is drawn. The EloEverything figures of the paper's ten
reward models (5b, 5c, A5, A6, A7, elo_summary.json) and figure 2 on each table use --elo-data. Nothing here runs
a model.

<out>/MANIFEST.json records, per group (sweeps, EloEverything tables, response runs), the inputs and the files
they made. When a group is made again, its files from the previous set that it did not make this time are removed
(a table of four models does not stay beside figures of one).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


from experiments import fig1_distributions, fig2_agreement, fig3_framing, fig4_best_worst, fig5_elo
from experiments.common import PAPER_RELEASE, whole_vocabulary_runs
from probe.core.prompts import PAPER_PROMPTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make_figures", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elo-data", default=str(PAPER_RELEASE), help="folder of the elo_*.csv tables")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "figures"), help="output folder")
    parser.add_argument("--permutations", type=int, default=10_000, help="permutations for RSA p-values")
    parser.add_argument("--runs", nargs="+", default=None, metavar="RUN",
                        help="the whole-vocabulary sweep runs to draw from (default: the ones MANIFEST.json names)")
    parser.add_argument("--response-runs", nargs="+", default=None, metavar="RUN",
                        help="response runs of an EloEverything table's items (default: the ones MANIFEST.json "
                             "names)")
    args = parser.parse_args(argv)
    from probe.errors import ProbeError
    from probe.runs.rundir import writable_dir

    made, skipped = [], []
    manifest = Manifest(Path(args.out))
    elo = Path(args.elo_data)
    try:
        writable_dir(args.out, "--out")
        runs = _runs_of(args.runs, manifest, "sweeps", "--runs", skipped)
        sweeps = whole_vocabulary_runs(runs) if runs else []
        responses = _runs_of(args.response_runs, manifest, "response_runs", "--response-runs", skipped)
        if responses:
            if not list(elo.glob("elo_*.csv")):
                raise ProbeError(f"--response-runs: no elo_*.csv tables in {elo} (--elo-data) to pair them with")
            fig5_elo.tables_from_runs(fig5_elo.load_tables(elo), responses)  # every run scored a whole table
    except ProbeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if sweeps:
        group = manifest.start("sweeps", [_describe(p) for p in runs])
        prompts = [k for k in PAPER_PROMPTS if any(k in s.prompts for s in sweeps)]  # the paper's figures' prompts
        for p in prompts:
            fig1_distributions.main(fig1_distributions.Fig1Config(runs=runs, prompt=p, out=args.out,
                                    name=f"{'fig1' if p == 'greatest' else 'figA1'}_distributions_{p}.png"))
            made.append(f"figure {'1' if p == 'greatest' else 'A1'} ({p})")
        if sum("greatest" in s.prompts for s in sweeps) >= 2:
            fig2_agreement.main(fig2_agreement.Fig2Config(runs=runs, out=args.out, permutations=args.permutations))
            made.append("figure 2 (sweeps)")
        else:
            skipped.append("figure 2 from sweeps: needs sweeps of two or more models")
        if any({"greatest", "worst"} <= set(s.prompts) for s in sweeps):
            fig3_framing.main(fig3_framing.Fig3Config(runs=runs, out=args.out))
            made.append("figure 3")
        else:
            skipped.append("figure 3: needs a sweep with the greatest and worst prompts")
        if any({"best", "worst"} <= set(s.prompts) for s in sweeps):
            fig4_best_worst.main(fig4_best_worst.Fig4Config(runs=runs, out=args.out))
            made.append("figure 4")
        else:
            skipped.append("figure 4: needs a sweep with the best and worst prompts")
        manifest.finish(group)
    if list(elo.glob("elo_*.csv")):
        group = manifest.start("elo_tables", [{"table": t.name} for t in sorted(elo.glob("elo_*.csv"))])
        fig5_elo.main(fig5_elo.EloConfig(data=str(elo), out=args.out))
        made.append("figures 5b, 5c, A5, A6, A7 and elo_summary.json")
        for table in sorted(elo.glob("elo_*.csv")):
            fig2_agreement.main(fig2_agreement.Fig2Config(table=str(table), out=args.out,
                                                          suffix=f"_{table.stem}", permutations=args.permutations))
        made.append("figure 2 on each EloEverything table")
        manifest.finish(group, exclude="responses/")
    else:
        skipped.append(f"EloEverything figures: no elo_*.csv in {elo}")
    if responses:
        group = manifest.start("response_runs", [_describe(p) for p in responses])
        fig5_elo.main(fig5_elo.EloConfig(data=str(elo), out=str(Path(args.out) / "responses"), runs=responses))
        made.append(f"figures 5b, 5c, A5 (A6, A7 where the runs cover them) from {len(responses)} response "
                    "run(s), in responses/")
        manifest.finish(group, only="responses/")
    manifest.write(" ".join(["python -m experiments.make_figures", *(argv if argv is not None else sys.argv[1:])]))
    print("made:\n  " + ("\n  ".join(made) or "nothing"))
    if skipped:
        print("skipped:\n  " + "\n  ".join(skipped))
    print(f"in {args.out}")
    return 0


def _runs_of(named: list[str] | None, manifest: "Manifest", group: str, flag: str, skipped: list) -> tuple[str, ...]:
    """The runs a group is drawn from: those named with ``flag``, else the ones MANIFEST.json names for the group
    where every one of them is on this machine (else none: the group's figures are kept, and said so in
    ``skipped``). Never the runs that happen to lie under results/."""
    if named:
        return tuple(named)
    before = [i["run"] for i in manifest.data["groups"].get(group, {}).get("inputs", []) if "run" in i]
    absent = [r for r in before if not (Path(r) / "meta.json").is_file()]
    if before and not absent:
        return tuple(before)
    skipped.append(manifest.kept(group) + (f"; {len(absent)} of them not on this machine" if absent else "")
                   + f" (name runs with {flag} to draw them anew)")
    return ()


def _describe(path: str) -> dict:
    """A run as the manifest names it: its folder, model, score mode, prompts and settings fingerprint."""
    import json

    meta = json.loads((Path(path) / "meta.json").read_text())
    return {"run": str(path), "model": meta.get("model", {}).get("id"), "mode": meta.get("score", {}).get("mode"),
            "prompts": sorted(meta.get("prompts", {})), "fingerprint": meta.get("fingerprint")}


class Manifest:
    """<out>/MANIFEST.json: per group of figures, the inputs and the files made from them."""

    def __init__(self, out: Path):
        import json

        self.out, self.path = out, out / "MANIFEST.json"
        try:
            self.data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.data = {}
        self.data.setdefault("groups", {})

    def start(self, name: str, inputs: list) -> tuple[str, list, float]:
        import time

        return name, inputs, time.time()

    def finish(self, group: tuple[str, list, float], exclude: str | None = None, only: str | None = None) -> None:
        """The files written since ``start`` are this group's; the group's previous files not among them are
        removed (stale: made from other inputs)."""
        name, inputs, t0 = group
        made = sorted(str(p.relative_to(self.out)) for p in self.out.rglob("*")
                      if p.is_file() and p.name != "MANIFEST.json" and p.stat().st_mtime >= t0
                      and (exclude is None or not str(p.relative_to(self.out)).startswith(exclude))
                      and (only is None or str(p.relative_to(self.out)).startswith(only)))
        before = self.data["groups"].get(name, {}).get("files", [])
        others = {f for g, v in self.data["groups"].items() if g != name for f in v.get("files", [])}
        for stale in sorted(set(before) - set(made) - others):
            (self.out / stale).unlink(missing_ok=True)
            print(f"removed {stale}: made from the previous inputs of {name}")
        self.data["groups"][name] = {"inputs": inputs, "files": made}

    def kept(self, name: str) -> str:
        g = self.data["groups"].get(name)
        if not g:
            return f"{name}: no runs named, and no figures of this group from before"
        return (f"{name}: no runs named; kept its {len(g['files'])} files from before, made from "
                f"{len(g['inputs'])} input(s) listed in MANIFEST.json")

    def write(self, command: str) -> None:
        import json

        from probe.runs.rundir import atomic_write_json

        self.data["command"] = command
        atomic_write_json(self.path, json.loads(json.dumps(self.data)))


if __name__ == "__main__":
    sys.exit(main())
