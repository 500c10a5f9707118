"""Plant the bugs a careful reader would plant (issue 28's list and a few more) on a copy of the repository, one at a
time, and check that the tests named beside each fail on it.

    python -m experiments.planted_bugs          # about 2 minutes; writes experiments/results/planted_bugs.md
    python -m experiments.planted_bugs --round 2  # issue 33's: before/after, experiments/results/planted_bugs_round2.md
    python -m experiments.planted_bugs --round 3  # issue 46's: the same, experiments/results/planted_bugs_round3.md
    python -m experiments.planted_bugs --round 4  # issue 57's: the same, experiments/results/planted_bugs_round4.md
    python -m experiments.planted_bugs --round 5  # the newest families and features: planted_bugs_round5.md
    python -m experiments.planted_bugs --round 6  # issue 67's: the families' limits and options, planted_bugs_round6.md
    python -m experiments.planted_bugs --round 7  # issue 74's: intervals, torchrun's counts, options' edges: round7.md
    python -m experiments.planted_bugs --round 8 --results experiments/results/planted_bugs_round8_explain.md  # explain
    python -m experiments.planted_bugs --round 5 --side after  # the after column again, the before one kept
    python -m experiments.planted_bugs --round 3 --only "DPO split one id late"  # that row again, the others kept

Each row: the bug, the file, the line as it is, the line as planted, and the tests that must fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
SHARED = ROOT.parent / "shared" / "data"

MUTS = [
  ("rank ordinal (scores.parquet)", "probe/core/sweep.py", 'rank(method="min"', 'rank(method="ordinal"', "tests/unit/test_sweep.py -k tied"),
  ("rank ordinal (responses)", "probe/core/responses.py", 'rank(method="min"', 'rank(method="ordinal"', "tests/unit/test_responses.py -k tied"),
  ("descending_ranks min ties", "probe/analysis/stats.py", 'method="average"', 'method="min"', "tests/unit/test_stats.py -k descending"),
  ("welch population variance", "probe/analysis/stats.py", "a.var(ddof=1) / a.size + b.var(ddof=1) / b.size", "a.var() / a.size + b.var() / b.size", "tests/unit/test_stats.py -k welch"),
  ("welch pooled", "probe/analysis/stats.py", "se = np.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)", "sp = ((a.size - 1) * a.var(ddof=1) + (b.size - 1) * b.var(ddof=1)) / (a.size + b.size - 2); se = np.sqrt(sp / a.size + sp / b.size)", "tests/unit/test_stats.py -k welch"),
  ("bbq tie picks first", "probe/social/metrics.py", "return int(top[0]) if top.size == 1 else None", "return int(top[0])", "tests/unit/test_social_real.py -k tie_at_the_top"),
  ("trailing probe copies leading", "probe/core/template.py", 'word=probes[0][0], side="trail")', 'word=probes[0][0], side="lead")', "tests/unit/test_template.py -k one_side"),
  ("contrast top-k off by one", "probe/analysis/contrast.py", "(ta, ba), (tb, bb) = ends(ra, kk), ends(rb, kk)", "(ta, ba), (tb, bb) = ends(ra, kk - 1), ends(rb, kk)", "tests/unit/test_analysis.py -k by_hand_top_k"),
  ("contrast bottom-k off by one", "probe/analysis/contrast.py", "set(order[::-1][:k].tolist())", "set(order[::-1][:k + 1].tolist())", "tests/unit/test_analysis.py -k by_hand_top_k"),
  ("rank_change sign flipped", "probe/analysis/contrast.py", 'pl.Series("rank_change", rb - ra)', 'pl.Series("rank_change", ra - rb)', "tests/unit/test_analysis.py -k by_hand_top_k"),
  ("head always reads column 0", "probe/core/heads.py", "self.weight = head.weight[label_index].detach()", "self.weight = head.weight[0].detach()", "tests/unit/test_more_families.py -k label"),
  ("mean logprob over padded length", "probe/core/heads.py", 'return total / (lengths.float() + self.k_fixed) if self.reduce == "mean" else total', 'return total / cont.shape[1] if self.reduce == "mean" else total', "tests/unit/test_more_families.py -k mean"),
  ("cohere logit_scale dropped", "probe/core/heads.py", "            logits = logits * scale\n", "            logits = logits\n", "tests/unit/test_more_families.py -k 'cohere'"),
  ("granite logits_scaling dropped", "probe/core/heads.py", "            logits = logits / divide\n", "            logits = logits\n", "tests/unit/test_more_families.py -k 'granite'"),
  ("kernel softmax over bf16 scores", "kernels/prefix_attention.py", "    query, key, value = _working(query), _working(key), _working(value)\n", "", "tests/unit/test_half_precision.py -k accumulates"),
  ("tolerance back to the spread rule", "probe/core/precision.py", "return np.maximum(floor, HALF_TOLERANCE * noise)", "return np.full_like(ref, 0.05 * (1 + float(ref.max() - ref.min())))", "tests/unit/test_half_precision.py -k 'tolerance_rules or command_passes'"),
  ("welch t sign flipped", "probe/analysis/stats.py", "return float((a.mean() - b.mean()) / se) if se > 0 else 0.0", "return float((b.mean() - a.mean()) / se) if se > 0 else 0.0", "tests/unit/test_stats.py -k welch"),
  ("contrast top-k, b side", "probe/analysis/contrast.py", "ends(ra, kk), ends(rb, kk)", "ends(ra, kk), ends(rb, kk - 1)", "tests/unit/test_analysis.py -k by_hand_top_k"),
  ("contrast top-k k+1 both sides", "probe/analysis/contrast.py", "return set(order[:k].tolist())", "return set(order[:k + 1].tolist())", "tests/unit/test_analysis.py -k by_hand_top_k"),
  ("social accuracy counts ties as wins", "probe/social/metrics.py", "wins = [s[it.pair[0]] > s[it.pair[1]]", "wins = [s[it.pair[0]] >= s[it.pair[1]]", "tests/unit/test_social.py"),
  ("report percentile off", "probe/report/multi.py", "- 1) / max(1, wide.height - 1)", ") / max(1, wide.height)", "tests/unit/test_report_numbers.py"),
  ("identity rank max not min", "probe/report/tables.py", 'pl.col("rank").min()', 'pl.col("rank").max()', "tests/unit/test_report_numbers.py"),
  ("GOMP spin not set", "probe/runs/cpu.py", '"GOMP_SPINCOUNT": SPINCOUNT}', '}', "tests/unit/test_cpu_threads.py"),
  ("float64 called half precision", "probe/models/loading.py", "double precision runs at half", "half-precision matmuls run at half", "tests/unit/test_cli_errors.py -k dtype_warning"),
]


# Round 2 (issue 33): bugs planted in modules round 1 left alone, each with the test FILES that should catch it. Each is
# run twice: with the tests as they were before this round (git revision BEFORE_ROUND_2) and with today's, the whole
# files each time (a bug a file's other tests catch counts as caught).
BEFORE_ROUND_2 = "f83cb5b"
ROUND_2 = [
  ("PairRM candidate budget fixed at 412", "probe/core/pairwise.py", "room = (PAIRRM_SOURCE_MAX + 2 * PAIRRM_CANDIDATE_MAX - len(src)) // 2", "room = PAIRRM_CANDIDATE_MAX", "tests/unit/test_pairwise.py"),
  ("LDL gating temperature ignored", "probe/models/families.py", "w = torch.softmax(w / temperature, dim=1)", "w = torch.softmax(w, dim=1)", "tests/unit/test_options.py tests/unit/test_rewardbench_families.py"),
  ("GCG patience one step late", "probe/core/gcg.py", "since_gain >= c.patience", "since_gain > c.patience", "tests/unit/test_gcg.py"),
  ("GCG min baseline negated", "probe/core/gcg.py", "rand_scores = config.sign * gcg.objective(rand).numpy()", "rand_scores = gcg.objective(rand).numpy()", "tests/unit/test_gcg.py"),
  ("--beta inf accepted", "probe/config.py", "if not math.isfinite(self.beta) or self.beta < 0:", "if self.beta < 0:", "tests/unit/test_implicit_reward.py"),
  ("WordPiece ## counted as a leading space", "probe/core/vocab.py", "p.startswith(SPACE_MARKERS[:2])", "p.startswith(SPACE_MARKERS)", "tests/unit/test_vocab.py"),
  ("byte fragment valid unless alone", "probe/core/vocab.py", '"valid_utf8": ["\\ufffd" not in d for d in decoded]', '"valid_utf8": [d != "\\ufffd" for d in decoded]', "tests/unit/test_vocab.py"),
  ("card class labels string-sorted", "probe/social/hub.py", "[names[k] for k in sorted(names, key=int)]", "[names[k] for k in sorted(names)]", "tests/unit/test_social_hub.py"),
  ("interrupt leaves status running", "probe/runs/rundir.py", '    meta["status"] = how\n', "", "tests/unit/test_user_paths.py tests/unit/test_first_hour.py"),
  ("resume counts a short last shard whole", "probe/runs/rundir.py", "left = sum(min(shard_size, n - s * shard_size)", "left = sum(shard_size", "tests/unit/test_user_paths.py"),
  ("response runs' text marked invalid", "probe/analysis/sweeps.py", 'pl.lit(True).alias("valid_utf8")', 'pl.lit(False).alias("valid_utf8")', "tests/unit/test_user_paths.py tests/unit/test_analysis.py"),
  ("constant run reaches the MDS", "probe/commands/analyze.py", "        if constant:\n", "        if False:\n", "tests/unit/test_user_paths.py tests/unit/test_analysis.py"),
  ("word ranks renumbered", "probe/report/text.py", 'pl.col("score").rank("min", descending=True)', 'pl.col("score").rank("ordinal", descending=True)', "tests/unit/test_user_paths.py tests/unit/test_report_audit.py"),
  ("sequence byte fragments as U+FFFD", "probe/report/text.py", '    if "\\ufffd" not in decoded:\n        return decoded', "    return decoded", "tests/unit/test_user_paths.py tests/unit/test_gcg.py"),
  ("DPO route in social drops the header", "probe/social/scoring.py", 'k = split.scored_within(len(prefix), f"item {item.item_id}")', "k = 0", "tests/unit/test_rewardbench_dpo.py tests/unit/test_social.py"),
  ("reference head ignores fixed tokens", "probe/core/scoring.py", "response_in_prefix=head.k_fixed, fused=head.fused)", "response_in_prefix=0, fused=head.fused)", "tests/unit/test_implicit_reward.py"),
  ("ArmoRM's doubled BOS masked", "probe/models/registry.py", 'DOUBLE_BOS_MASKED = ("RewardBenchPipeline", "LDLPipeline")', 'DOUBLE_BOS_MASKED = ("RewardBenchPipeline", "LDLPipeline", "ArmoRMPipeline")', "tests/unit/test_rewardbench_families.py tests/unit/test_dialogue_inputs.py"),
  ("social --seed not passed on", "probe/commands/social.py", "metrics.summarise(all_items, scores, cfg.seed)", "metrics.summarise(all_items, scores)", "tests/unit/test_options.py tests/unit/test_social.py"),
  ("misalignment mean always", "probe/analysis/misalignment.py", 'np.median(model_ranks, 1) if center == "median" else', 'model_ranks.mean(1) if center == "median" else', "tests/unit/test_options.py tests/unit/test_analysis.py"),
  ("BNC frequencies log10", "probe/analysis/lexicons.py", 'pl.col("freq").log().alias("log_freq")', 'pl.col("freq").log10().alias("log_freq")', "tests/unit/test_options.py tests/unit/test_analysis.py"),
  ("analyze file names unsanitised", "probe/commands/analyze.py", 'return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "run"', "return name", "tests/unit/test_user_paths.py tests/unit/test_analysis.py"),
  ("--ref vocabulary check converts the GGUF", "probe/models/loading.py", "return str(packaged_tokenizer_dir(x)) if packaged(x) is not None else _source(x)[1]", "return _source(x)[1]", "tests/unit/test_user_paths.py tests/unit/test_implicit_reward.py"),
  ("encoder route keeps the text pair", "probe/models/loading.py", 'spec = replace(spec, chat_template="raw", rewardbench_pipeline="pipeline")', 'spec = replace(spec, rewardbench_pipeline="pipeline")', "tests/unit/test_encoders.py"),
  ("INF-ORM reads the last token", "probe/models/families.py", 'HeadLayout("inform", "model", "before_first_pad")', 'HeadLayout("inform", "model", "last")', "tests/unit/test_rewardbench_families.py"),
  ("rounding noise from the first model only", "probe/core/precision.py", "for k, model in enumerate(models):", "for k, model in enumerate(models[:1]):", "tests/unit/test_half_precision.py"),
]


# Round 3 (issue 46): the memory plan, RewardBench's routes, persona analysis, Holm, the length rules and response
# runs (the code that landed after round 2; not the judges or traces, rewritten meanwhile)
BEFORE_ROUND_3 = "2cf57dc"
_MEM, _DPO, _RESP = ("tests/unit/test_gpu_readiness.py", "tests/unit/test_rewardbench_dpo.py tests/unit/test_responses.py",
                     "tests/unit/test_responses.py tests/unit/test_api.py")
ROUND_3 = [
  ("--ref's rows held with the model's", "probe/models/memory.py", "max(p.per_row() for p in here)", "sum(p.per_row() for p in here)", _MEM),
  ("batch planned on the card's total", "probe/core/scoring.py", "torch.cuda.mem_get_info(d)[0]", "torch.cuda.mem_get_info(d)[1]", _MEM),
  ("spread model's prefix cache whole on each device", "probe/models/memory.py", "fixed = sum(p.layer_share * p.fixed for p in here)", "fixed = sum(p.fixed for p in here)", _MEM),
  ("spread model's row copies whole on each device", "probe/models/memory.py", "return self.layer_share * self.cost.layers + max(", "return self.cost.layers + max(", _MEM),
  ("the free fraction dropped", "probe/models/memory.py", "room = FREE_FRACTION * free - fixed", "room = free - fixed", _MEM),
  ("head added to the layers' working set", "probe/models/memory.py", "return self.layers + max(self.transient, self.head)", "return self.layers + self.transient + self.head", _MEM),
  ("DPO split one id late", "probe/core/template.py", "start = len(own) - (own != full[: len(own)])", "start = len(own)", _DPO),
  ("DPO merged span widened", "probe/core/template.py", "k = self.scored_in_prefix - (len(self.prefix_ids) - prefix_len)", "k = self.scored_in_prefix + (len(self.prefix_ids) - prefix_len)", _DPO),
  ("DPO merged response scores the whole header", "probe/core/responses.py", 'return self.split.scored_within(len(prefix), f"prompt {self.prompt_key!r}") if self.split is not None else 0', "return self.scored_in_prefix", _DPO),
  ("DPO input of 2,048 ids refused", "probe/core/template.py", "if len(prompt_ids) + len(answer_ids) > REWARDBENCH_DPO_MAX_LENGTH:", "if len(prompt_ids) + len(answer_ids) >= REWARDBENCH_DPO_MAX_LENGTH:", _DPO),
  ("DPO header one id short", "probe/core/template.py", "    return n_pre - starts.pop()", "    return n_pre - starts.pop() - 1", _DPO),
  ("a single BOS dropped as doubled", "probe/core/template.py", "out[:2] == [bos, bos]", "out[:1] == [bos]", "tests/unit/test_dialogue_inputs.py"),
  ("persona bottom RBO is the top one", "probe/analysis/personas.py", "stats.rbo(a, b, p, bottom=True)", "stats.rbo(a, b, p)", "tests/unit/test_personas.py"),
  ("persona mean shift negated", "probe/analysis/personas.py", '"mean_shift": float(b.mean() - a.mean())', '"mean_shift": float(a.mean() - b.mean())', "tests/unit/test_personas.py"),
  ("persona movers over every token", "probe/analysis/personas.py", 'pool = moved.filter(pl.col("is_word")) if words_only and "is_word" in moved.columns else moved', "pool = moved", "tests/unit/test_personas.py"),
  ("persona falls in rising order", "probe/analysis/personas.py", "ordered.tail(n).reverse().select(cols)", "ordered.tail(n).select(cols)", "tests/unit/test_personas.py"),
  ("persona same-best reads the worst", "probe/analysis/personas.py", 'both["token_id"][int(np.argmax(b))]', 'both["token_id"][int(np.argmin(b))]', "tests/unit/test_personas.py"),
  ("agreement p_holm unadjusted", "probe/analysis/agreement.py", "g.update(p_holm=float(h), n_tests=len(groups))", 'g.update(p_holm=g["p_value"], n_tests=len(groups))', "tests/unit/test_analysis.py tests/unit/test_stats.py"),
  ("social Holm line by unadjusted p", "probe/commands/social.py", 'for g, e in tested.items() if e["p_holm"] < 0.05)', 'for g, e in tested.items() if e["p_undesirable_vs_half"] < 0.05)', "tests/unit/test_social_real.py"),
  ("values panels' p_holm unadjusted", "probe/analysis/values.py", '"p_holm": float(h), "n_tests": k})', '"p_holm": t.p, "n_tests": k})', "tests/unit/test_values.py"),
  ("Holm not made monotone", "probe/analysis/stats.py", "np.maximum.accumulate(p[order] * (m - np.arange(m)))", "p[order] * (m - np.arange(m))", "tests/unit/test_stats.py"),
  ("length rules count white space", "probe/social/metrics.py", "len(o.strip()) for o in it.options", "len(o) for o in it.options", "tests/unit/test_social_real.py"),
  ("shorter-wins column reads the longer rule", "probe/commands/social.py", '"shorter_wins_acc": (rules.get("shorter_wins") or {})', '"shorter_wins_acc": (rules.get("longer_wins") or {})', "tests/unit/test_social_real.py"),
  ("agreement with the longer counts tied lengths", "probe/social/metrics.py", "if a is not None and b is not None]", "if a is not None]", "tests/unit/test_social_real.py"),
  ("response n_tokens counts the closing ids", "probe/core/responses.py", "rows.n_tokens.append(len(slot_ids))", "rows.n_tokens.append(len(cont))", _RESP),
]


# Round 4 (issue 57): the code of the last two rounds (torchrun's deals: responses, social, trace, batch; chunk
# checkpoints and resume; response and social fingerprints; soft-cap switching, version checks, the control-token
# rule, card inputs and the glued slot, persona movers, judges' fill, random head seeding). Not the two the issue
# names (units dealt by the local rank; a resumed response run's batch size): tests/unit/test_round4_*.py test both.
# Test targets are narrow (a test file's node ids where the file is slow): a row takes well under a minute.
BEFORE_ROUND_4 = "7266beb"
_NODES, _RESUME, _MISC = ("tests/unit/test_round4_nodes.py", "tests/unit/test_round4_resume.py",
                          "tests/unit/test_round4_misc.py")
_DEAL = "tests/unit/test_batch_parallel.py::test_deal_balances_costs_and_gives_every_item_once"
_SOCIAL_CUT = "tests/unit/test_first_hour.py::test_social_resume_keeps_the_chunks_of_a_data_set_cut_short"
ROUND_4 = [
  ("deal: cheapest first", "probe/runs/distributed.py", "key=lambda i: (-costs[i], i))", "key=lambda i: (costs[i], i))", f"{_DEAL} {_MISC}"),
  ("deal: a rank's load not added up", "probe/runs/distributed.py", "load[r] += costs[i]", "load[r] = costs[i]", f"{_DEAL} {_MISC}"),
  ("batch queue skips job 0", "probe/runs/distributed.py", 'return self.store.add("next", 1) - 1', 'return self.store.add("next", 1)', "tests/unit/test_batch_parallel.py::test_two_ranks_write_what_one_process_writes_and_skip_on_a_rerun "
   f"{_NODES}::test_two_nodes_take_every_job_of_a_batch_once"),
  ("social deals chunk positions, not chunk numbers", "probe/social/scoring.py", "mine = [left[k] for k in deal(costs, dist.world)[dist.rank]]", "mine = deal(costs, dist.world)[dist.rank]", f"{_SOCIAL_CUT} {_RESUME}"),
  ("social kept chunks scored again", "probe/social/scoring.py", "if c not in kept] if dist.main else None)", "] if dist.main else None)", f"{_SOCIAL_CUT} {_RESUME}"),
  ("social last chunks of a process not kept", "probe/social/scoring.py", "    if keep and pending:", "    if keep and not pending:", f"{_SOCIAL_CUT} {_RESUME}"),
  ("social short last chunk's file thrown away", "probe/social/scoring.py", "[len(part) for _, part in chunks]) if keep", "[256 for _ in chunks]) if keep", f"{_SOCIAL_CUT} {_RESUME}"),
  ("trace unit drops its chunk's last response", "probe/commands/trace.py", "rs[s : s + CHUNK], True)", "rs[s : s + CHUNK - 1], True)", "tests/unit/test_trace.py::test_the_units_of_work_are_one_processs_batches " + _MISC),
  ("trace ids pieces read from the text units", "probe/commands/trace.py", "enumerate(units) if not text)", "enumerate(units) if text)", f"{_MISC}::test_a_piece_given_as_ids_is_traced_as_those_ids "
   "tests/unit/test_rows_torchrun.py::test_two_ranks_trace_into_one_folder"),
  ("batch --shard I/N takes part I+1", "probe/commands/batch.py", "order = largest_first(jobs)[i - 1::n]", "order = largest_first(jobs)[i::n]", "tests/unit/test_batch_parallel.py::test_shard_parts_together_are_the_whole_batch " + _RESUME),
  ("batch smallest job first", "probe/commands/batch.py", "key=lambda k: -sizes[k])", "key=lambda k: sizes[k])", "tests/unit/test_batch_parallel.py::test_job_size_is_rows_times_prompts " + _MISC),
  ("batch resumes the oldest partial run", "probe/commands/batch.py", "partial = partial or run_path", "partial = run_path", f"tests/unit/test_batch.py {_RESUME}"),
  ("response resume self-checks a checked prompt again", "probe/commands/responses.py", '- set(meta["self_check"])}', "}", "tests/unit/test_responses.py " + _RESUME),
  ("response identity ignores their order", "probe/commands/responses.py", "json.dumps(responses, ensure_ascii=False)", "json.dumps(sorted(responses), ensure_ascii=False)", "tests/unit/test_responses.py " + _RESUME),
  ("response shard size not fingerprinted", "probe/commands/responses.py", '"responses_sha256": digest, "shard_size": config.shard_size,', '"responses_sha256": digest,', "tests/unit/test_responses.py " + _RESUME),
  ("response input method not fingerprinted", "probe/commands/responses.py", '**({"input_method": config.input_method} if config.input_method != "ids" else {}),', "", "tests/unit/test_responses.py " + _RESUME),
  ("model revision not fingerprinted", "probe/runs/meta.py", '"weights": weights_identity(loaded), "revision": revision,', '"weights": weights_identity(loaded), "revision": None,', f"tests/unit/test_sweep.py::test_resume_refuses_other_settings {_RESUME}"),
  ("social chat template not fingerprinted", "probe/commands/social.py", '("revision", "spec", "label_index", "chat_template")', '("revision", "spec", "label_index")', "tests/unit/test_first_hour.py::test_social_resume " + _RESUME),
  ("social system prompt not fingerprinted", "probe/commands/social.py", '"system": cfg.system, "date"', '"date"', "tests/unit/test_first_hour.py::test_social_resume " + _RESUME),
  ("social input method not fingerprinted", "probe/commands/social.py", '**({"input_method": mcfg.input_method} if getattr(mcfg, "input_method", "ids") != "ids" else {})}', "}", "tests/unit/test_first_hour.py::test_social_resume " + _RESUME),
  ("SDPA counted as applying the soft-cap", "probe/models/attention.py", 'frozenset({"eager",', 'frozenset({"sdpa", "eager",', "tests/unit/test_softcap.py " + _MISC),
  ("attention record: transformers always chose", "probe/models/attention.py", 'out["chosen_by"] = "rm-probe" if choice else "transformers"', 'out["chosen_by"] = "transformers"', "tests/unit/test_softcap.py " + _MISC),
  ("newest tested series compared whole", "probe/versions.py", "have.release[: len(series)] > series", "have.release > series", "tests/unit/test_where_it_runs.py::test_the_tested_span " + _MISC),
  ("lowest tested version warned about", "probe/versions.py", "have < Version(low)", "have <= Version(low)", "tests/unit/test_where_it_runs.py::test_the_tested_span " + _MISC),
  ("control tokens matched shortest first", "probe/core/control_tokens.py", "return tuple(sorted(set(found), key=len, reverse=True))", "return tuple(sorted(set(found)))", "tests/unit/test_control_tokens.py " + _MISC),
  ("white-space added tokens counted as control tokens", "probe/core/control_tokens.py", "(not t.content.isspace() and any(", "(any(", "tests/unit/test_control_tokens.py " + _MISC),
  ("a piece's space marker read as nothing", "probe/core/template.py", 'piece.replace("\\u2581", " ")', 'piece.replace("\\u2581", "")', "tests/unit/test_card_inputs.py " + _MISC),
  ("a card's dialogue format loses to the tokenizer's template", "probe/models/loading.py", "    return spec.chat_template, card", "    return spec.chat_template, False", "tests/unit/test_card_inputs.py::test_probe_load_reads_eurus_by_its_card_although_its_tokenizer_has_a_template " + _MISC),
  ("random head ignores the traced run's seed", "probe/models/loading.py", 'torch.manual_seed(int(seed if seed is not None else get("seed", 0) or 0))', 'torch.manual_seed(int(get("seed", 0) or 0))', "tests/unit/test_gcg.py::test_a_random_head_is_drawn_from_the_seed_and_trace_agrees " + _MISC),
  ("random head seeding leaks into the caller's state", "probe/models/loading.py", "with torch.random.fork_rng(devices=list(range(torch.cuda.device_count()))):", "with torch.random.fork_rng(devices=[], enabled=False):", "tests/unit/test_api.py::test_a_random_head_is_drawn_from_the_seed_whatever_the_global_state " + _MISC),
  ("persona movers: unmoved strings called rising", "probe/analysis/personas.py", 'ordered.filter(pl.col("dz") > 0)', 'ordered.filter(pl.col("dz") >= 0)', "tests/unit/test_personas.py " + _MISC),
  ("judge pair prompt filled in three passes", "probe/core/judges.py", "return fill(self.user, prompt=prompt, response_a=first, response_b=second)", 'return self.user.replace("{prompt}", prompt).replace("{response_a}", first).replace("{response_b}", second)', "tests/unit/test_judges.py::test_judges_fill_their_prompts_in_one_pass " + _MISC),
]


# Round 5: the newest families and features, which no earlier round planted bugs in: the Nemotron logit reader and
# its principle, POLAR's pairwise text, the PRM step reader, LMUnit's top-k rating, the Starling-7B, SteamSHP,
# Better-PairRM and WorldPM readers, rm-probe's own GGUF tokenizer, the versioned model cache (made_by.json), the GPU
# benchmark's batch invariance, --list-models, run labels (two runs of one id) and the seed in the fingerprint.
BEFORE_ROUND_5 = "1d9bff0"
_NEMO, _POLAR, _PRM, _LMU, _REF = ("tests/unit/test_nemotron.py", "tests/unit/test_polar.py", "tests/unit/test_prm.py",
                                   "tests/unit/test_lmunit.py", "tests/unit/test_refused_families.py")
_PACK, _INV, _WR2 = ("tests/unit/test_packaged_tokenizers.py", "tests/unit/test_batch_invariance.py",
                     "tests/unit/test_wrong_results2.py")
_R5 = "tests/unit/test_round5.py"
_GGUF = (f"{_PACK}::test_merges_rule_on_a_small_vocabulary {_PACK}::test_rm_probes_tokenizer_is_the_newest_transformers_"
         f"conversion {_R5}")
ROUND_5 = [
  ("logit reader adds the minus id's logit", "probe/core/heads.py", "else logits[:, 0] - logits[:, 1]", "else logits[:, 0] + logits[:, 1]", f"{_NEMO}::test_principle_scores_and_sweep_equal_the_cards_generate {_R5}"),
  ("logit reader drops logit_minus", "probe/core/scoring.py", "LogitRewardHead(model, spec.label_index, spec.logit_minus)", "LogitRewardHead(model, spec.label_index)", f"{_NEMO}::test_principle_scores_and_sweep_equal_the_cards_generate {_R5}"),
  ("logit reader accepts the id one past the vocabulary", "probe/core/heads.py", "if i is not None and not 0 <= i < vocab:", "if i is not None and not 0 <= i <= vocab:", f"{_NEMO}::test_the_reference_path_is_the_models_own_logit_and_a_bad_index_is_refused {_R5}"),
  ("--principle ignored for the card's", "probe/core/scoring.py", "question = fill(loaded.spec.principle_question, principle=loaded.principle)", "question = fill(loaded.spec.principle_question, principle=loaded.spec.principle)", f"{_NEMO}::test_principle_scores_and_sweep_equal_the_cards_generate {_R5}"),
  ("principle not in the batch job key", "probe/config.py", '            key |= {"principle": self.principle}\n', "            pass\n", f"{_NEMO}::test_the_principle_is_recorded_in_meta_fingerprint_and_report {_R5}"),
  ("POLAR prompt cut from the right", "probe/core/pairwise.py", "p_ids = p_ids[-room:]", "p_ids = p_ids[:room]", f"{_POLAR}::test_long_inputs_are_cut_as_the_cards_client_cuts_them {_R5}"),
  ("POLAR candidate cut one id short", "probe/core/pairwise.py", "r2_ids[:POLAR_MAX_RESPONSE]\n", "r2_ids[:POLAR_MAX_RESPONSE - 1]\n", f"{_POLAR}::test_long_inputs_are_cut_as_the_cards_client_cuts_them {_R5}"),
  ("POLAR system text dropped", "probe/core/pairwise.py", 'prompt = self.prompt if not self.system else f"{self.system}\\n{self.prompt}"', "prompt = self.prompt", f"{_POLAR}::test_another_reference_and_a_system_text_follow_the_card {_R5}"),
  ("POLAR scored in two orders", "probe/core/pairwise.py", '        return self.format != "polar"\n', "        return True\n", f"{_POLAR}::test_responses_equal_the_cards_code {_R5}"),
  ("PRM reads one id before the separator", "probe/core/heads.py", "        return len(self.prefix_ids) + found\n", "        return len(self.prefix_ids) + found - 1\n", f"{_PRM}::test_sweep_equals_the_card_on_each_token {_R5}"),
  ("PRM reads the negative class", "probe/core/heads.py", "        return torch.softmax(logits, -1)[:, 1]\n", "        return torch.softmax(logits, -1)[:, 0]\n", f"{_PRM}::test_score_responses_equal_the_cards_step_reward {_R5}"),
  ("PRM separator after the end of turn", "probe/core/scoring.py", "return ids[: len(ids) - n] + [self.sep_id] + ids[len(ids) - n:]", "return ids + [self.sep_id]", f"{_PRM}::test_score_responses_equal_the_cards_step_reward {_R5}"),
  ("WorldPM's empty system turn dropped", "probe/core/scoring.py", "opts.date_string, keep_empty_system=True)", "opts.date_string, keep_empty_system=False)", f"{_REF}::test_worldpm_scores_equal_the_cards_get_score {_R5}"),
  ("LMUnit drops the k-th token", "probe/core/heads.py", "kept = rated >= kth", "kept = rated > kth", f"{_LMU}::test_the_top_k_reading_is_lmunits_postprocess {_R5}"),
  ("LMUnit greedy rule dropped", "probe/core/heads.py", "torch.where(greedy & kept.any(-1), out,", "torch.where(kept.any(-1), out,", f"{_LMU}::test_the_top_k_reading_is_lmunits_postprocess {_R5}"),
  ("LMUnit top-k reading dropped", "probe/core/heads.py", 'self.top_k = getattr(judge, "top_logprobs", None)', "self.top_k = None", f"{_LMU}::test_score_responses_equal_lmunits_code {_R5}"),
  ("Starling-7B's model.model. wins over transformer.", "probe/models/families.py", "for prefix in reversed(STARLING7B_BACKBONES):", "for prefix in STARLING7B_BACKBONES:", f"{_REF}::test_starling7b_scores_equal_the_cards_code {_R5}"),
  ("SteamSHP's labels swapped", "probe/core/scoring.py", 'single_ids(loaded.tokenizer, ["A", "B"], "SteamSHP', 'single_ids(loaded.tokenizer, ["B", "A"], "SteamSHP', f"{_REF}::test_steamshp_scores_sweep_and_social_equal_the_cards_generate {_R5}"),
  ("SteamSHP's post joined by newlines", "probe/core/pairwise.py", 'post = " ".join(m["content"] for m in self(first)[0][:-1])', 'post = "\\n".join(m["content"] for m in self(first)[0][:-1])', f"{_REF}::test_steamshp_scores_sweep_and_social_equal_the_cards_generate {_R5}"),
  ("Better-PairRM source cut on the right", "probe/core/pairwise.py", 'BETTER_PAIRRM_SOURCE_MAX - len(src), "left")', 'BETTER_PAIRRM_SOURCE_MAX - len(src), "right")', f"{_REF}::test_better_pairrm_scores_equal_its_pipeline {_R5}"),
  ("GGUF merges shorter left piece first", "probe/models/gguf_tokenizer.py", "for cut in range(len(token) - 1, 0, -1):", "for cut in range(1, len(token)):", _GGUF),
  ("GGUF space tokens added whole", "probe/models/gguf_tokenizer.py", "if kind == USER_DEFINED and respell(t) == t])", "if kind == USER_DEFINED])", _GGUF),
  ("GGUF add_eos_token ignored", "probe/models/gguf_tokenizer.py", 'tail = [eos] if metadata["add_eos_token"] else []', "tail = []", _GGUF),
  ("cache manifest not checked", "probe/models/embedded.py", "return manifest == made_by() and all(", "return all(", f"{_PACK}::test_a_cache_made_by_another_version_is_not_read {_R5}"),
  ("cache key without the tokenizers version", "probe/models/embedded.py", '"tokenizers": have("tokenizers"), ', "", f"{_PACK}::test_the_folder_name_follows_every_version_that_shapes_it {_R5}"),
  ("invariance batches: the odd size even", "experiments/gpu_common.py", "max(3, base // 3) | 1}", "max(3, base // 3)}", f"{_INV}::test_invariance_batches {_R5}"),
  ("invariance: rank changes ranked ordinal", "experiments/gpu_common.py", 'np.sum(rankdata(-s, method="min") != base_rank)', 'np.sum(rankdata(-s, method="ordinal") != base_rank)', f"{_INV}::test_batch_invariance_counts_what_moves {_R5}"),
  ("--list-models drops the default entry", "probe/commands/models.py", 'for spec in [*specs, REGISTRY["default"]]:', "for spec in specs:", f"tests/unit/test_list_models.py::test_every_entry_is_listed_with_its_input_source_or_its_refusal {_R5}"),
  ("labels name settings that do not differ", "probe/analysis/sweeps.py", "for k, q in enumerate(names) if q == n}) > 1", "for k, q in enumerate(names) if q == n}) >= 1", f"{_WR2}::test_labels_tell_runs_of_one_model_apart_by_what_differs {_R5}"),
  ("random head seed not in the batch job key", "probe/config.py", 'key |= {"allow_random_head": True, "seed": self.seed}', 'key |= {"allow_random_head": True}', f"{_WR2}::test_a_batch_job_with_another_seed_is_not_skipped_as_done {_R5}"),
  ("weights identity drops the random head", "probe/models/loading.py", 'return replace(loaded, random_head={**loaded.random_head, "seed": drawn_from}) if loaded.random_head else loaded', "return loaded", f"{_WR2}::test_a_response_run_is_not_resumed_with_another_seeds_random_head {_R5}"),
]


# Round 6 (issue 67): the same families and features at their limits and options (inputs over each truncation limit,
# white space and empty turns, --system, both orders), rm-probe's GGUF reader (special ids, id 0, its flags), the
# versioned cache's other libraries, --dry-run's figures and the invariance record's sign; none of them the issue's
# audit's bugs. Targets: the round's test (tests/unit/test_families_round5.py) and an existing test near the code.
BEFORE_ROUND_6 = "5a97ac2"
_F6 = "tests/unit/test_families_round5.py"
_POLAR_CUT, _POLAR_SYS = (f"{_POLAR}::test_long_inputs_are_cut_as_the_cards_client_cuts_them",
                          f"{_POLAR}::test_another_reference_and_a_system_text_follow_the_card")
_BETTER = f"{_R5}::test_better_pairrm_ids_of_a_prompt_over_its_source_limit_are_its_pipelines"
_SHP = f"{_R5}::test_steamshp_post_is_every_turn_before_the_response_joined_by_spaces"
_GGUF6 = f"{_PACK}::test_merges_rule_on_a_small_vocabulary {_R5}::test_gguf_tokenizer_adds_bos_and_eos_as_the_file_says"
_DRY = "tests/unit/test_gpu_readiness.py::test_dry_run_counts_the_reference_model_and_the_devices_of_a_device_map"
_INV6 = f"{_INV}::test_batch_invariance_counts_what_moves {_R5}::test_batch_invariance_counts_a_tie_made_by_rounding_as_a_rank_change"
ROUND_6 = [
  ("POLAR's empty system turn dropped", "probe/core/pairwise.py", "prompt = self.prompt if self.system is None else", "prompt = self.prompt if not self.system else", f"{_POLAR_SYS} {_F6}::test_polar_system_turns_are_joined_as_the_client_joins_an_empty_one_included"),
  ("POLAR reference cut from the left", "probe/core/pairwise.py", "r1_ids, r2_ids = r1_ids[:POLAR_MAX_RESPONSE], r2_ids", "r1_ids, r2_ids = r1_ids[-POLAR_MAX_RESPONSE:], r2_ids", f"{_POLAR_CUT} {_F6}::test_polar_reference_and_candidate_over_4096_ids_and_a_long_system_prompt_are_cut_as_the_client_cuts"),
  ("POLAR prompt room counts the candidate twice", "probe/core/pairwise.py", "room = (POLAR_MAX_LENGTH - len(r1_ids) - len(r2_ids)) // 2", "room = (POLAR_MAX_LENGTH - 2 * len(r2_ids)) // 2", f"{_POLAR_CUT} {_F6}::test_polar_reference_and_candidate_over_4096_ids_and_a_long_system_prompt_are_cut_as_the_client_cuts"),
  ("POLAR limit without the client's 4 ids", "probe/core/pairwise.py", "POLAR_MAX_LENGTH, POLAR_MAX_RESPONSE = 16384 - 4, 4096", "POLAR_MAX_LENGTH, POLAR_MAX_RESPONSE = 16384, 4096", f"{_POLAR_CUT} {_F6}::test_polar_reference_and_candidate_over_4096_ids_and_a_long_system_prompt_are_cut_as_the_client_cuts"),
  ("Better-PairRM turn text not trimmed", "probe/core/pairwise.py", "{m['content'].strip()}\" for m in self(first)", "{m['content']}\" for m in self(first)", f"{_BETTER} {_F6}::test_better_pairrm_trims_turns_labels_a_system_turn_and_cuts_long_responses_as_its_pipeline"),
  ("Better-PairRM system turn labelled SYSTEM", "probe/core/pairwise.py", '{"system": "SYSTEM MESSAGE: ",', '{"system": "SYSTEM: ",', f"{_BETTER} {_F6}::test_better_pairrm_trims_turns_labels_a_system_turn_and_cuts_long_responses_as_its_pipeline"),
  ("Better-PairRM response text cut on the left", "probe/core/pairwise.py", 'BETTER_PAIRRM_CANDIDATE_MAX, "right", special=False)', 'BETTER_PAIRRM_CANDIDATE_MAX, "left", special=False)', f"{_BETTER} {_F6}::test_better_pairrm_trims_turns_labels_a_system_turn_and_cuts_long_responses_as_its_pipeline"),
  ("Better-PairRM candidate ids cut on the left", "probe/core/pairwise.py", 'for i in _cut_ids(tok, f"{prefix}{cand}", room, "right")]', 'for i in _cut_ids(tok, f"{prefix}{cand}", room, "left")]', f"{_BETTER} {_F6}::test_better_pairrm_trims_turns_labels_a_system_turn_and_cuts_long_responses_as_its_pipeline"),
  ("SteamSHP cut without its closing id", "probe/core/pairwise.py", "response_B=second), max_length=SHP_MAX,\n                          truncation=True)", "response_B=second))[:SHP_MAX]", f"{_SHP} {_F6}::test_steamshp_input_over_2048_ids_is_cut_on_the_right_keeping_its_closing_id"),
  ("SteamSHP cut one id short", "probe/core/pairwise.py", "SHP_MAX = 2048  #", "SHP_MAX = 2047  #", f"{_SHP} {_F6}::test_steamshp_input_over_2048_ids_is_cut_on_the_right_keeping_its_closing_id"),
  ("SteamSHP post's turns stripped", "probe/core/pairwise.py", 'post = " ".join(m["content"] for m', 'post = " ".join(m["content"].strip() for m', f"{_SHP} {_F6}::test_steamshp_input_over_2048_ids_is_cut_on_the_right_keeping_its_closing_id"),
  ("an empty --system gets the card's system prompt", "probe/core/scoring.py", 'if mode == "reward" and system is None and loaded is not None', 'if mode == "reward" and not system and loaded is not None', f"{_PRM}::test_score_responses_equal_the_cards_step_reward {_F6}::test_card_system_prompts_fill_only_an_absent_system_turn_on_the_cards_route"),
  ("principle question without the assistant's turn", "probe/core/scoring.py", '[{"role": "user", "content": self.question}], True', '[{"role": "user", "content": self.question}], False', f"{_NEMO}::test_the_principle_models_trace_asks_the_principle_after_each_cut_response {_F6}::test_the_principle_question_follows_the_response_under_any_system_turn"),
  ("principle asked under --score logprob", "probe/core/scoring.py", 'if mode == "reward" and loaded is not None and loaded.principle is not None:', "if loaded is not None and loaded.principle is not None:", f"{_NEMO}::test_the_principle_models_trace_asks_the_principle_after_each_cut_response {_F6}::test_the_principle_question_follows_the_response_under_any_system_turn"),
  ("LMUnit's vLLM call under any reading", "probe/models/loading.py", "if spec.input_call is not None and (kind == \"reward\" or own_judge):", "if spec.input_call is not None:", f"{_LMU}::test_every_lmunit_id_is_read_as_its_unit_test_judge {_F6}::test_lmunit_reads_its_vllm_call_under_its_own_prompt_only"),
  ("GGUF special id 0 read as absent", "probe/models/gguf_tokenizer.py", 'out["tokens"][token_id] if token_id is not None else None', 'out["tokens"][token_id] if token_id else None', f"{_GGUF6} {_F6}::test_gguf_reader_names_every_special_token_id_0_included_and_reads_both_flags"),
  ("GGUF add_eos_token read from add_bos_token", "probe/models/gguf_tokenizer.py", '"add_eos_token": fields.get("tokenizer.ggml.add_eos_token")', '"add_eos_token": fields.get("tokenizer.ggml.add_bos_token")', f"{_GGUF6} {_F6}::test_gguf_reader_names_every_special_token_id_0_included_and_reads_both_flags"),
  ("GGUF user-defined tokens made special", "probe/models/gguf_tokenizer.py", "for t, kind in zip(metadata[\"tokens\"], types) if kind == CONTROL])", "for t, kind in zip(metadata[\"tokens\"], types) if kind >= CONTROL])", f"{_GGUF6} {_F6}::test_gguf_reader_names_every_special_token_id_0_included_and_reads_both_flags"),
  ("GGUF folder's config: no EOS", "probe/models/gguf_tokenizer.py", 'add_eos_token=bool(metadata["add_eos_token"]))', "add_eos_token=False)", f"{_GGUF6} {_F6}::test_gguf_reader_names_every_special_token_id_0_included_and_reads_both_flags"),
  ("cache manifest: transformers only", "probe/models/embedded.py", "return manifest == made_by() and all(", 'return manifest.get("transformers") == made_by()["transformers"] and all(', f"{_PACK}::test_a_cache_made_by_another_version_is_not_read {_F6}::test_a_converted_model_folder_made_by_another_version_is_converted_again"),
  ("converted model folder read without its manifest", "probe/models/embedded.py", 'if _usable(target, "config.json"):', 'if (target / "config.json").is_file():', f"{_PACK}::test_a_cache_made_by_another_version_is_not_read {_F6}::test_a_converted_model_folder_made_by_another_version_is_converted_again"),
  ("tokenizer served from another version's model folder", "probe/models/embedded.py", "    if _usable(full):\n", '    if (full / "tokenizer_config.json").is_file():\n', f"{_PACK}::test_a_cache_made_by_another_version_is_not_read {_F6}::test_a_converted_model_folder_made_by_another_version_is_converted_again"),
  ("dry run: a reward model counted with an LM head", "probe/models/dryrun.py", 'params = meta_parameters(cfg, "reward" if m == "reward" else "causal")', 'params = meta_parameters(cfg, "causal")', f"{_DRY} {_F6}::test_dry_run_parameters_weights_and_flops_are_the_models_own"),
  ("dry run: parameters of the reference", "probe/models/dryrun.py", "n_params, weights = (n_params or params), weights", "n_params, weights = params, weights", f"{_DRY} {_F6}::test_dry_run_parameters_weights_and_flops_are_the_models_own"),
  ("dry run: a reward model's work less its embeddings twice", "probe/models/dryrun.py", 'tied = getattr(text, "tie_word_embeddings", False) or mode == "reward"', 'tied = getattr(text, "tie_word_embeddings", False)', f"{_DRY} {_F6}::test_dry_run_parameters_weights_and_flops_are_the_models_own"),
  ("invariance: a lower batch counts as no difference", "experiments/gpu_common.py", '"max_abs_diff": float(np.max(np.abs(s - base))),', '"max_abs_diff": float(np.max(s - base)),', f"{_INV6} {_F6}::test_batch_invariance_counts_scores_that_fall_as_differences"),
  ("invariance: lower reversed rows count as none", "experiments/gpu_common.py", '{"max_abs_diff": float(np.max(np.abs(rev - base))),', '{"max_abs_diff": float(np.max(rev - base)),', f"{_INV6} {_F6}::test_batch_invariance_counts_scores_that_fall_as_differences"),
]


# Round 7 (issue 74): statistics against their textbook values (which variance each interval uses, at small n, with
# missing cells), torchrun's gathered counts, and options at values the tests never used (a switch where a number
# belongs, --top at its edges, an odd-sized small sweep, exactly two responses, the terminal's tables, the W flag,
# --dry-run's plan, figures' inputs, MKL's mode). Not the GPU's rules (invariance, kernels) nor probe explain, which
# other sessions were rewriting. Targets: an existing test near the code and the round's tests
# (tests/unit/test_round7_*.py); a torchrun row's existing test is the torchrun launch that covers it (slow).
BEFORE_ROUND_7 = "f1f451f"
_S7, _O7, _R7 = ("tests/unit/test_round7_stats.py", "tests/unit/test_round7_options.py",
                 "tests/unit/test_round7_ranks.py")
_FZ7 = f"{_S7}::test_fisher_z_intervals_use_fieller_hartley_and_pearsons_variance"
_MIS64 = "tests/unit/test_issue64_reports.py::test_misalignment_over_few_items_says_n_the_interval_and_the_prompt"
_RESP64 = ("tests/unit/test_issue64_reports.py::test_response_findings_on_five_responses_neither_overlap_nor_claim_"
           "length")
_CON64 = "tests/unit/test_issue64_reports.py::test_contrast_over_few_strings_keeps_top_and_bottom_apart"
_BOOT = "tests/unit/test_social.py::test_pairwise_accuracy_ties_count_as_wrong_and_bootstrap"
_CON7 = ("tests/unit/test_analysis.py::test_contrast_identical_and_reversed "
         "tests/unit/test_analysis.py::test_contrast_by_hand_top_k_and_the_sign_of_rank_change")
_TORCH_RESP = "tests/unit/test_rows_torchrun.py::test_two_ranks_score_responses_into_one_folder"
_TORCH_SWEEP = "tests/integration/test_distributed.py::test_two_process_sweep_equals_single_process"
_RESP_COUNT = f"{_R7}::test_two_ranks_count_every_response_the_slowest_ranks_time_and_the_smallest_batch"
_SWEEP_COUNT = f"{_R7}::test_two_ranks_count_every_token_of_an_odd_sized_sweep"
_TOP_TABLES = "tests/unit/test_issue64_reports.py::test_the_terminal_tables_of_a_small_run_never_list_a_token_as_both_best_and_worst"
_DRY7 = "tests/unit/test_counts.py::test_a_dry_run_prints_each_prompts_row_where_they_differ tests/unit/test_first_hour.py::test_dry_run_on_cpu_plans_the_cpu_batch"
_MKL7 = f"tests/unit/test_cpu_threads.py::test_prepare_sets_only_what_the_user_has_not {_O7}::test_blas_mode_reads_mkls_mode_and_says_why_it_is_not_strict {_O7}::test_prepare_after_torch_sets_only_mkls_mode {_O7}::test_a_process_that_ran_torch_before_rm_probe_is_told_mkls_mode"
ROUND_7 = [
  ("Kendall's interval with Pearson's variance", "probe/analysis/stats.py", 'FISHER_Z = {"kendall": (0.437, 4),', 'FISHER_Z = {"kendall": (1.0, 3),', f"tests/unit/test_stats.py {_MIS64} {_FZ7}"),
  ("Spearman's interval with Pearson's variance", "probe/analysis/stats.py", '"spearman": (1.06, 3)}', '"spearman": (1.0, 3)}', f"tests/unit/test_stats.py {_RESP64} {_FZ7}"),
  ("interval from the one-sided normal point", "probe/analysis/stats.py", "half = stats.norm.ppf(0.5 + level / 2) * np.sqrt(c / (n - d))", "half = stats.norm.ppf(level) * np.sqrt(c / (n - d))", f"tests/unit/test_stats.py {_MIS64} {_FZ7}"),
  ("an interval at n = 4 for tau (n - 4 = 0)", "probe/analysis/stats.py", "    if n <= d or not np.isfinite(r):", "    if n < d or not np.isfinite(r):", f"tests/unit/test_stats.py {_MIS64} {_FZ7}"),
  ("OLS interval from the normal, not t", "probe/analysis/stats.py", "t = stats.t.ppf(0.5 + level / 2, dof)", "t = stats.norm.ppf(0.5 + level / 2)", f"tests/unit/test_stats.py {_S7}::test_ols_on_the_textbook_five_points"),
  ("contrast's rho interval with tau's variance", "probe/analysis/contrast.py", 'stats.rank_correlation_interval(self.spearman, self.n, "spearman")', 'stats.rank_correlation_interval(self.spearman, self.n, "kendall")', f"{_CON7} {_CON64} {_S7}::test_contrast_gives_each_coefficient_its_own_interval_over_the_strings_both_rank"),
  ("contrast's n before the join", "probe/analysis/contrast.py", "    n = j.height\n", "    n = a.height\n", f"{_CON7} {_CON64} {_S7}::test_contrast_gives_each_coefficient_its_own_interval_over_the_strings_both_rank"),
  ("misalignment's interval over the rows before empty cells went", "probe/commands/analyze.py", "    n = res.items.height\n", "    n = table.height\n", f"{_MIS64} {_S7}::test_misalignment_over_a_table_with_empty_cells_counts_the_complete_items"),
  ("misalignment keeps items a model did not score", "probe/analysis/misalignment.py", "df = df.drop_nulls([human, *models])", "df = df.drop_nulls([human])", f"tests/unit/test_analysis.py::test_misalignment_by_hand {_MIS64} {_S7}::test_misalignment_over_a_table_with_empty_cells_counts_the_complete_items"),
  ("response page's Spearman interval with tau's variance", "probe/report/audit.py", 'interval = rank_correlation_interval(rho, df.height, "spearman")', 'interval = rank_correlation_interval(rho, df.height, "kendall")', f"{_RESP64} {_S7}::test_the_response_findings_spearman_interval_over_ties_in_length"),
  ("a length correlation over two responses", "probe/report/audit.py", "if np.unique(lengths).size > 1 and df.height > 2:", "if np.unique(lengths).size > 1 and df.height > 1:", f"{_RESP64} {_S7}::test_exactly_two_responses_have_no_length_correlation"),
  ("bootstrap never draws the last item", "probe/social/metrics.py", "values[rng.integers(0, values.size, size=(n, values.size))]", "values[rng.integers(0, values.size - 1, size=(n, values.size))]", f"{_BOOT} {_S7}::test_bootstrap_interval_is_the_percentile_bootstrap_of_the_mean"),
  ("bootstrap's 90% percentiles called 95%", "probe/social/metrics.py", "np.quantile(means, [(1 - level) / 2, (1 + level) / 2])", "np.quantile(means, [1 - level, level])", f"{_BOOT} {_S7}::test_bootstrap_interval_is_the_percentile_bootstrap_of_the_mean"),
  ("a switch read as a number", "probe/commands/args.py", "if isinstance(value, bool) or not isinstance(value, (int, float)):", "if not isinstance(value, (int, float)):", f"tests/unit/test_config_files.py {_O7}::test_a_switch_value_where_a_number_belongs_is_refused {_O7}::test_a_switch_value_where_a_number_belongs_in_a_job_file_and_a_suite"),
  ("analyze --top 1 refused", "probe/commands/analyze.py", 'check_at_least(self, 1, "top", "permutations")', 'check_at_least(self, 2, "top", "permutations")', f"tests/unit/test_wrong_results4.py::test_analyze_counts_below_one_are_refused tests/unit/test_analysis.py::test_analyze_cli_on_fake_runs {_O7}::test_top_1_lists_one_token_and_one_word_a_side {_O7}::test_misalignment_top_1_lists_one_item_a_side"),
  ("probe score --top 0 taken", "probe/config.py", 'check_at_least(self, 1, "shard_size", "top", "batch_size", "limit", "devices")', 'check_at_least(self, 1, "shard_size", "batch_size", "limit", "devices")', f"tests/unit/test_config_files.py {_O7}::test_top_0_is_refused"),
  ("torchrun sweep counts rank 0's tokens", "probe/core/sweep.py", "n_todo = sum(counts)  #", "n_todo = counts[0]  #", f"{_TORCH_SWEEP} {_SWEEP_COUNT}"),
  ("sweep counts a short last shard whole", "probe/core/sweep.py", "n_todo = sum(min(k, self.token_ids.size - s * k) for s in todo)", "n_todo = len(todo) * k", f"tests/unit/test_sweep.py::test_outputs_are_complete_and_ranked {_SWEEP_COUNT}"),
  ("torchrun sweep recorded as one process", "probe/commands/score.py", "timing = SessionTiming(meta, started, round(t_loaded - t_start, 3), dist.world)", "timing = SessionTiming(meta, started, round(t_loaded - t_start, 3), 1)", f"{_TORCH_SWEEP} {_SWEEP_COUNT}"),
  ("torchrun responses: rank 0's count", "probe/commands/responses.py", "session.update(responses_scored=sum(r[1] for r in ranks),", "session.update(responses_scored=ranks[0][1],", f"{_TORCH_RESP} {_RESP_COUNT}"),
  ("torchrun responses: the ranks' seconds added", "probe/commands/responses.py", "score_s=max(r[2] for r in ranks),", "score_s=sum(r[2] for r in ranks),", f"{_TORCH_RESP} {_RESP_COUNT}"),
  ("torchrun responses: the largest batch kept", "probe/commands/responses.py", 'meta["batch_size"] = min(meta["batch_size"], *(r[3] for r in ranks))', 'meta["batch_size"] = max(meta["batch_size"], *(r[3] for r in ranks))', f"{_TORCH_RESP} {_RESP_COUNT}"),
  ("torchrun social: rank 0's scores only", "probe/social/scoring.py", "scores = {key: v for p in parts for key, v in p.items()}", "scores = {key: v for p in parts[:1] for key, v in p.items()}", f"tests/unit/test_rows_torchrun.py::test_two_ranks_run_social_into_one_folder {_R7}::test_two_ranks_count_every_social_row"),
  ("a one-word response with white space is not a word", "probe/analysis/sweeps.py", 'words = [" " not in r.strip() and is_english_word(r.strip(), freqs)', 'words = [" " not in r and is_english_word(r.strip(), freqs)', f"tests/unit/test_analysis.py::test_every_analyze_output_recomputed_from_scores_parquet {_O7}::test_a_one_word_response_is_a_word_whatever_white_space_surrounds_it"),
  ("findings' words are the alphabetic tokens", "probe/report/audit.py", '    words = ranked.filter(pl.col("is_word"))\n    text = lambda', '    words = ranked.filter(pl.col("is_alpha"))\n    text = lambda', f"tests/unit/test_issue64_reports.py::test_sweep_findings_on_few_words_never_list_a_word_as_both_best_and_worst {_O7}::test_findings_without_an_english_word_say_so"),
  ("terminal words table of the alphabetic tokens", "probe/report/text.py", 'words = df.filter(pl.col("is_word")).with_columns(', 'words = df.filter(pl.col("is_alpha")).with_columns(', f"{_TOP_TABLES} {_O7}::test_the_terminal_tables_of_an_odd_sized_sweep_leave_the_middle_token_out"),
  ("an odd sweep's middle token best and worst", "probe/report/text.py", "k_raw, k_words = min(n, raw.height // 2),", "k_raw, k_words = min(n, (raw.height + 1) // 2),", f"{_TOP_TABLES} {_O7}::test_the_terminal_tables_of_an_odd_sized_sweep_leave_the_middle_token_out"),
  ("plain_table: 0.001 in scientific notation", "probe/report/text.py", "abs(v) >= 10 ** -digits else", "abs(v) > 10 ** -digits else", f"tests/unit/test_issue64_reports.py::test_plain_table_cells {_O7}::test_plain_table_cells_at_their_edges"),
  ("plain_table: a number column with an empty cell left-aligned", "probe/report/text.py", "numeric = [all(isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool) or r.get(c) is None", "numeric = [all(isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool)", f"tests/unit/test_issue64_reports.py::test_plain_table_cells {_O7}::test_plain_table_cells_at_their_edges"),
  ("two responses at --top 1 as best and worst", "probe/commands/responses.py", "if part.height <= 2 * top else (", "if part.height < 2 * top else (", f"tests/unit/test_responses.py::test_response_run_equals_the_api_and_resumes_identically {_O7}::test_exactly_two_responses_print_once_at_any_top"),
  ("dry run: a prompt's work is the run's over 3", "probe/models/dryrun.py", "{p['sweep_flops'] / p.get('n_prompts', 3) / 1e15:.2f} PFLOP", "{p['sweep_flops'] / 3 / 1e15:.2f} PFLOP", f"{_DRY7} {_O7}::test_the_dry_runs_work_per_prompt_is_one_prompts_whatever_the_run_holds"),
  ("dry run: the larger batch of two prompt shapes", "probe/models/dryrun.py", 'out = dict(out, batch_size=min(q["batch_size"] for q in plans.values()))', 'out = dict(out, batch_size=max(q["batch_size"] for q in plans.values()))', f"{_DRY7} {_O7}::test_the_dry_run_of_prompts_of_two_shapes_takes_the_larger_row_and_the_smaller_batch"),
  ("dry run: the smaller row of two prompt shapes", "probe/models/dryrun.py", 'out = max(plans.values(), key=lambda q: q["bytes_per_row"])', 'out = min(plans.values(), key=lambda q: q["bytes_per_row"])', f"{_DRY7} {_O7}::test_the_dry_run_of_prompts_of_two_shapes_takes_the_larger_row_and_the_smaller_batch"),
  ("figure 2 keeps a table's empty cells", "experiments/fig2_agreement.py", "        df = df.drop_nulls(models)  #", "        df = df  #", f"tests/unit/test_figures.py::test_elo_summary_agrees_with_the_paper {_O7}::test_figure_2_of_a_table_with_empty_cells_ranks_the_items_every_model_scored"),
  ("figure 1's variance over n", "experiments/fig1_distributions.py", '"variance": float(scores.var(ddof=1))', '"variance": float(scores.var())', f"tests/unit/test_figures.py::test_make_figures_from_fake_runs {_O7}::test_figure_1s_moments_are_the_sample_variance_and_skewness"),
  ("sweep figures draw a response run", "experiments/common.py", "        if s.responses:\n", "        if False:\n", f"tests/unit/test_first_hour.py::test_figures_after_a_limited_run {_O7}::test_the_sweep_figures_refuse_a_response_run_in_one_line"),
  ("MKL's strict bit not read", "probe/runs/cpu.py", "strict = mode > 0 and bool(mode & _CBWR_STRICT)", "strict = mode > 0", _MKL7),
  ("MKL left unset called another mode", "probe/runs/cpu.py", 'if os.environ.get("MKL_CBWR") not in (None, MKL_CBWR)', 'if os.environ.get("MKL_CBWR") != MKL_CBWR', _MKL7),
  ("MKL's mode not set after torch", "probe/runs/cpu.py", '    if "torch" in sys.modules and environ is None:\n        return reproducible_blas(env)', '    if "torch" in sys.modules and environ is None:\n        return {}', _MKL7),
]


# Round 8 (issue 74, its part on probe explain): one-line slips in explain's own code (probe/attribution/*,
# probe/report/why.py): the difference of two responses, the pooled and per-response agreements and their intervals,
# integrated gradients' rule (nodes, halving, panels, the floor of the target, the baseline), a sweep's --top, the
# mean's rest items, the heads' closure and the why section's bars and words. Targets: the existing test nearest the
# code and the round's own (tests/unit/test_round7_explain.py).
BEFORE_ROUND_8 = "31a21ca"
_X8 = "tests/unit/test_round7_explain.py"
_DIFF8 = ("tests/unit/test_explain_exact.py::test_half_precision_explanations_are_true_to_their_bound "
          f"{_X8}::test_the_difference_of_exactly_two_responses_by_hand")
_AGREE8 = ("tests/unit/test_explain_patching.py::test_components_and_heads_are_compared_within_one_level "
           "tests/unit/test_explain_patching.py::test_agreements_carry_n_and_an_interval_and_verdicts_need_enough_pairs "
           f"{_X8}::test_agreements_over_the_right_pairs_by_hand")
_IG8 = ("tests/unit/test_explain.py::test_integrated_gradients_reach_their_target_and_say_so "
        f"{_X8}::test_integrated_gradients_rule_points_and_completeness_by_hand")
_WHY8 = ("tests/unit/test_explain.py::test_the_command_writes_explain_json_with_the_scores_probe_score_gives "
         f"{_X8}::test_the_why_sections_bars_and_words_are_explain_jsons_numbers")
_PARTS8 = ("tests/unit/test_explain.py::test_parts_sum_to_the_score_the_engine_gives_on_every_tiny_family "
           f"{_X8}::test_every_responses_parts_heads_and_closure_by_hand_in_a_batch "
           f"{_X8}::test_rest_items_of_every_reduction_by_hand_on_a_soft_capped_model")
ROUND_8 = [
  ("two responses have no difference", "probe/attribution/explain.py", "    if len(records) < 2:\n        return None", "    if len(records) < 3:\n        return None", _DIFF8),
  ("the difference's lower is the last given", "probe/attribution/explain.py", '    lo = min(records, key=lambda r: r["score"])', "    lo = records[-1]", _DIFF8),
  ("the difference's bound the larger item's", "probe/attribution/explain.py", '"bound": hi["check"]["bound"] + lo["check"]["bound"]}}', '"bound": max(hi["check"]["bound"], lo["check"]["bound"])}}', _DIFF8),
  ("pooled direct differences are the effects", "probe/attribution/explain.py", 'got["direct"].append(p.direct_difference[k])', 'got["direct"].append(p.effects[k])', _AGREE8),
  ("pooled AtP from the direct differences", "probe/attribution/explain.py", 'got["atp"].append(p.atp[k])', 'got["atp"].append(p.direct_difference[k])', _AGREE8),
  ("n_pairs counts the responses", "probe/attribution/explain.py", '"n_pairs": comp.get("n", 0), "levels": levels}', '"n_pairs": len(per), "levels": levels}', _AGREE8),
  ("the median per response is the mean", "probe/attribution/explain.py", "float(np.median([p for p in per if p is not None]))", "float(np.mean([p for p in per if p is not None]))", f"{_AGREE8} {_X8}::test_the_median_per_response_is_a_median_not_a_mean"),
  ("Spearman's interval with Pearson's variance", "probe/attribution/patching.py", "half = 1.959964 * math.sqrt((1 + r * r / 2) / (n - 3))", "half = 1.959964 * math.sqrt(1 / (n - 3))", _AGREE8),
  ("a response's AtP agreement over the direct differences", "probe/attribution/patching.py", 'out[lev]["atp_vs_patching"] = agreement([p.atp[k] for k in keys], eff)', 'out[lev]["atp_vs_patching"] = agreement([p.direct_difference[k] for k in keys], eff)', _AGREE8),
  ("Gauss-Legendre nodes at the thirds", "probe/attribution/ig.py", "GL2 = (np.array([-1.0, 1.0]) / math.sqrt(3.0),", "GL2 = (np.array([-1.0, 1.0]) / 3.0,", _IG8),
  ("a log panel halved at its arithmetic middle", "probe/attribution/ig.py", "mid = math.sqrt(self.a * self.b) if self.log else (self.a + self.b) / 2", "mid = (self.a + self.b) / 2", _IG8),
  ("attributions without the baseline's embeddings", "probe/attribution/ig.py", "attr = ((x - x0)[0] * q).sum(-1)[pos]", "attr = (x[0] * q).sum(-1)[pos]", _IG8),
  ("the target without the rounding floor", "probe/attribution/ig.py", "goal = max(target * abs(gap), floor)", "goal = target * abs(gap)", _IG8),
  ("a token's path in 8 panels whatever the points", "probe/attribution/ig.py", "n = max(1, min(8, steps // 2))", "n = 8", _IG8),
  ("the zero path's floor at the smallest normal, not its root", "probe/attribution/ig.py", "lo = min(0.1, math.sqrt(torch.finfo(dtype).tiny) / span)", "lo = min(0.1, torch.finfo(dtype).tiny / span)", _IG8),
  ("the MLP bars drawn from the attention parts", "probe/report/why.py", 'mlp = [components.get(f"L{i}.mlp", 0.0) for i in layers]', 'mlp = [components.get(f"L{i}.attn", 0.0) for i in layers]', _WHY8),
  ("the why section's largest parts by signed value", "probe/report/why.py", "big = sorted(comps.items(), key=lambda kv: -abs(kv[1]))[:top]", "big = sorted(comps.items(), key=lambda kv: -kv[1])[:top]", _WHY8),
  ("the why section's prompt words by signed attribution", "probe/report/why.py", 'best = sorted(zip(toks, g["attributions"]), key=lambda kv: -abs(kv[1]))[:top]', 'best = sorted(zip(toks, g["attributions"]), key=lambda kv: -kv[1])[:top]', _WHY8),
  ("an odd sweep's middle token best and worst", "probe/attribution/inputs.py", "    n = min(top, df.height // 2)", "    n = min(top, (df.height + 1) // 2)", f"tests/unit/test_explain.py::test_a_sweeps_best_and_worst_tokens_are_explained_with_the_sweeps_scores {_X8}::test_top_at_its_edges_with_a_sweeps_run"),
  ("the mean's normaliser not divided", "probe/attribution/readers.py", 'items = {"log_softmax_normaliser": float(-lse.sum() / n),', 'items = {"log_softmax_normaliser": float(-lse.sum()),', _PARTS8),
  ("a linear head's bias left out of rest", "probe/attribution/readers.py", 'u[None].clone().cpu(), score, lambda normed: {"head_bias": b},', 'u[None].clone().cpu(), score, lambda normed: {"head_bias": 0.0},', f"tests/unit/test_explain.py::test_parts_sum_to_the_score_the_engine_gives_on_every_tiny_family {_X8}::test_rest_items_of_a_reward_head_with_a_bias_by_hand"),
  ("the heads' closure from the first layer", "probe/attribution/direct.py", "if bound > 0 and gap / bound >= (worst / allowed if allowed else 0):", "if bound > 0 and not allowed:", f"tests/unit/test_explain.py::test_heads_sum_to_their_layers_attention_part {_X8}::test_every_responses_parts_heads_and_closure_by_hand_in_a_batch"),
]


def run_tests(copy: Path, tests: str, env: dict, deselect: tuple[str, ...] = ()) -> tuple[bool, str]:
    skip = " ".join(f"--deselect '{t}'" for t in deselect)
    proc = subprocess.run(f"{sys.executable} -m pytest -q -x -p no:cacheprovider {skip} {tests}", shell=True, cwd=copy,
                          env={**env, "PYTHONPATH": str(copy)}, capture_output=True, text=True)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()[-200:]
    return proc.returncode == 1 and " failed" in last and "error" not in last, last


def failing_without_a_bug(copy: Path, tests: str, env: dict) -> tuple[str, ...]:
    """The tests of ``tests`` that fail on the copy as it is (the earlier tests against today's code, where a
    message or an interface changed on purpose): left out of the planted runs, so that they count for nothing."""
    proc = subprocess.run(f"{sys.executable} -m pytest -q -rf -p no:cacheprovider {tests}", shell=True, cwd=copy,
                          env={**env, "PYTHONPATH": str(copy)}, capture_output=True, text=True)
    return tuple(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("FAILED "))


ROUNDS = {2: (ROUND_2, BEFORE_ROUND_2), 3: (ROUND_3, BEFORE_ROUND_3), 4: (ROUND_4, BEFORE_ROUND_4),
          5: (ROUND_5, BEFORE_ROUND_5), 6: (ROUND_6, BEFORE_ROUND_6), 7: (ROUND_7, BEFORE_ROUND_7),
          8: (ROUND_8, BEFORE_ROUND_8)}

# what a results file says below its table: round 4's check of the two bugs issue 57 names, planted by hand
NOTES = {4: [
  "The two bugs issue 57 names (not rows above), each planted by hand on a copy and run against this round's tests:",
  "",
  "| bug, as planted | test | result |", "|---|---|---|",
  "| responses: `todo[dist.local_rank :: dist.world]` | `test_round4_nodes.py -k responses` | 1 failed |",
  "| social: `deal(costs, dist.world)[dist.local_rank]` | `test_round4_nodes.py -k social` | 1 failed |",
  "| sweeps and trace: `Dist.owns` by `self.local_rank` | `test_round4_nodes.py -k 'sweep or trace'` | 1 failed |",
  "| trace: `u % dist.world == dist.local_rank` | `test_round4_nodes.py -k trace` | 1 failed |",
  "| batch: `launched()` reads `LOCAL_RANK` as the rank | `test_round4_nodes.py -k batch` | 1 failed |",
  "| `init()` returns `Dist(local_rank, ...)` | `test_round4_nodes.py -k responses` | 1 failed |",
  "| a resumed response run's `meta[\"batch_size\"] = batch_size` (this session's) | "
  "`test_round4_resume.py -k batch_size_it_started` | 1 failed |",
  "| its batcher from `config.batch_size or meta[\"batch_size\"]` | `test_round4_resume.py -k batch_size_it_started` "
  "| 1 failed |"],
  5: ["Each column's baseline (the tests failing without a bug) comes from one pytest run of every row's targets, not "
      "one per row. The before column's first four rows ran before that change, the rest with `--only`; "
      "the job-key rows were named for a fingerprint at first and the seed's row then aimed at the sweep's resume "
      "test, not the batch runner's: rerun alone with the batch runner's test.",
      "",
      "A real bug found on the way (fixed, tested in test_batch_invariance.py::test_invariance_batches, which fails "
      "on the old code): `experiments/gpu_bench.py`'s `invariance_batches` compared a batch of 3 against a batch "
      "halved to 1 or 2 by memory, a batch that may not fit."],
  6: ["Not a bug (left in the table as not caught): \"SteamSHP post's turns stripped\". SHPPipeline joins the turns "
      "untrimmed, but T5's tokenizer (SteamSHP's, and the stand-in's: the same normalizer) collapses and strips white "
      "space before its SentencePiece model, so the stripped and the unstripped post give the same ids; the round's "
      "test feeds a system turn \" Be brief. \" and passes on both.",
      "",
      "A real bug found on the way (fixed in probe/core/pairwise.py, one line; tested by "
      "test_polar_system_turns_are_joined_as_the_client_joins_an_empty_one_included, which fails on the old code): "
      "POLAR dropped an explicit empty `--system \"\"`, where the card's client joins an empty system turn as a "
      "leading newline (and the README says an explicit empty value is what runs). Its row above plants the old line "
      "back.",
      "",
      "Better-PairRM's trim was first tested on the MiniLM WordPiece tokenizer alone, which drops every space and "
      "newline (the row was not caught); the test now runs on a SentencePiece tokenizer too (Mistral v0.1's, as "
      "Better-PairRM's DeBERTa-v3 one is SentencePiece), and the row was rerun with --only, with LMUnit's row (added after the full run)."],
  7: ["The torchrun rows' existing tests are torchrun launches (tests/unit/test_rows_torchrun.py, "
      "tests/integration/test_distributed.py, marked slow): they compare the run's files with one process's, "
      "meta.json aside but for a few fields, so the seconds and the batch size it records pass them, and they run "
      "only in make test-all. The round's tests (tests/unit/test_round7_ranks.py) run two "
      "ranks as two threads of one process, the collectives replaced by pickling ones, in seconds.",
      "",
      "The first full run's after column left out test_two_ranks_count_every_social_row: it failed there without a "
      "bug (another test had imported probe.commands.social first, so its own barrier and broadcast were the real "
      "ones, not the threads'); the test now replaces them in every module that imported them, and that row was "
      "rerun with --only.",
      "",
      "Two real bugs found on the way (fixed, each tested by a test that fails on the old code; the rows above "
      "plant the old lines back): `--dry-run` said \"one prompt over V tokens: X PFLOP\" with X the run's work over "
      "3 whatever the number of prompts (a run of one --prompt: a third of its cost); figure 2 of an item table with "
      "an empty cell raised LinAlgError (NaN tau into the MDS) where misalignment and figure 5 rank the items every "
      "model scored.",
      "",
      "The statistics themselves agreed with their textbook values: tau-b and rho with ties (scipy's documented "
      "examples, tau-b by hand), the Fisher-z intervals (Fieller, Hartley & Pearson's 0.437 / (n - 4) and "
      "1.06 / (n - 3)), the percentile bootstrap and OLS on the five-point textbook example."]}


def read_rows(out: Path) -> dict[str, tuple[str, ...]]:
    """A results file's rows by bug name."""
    done = {}
    for line in out.read_text().splitlines() if out.is_file() else ():
        if not line.startswith("| ") or line.startswith("| bug |"):
            continue
        cells = [c.strip().strip("`") for c in line.strip("|").split(" | ")]
        if len(cells) == 5:  # a bug's row (not the notes' table)
            done[cells[0]] = tuple(cells)
    return done


def before_and_after(env: dict, number: int, only: tuple[str, ...] = (), out: Path | None = None,
                     join: tuple[Path, ...] = (), side: str = "both") -> int:
    """Each bug of round ``number`` on a copy, its test files run as they were before the round and as they are
    now; ``only``: just the bugs of these names, the other rows kept as the results file (``out``) has them;
    ``join``: no runs, the rows of these files (parts run at once) written into ``out``; ``side``: ``before`` or
    ``after`` runs that column only, the other kept as ``out`` has it (the before column, run while the round's
    tests are written, need not be run again)."""
    bugs, before_rev = ROUNDS[number]
    out = out or RESULTS / f"planted_bugs_round{number}.md"
    done = read_rows(out) if only or join or side != "both" else {}  # name -> row, from the last run
    for part in join:
        done |= read_rows(part)
    if join:
        only = ("(none: rows joined from parts run at the same time)",)
    baseline: dict[tuple[str, str], tuple[str, ...]] = {}  # (when, file or node id) -> tests failing without a bug
    if number >= 5:  # every row's baseline in one pytest run per column (module fixtures built once, not per row)
        targets = list(dict.fromkeys(f for name, *_, tests in bugs if not only or name in only for f in tests.split()))
        for when in (w for w in ("before", "after") if side in ("both", w)):
            with tempfile.TemporaryDirectory() as tmp:
                copy = _copy(Path(tmp), when, before_rev)
                there = [f for f in targets if (copy / f.split("::")[0]).is_file()]
                failing = failing_without_a_bug(copy, " ".join(there), env) if there else ()
                for f in there:
                    baseline[when, f] = tuple(t for t in failing if t == f or t.startswith(
                        f + ("[" if "::" in f else "::")))
            print(f"{when}: failing without a bug: {[t for f in there for t in baseline[when, f]]}", flush=True)
    rows = []
    for name, path, old, new, tests in bugs:
        if only and name not in only:
            rows.append(done.get(name, (name, path, tests, "NOT CAUGHT: not run", "NOT CAUGHT: not run")))
            continue
        results = []
        for when in ("before", "after"):
            if side not in ("both", when):  # this column as the last run left it
                kept = done.get(name, (name, path, tests, "NOT CAUGHT: not run", "NOT CAUGHT: not run"))
                results.append((kept[3 if when == "before" else 4].startswith("caught"),
                                kept[3 if when == "before" else 4].split(": ", 1)[-1]))
                continue
            with tempfile.TemporaryDirectory() as tmp:
                copy = _copy(Path(tmp), when, before_rev)
                files = " ".join(f for f in tests.split() if (copy / f.split("::")[0]).is_file())  # a file or a node id
                fresh = [f for f in files.split() if (when, f) not in baseline]
                if fresh:  # each file or node id's failures without a bug, found once per run of this script
                    failing = failing_without_a_bug(copy, " ".join(fresh), env)
                    for f in fresh:
                        baseline[when, f] = tuple(t for t in failing if t == f or t.startswith(
                            f + ("[" if "::" in f else "::")))
                if not plant(copy, path, old, new):
                    results.append((False, "the line to change is not there: update this list"))
                    continue
                results.append(run_tests(copy, files, env, tuple(x for f in files.split() for x in baseline[when, f]))
                               if files
                               else (False, "no such test file then"))
        rows.append((name, path, tests, *(("caught: " if ok else "NOT CAUGHT: ") + last for ok, last in results)))
        print(" | ".join(rows[-1]), flush=True)
    before_caught, after_caught = (sum(r[k].startswith("caught") for r in rows) for k in (3, 4))
    lines = [f"# Planted bugs, round {number}: before and after this round's tests", "",
             f"`python -m experiments.planted_bugs --round {number}`: each bug planted alone on a copy of the "
             f"repository; the named test files run as they were at {before_rev} (before) and as they are now (after). Tests that "
             "fail on the copy without any bug (earlier tests of a message or an interface changed on purpose since) "
             "are left out of both runs, so that a bug counts as caught only by a test it makes fail.", "",
             f"Caught before: {before_caught} of {len(rows)}; after: {after_caught} of {len(rows)}.", "",
             "| bug | file | test files | before | after |", "|---|---|---|---|---|"]
    if join:
        lines[5:5] = ["", "Joined (--join) from parts of the round run at the same time, each on its own rows."]
    elif only:
        lines[5:5] = ["", f"Rerun alone (--only) after the last full run: {', '.join(only)}."]
    if side != "both":
        lines[5:5] = ["", f"This run ran the {side} column; the other is the last run's (--side)."]
    lines += [f"| {n} | `{p}` | `{t}` | {b} | {a} |" for n, p, t, b, a in rows]
    lines += ["", *NOTES[number]] if number in NOTES else []
    out.write_text("\n".join(lines) + "\n")
    print(f"caught before: {before_caught} of {len(rows)}; after: {after_caught} of {len(rows)}")
    return 0 if after_caught == len(rows) else 1


def _copy(tmp: Path, when: str, before_rev: str) -> Path:
    """The repository copied under ``tmp``; ``when == "before"``: its test folder as it was at ``before_rev``."""
    copy = tmp / "repo"
    shutil.copytree(ROOT, copy, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".git", "results", "__pycache__", "figures"))
    if not (copy / "probe" / "kernels").exists():  # a worktree has it already, as a link
        (copy / "probe" / "kernels").symlink_to(copy / "kernels")
    if when == "before":  # the test folder as it was, the code as it is
        shutil.rmtree(copy / "tests")
        archive = subprocess.run(["git", "archive", before_rev, "tests"], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(copy)], input=archive, check=True)
    return copy


def plant(copy: Path, path: str, old: str, new: str) -> bool:
    f = copy / path
    text = f.read_text()
    if old not in text:
        return False
    f.write_text(text.replace(old, new, 1))
    return True


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--round", type=int, choices=(1, 2, 3, 4, 5, 6, 7, 8), default=1)
    parser.add_argument("--only", action="append", default=[], metavar="BUG",
                        help="rounds 2-7: rerun this bug (by name) alone, keeping the results file's other rows")
    parser.add_argument("--results", type=Path, help="rounds 2-7: the results file (default: "
                        "experiments/results/planted_bugs_round<N>.md); several parts of a round may run at once, each "
                        "with --only and a file of its own, then be joined by --join")
    parser.add_argument("--join", type=Path, action="append", default=[], metavar="FILE",
                        help="rounds 2-7: write these parts' rows into the results file, running nothing")
    parser.add_argument("--side", choices=("both", "before", "after"), default="both",
                        help="rounds 2-7: run only this column, keeping the other as the results file has it")
    args = parser.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RM_PROBE_SOCIAL_DATA": os.environ.get("RM_PROBE_SOCIAL_DATA", str(SHARED / "social")),
           "RM_PROBE_PAPER_RELEASE": os.environ.get("RM_PROBE_PAPER_RELEASE", str(SHARED / "paper-release")),
           "RM_PROBE_VALUES_RELEASE": os.environ.get("RM_PROBE_VALUES_RELEASE", str(SHARED / "values-release"))}
    if args.round in ROUNDS:
        return before_and_after(env, args.round, tuple(args.only), args.results, tuple(args.join), args.side)
    rows, missed = [], 0
    for name, path, old, new, tests in MUTS:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "repo"
            shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".venv", ".git", "results", "__pycache__", "figures"))
            (copy / "probe" / "kernels").symlink_to(copy / "kernels")  # the installed layout of probe.kernels
            if not plant(copy, path, old, new):
                rows.append((name, path, tests, "the line to change is not there: update this list"))
                missed += 1
                continue
            proc = subprocess.run(f"{sys.executable} -m pytest -q -x -p no:cacheprovider {tests}", shell=True, cwd=copy,
                                  env={**env, "PYTHONPATH": str(copy)}, capture_output=True, text=True)
            last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()[-200:]
            caught = proc.returncode == 1 and " failed" in last and "error" not in last
            missed += not caught
            rows.append((name, path, tests, ("caught: " if caught else "NOT CAUGHT: ") + last))
            print(" | ".join(rows[-1]), flush=True)
    lines = ["# Planted bugs and the tests that catch them", "", "`python -m experiments.planted_bugs`: each bug "
             "planted alone on a copy of the repository, the named tests run on it.", "",
             "| bug | file | tests | result |", "|---|---|---|---|"]
    lines += [f"| {n} | `{p}` | `{t}` | {r} |" for n, p, t, r in rows]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "planted_bugs.md").write_text("\n".join(lines) + "\n")
    print(f"{len(rows) - missed} of {len(rows)} caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
