"""The auditors' report across models: one self-contained HTML page for several sweep runs.

    python -m probe.report RUN_A RUN_B [RUN_C ...] --out audit.html

For each prompt the runs share (matched by text): the best and worst tokens of every model side by side (all
tokens, or words only); the agreement between the models on their shared vocabulary (Kendall tau-b heatmap,
Spearman, the vocabulary's size); the strings the models disagree on most (largest spread of rank percentiles);
the rank of each identity term (probe/data/identity_terms.csv) per model; the framing and frequency slopes per
model (AFINN-111 valence, wordfreq frequency); and each run's provenance. Runs with different tokenizers are
compared on the strings each tokenizer has as exactly one id (the paper's matching), runs of one tokenizer on
their token ids.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import polars as pl

from probe.analysis import stats
from probe.analysis.sweeps import Sweep, load_sweep, shared_vocabulary, short_name
from probe.errors import ProbeError
from probe.report import page_template
from probe.report.provenance import provenance_table
from probe.report.tables import identity_table, slopes_table
from probe.report.text import flags, model_label, run_label, score_decimal, shown_text

COLUMNS = ["rank", "score", "id", "flags", "token"]


def shared_prompts(sweeps: list[Sweep]) -> dict[str, list[str]]:
    """Prompt label (the first run's key) -> each run's key, for the prompt texts every run has."""
    texts = set.intersection(*(set(s.prompts.values()) for s in sweeps))
    if not texts:
        raise ProbeError("the runs share no prompt text: a multi-model report needs at least one common prompt")
    first = sweeps[0]
    return {first.key_for(t): [s.key_for(t) for s in sweeps] for t in sorted(texts, key=list(first.prompts.values()).index)}


def _rows(df: pl.DataFrame, n: int) -> list[list]:
    return [[r["rank"], score_decimal(r["score"]), r["token_id"], flags(r),
             shown_text(r["decoded"], r.get("piece") or "", r["valid_utf8"])] for r in df.head(n).iter_rows(named=True)]


def best_worst(df: pl.DataFrame, n: int) -> dict:
    """Best and worst rows, of all tokens and of words only: [rank, score, id, flags, text], ``n`` a side, or half
    of them where there are fewer than 2n (no token is in both tables), with ``of``: how many there are."""
    ranked = df.sort(["rank", "token_id"])
    words = ranked.filter(pl.col("is_word"))
    out = {}
    for view, part in (("all", ranked), ("words", words)):
        k = min(n, part.height // 2)
        out[view] = {"best": _rows(part, k), "worst": _rows(part.reverse(), k), "of": part.height}
    return out


def disagreement(wide: pl.DataFrame, labels: list[str], n: int = 25) -> list[dict]:
    """Shared strings with the largest spread of rank percentiles across models (0 = best, 100 = worst)."""
    pct = {lab: 100 * (stats.descending_ranks(wide[lab].to_numpy()) - 1) / max(1, wide.height - 1) for lab in labels}
    spread = np.max(np.stack(list(pct.values())), 0) - np.min(np.stack(list(pct.values())), 0)
    order = np.argsort(-spread, kind="stable")[:n]
    strings = wide["string"].to_list()
    return [{"string": strings[i], "spread": round(float(spread[i]), 1),
             **{lab: round(float(pct[lab][i]), 1) for lab in labels}} for i in order]


def heatmap_png(tau: np.ndarray, labels: list[str], title: str) -> str:
    import base64
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import textwrap

    fig, ax = plt.subplots(figsize=(0.9 * len(labels) + 3.5, 0.8 * len(labels) + 2.4))
    im = ax.imshow(tau, vmin=-1, vmax=1, cmap="RdBu_r")
    for i in range(len(labels)):
        for j in range(len(labels)):  # light text on the dark ends of the scale, dark text in between
            ax.text(j, i, f"{tau[i, j]:.2f}", ha="center", va="center", fontsize=8,
                    color="white" if abs(tau[i, j]) > 0.55 else "black")
    ax.set_xticks(range(len(labels)), labels, rotation=40, ha="right", fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_title("\n".join(textwrap.wrap(title, 38)), fontsize=9)  # the whole title, over lines that fit
    fig.colorbar(im, ax=ax, shrink=0.8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def report_data(sweeps: list[Sweep], rows: int) -> dict:
    from probe.analysis.sweeps import TELLING, tell_apart

    # the route is in run_label already; two runs alike but for their revision, random-head seed, ... are named by it
    labels = tell_apart([run_label(short_name(s.model), s.meta) for s in sweeps], [s.meta for s in sweeps],
                        TELLING[1:])
    data: dict = {"labels": labels, "models": [model_label(s.meta) for s in sweeps], "prompts": {}}
    for prompt, keys in shared_prompts(sweeps).items():
        frames = [s.prompt(k) for s, k in zip(sweeps, keys)]
        wide, by = shared_vocabulary(dict(zip(labels, frames)), "exact", by="auto", with_kind=True)
        cols = [wide[lab].to_numpy() for lab in labels]
        tau = stats.matrix(cols, stats.kendall_tau_b)
        rho = stats.matrix(cols, stats.spearman)
        data["prompts"][prompt] = {
            "text": sweeps[0].prompts[keys[0]], "tables": [best_worst(df, rows) for df in frames],
            "agreement": {"n": wide.height, "by": by, "kendall": tau.tolist(), "spearman": rho.tolist()},
            "disagreement": disagreement(wide, labels), "identity": identity_table(frames, labels),
            "slopes": slopes_table(frames, labels, prompt), "warnings": coverage_warnings(sweeps, frames, labels),
        }
    return data


def coverage_warnings(sweeps: list[Sweep], frames: list[pl.DataFrame], labels: list[str]) -> list[str]:
    """Where the runs scored different parts of their vocabularies (--limit), the comparison is over a part."""
    from probe.report.audit import coverage

    ranges = [(int(df["token_id"].min()), int(df["token_id"].max()), df.height) for df in frames]
    whole = [coverage(s.meta)[0] for s in sweeps]
    constant = [f"{lab} gives every token the same score: its agreement with the others is undefined (blank)"
                for lab, df in zip(labels, frames) if df["score"].n_unique() == 1]
    if len({r for r in ranges}) == 1 and len(set(whole)) == 1:
        return constant
    parts = ", ".join(f"{lab}: {n:,} ids ({lo:,}-{hi:,}{'' if w else ', part of its vocabulary'})"
                      for lab, (lo, hi, n), w in zip(labels, ranges, whole))
    return constant + [f"The runs cover different token ids ({parts}): agreement, ranks and percentiles compare what "
                       "each run scored, not whole vocabularies."]


def _table(rows: list[dict], cols: list[str], table_id: str) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape('' if r.get(c) is None else str(r.get(c)))}</td>" for c in cols)
                   + "</tr>" for r in rows)
    return f"<table id='{table_id}'><tr>{head}</tr>{body}</table>"


def _static(data: dict) -> str:
    """The per-prompt sections that do not change with the toggles, written by Python."""
    labels = data["labels"]
    parts = []
    for key, p in data["prompts"].items():
        a = p["agreement"]
        tau = np.asarray(a["kendall"])
        img = heatmap_png(tau, labels, f"{key}: Kendall tau-b over {a['n']:,} shared {a['by']}")
        agree_rows = [{"model": lab, **{f"tau-b {m}": f"{tau[i, j]:.3f}" for j, m in enumerate(labels)}}
                      for i, lab in enumerate(labels)]
        parts.append(
            f"<section class='prompt' data-prompt='{html.escape(key)}'><h2>{html.escape(key)}: agreement</h2>"
            f"<p>{a['n']:,} shared {html.escape(a['by'])} (compared on {'token ids' if a['by'] == 'token ids' else 'decoded strings'})</p>"
            + "".join(f"<p class='warn'>{html.escape(w)}</p>" for w in p.get("warnings", []))
            + f"<img alt='agreement heatmap' src='data:image/png;base64,{img}'>"
            + _table(agree_rows, ["model", *[f"tau-b {m}" for m in labels]], f"agreement-{key}")
            + f"<h2>{html.escape(key)}: strings the models disagree on most</h2><p class='muted'>rank percentile per "
            "model (0 = best, 100 = worst) on the shared vocabulary</p>"
            + _table(p["disagreement"], ["string", "spread", *labels], f"disagreement-{key}")
            + f"<h2>{html.escape(key)}: identity terms</h2><p class='muted'>best rank of a token whose word form is "
            "the term (probe/data/identity_terms.csv); a blank cell: that model's run has no token whose word form "
            "is the term (its tokenizer splits the word, or the run scored only part of the vocabulary)</p>"
            + _table(p["identity"], ["term", "category", *labels], f"identity-{key}")
            + f"<h2>{html.escape(key)}: framing and frequency slopes</h2>"
            + _table([r | {"estimate": f"{r['estimate']:.3g}"} for r in p["slopes"]],
                     ["model", "slope", "estimate", "ci", "n"], f"slopes-{key}") + "</section>")
    return "\n".join(parts)


PAGE = page_template("multi.html")


def build(run_dirs: list[str | Path], rows: int = 25) -> str:
    sweeps = [load_sweep(p) for p in run_dirs]
    data = report_data(sweeps, rows)
    payload = json.dumps({k: data[k] for k in ("labels", "models")} | {
        "prompts": {k: {"text": v["text"], "tables": v["tables"]} for k, v in data["prompts"].items()}},
        ensure_ascii=True, separators=(",", ":")).replace("</", "<\\/")
    prov = "".join(f"<details><summary>{html.escape(lab)}: {html.escape(str(s.path))}</summary>{provenance_table(s.meta)}"
                   "</details>" for lab, s in zip(data["labels"], sweeps))
    title = html.escape(", ".join(data["labels"]))
    from probe.report.audit import summary_html

    summary = summary_html(sweeps, data["labels"], shared_prompts(sweeps), data)
    return (PAGE.replace("__TITLE__", title).replace("__NCOL__", str(min(4, len(sweeps))))
            .replace("__SUMMARY__", summary)
            .replace("__STATIC__", _static(data)).replace("__PROVENANCE__", prov).replace("__DATA__", payload))
