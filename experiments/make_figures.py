"""Rebuild every figure from saved results: ``make figures`` or ``python -m experiments.make_figures``.

Sweep figures (1, A1, 2a-c, 3a-d, 4) use the complete exhaustive runs under --results (the newest per model,
score mode and input method); figure 2 also runs on each EloEverything table, whose ten model columns are the
paper's reward models. The EloEverything figures (5b, 5c, A5, A6, A7, elo_summary.json) use --elo-data; the same
figures for the user's own models go to <out>/responses/ from the complete response runs under --results that
scored an EloEverything table's items under its prompt (``probe score --responses elo_greatest_ever.csv
--response-column name --prompt "..."``). A figure whose inputs are missing is skipped with a note; nothing here
runs a model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


from experiments import fig1_distributions, fig2_agreement, fig3_framing, fig4_best_worst, fig5_elo  # noqa: E402
from experiments.common import PAPER_RELEASE, discover_response_runs, discover_runs, load_runs  # noqa: E402
from probe.core.prompts import PAPER_PROMPTS  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make_figures", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="results", help="root of the run directories")
    parser.add_argument("--elo-data", default=str(PAPER_RELEASE), help="folder of the elo_*.csv tables")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "figures"), help="output folder")
    parser.add_argument("--permutations", type=int, default=10_000, help="permutations for RSA p-values")
    args = parser.parse_args(argv)
    from probe.errors import ProbeError
    from probe.runs.rundir import writable_dir

    try:
        writable_dir(args.out, "--out")
    except ProbeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    limited: list = []
    runs = tuple(str(p) for p in discover_runs(args.results, limited))
    made, skipped = [], [f"{p}: a run of part of the vocabulary (--limit); figures use whole-vocabulary runs"
                         for p in limited]
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
    elo = Path(args.elo_data)
    if list(elo.glob("elo_*.csv")):
        fig5_elo.main(fig5_elo.EloConfig(data=str(elo), out=args.out))
        made.append("figures 5b, 5c, A5, A6, A7 and elo_summary.json")
        for table in sorted(elo.glob("elo_*.csv")):
            fig2_agreement.main(fig2_agreement.Fig2Config(table=str(table), out=args.out,
                                                          suffix=f"_{table.stem}", permutations=args.permutations))
        made.append("figure 2 on each EloEverything table")
        responses = tuple(str(p) for p in discover_response_runs(args.results))
        if responses:
            from probe.errors import DataFormatError

            try:
                fig5_elo.main(fig5_elo.EloConfig(data=str(elo), out=str(Path(args.out) / "responses"), runs=responses))
                made.append(f"figures 5b, 5c, A5 (A6, A7 where the runs cover them) from {len(responses)} response "
                            "run(s), in responses/")
            except DataFormatError as err:
                skipped.append(f"EloEverything figures from response runs: {err}")
    else:
        skipped.append(f"EloEverything figures: no elo_*.csv in {elo}")
    print("made:\n  " + "\n  ".join(made))
    if skipped:
        print("skipped:\n  " + "\n  ".join(skipped))
    print(f"in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
