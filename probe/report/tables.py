"""Tables drawn from one prompt's scores of one or several runs, shared by the single-run and multi-model pages
(probe/report/audit.py, probe/report/multi.py): identity terms' ranks, and framing and frequency slopes."""

from __future__ import annotations

import polars as pl

from probe.core.vocab import strip_markers


def identity_table(frames: list[pl.DataFrame], labels: list[str]) -> list[dict]:
    """Per identity term that some model has as a token: each model's best rank among the tokens whose word form
    is the term (case-insensitive), as 'rank / vocabulary (percentile)'."""
    from probe.analysis.misalignment import identity_terms

    terms = identity_terms().filter(~pl.col("term").str.contains(" "))
    out = []
    forms = [df.with_columns(pl.col("decoded").map_elements(lambda t: strip_markers(t).lower(),
                                                            return_dtype=pl.String).alias("form")) for df in frames]
    best = [f.group_by("form").agg(pl.col("rank").min()) for f in forms]
    lookup = [dict(zip(b["form"].to_list(), b["rank"].to_list())) for b in best]
    for term, category in terms.iter_rows():
        row = {"term": term, "category": category}
        for lab, look, df in zip(labels, lookup, frames):
            r = look.get(term.lower())
            row[lab] = None if r is None else f"{r:,} / {df.height:,} ({100 * r / df.height:.1f}%)"
        if any(row[lab] for lab in labels):
            out.append(row)
    return out


def slopes_table(frames: list[pl.DataFrame], labels: list[str], prompt: str) -> list[dict]:
    from probe.analysis.regressions import exposure_slopes, framing_slopes

    by = {(lab, prompt): df for lab, df in zip(labels, frames)}
    out = []
    framing = framing_slopes(by)
    exposure = exposure_slopes(by)
    for r in framing.iter_rows(named=True):
        out.append({"model": r["model"], "slope": f"valence, {r['affect']} words", "estimate": r["estimate"],
                    "ci": f"[{r['ci_low']:.3g}, {r['ci_high']:.3g}]", "n": r["n"]})
    for r in exposure.iter_rows(named=True):
        out.append({"model": r["model"], "slope": f"ln frequency (wordfreq), {r['controls'].replace(', ', ' and ')} "
                                                   "held fixed",
                    "estimate": r["estimate"], "ci": f"[{r['ci_low']:.3g}, {r['ci_high']:.3g}]", "n": r["n"]})
    return out
