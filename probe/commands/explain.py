"""Why a token wins: the score decomposed into what each component of the model wrote, checked against patching.

    probe explain --rm MODEL --prompt "What, in one word, is the greatest thing ever?" --response Love --out DIR
    probe explain --rm MODEL --responses answers.txt --baseline "I don't know." --out DIR
    probe explain --run results/<model>/exhaustive_<time>/ --top 5 --out DIR     # a sweep's best and worst 5
    probe explain --run results/<model>/gcg_max_<time>/ --baseline the --out DIR  # a GCG or beam search's best

For each response (scored exactly as ``probe score --responses`` scores it: the same rendering, head and engine):

* ``components``: the embedding and each layer's attention and MLP output (times Granite's residual multiplier),
  the model's own activations read through the final norm frozen at the scale it really had and the head's linear
  reader, summed in float32; ``rest``: what lies outside them (the head's bias; for ``logprob`` minus each
  position's log-sum-exp; a soft-cap's bend; the residual stream's and the final norm's rounding in the model's
  dtype). ``check``: ``score = sum(components) + rest`` to a bound that can fail in the dtype used, and the score
  decomposed is the one reported; an item that fails either is refused (exit 2, one line), never written.
  ``--heads``: each attention head (o_proj's columns per head; the heads of a layer sum to its attention part).
* ``patching``: each component replaced by its value under a baseline response (``--baseline``; default the median
  one of those given, or the run's median token), on the prefix's KV cache at the continuation's positions; its
  effect beside its direct difference and attribution patching's estimate (``--atp``), with Spearman agreements
  (n, 95% interval) within one level (components, or heads).
* ``integrated_gradients``: per prompt position, over the input embeddings (``--ig-steps`` points at most,
  ``--ig-baseline``), refined until the completeness residual is under ``--ig-target`` of the gap; the residual
  reached and whether it met the target.

Exact for reward heads read linearly (sequence classifiers, affine family heads in any dtype, the Nemotron logit
reader), gated heads (ArmoRM, QRM: the gate held at its real value), the Yes/No judge and the log-probability;
process models' softmax, rating judges, MLP heads, encoders' own forward, pairwise models and implicit rewards are
refused with the reason. ``--run`` explains the run's own input (its ids, template, system turn, date, principle,
input method and spec) and refuses a ``--ref`` run or an ``--input-method paper`` sweep. Writes ``explain.json``,
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
from probe.config import DEFAULT_DATE, ModelOptions, check_not_blank, resolve_date
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
    atp: bool = field(default=True, metadata={
        "help": "with patching: attribution patching's estimate of every effect (one backward), and its agreement"})
    ig_steps: int = field(default=128, metadata={
        "help": "integrated gradients over the prompt's input embeddings: the most points on the path (0: none)"})
    ig_target: float = field(default=0.01, metadata={
        "help": "integrated gradients: refine until the completeness residual is under this fraction of the "
                "score's distance from the baseline's (recorded: reached or not)"})
    ig_baseline: str = field(default="zero", metadata={
        "help": "integrated gradients' baseline: zero (embeddings), pad, or a one-token text", "metavar": "WHAT"})
    batch_size: int = field(default=64, metadata={
        "help": "rows per patched call on the prefix cache (one item's components, the last call padded); "
                "integrated gradients run min(8, half of it) points per call"})
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
        check_not_blank(self, "responses", "run", "prompt_key", "ig_baseline", "out")
        if not (self.response or self.responses or self.run):
            raise ValueError("give --response TEXT, --responses FILE or --run SWEEP_DIR")
        if self.run and (self.response or self.responses):
            raise ValueError("--run explains a sweep's tokens; --response/--responses explain texts: one at a time")
        if any(not r.strip() for r in self.response):
            raise ValueError("--response is empty: nothing to explain")
        if self.prompt is not None and not self.prompt.strip():
            raise ValueError("--prompt is empty: give the user prompt the responses answer (leave it out for the "
                             "paper's)")
        if self.run and self.prompt is not None:
            raise ValueError("--prompt goes with --response/--responses; --run explains the run's own prompt")
        if not (0 < self.ig_target < 1):
            raise ValueError("--ig-target is a fraction of the score's distance from the baseline's, in (0, 1)")
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


def _sweep_model(cfg: ExplainConfig, meta: dict) -> tuple[ExplainConfig, str, dict]:
    """The run's model and score mode (its model record, spec and output column, dtype) and its inputs beyond the
    ids (`run_inputs`: template, principle, input method, ...); one line where they cannot be decomposed."""
    from probe.commands.trace import _model_ref

    from probe.attribution.inputs import SEARCHES, run_inputs, search_config

    s, model = meta.get("settings") or {}, meta.get("model") or {}
    mode = search_config(meta).mode if meta.get("experiment") in SEARCHES else s.get("mode")
    if mode not in ("reward", "logprob", "judge"):
        raise ProbeError(f"--run {cfg.run}: scored with --score {mode}; explain reads reward, logprob or judge")
    if cfg.score not in ("auto", mode):
        raise ProbeError(f"--score {cfg.score}: the run was scored with {mode}; leave --score out")
    inputs = run_inputs(meta, cfg.run)
    dtype = str(model.get("dtype") or s.get("dtype") or "auto").replace("torch.", "")
    config = meta.get("config") or {}
    head = s.get("head") or {}
    spec = s.get("spec") if isinstance(s.get("spec"), str) else inputs.get("spec")
    label = s.get("label_index") if "label_index" in s else inputs.get("label_index")
    return replace(cfg, rm=_model_ref(model), spec=spec, label_index=label, dtype=dtype,
                   trust_remote_code=cfg.trust_remote_code or bool(config.get("trust_remote_code")),
                   allow_random_head=cfg.allow_random_head or bool(config.get("allow_random_head")),
                   chat_template=inputs.get("chat_template", cfg.chat_template),
                   principle=inputs.get("principle", cfg.principle),
                   reference_response=inputs.get("reference_response", cfg.reference_response),
                   unit_test=inputs.get("unit_test", cfg.unit_test), revision=inputs.get("revision", cfg.revision),
                   logprob_reduce=head.get("reduce", config.get("logprob_reduce", "sum"))), mode, inputs


def run(cfg: ExplainConfig) -> Path:
    """Reads and checks every input, loads the model, explains, writes ``--out`` whole."""
    from probe.config import JUDGE_QUESTION, ScoringOptions, model_kind, resolve_score_mode
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
    inputs: dict = {}
    if cfg.run:
        meta, scores = read_sweep(cfg.run)
        cfg, mode, inputs = _sweep_model(cfg, meta)
    else:
        mode = resolve_score_mode(cfg.score, cfg.rm, cfg.ref, cfg.spec)
        if mode not in ("reward", "logprob", "judge"):
            raise ProbeError(f"this model is read with --score {mode}; explain reads reward, logprob or judge")
    responses = list(cfg.response)
    if cfg.responses:
        from probe.core.response_files import read_responses

        responses += read_responses(cfg.responses, "response")
    seed = int((meta or {}).get("config", {}).get("seed") or 0)
    loaded = load_for_config(cfg, model_kind(mode), seed=seed, input_method=inputs.get("input_method"))
    opts = ScoringOptions(cfg.logprob_reduce, inputs.get("judge_question", JUDGE_QUESTION),  # type: ignore[arg-type]
                          date_string=resolve_date(cfg.date or DEFAULT_DATE))
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
                               patch_components=cfg.patch, atp=cfg.atp, ig_steps=cfg.ig_steps,
                               ig_target=cfg.ig_target,
                               ig_baseline_id=ig_baseline_id(loaded.tokenizer, cfg.ig_baseline),
                               batch=cfg.batch_size, tokenizer=loaded.tokenizer,
                               source="the score the run reported") | said
        result["run"]["inputs"] = {k: v for k, v in inputs.items() if k != "judge_question"}
    else:
        from probe.config import PAPER_PROMPTS

        result = explain_responses(loaded, mode, PAPER_PROMPTS["greatest"] if cfg.prompt is None else cfg.prompt,
                                   responses, opts, cfg.system, baseline=cfg.baseline, heads=cfg.heads,
                                   patch=cfg.patch, atp=cfg.atp, ig_steps=cfg.ig_steps, ig_target=cfg.ig_target,
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
    from probe.attribution.checks import closure_line
    from probe.report.why import agreement_words

    for r in result["responses"]:
        top = sorted(r["components"].items(), key=lambda kv: -abs(kv[1]))[:3]
        said = ", ".join(f"{k} {v:+.3f}" for k, v in top)
        print(f"{r['response']!r}: {closure_line(r)}; largest {said}")
    for lev, got in result["agreement"].get("levels", {}).items():
        for what, a in got.items():
            print(f"{lev}, {what.replace('_', ' ')}: {agreement_words(a)}", file=sys.stderr)


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
