"""The auditors' page for response runs (``probe score --responses``): one run or several side by side.

First what was measured (per run: the score mode in words, the responses, what the template changed, what the
score mode does with length). Per prompt (matched by key across runs): findings (best and worst, how score goes
with length), each model's best and worst responses with their rank, score and length in tokens (one table of all
where there are few), a plot of score against length; the identity terms (probe/data/identity_terms.csv) found among the responses with each
model's rank for them (case-insensitive); with a value dictionary, each category's median rank per model
(probe/analysis/values.py); what the chat template did to responses; and each run's provenance.
"""

from __future__ import annotations

import html
from pathlib import Path

import polars as pl

from probe.report import page_template
from probe.report.audit import length_plot_png, measured_box, personas_html, response_findings
from probe.report.provenance import provenance_table
from probe.report.text import model_label, plural, run_label
from probe.runs.rundir import RunDir


def _table(rows: list[dict], cols: list[str], css: str = "") -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape('' if r.get(c) is None else str(r.get(c)))}</td>"
                                    for c in cols) + "</tr>" for r in rows)
    return f"<table class='{css}'><tr>{head}</tr>{body}</table>"


def _ranked(df: pl.DataFrame, n: int) -> tuple[list[dict], list[dict]]:
    def rows(part: pl.DataFrame) -> list[dict]:
        return [{"rank": r["rank"], "score": f"{r['score']:.4f}", "tokens": r["n_tokens"], "response": r["response"]}
                for r in part.iter_rows(named=True)]

    ordered = df.sort("rank", "response")
    if ordered.height <= 2 * n:  # few responses: one table of all, not two that repeat each other
        return rows(ordered), []
    return rows(ordered.head(n)), rows(ordered.tail(n).reverse())


def build(run_dirs: list[str | Path], rows: int = 25, dictionary: str | None = None) -> str:
    from probe.analysis.misalignment import identity_terms

    runs = [RunDir(p) for p in run_dirs]
    metas = [r.read_meta() for r in runs]
    tables = [r.read_table("scores.parquet") for r in runs]
    from probe.analysis.sweeps import TELLING, tell_apart

    # the route is in run_label already; two runs alike but for their revision, random-head seed, ... are named by it
    labels = tell_apart([run_label(model_label(m), m) for m in metas], metas, TELLING[1:])
    keys = list(dict.fromkeys(k for m in metas for k in m["prompts"]))
    terms = identity_terms().with_columns(pl.col("term").str.to_lowercase().alias("key"))
    value_ranks = None
    if dictionary:
        from probe.analysis import values

        from probe.errors import DataFormatError

        d = values.read_dictionary(dictionary)
        value_ranks = []
        for lab, t in zip(labels, tables):
            long = t.select(pl.lit(lab).alias("model"), pl.col("prompt_key").alias("prompt"), "response",
                            pl.col("score").cast(pl.Float64))
            try:
                value_ranks.append(values.median_ranks(values.ranked(long, d)))
            except DataFormatError:  # none of this run's responses is a term of the dictionary
                value_ranks.append(pl.DataFrame(schema={"prompt": pl.String, "category": pl.String,
                                                        "median_rank": pl.Float64, "n_terms": pl.UInt32}))
    sections = []
    for key in keys:
        text = next(m["prompts"][key]["text"] for m in metas if key in m["prompts"])
        present = [i for i, m in enumerate(metas) if key in m["prompts"]]
        cards = []
        for i in present:
            df = tables[i].filter(pl.col("prompt_key") == key)
            best, worst = _ranked(df, rows)
            changes = metas[i]["prompts"][key].get("template_changes") or {}
            note = ("<p class='muted'>responses the chat template changed: " + ", ".join(
                f"{html.escape(c)} {n}" for c, n in changes.items()) + "</p>") if changes else ""
            cols = ['rank', 'score', 'tokens', 'response']
            tables_html = (f"<b>best</b>{_table(best, cols, 'tok')}<b>worst</b>{_table(worst, cols, 'tok')}" if worst
                           else f"<b>all {len(best)}, best first</b>{_table(best, cols, 'tok')}")
            items = "".join(f"<li>{html.escape(x)}</li>" for x in response_findings(df, metas[i]))
            cards.append(f"<div><h3>{html.escape(labels[i])}</h3><p class='muted'>{plural(df.height, 'response')}</p>{note}"
                         f"<ul class='findings'>{items}</ul>{tables_html}</div>")
        ident = []
        for t in terms.iter_rows(named=True):
            row = {"term": t["term"], "category": t["category"]}
            for i in present:
                df = tables[i].filter((pl.col("prompt_key") == key) & (pl.col("response").str.to_lowercase() == t["key"]))
                row[labels[i]] = None if df.is_empty() else f"{int(df['rank'].min()):,} / {tables[i].filter(pl.col('prompt_key') == key).height:,}"
            if any(row.get(labels[i]) for i in present):
                ident.append(row)
        plot = length_plot_png([(labels[i], tables[i].filter(pl.col("prompt_key") == key)) for i in present], key)
        parts = [f"<section><h2>{html.escape(key)}: {html.escape(text)}</h2>",
                 f"<div class='models' style='grid-template-columns:repeat({min(4, len(present))},1fr)'>"
                 + "".join(cards) + "</div>",
                 f"<img alt='score against response length for {html.escape(key)}' "
                 f"src='data:image/png;base64,{plot}'>",
                 "<h3>Identity terms among the responses</h3>",
                 (_table(ident, ["term", "category", *[labels[i] for i in present]]) if ident else
                  "<p class='muted'>none of the shipped identity terms is among these responses</p>")]
        if value_ranks is not None:
            cats = sorted({c for v in value_ranks for c in v["category"].to_list()}) or ["(no response is a term)"]
            vrows = []
            for c in cats:
                row = {"category": c}
                for i in present:
                    part = value_ranks[i].filter((pl.col("prompt") == key) & (pl.col("category") == c))
                    row[labels[i]] = None if part.is_empty() else f"{part['median_rank'][0]:g} ({part['n_terms'][0]} terms)"
                vrows.append(row)
            parts += [f"<h3>Value categories ({html.escape(Path(dictionary).name)}): median rank, 1 = best</h3>",
                      _table(vrows, ["category", *[labels[i] for i in present]])]
        sections.append("".join(parts) + "</section>")
    prov = "".join(f"<details><summary>{html.escape(lab)}: {html.escape(str(r.path))}</summary>"
                   f"{provenance_table(m)}</details>" for lab, r, m in zip(labels, runs, metas))
    measured = "".join(f"<h3>{html.escape(lab)}</h3>{measured_box(m)}" for lab, m in zip(labels, metas))
    from probe.analysis.sweeps import response_rows

    sections = [personas_html(response_rows(t), m) for t, m in zip(tables, metas)] + sections
    return (page_template("responses.html").replace("__TITLE__", html.escape(", ".join(labels)))
            .replace("__MEASURED__", measured)
            .replace("__SECTIONS__", "\n".join(sections)).replace("__PROVENANCE__", prov))
