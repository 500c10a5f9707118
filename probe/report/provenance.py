"""The provenance table of a run, shared by the reports: readable values (rounded numbers, "default" for no
revision, versions as a list), with every fact a reader needs to reproduce the run."""

from __future__ import annotations

import html

from probe.report.text import model_label


def _num(x, digits: int = 3) -> str:
    """A number as a person reads it: 3 significant digits, thousands separated; '-' for none."""
    if x is None:
        return "-"
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) >= 1):
        return f"{int(x):,}"
    return f"{x:.{digits}g}"


def _score(score: dict) -> str:
    parts = [score.get("mode", "?")]
    for key, name in (("head", "head"), ("reduce", "reduce"), ("label_index", "output column"),
                      ("pooling", "pooling"), ("fused", "fused head")):
        if score.get(key) not in (None, "", score.get("mode")):
            parts.append(f"{name} {score[key]}")
    return ", ".join(str(p) for p in parts)


def _check(check) -> str:
    if isinstance(check, list):  # a response run checks each prefix group: the worst of them
        check = {"max_abs_diff": max((c["max_abs_diff"] for c in check), default=None),
                 "tolerance": min((c["tolerance"] for c in check), default=None),
                 "token_ids": [None] * sum(len(c.get("responses", [])) for c in check)}
    if not check:
        return "not run (--verify 0)"
    n = len(check.get("token_ids") or [])
    return (f"{n} rows re-scored through the model's own forward: largest difference {_num(check.get('max_abs_diff'))}"
            f" (tolerance {_num(check.get('tolerance'))})")


def _judge_prompt(meta: dict) -> list[tuple[str, str]]:
    """A judge prompt's whole text (a rating or pairwise judge's run), as the run recorded it."""
    p = (meta.get("score") or {}).get("judge_prompt") or (meta.get("model") or {}).get("judge_prompt")
    if not p:
        return []
    return [("judge prompt text", f"{p['name']} (sha256 {p['sha256'][:16]}...): system {p.get('system')!r}, "
                                  f"answer prefix {p.get('answer_prefix')!r}, user turn {p['user']!r}"
                                  + (f", unit test {p['unit_test']!r}" if p.get("unit_test") is not None else ""))]


def provenance_table(meta: dict) -> str:
    """A run's provenance as an HTML table: model, spec, score, dtype, coverage, timing, versions, command,
    and per prompt the verified template split and the self-check."""
    m, env = meta.get("model", {}), meta.get("environment", {})
    settings, timing = meta.get("settings", {}), meta.get("timing", {})
    spec = m.get("spec", {}) or {}
    seconds = timing.get("sweep_s", timing.get("score_s"))
    rate = timing.get("tokens_per_s", timing.get("responses_per_s"))
    versions = env.get("versions") or {}
    rows = [("model", model_label(meta)), ("path", m.get("path") or "-"), ("revision", m.get("revision") or "default"),
            ("registry spec", f"{spec.get('name', '-')} (matched by {m.get('spec_match') or '-'})"),
            ("score", _score(meta.get("score") or {})), ("dtype / device", f"{m.get('dtype')} / {m.get('device')}"),
            ("scored", f"{_num(settings.get('n_tokens', settings.get('n_responses')))} "
                       f"{'tokens' if 'n_tokens' in settings else 'responses'} per prompt"),
            ("input method", settings.get("input_method", "ids")), *_judge_prompt(meta),
            ("created / finished", f"{meta.get('created') or '-'} / {meta.get('finished') or '-'}"),
            ("scoring time", f"{_num(seconds)} s ({_num(rate)} per second)" if seconds else "-"),
            ("versions", ", ".join(f"{k} {v}" for k, v in versions.items() if v) or "-"),
            ("git commit", env.get("git_commit") or "-"),
            ("command", env["command"] if isinstance(env.get("command"), str) else " ".join(env.get("command") or []))]
    out = ["<table class='prov'>"] + [f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                                      for k, v in rows]
    for key, p in meta.get("prompts", {}).items():
        check = (meta.get("self_check") or {}).get(key) or {}
        out.append(f"<tr><th>prompt {html.escape(key)}</th><td><b>{html.escape(p.get('text', ''))}</b><br>"
                   f"prefix ({len(p.get('prefix_ids', []))} ids): <code>{html.escape(repr(p.get('prefix_text')))}</code><br>"
                   f"suffix ids {p.get('suffix_ids')}: <code>{html.escape(repr(p.get('suffix_text')))}</code><br>"
                   f"template: leading space {p.get('leading_space', '-')}, trailing space "
                   f"{p.get('trailing_space', '-')}, BOS count {p.get('bos_count', '-')}, split verified on "
                   f"{p.get('verified_tokens', '-')} tokens<br>self-check: {html.escape(_check(check))}</td></tr>")
    out.append("</table>")
    return "\n".join(out)
