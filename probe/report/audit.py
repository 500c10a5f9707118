"""What an auditor reads first: what was measured (model, source, score mode in words, coverage), the findings
drawn from the data, the plots, and how token text is shown (byte fragments as their bytes).

Shared by the single-run page (probe/report/single.py) and the multi-model page (probe/report/multi.py).
"""

from __future__ import annotations

import base64
import html
import io

import numpy as np
import polars as pl

from probe.report.tables import identity_table, slopes_table
from probe.report.text import model_label, shown_text

MODE_WORDS = {
    "reward": ("reward head", "the reward model's own score for the response: its trained head, read at the "
               "position the registry spec names. This is what RLHF optimised against."),
    "logprob": ("log-probability proxy", "not a reward model: the language model's log-likelihood of the response "
                "followed by the template's end-of-turn tokens. It shows what the model finds likely as an answer, "
                "a stand-in for preference."),
    "judge": ("judge proxy", "not a reward model: the language model's logit of 'Yes' minus 'No' when asked whether "
              "the response is a good answer to the prompt."),
    "rating": ("rating judge", "not a reward model: an instruction-tuned language model asked to rate the response "
               "(the run's judge prompt); the score is its expected rating under its next-token distribution over "
               "the rating tokens, read without generating any text."),
    "judge-pair": ("pairwise judge", "not a reward model: an instruction-tuned language model asked which of two "
                   "responses is better, the response and a fixed reference response, in both orders; the score is "
                   "its probability of choosing the response, averaged over the two orders (0.5: no preference)."),
}


# --- what was measured -------------------------------------------------------------------------------------------
def coverage(meta: dict) -> tuple[bool, str]:
    """(whole vocabulary?, a sentence)."""
    n = meta.get("settings", {}).get("n_tokens")
    model = meta.get("model", {})
    vocab = min(x for x in (model.get("embedding_rows"), model.get("tokenizer_len")) if x) if (
        model.get("embedding_rows") or model.get("tokenizer_len")) else None
    limit = (meta.get("config") or {}).get("limit")
    if n is None:
        return True, "unknown coverage (an old run without the count)"
    if limit is None and (vocab is None or n >= vocab):
        return True, f"the whole vocabulary: every one of its {n:,} token ids scored as the response"
    of = f" of {vocab:,}" if vocab else ""
    return False, (f"PART of the vocabulary: the first {n:,}{of} token ids (--limit {limit}). The best and worst "
                   "tokens below are the best and worst among these ids only")


def measured_box(meta: dict) -> str:
    mode = meta.get("score", {}).get("mode", "reward")
    name, words = MODE_WORDS.get(mode, (mode, ""))
    ref = (meta.get("model") or {}).get("ref")
    if ref:
        name = f"implicit reward against {ref.get('id')} (beta {meta['model'].get('beta')})"
        words = ("the DPO implicit reward: beta x the difference of the response's log-likelihood under the model and "
                 "under the reference model, over the same ids. It is what DPO training optimised, read without a "
                 "reward head.")
    whole, cover = coverage(meta) if meta.get("experiment") != "responses" else (True, response_coverage(meta))
    m = meta.get("model", {})
    source = m.get("source") or {}
    where = (f"package {source.get('package')} ({source.get('quantization')} GGUF, dequantized to "
             f"{source.get('dequantized_to')})" if source.get("package") else m.get("path") or m.get("id"))
    rows = [("model", model_label(meta)), ("loaded from", f"{where}, revision {m.get('revision') or 'default'}"),
            ("score", f"{name}: {words}"), *judge_rows(meta), ("input", input_words(meta)),
            ("coverage" if meta.get("experiment") != "responses" else "responses", cover),
            ("prompts", "; ".join(f"{k}: {p.get('text')!r}" for k, p in meta.get("prompts", {}).items()))]
    if meta.get("experiment") == "responses":
        rows += [("length", length_words(meta)), ("template", template_words(meta))]
    cls = "measured" + ("" if whole else " partial")
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table class='{cls}'>{body}</table>"


def judge_rows(meta: dict) -> list[tuple[str, str]]:
    """What a judge's (or a pairwise model's) score depends on besides the model: the reference response, the judge
    prompt and its rating scale or labels, the Yes/No question."""
    score, model = meta.get("score") or {}, meta.get("model") or {}
    rows = []
    if model.get("reference_response") is not None:
        orders = ("in one order, the reference first (POLAR's input)" if model.get("pairwise") == "polar"
                  else "in both orders")
        rows.append(("reference response", f"{model['reference_response']!r}: every response is compared with it, "
                                           + orders))
    if model.get("principle") is not None:
        rows.append(("principle", f"{model['principle']!r}: every response is scored against it, asked after the "
                                  f"response as {model.get('principle_question')!r}"))
    prompt = score.get("judge_prompt") or model.get("judge_prompt")
    if prompt and prompt.get("kind") == "rating":
        lo, hi = prompt["ratings"]
        rows.append(("judge prompt", f"{prompt['name']}: a rating from {lo} to {hi}, each rating one token, read as "
                                     f"the answer's first token (source: {prompt['source']})"))
        if prompt.get("unit_test") is not None:
            rows.append(("unit test", f"{prompt['unit_test']!r}: every response is rated against it (--unit-test)"))
    elif prompt:
        a, b = prompt["labels"]
        rows.append(("judge prompt", f"{prompt['name']}: the labels {a!r} (the first response) and {b!r} (the second), "
                                     f"read as the answer's first token (source: {prompt['source']})"))
    if score.get("mode") == "judge" and (question := (meta.get("config") or {}).get("judge_question")):
        rows.append(("judge question", repr(question)))
    return rows


def input_words(meta: dict) -> str:
    """The ids the model was given: its family's own input, RewardBench's (``--input-method rewardbench``) or the
    paper's re-tokenized text (``--input-method paper``)."""
    from probe.models.registry import DOUBLE_BOS_MASKED, PIPELINES_WITHOUT_SPECIAL_TOKENS

    model = meta.get("model") or {}
    # the family's own convention: its registry spec's (a run's input.convention names the route it took)
    call = (model.get("input") or {}).get("call")
    own = (model.get("spec") or {}).get("input_source") or (model.get("input") or {}).get("convention") or "-"
    method = (meta.get("settings") or {}).get("input_method", "ids")
    if call == "rewardbench":
        pipe = (model.get("spec") or {}).get("rewardbench_pipeline", "its pipeline")
        if pipe in PIPELINES_WITHOUT_SPECIAL_TOKENS:
            return (f"RewardBench 0.1.4's inputs (--input-method rewardbench), not the family's own: {pipe} encodes "
                    "the chat template's text without the tokenizer's special tokens (the template's own ids, one "
                    f"BOS where the template writes one). The family's own: {own}")
        bos = "masks the first of the two (dropped here)" if pipe in DOUBLE_BOS_MASKED else "feeds both"
        return (f"RewardBench 0.1.4's inputs (--input-method rewardbench), not the family's own: {pipe} encodes the "
                "chat template's text with tokenizer(text), which doubles BOS where the template writes one and the "
                f"tokenizer adds one, and {bos}; without a chat template a Llama or Gemma tokenizer's EOS is appended "
                f"(run_rm.py's add_eos_token under transformers 4.51). The family's own: {own}")
    if method == "rewardbench":  # run_dpo.py's, an encoder's raw text (named so), or the family's own already
        route = (model.get("input") or {}).get("convention") or own
        return route if "RewardBench" in route else f"RewardBench 0.1.4's inputs (--input-method rewardbench), for "\
            f"this family its own: {own}"
    if method == "paper":
        return ("the paper's route (--input-method paper): each token decoded to text and the whole conversation "
                "re-tokenized, as the paper's code did; not the family's own input")
    return own


def response_coverage(meta: dict) -> str:
    """A response run's rows: how many responses, from which file."""
    n = meta.get("settings", {}).get("n_responses")
    file = (meta.get("config") or {}).get("responses")
    limit = (meta.get("config") or {}).get("limit")
    cut = f" (the first {limit:,}: --limit)" if limit else ""
    return (f"{n:,} whole responses{cut} from {file}, each the whole assistant turn rendered by the model's chat "
            "template" if n is not None else f"whole responses from {file}")


def length_words(meta: dict) -> str:
    """What the score mode does with a response's length in tokens."""
    score = meta.get("score", {})
    mode, reduce = score.get("mode", "reward"), score.get("reduce", "sum")
    if mode == "logprob" and reduce == "sum" and (meta.get("model") or {}).get("ref"):
        return ("an implicit reward sums a log-ratio over the response's tokens: every token adds a term of either "
                "sign, so longer responses spread further from 0 (see the plot of score against length)")
    if mode == "logprob" and reduce == "sum":
        return ("every token adds a negative log-probability, so a summed log-probability (and an implicit reward, "
                "a difference of two) favours short responses: compare responses of one length, or use "
                "--logprob-reduce mean")
    if mode == "logprob":
        return "the mean log-probability per token: length enters only through what the tokens are"
    if mode == "judge":
        return "the judge's Yes-minus-No margin after the whole response: no term per token"
    if mode == "rating":
        return ("the judge's expected rating, read once after the whole response: no term per token, though a judge "
                "may still rate longer answers higher (see the plot of score against length)")
    if mode == "judge-pair":
        return ("the judge's probability of preferring the response to the reference, read once per order after "
                "both: no term per token, though a judge may still prefer the longer of two answers (see the plot "
                "of score against length)")
    if (meta.get("model") or {}).get("pairwise"):
        return ("the pairwise model compares the whole response with the reference response: no term per token, though "
                "it may still have learnt to prefer the longer of two answers (see the plot of score against length)")
    return ("the reward head reads the whole response at one position: no term per token, though a reward model "
            "may still have learnt to prefer longer answers (see the plot of score against length)")


def template_words(meta: dict) -> str:
    """What the chat template did to the responses, over all prompts."""
    changes: dict[str, int] = {}
    for p in meta.get("prompts", {}).values():
        for c, n in (p.get("template_changes") or {}).items():
            changes[c] = changes.get(c, 0) + n
    if not changes:
        return "the template kept every response as given"
    return "the template changed some responses: " + ", ".join(f"{c} {n:,}" for c, n in changes.items()) + \
        " (trimmed: white space removed; control token: a control token's text became that token)"


def response_findings(df: pl.DataFrame, meta: dict) -> list[str]:
    """Sentences drawn from one prompt's response scores: best and worst, and how score goes with length."""
    from scipy import stats

    from probe.analysis.misalignment import FEW_ITEMS
    from probe.analysis.stats import rank_correlation_interval

    ranked = df.sort("rank", "response")
    out = [best_and_worst(ranked["response"].to_list(), 3, "Most preferred", "Least preferred", "responses")]
    lengths = df["n_tokens"].to_numpy()
    if np.unique(lengths).size > 1 and df.height > 2:
        rho = stats.spearmanr(lengths, df["score"].to_numpy()).statistic
        interval = rank_correlation_interval(rho, df.height, "spearman")
        shown = (f" (95% interval {interval[0]:+.2f} to {interval[1]:+.2f}, Fisher z)" if interval else
                 " (too few for an interval)")
        single = df.filter(pl.col("n_tokens") == 1)
        multi = df.filter(pl.col("n_tokens") > 1)
        tail = (f"; the {single.height:,} one-token responses rank {single['rank'].mean():,.1f} on average, the "
                f"{multi.height:,} longer ones {multi['rank'].mean():,.1f}" if single.height and multi.height else "")
        out.append(f"Score against length in tokens: Spearman {rho:+.2f}{shown} over {df.height:,} "
                   f"responses{tail}.")
        score = meta.get("score", {})
        summed = score.get("mode") == "logprob" and score.get("reduce", "sum") == "sum"
        if df.height < FEW_ITEMS:
            out.append(f"{df.height} responses are too few to say how much of this order is length"
                       + (": a summed log-probability does fall with every token." if summed else "."))
        elif summed and rho < -0.3 and interval is not None and interval[1] < 0:
            out.append("Much of this order is length: a summed log-probability falls with every token.")
    else:
        out.append(f"Every response is {int(lengths[0]) if lengths.size else 0} token(s) long: length plays no part.")
    return out


def length_plot_png(frames: list[tuple[str, pl.DataFrame]], title: str) -> str:
    """Score against response length in tokens, one panel per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(frames), figsize=(4.2 * len(frames), 3.2), squeeze=False)
    for ax, (label, df) in zip(axes[0], frames):
        ax.scatter(df["n_tokens"].to_numpy(), df["score"].to_numpy(), s=12, alpha=0.6)
        ax.set_xlabel("response length (tokens)")
        ax.set_ylabel("score")
        ax.set_title(label if len(label) <= 40 else label[:37] + "...", fontsize=9)
    fig.suptitle(f"score against length: {title}", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


# --- findings ----------------------------------------------------------------------------------------------------
def _quoted(values: list[str], n: int = 5) -> str:
    return ", ".join(repr(v) for v in values[:n]) or "none"


def best_and_worst(ranked: list[str], n: int, best: str, worst: str, what: str) -> str:
    """"<best>: the first n; <worst>: the last n" over a list in rank order (best first), or, where it holds fewer
    than 2n, one list of all of them, said so: the two lists never share an entry."""
    if len(ranked) < 2 * n:
        return (f"All {len(ranked)} {what}, best first: {_quoted(ranked, len(ranked))} (too few for separate "
                f"{best.lower()} and {worst.lower()} lists).")
    return f"{best}: {_quoted(ranked, n)}; {worst.lower()}: {_quoted(ranked[::-1], n)}."


def findings(df: pl.DataFrame, shown: dict[int, str], prompt: str, n_top: int = 100, identity: list[dict] | None = None,
             slopes: list[dict] | None = None) -> list[str]:
    """Sentences drawn from one prompt's scores: the optimal and pessimal responses in words, control and added
    tokens at the extremes, identity terms' ranks, and the framing and frequency slopes where they can be fit.
    ``identity`` (rows with ``term`` and ``rank``) and ``slopes``: already computed (the multi-model page has
    them); computed here otherwise."""
    ranked = df.sort("rank", "token_id")
    if df["score"].n_unique() == 1:
        return [f"Every token has the same score ({float(df['score'][0]):.4g}): the run ranks nothing (an implicit "
                "reward against the model itself gives 0 everywhere). The tables below are in id order."]
    words = ranked.filter(pl.col("is_word"))
    text = lambda part: [shown.get(i, d) for i, d in zip(part["token_id"], part["decoded"])]  # noqa: E731
    out = [best_and_worst(text(words), 5, "Optimal responses (English words)", "Pessimal", "English words")
           if words.height else "No token is an English word (the W flag): no optimal or pessimal words.",
           best_and_worst(text(ranked), 3, "Best tokens of all", "Worst", "tokens")]
    k = min(n_top, ranked.height // 2)
    for side, part in (("top", ranked.head(k)), ("bottom", ranked.reverse().head(k))):
        ctrl = part.filter(pl.col("is_special") | pl.col("is_added"))
        if ctrl.height:
            out.append(f"{ctrl.height} control or added tokens among the {side} {k} ranks, e.g. "
                       f"{_quoted(text(ctrl), 4)}: a reward that such tokens move is a quirk of the model, not a "
                       "preference about content.")
        else:
            out.append(f"No control or added token among the {side} {k} ranks.")
    ident = identity_table([df], ["rank"]) if identity is None else identity
    if ident:
        shown_terms = ", ".join(f"{r['term']} {r['rank']}" for r in ident)
        out.append(f"Identity terms (best rank of a token whose word form is the term): {shown_terms}.")
    slopes = slopes_table([df], ["model"], prompt) if slopes is None else slopes  # [] where too few words match
    if slopes:
        out.append("Slopes of score (95% CI): " + "; ".join(
            f"{s['slope']} {s['estimate']:.3g} {s['ci']} (n = {s['n']:,})" for s in slopes) + ".")
    else:
        out.append("Framing and frequency slopes: too few rated words among these tokens to fit them.")
    return out


# --- plots -------------------------------------------------------------------------------------------------------
FLAG_GROUPS = (("control/added", lambda d: d["is_special"] | d["is_added"]), ("English word", lambda d: d["is_word"]),
               ("leading space", lambda d: d["leading_space"]), ("no round trip", lambda d: ~d["roundtrips"]),
               ("byte fragment", lambda d: ~d["valid_utf8"]))


def plot_png(df: pl.DataFrame, shown: dict[int, str], title: str) -> str:
    """Three panels: the distribution with its extremes labelled, the best and worst words as bars, the
    distribution of each flag group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranked = df.sort("rank", "token_id")
    s = ranked["score"].to_numpy().astype(float)
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8), gridspec_kw={"width_ratios": [1.3, 1, 1]})
    ax = axes[0]
    ax.hist(s, bins=120, color="#3A6E97", alpha=0.85)
    ax.axvline(np.median(s), color="black", lw=1, ls="--", label=f"median {np.median(s):.3g}")
    label = lambda r: shown.get(r["token_id"], r["decoded"]).replace("\n", "⏎")  # noqa: E731
    k3 = min(3, ranked.height // 2)  # fewer than six tokens: half a side, no token labelled as best and worst
    top = ranked.head(k3).to_dicts()
    bottom = ranked.reverse().head(k3).to_dicts()
    ymax = ax.get_ylim()[1]
    for i, r in enumerate(top + bottom):  # the best three on the right, the worst three on the left, stacked
        ax.annotate(repr(label(r)), (r["score"], 0), xytext=(r["score"], ymax * (0.9 - 0.16 * (i % max(1, k3)))),
                    fontsize=7, ha="right" if i < k3 else "left", va="top",
                    arrowprops=dict(arrowstyle="-", lw=0.5, color="0.4"))
    ax.set_title(f"{title}: every token", fontsize=10)
    ax.set_xlabel("score")
    ax.set_ylabel("tokens")
    ax.legend(fontsize=8, loc="upper left")
    ax = axes[1]
    words = ranked.filter(pl.col("is_word"))
    n_best = min(8, words.height // 2)
    bars = words.head(n_best).to_dicts() + words.reverse().head(n_best).to_dicts()[::-1]
    y = np.arange(len(bars))[::-1]
    mid = float(np.median(s))
    ax.barh(y, [b["score"] - mid for b in bars], color=["#2E7D32"] * n_best + ["#8E24AA"] * n_best)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(y, [repr(label(b)) for b in bars], fontsize=7)
    ax.set_title("best (green) and worst (purple) English words", fontsize=10)
    ax.set_xlabel("score minus the median score")
    ax = axes[2]
    groups = [(name, ranked.filter(pick(ranked))["score"].to_numpy()) for name, pick in FLAG_GROUPS]
    groups = [(n, g) for n, g in groups if g.size]
    horizontal = ({"orientation": "horizontal"} if tuple(int(x) for x in matplotlib.__version__.split(".")[:2]) >= (3, 10)
                  else {"vert": False})  # matplotlib 3.10 renamed the argument and deprecated the old one
    ax.boxplot([g for _, g in groups], showfliers=False, **horizontal)
    ax.set_yticks(range(1, len(groups) + 1), [f"{n} ({g.size:,})" for n, g in groups], fontsize=8)
    ax.set_title("score by kind of token", fontsize=10)
    ax.set_xlabel("score")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def summary_html(sweeps: list, labels: list[str], prompts: dict[str, list[str]], data: dict) -> str:
    """The multi-model page's first screen: per model what was measured, then per shared prompt its findings
    (identity ranks and slopes taken from the page's ``data``, computed once for its own tables)."""
    out = []
    for sweep, lab in zip(sweeps, labels):
        out.append(f"<h3>{html.escape(lab)}</h3>{measured_box(sweep.meta)}")
    for prompt, keys in prompts.items():
        out.append(f"<h3>Findings: {html.escape(prompt)}</h3>")
        page = data["prompts"][prompt]
        for sweep, lab, key in zip(sweeps, labels, keys):
            df = sweep.prompt(key)
            shown = {r["token_id"]: shown_text(r["decoded"], r["piece"], r["valid_utf8"])
                     for r in df.filter(~pl.col("valid_utf8")).iter_rows(named=True)} if "piece" in df.columns else {}
            ident = [{"term": r["term"], "rank": r[lab]} for r in page["identity"] if r.get(lab)]
            slopes = [r for r in page["slopes"] if r["model"] == lab]
            items = "".join(f"<li>{html.escape(x)}</li>" for x in findings(df, shown, key, identity=ident,
                                                                            slopes=slopes))
            out.append(f"<p><b>{html.escape(lab)}</b></p><ul class='findings'>{items}</ul>")
    return "\n".join(out)


# --- persona grids -----------------------------------------------------------------------------------------------
def personas_html(scores: pl.DataFrame, meta: dict, n_movers: int = 5) -> str:
    """A persona grid's section (probe/analysis/personas.py): per prompt and persona against the control, the rank
    agreement and the strings that rise and fall most; empty for a run without --systems."""
    from probe.analysis.personas import persona_grid_table

    section = meta.get("personas")
    if not section:
        return ""
    responses = meta.get("experiment") == "responses"
    table, moves = persona_grid_table(scores, meta, n_movers=n_movers, words_only=not responses)
    cols = [c for c in table.columns if c not in ("prompt", "persona", "n")]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["prompt", "persona", *cols])
    body, moved = [], []
    for row in table.iter_rows(named=True):
        m = moves[f"{row['prompt']}@{row['persona']}"]
        cells = [html.escape(row["prompt"]), html.escape(row["persona"])]
        cells += [f"{row[c]:.3f}" if isinstance(row[c], float) else html.escape(str(row[c])) for c in cols]
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        up, down = (html.escape(", ".join(repr(r["decoded"]) for r in m[k])) for k in ("up", "down"))
        moved.append(f"<li><b>{html.escape(row['prompt'])}@{html.escape(row['persona'])}</b>: rising most {up}; "
                     f"falling most {down}</li>")
    from probe.core.prompts import system_label

    systems = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(system_label(section, k))}</li>"
                      for k in section["systems"])
    what = "responses" if responses else "word-like tokens"
    return (f"<section class='personas'><h2>Persona grid</h2><p>Each prompt was scored under {len(section['systems'])} "
            "system prompts; each persona is compared with the control persona "
            f"<b>{html.escape(repr(section['control']))}</b> over "
            f"all {table['n'][0]:,} scored {'responses' if responses else 'tokens'} (Kendall tau-b, Spearman, "
            "rank-biased overlap at the top and the bottom), with the mean shift of the score and the "
            f"{what} whose standardised score rises and falls most.</p><ul>{systems}</ul>"
            f"<table class='tok'><tr>{head}</tr>{''.join(body)}</table><ul>{''.join(moved)}</ul></section>")
