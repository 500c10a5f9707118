"""Why a token wins: the score decomposed into what each component of the model wrote, checked against patching.

    probe explain --rm MODEL --prompt "What, in one word, is the greatest thing ever?" --response Love --out DIR
    probe explain --rm MODEL --responses answers.txt --baseline "I don't know." --out DIR
    probe explain --run results/<model>/exhaustive_<time>/ --top 5 --out DIR     # a sweep's best and worst 5
    probe explain --run results/<model>/gcg_max_<time>/ --baseline the --out DIR  # a GCG or beam search's best

For each response (scored exactly as ``probe score --responses`` scores it: the same rendering, head and engine):

* ``components``: the embedding and each layer's attention and MLP output, read through the final norm frozen at
  the scale it really had and the head's linear reader, in float32; ``rest``: what lies outside them (the head's
  bias; for ``logprob`` minus each position's log-sum-exp; a soft-cap's bend). ``score = sum(components) + rest``
  to the dtype's rounding (``check``: the closure and the bound it is held to). ``--heads``: each attention head
  (o_proj's columns per head; the heads of a layer sum to its attention part).
* ``patching``: each component replaced by its value under a baseline response (``--baseline``; default the median
  one of those given, or the run's median token), batched; its effect on the score beside its direct difference,
  and their Spearman agreement (per response and overall): how far the direct parts tell cause on this model.
* ``integrated_gradients``: per prompt position, over the input embeddings (``--ig-steps``, ``--ig-baseline``),
  with the completeness residual.

Exact for reward heads read linearly (sequence classifiers, linear family heads, the Nemotron logit reader), the
Yes/No judge and the log-probability; gated heads (ArmoRM), process models' softmax, rating judges, encoders'
own forward, pairwise models and implicit rewards are refused with the reason. Writes ``explain.json``,
``explain.md`` and ``explain.html`` (the auditors' "why" section: parts by layer, top heads, prompt words, the
agreement in words; probe/report/why.py) into ``--out``, a new or empty folder, written whole at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from probe.commands.args import config_from_args
from probe.config import DEFAULT_DATE, ModelOptions, resolve_date
from probe.errors import ProbeError


@dataclass(frozen=True)
class ExplainConfig(ModelOptions):
    prompt: str | None = field(default=None, metadata={
        "help": "the user prompt of --response/--responses (default: the paper's greatest-thing prompt)"})
    response: tuple[str, ...] = field(default=(), metadata={"help": "a response to explain (repeatable)",
                                                            "repeat": True, "metavar": "TEXT"})
    responses: str | None = field(default=None, metadata={
        "help": "a text file of responses, one per line", "metavar": "FILE"})
    run: str | None = field(default=None, metadata={
        "help": "a probe score sweep run folder (its best and worst --top tokens, under its own ids) or a probe gcg "
                "or beam run folder (its best response, under its own prompt, system and date), with the run's model "
                "and score mode and the scores it reported", "metavar": "DIR"})
    top: int = field(default=5, metadata={"help": "with --run: how many best and how many worst tokens"})
    prompt_key: str | None = field(default=None, metadata={
        "help": "with --run: which of the run's prompts (default: its first)", "metavar": "KEY"})
    baseline: str | None = field(default=None, metadata={
        "help": "the response each component is patched from (default: the median-scored response given, or the "
                "run's median token)", "metavar": "TEXT"})
    heads: bool = field(default=False, metadata={"help": "also each attention head (decomposed and patched)"})
    patch: bool = field(default=True, metadata={"help": "activation patching against the baseline"})
    ig_steps: int = field(default=32, metadata={
        "help": "integrated-gradients steps over the prompt's input embeddings (0: none)"})
    ig_baseline: str = field(default="zero", metadata={
        "help": "integrated gradients' baseline: zero (embeddings), pad, or a one-token text", "metavar": "WHAT"})
    batch_size: int = field(default=16, metadata={"help": "sequences per hooked or patched forward"})
    system: str | None = field(default=None, metadata={"help": "system prompt (default: the template's)"})
    date: str | None = field(default=None, metadata={
        "help": f"date for chat templates that write one (default: {DEFAULT_DATE})"})
    score: str = field(default="auto", metadata={
        "help": "reward, logprob or judge (auto: logprob for the packaged language models, reward otherwise; "
                "with --run: the run's)"})
    logprob_reduce: Literal["sum", "mean"] = field(default="sum", metadata={
        "help": "sum or mean of the response's log-probabilities"})
    out: str | None = field(default=None, metadata={
        "help": "output folder, new or empty (default: results/explain_<time>)"})

    def __post_init__(self) -> None:
        self.check_reference()
        if not (self.response or self.responses or self.run):
            raise ValueError("give --response TEXT, --responses FILE or --run SWEEP_DIR")
        if self.run and (self.response or self.responses):
            raise ValueError("--run explains a sweep's tokens; --response/--responses explain texts: one at a time")
        if any(not r.strip() for r in self.response):
            raise ValueError("--response is empty: nothing to explain")
        if self.baseline is not None and not self.baseline.strip():
            raise ValueError("--baseline is empty: name a response to patch from")
        if self.top < 1:
            raise ValueError("--top must be >= 1")
        if self.ig_steps < 0:
            raise ValueError("--ig-steps must be >= 0")
        if self.batch_size < 2:
            raise ValueError("--batch-size must be >= 2 (one unpatched row and at least one patched row)")
        if self.score not in ("auto", "reward", "logprob", "judge"):
            raise ValueError(f"--score {self.score}: explain reads reward, logprob or judge (a rating judge's "
                             "softmax and pairwise models are not decomposed)")
        if self.date is not None:
            resolve_date(self.date)


def _check_out(out: Path) -> None:
    from probe.commands.trace import _check_out as check

    check(out)


def _sweep_model(cfg: ExplainConfig, meta: dict) -> tuple[ExplainConfig, str]:
    """The sweep's model and score mode (its model record, spec and output column, dtype)."""
    from probe.commands.trace import _model_ref

    from probe.attribution.inputs import SEARCHES, search_config

    s, model = meta.get("settings") or {}, meta.get("model") or {}
    mode = search_config(meta).mode if meta.get("experiment") in SEARCHES else s.get("mode")
    if mode not in ("reward", "logprob", "judge"):
        raise ProbeError(f"--run {cfg.run}: scored with --score {mode}; explain reads reward, logprob or judge")
    if cfg.score not in ("auto", mode):
        raise ProbeError(f"--score {cfg.score}: the run was scored with {mode}; leave --score out")
    dtype = str(s.get("dtype") or model.get("dtype") or "auto").replace("torch.", "")
    config = meta.get("config") or {}
    head = s.get("head") or {}
    return replace(cfg, rm=_model_ref(model), spec=s.get("spec"), label_index=s.get("label_index"), dtype=dtype,
                   trust_remote_code=cfg.trust_remote_code or bool(config.get("trust_remote_code")),
                   allow_random_head=cfg.allow_random_head or bool(config.get("allow_random_head")),
                   logprob_reduce=head.get("reduce", "sum")), mode


def run(cfg: ExplainConfig) -> Path:
    """Reads and checks every input, loads the model, explains, writes ``--out`` whole."""
    from probe.config import ScoringOptions, model_kind, resolve_score_mode
    from probe.core.scoring import make_head
    from probe.attribution.explain import check_explainable, explain_items, summary_markdown
    from probe.attribution.inputs import (SEARCHES, explain_responses, ig_baseline_id, read_sweep, search_items,
                                      sweep_items)
    from probe.models.loading import load_for_config
    from probe.runs.rundir import utc_stamp

    t0 = time.perf_counter()
    out = Path(cfg.out or Path("results") / f"explain_{utc_stamp()}").expanduser()
    _check_out(out)
    meta = scores = None
    if cfg.run:
        meta, scores = read_sweep(cfg.run)
        cfg, mode = _sweep_model(cfg, meta)
    else:
        mode = resolve_score_mode(cfg.score, cfg.rm, cfg.ref, cfg.spec)
        if mode not in ("reward", "logprob", "judge"):
            raise ProbeError(f"this model is read with --score {mode}; explain reads reward, logprob or judge")
    responses = list(cfg.response)
    if cfg.responses:
        from probe.core.response_files import read_responses

        responses += read_responses(cfg.responses, "response")
    seed = int((meta or {}).get("config", {}).get("seed") or 0)
    loaded = load_for_config(cfg, model_kind(mode), seed=seed)
    opts = ScoringOptions(cfg.logprob_reduce, date_string=resolve_date(cfg.date or DEFAULT_DATE))  # type: ignore[arg-type]
    t_loaded = time.perf_counter()
    if cfg.run:
        from probe.commands.trace import TracedRun, check_weights

        s = meta["settings"]
        check_weights(loaded, [TracedRun("--run", cfg.run, {}, s.get("weights"), None, seed, False, False, None)])
    if cfg.run and meta["experiment"] in SEARCHES:
        items, base, opts = search_items(meta, scores, loaded, cfg.baseline)
        said = {"baseline": {"response": base.label if base else None, "score": None,
                             "chosen": "named (--baseline)" if base else
                             "no patching: name a --baseline response to patch the search's best from"},
                "prompt": s["prompt"],
                "run": {"folder": cfg.run, "experiment": meta["experiment"],
                        "scores": "the search's (result.json's best_score: its own full forward)"}}
    elif cfg.run:
        items, median, key = sweep_items(meta, scores, cfg.top, cfg.prompt_key, loaded.tokenizer)
        base = median
        if cfg.baseline is not None:
            ids = loaded.tokenizer.encode(cfg.baseline, add_special_tokens=False)
            if len(ids) != 1:
                raise ProbeError(f"--baseline {cfg.baseline!r}: {len(ids)} tokens; a sweep's baseline is one token")
            base = replace(median, label=cfg.baseline, continuation=[ids[0], *median.continuation[1:]],
                           engine_score=None, extra={"token_id": ids[0], "role": "baseline"})
        said = {"baseline": {"response": base.label, "score": base.engine_score,
                             "chosen": "named (--baseline)" if cfg.baseline else "the run's median token"},
                "prompt": meta["prompts"].get(key, {}).get("text", key) if meta.get("prompts") else key,
                "run": {"folder": cfg.run, "prompt_key": key, "top": cfg.top, "scores": "the sweep's (scores.parquet)"}}
    if cfg.run:
        head_for = lambda k: make_head(loaded, mode, opts, response_in_prefix=k)  # noqa: E731
        check_explainable(loaded, head_for(0))
        result = explain_items(loaded, head_for, items, base if cfg.patch else None, heads=cfg.heads,
                               patch_components=cfg.patch, ig_steps=cfg.ig_steps,
                               ig_baseline_id=ig_baseline_id(loaded.tokenizer, cfg.ig_baseline),
                               batch=cfg.batch_size, tokenizer=loaded.tokenizer) | said
    else:
        from probe.config import PAPER_PROMPTS

        result = explain_responses(loaded, mode, cfg.prompt or PAPER_PROMPTS["greatest"], responses, opts, cfg.system,
                                   baseline=cfg.baseline, heads=cfg.heads, patch=cfg.patch, ig_steps=cfg.ig_steps,
                                   ig_baseline=cfg.ig_baseline, batch=cfg.batch_size)
    result = {"model": loaded.model_id, "mode": mode, "dtype": str(loaded.dtype), "device": str(loaded.device),
              **result}
    result["timing"] |= {"load_s": round(t_loaded - t0, 3), "wall_s": round(time.perf_counter() - t0, 3)}
    _say(result)
    from probe.commands.trace import _write_whole

    md = summary_markdown(result, f"{loaded.model_id} ({mode})")

    def write(folder: Path) -> None:
        (folder / "explain.json").write_text(json.dumps(result, indent=1))
        (folder / "explain.md").write_text(md, encoding="utf-8")
        from probe.report.why import why_page

        (folder / "explain.html").write_text(why_page(result), encoding="utf-8")
    _write_whole(out, write)
    print(f"wrote {out}")
    return out


def _say(result: dict) -> None:
    for r in result["responses"]:
        top = sorted(r["components"].items(), key=lambda kv: -abs(kv[1]))[:3]
        said = ", ".join(f"{k} {v:+.3f}" for k, v in top)
        rho = (r.get("patching") or {}).get("spearman")
        print(f"{r['response']!r}: score {r['score']:+.4f} = parts {sum(r['components'].values()):+.4f} + rest "
              f"{r['rest']:+.4f}; largest {said}" + ("" if rho is None else f"; patching Spearman {rho:+.2f}"))
    ag = result["agreement"]
    if ag["overall_spearman"] is not None:
        print(f"agreement with patching, overall Spearman {ag['overall_spearman']:+.3f} ({ag['n_pairs']} pairs)",
              file=sys.stderr)


def main_from_args(ns: argparse.Namespace) -> int:
    run(config_from_args(ExplainConfig, ns))
    return 0


def make_parser(subparsers=None) -> argparse.ArgumentParser:
    from probe.commands.cli import command_parser

    return command_parser(subparsers, "explain", "why a token wins: the score decomposed, checked against patching",
                          "python -m probe.commands.explain", __doc__, ExplainConfig, main_from_args)


def main(argv: list[str] | None = None) -> int:
    from probe.commands.cli import run_command

    return run_command(make_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
