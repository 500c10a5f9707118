"""Rebuild every figure from saved results: ``make figures`` or ``python -m experiments.make_figures``.

Sweep figures (1, A1, 2a-c, 3a-d, 4) use the complete exhaustive runs under --results (the newest per model,
score mode and input method); figure 2 also runs on each EloEverything table, whose ten model columns are the
paper's reward models. The EloEverything figures (5b, 5c, A5, A6, A7, elo_summary.json) use --elo-data; the same
figures for the user's own models go to <out>/responses/ from the complete response runs under --results that
scored an EloEverything table's items under its prompt (``probe score --responses elo_greatest_ever.csv
--response-column name --prompt "..."``). A figure whose inputs are missing is skipped with a note; nothing here
runs a model.

The figures are one consistent set: the sweep figures come from one stated set of runs (every complete run found,
or the ones named with --runs), and <out>/MANIFEST.json records, per group (sweeps, EloEverything tables,
response runs), the inputs and the files they made. When a group is made again, its files from the previous set
that it did not make this time are removed (a table of four models does not stay beside figures of one); a group
whose inputs are absent this time is left as the manifest describes it, and said so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


from experiments import fig1_distributions, fig2_agreement, fig3_framing, fig4_best_worst, fig5_elo
from experiments.common import PAPER_RELEASE, discover_response_runs, discover_runs, load_runs
from probe.core.prompts import PAPER_PROMPTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make_figures", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="results", help="root of the run directories")
    parser.add_argument("--elo-data", default=str(PAPER_RELEASE), help="folder of the elo_*.csv tables")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "figures"), help="output folder")
    parser.add_argument("--permutations", type=int, default=10_000, help="permutations for RSA p-values")
    parser.add_argument("--runs", nargs="+", default=None, metavar="RUN",
                        help="the sweep runs to draw from (default: every complete whole-vocabulary run under --results)")
    args = parser.parse_args(argv)
    from probe.errors import ProbeError
    from probe.runs.rundir import writable_dir

    try:
        writable_dir(args.out, "--out")
    except ProbeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    limited: list = []
    runs = tuple(args.runs) if args.runs else tuple(str(p) for p in discover_runs(args.results, limited))
    made, skipped = [], [f"{p}: a run of part of the vocabulary (--limit); figures use whole-vocabulary runs"
                         for p in limited]
    manifest = Manifest(Path(args.out))
    group = manifest.start("sweeps", [_describe(p) for p in runs])
    sweeps = load_runs(runs)
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
    if sweeps:
        manifest.finish(group)
    else:
        skipped.append(manifest.kept("sweeps"))
    elo = Path(args.elo_data)
    if list(elo.glob("elo_*.csv")):
        group = manifest.start("elo_tables", [{"table": t.name} for t in sorted(elo.glob("elo_*.csv"))])
        fig5_elo.main(fig5_elo.EloConfig(data=str(elo), out=args.out))
        made.append("figures 5b, 5c, A5, A6, A7 and elo_summary.json")
        for table in sorted(elo.glob("elo_*.csv")):
            fig2_agreement.main(fig2_agreement.Fig2Config(table=str(table), out=args.out,
                                                          suffix=f"_{table.stem}", permutations=args.permutations))
        made.append("figure 2 on each EloEverything table")
        manifest.finish(group, exclude="responses/")
        responses = tuple(str(p) for p in discover_response_runs(args.results))
        if responses:
            from probe.errors import DataFormatError

            group = manifest.start("response_runs", [_describe(p) for p in responses])
            try:
                fig5_elo.main(fig5_elo.EloConfig(data=str(elo), out=str(Path(args.out) / "responses"), runs=responses))
                made.append(f"figures 5b, 5c, A5 (A6, A7 where the runs cover them) from {len(responses)} response "
                            "run(s), in responses/")
                manifest.finish(group, only="responses/")
            except DataFormatError as err:
                skipped.append(f"EloEverything figures from response runs: {err}")
        else:
            skipped.append(manifest.kept("response_runs"))
    else:
        skipped.append(f"EloEverything figures: no elo_*.csv in {elo}")
    manifest.write(" ".join(["python -m experiments.make_figures", *(argv if argv is not None else sys.argv[1:])]))
    print("made:\n  " + "\n  ".join(made))
    if skipped:
        print("skipped:\n  " + "\n  ".join(skipped))
    print(f"in {args.out}")
    return 0


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
            return f"{name}: no inputs found, and no figures of this group from before"
        return (f"{name}: no inputs found; kept its {len(g['files'])} files from before, made from "
                f"{len(g['inputs'])} input(s) listed in MANIFEST.json")

    def write(self, command: str) -> None:
        import json

        from probe.runs.rundir import atomic_write_json

        self.data["command"] = command
        atomic_write_json(self.path, json.loads(json.dumps(self.data)))


if __name__ == "__main__":
    sys.exit(main())
