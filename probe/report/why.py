"""The auditors' "why" section: for each explained response (explain.json, `probe explain`), a bar plot of the
layers' parts, the top heads, the prompt words that matter and the agreement with patching, in words.

`why_section(result)` returns an HTML fragment (a section other pages can embed); `why_page(result)` a whole page,
which `probe explain` writes as explain.html beside explain.json.
"""

from __future__ import annotations

import base64
import html
import io


def _bars_png(components: dict[str, float], title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k for k in components if k != "embed"]
    layers = sorted({int(k.split(".")[0][1:]) for k in names})
    attn = [components.get(f"L{i}.attn", 0.0) for i in layers]
    mlp = [components.get(f"L{i}.mlp", 0.0) for i in layers]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.22 * len(layers) + 2), 3.2))
    w = 0.42
    ax.bar([i - w / 2 for i in layers], attn, w, label="attention")
    ax.bar([i + w / 2 for i in layers], mlp, w, label="MLP")
    ax.axhline(0, color="0.4", lw=0.6)
    ax.set_xlabel("layer")
    ax.set_ylabel("part of the score")
    ax.set_title(title if len(title) <= 70 else title[:67] + "...", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


MIN_PAIRS = 10  # below this, no verdict whatever the interval says


def agreement_words(a) -> str:
    """An agreement with patching (``{"spearman", "n", "ci95"}``, probe/attribution/patching.py: `agreement`) said in
    words, with its n and 95% interval. The verdict is the one the whole interval supports (its lower end decides
    how strong the agreement is at least); none below `MIN_PAIRS` pairs or where the interval spans the thresholds."""
    if a is None or (isinstance(a, dict) and not a.get("n")):
        return "not measured (no baseline to patch from)"
    rho, n, ci = a.get("spearman"), a.get("n", 0), a.get("ci95")
    if rho is None:
        return f"undefined over n={n} pairs (one side constant)"
    said = f"Spearman {rho:+.2f} (n={n}"
    if ci is None or n < MIN_PAIRS:
        return said + (f", 95% interval [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "") + \
            f"): too few pairs for a verdict (fewer than {MIN_PAIRS})"
    lo, hi = ci
    said += f", 95% interval [{lo:+.2f}, {hi:+.2f}])"
    if lo >= 0.7:
        how = "they rank the components much as patching does: read them as causes"
    elif lo >= 0.4:
        how = "they agree at least in part: trust the largest, not their order"
    elif lo > 0.1:
        how = "at least weak agreement: most of the effect may travel through later layers"
    elif hi <= 0.1:
        how = "no agreement: they say little about cause on this model"
    else:
        how = "not settled: the interval spans agreement and none"
    return f"{said}: {how}"


def why_section(result: dict, top: int = 5) -> str:
    from probe.attribution.checks import closure_line

    e = html.escape
    ag = result.get("agreement", {})
    said = "; ".join(f"{lev}, {what.replace('_', ' ')}: {agreement_words(a)}"
                     for lev, got in ag.get("levels", {}).items() for what, a in got.items())
    parts = [f"<section class='why'><h2>Why: {e(str(result.get('model', '')))} ({e(str(result.get('mode', '')))})</h2>",
             f"<p>{e(str(result.get('reader') or ''))}. {e(str(result.get('exactness') or ''))}.</p>",
             f"<p>Agreement with activation patching over all responses: "
             f"{e(said or agreement_words(None))}.</p>"]
    for r in result.get("responses", []):
        comps = r["components"]
        big = sorted(comps.items(), key=lambda kv: -abs(kv[1]))[:top]
        outside = ", ".join(f"{k.replace('_', ' ')} {v:+.3f}" for k, v in r["rest_items"].items())
        items = [closure_line(r) + f"; what lies outside the parts: {outside}",
                 "largest parts: " + ", ".join(f"{k} {v:+.3f}" for k, v in big)]
        if r.get("held"):
            items.append("held at its real value: the gate " + ", ".join(f"{g:.3f}" for g in r["held"]["gate"])
                         + f" (position {r['held']['gate_position']})")
        if r.get("heads"):
            hs = sorted(((k, v) for k, v in r["heads"].items() if ".h" in k), key=lambda kv: -abs(kv[1]))[:top]
            items.append("top heads: " + ", ".join(f"{k} {v:+.3f}" for k, v in hs))
        p = r.get("patching") or {}
        if "effects" in p:
            for lev, got in p.get("agreement", {}).items():
                for what, a in got.items():
                    items.append(f"against {p['baseline']!r}, {lev}, {what.replace('_', ' ')}: {agreement_words(a)}")
        g = r.get("integrated_gradients")
        if g:
            toks = g.get("tokens") or [str(x) for x in g["positions"]]
            best = sorted(zip(toks, g["attributions"]), key=lambda kv: -abs(kv[1]))[:top]
            said = (f" (completeness residual {g['residual']:+.2e} against the target {g['target']:.1e}: "
                    + ("met" if g.get("met") else "NOT met: read these as unconverged") + ")") if "target" in g else \
                f" (completeness residual {g['residual']:+.2e}, no target recorded)"
            items.append("prompt words that matter most: " + ", ".join(f"{t!r} {a:+.3f}" for t, a in best) + said)
        img = _bars_png(comps, f"{r['response']!r}: parts by layer")
        parts.append(f"<h3>{e(repr(r['response']))}</h3><ul>" + "".join(f"<li>{e(x)}</li>" for x in items)
                     + f"</ul><img alt='parts of {e(repr(r['response']))} by layer' src='data:image/png;base64,{img}'>")
    return "".join(parts) + "</section>"


def why_page(result: dict) -> str:
    style = ("<style>body{font:14px system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
             "img{max-width:100%}h3{border-top:1px solid #ddd;padding-top:.6em}</style>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>why: {html.escape(str(result.get('model')))}"
            f"</title>{style}</head><body>{why_section(result)}</body></html>")
