"""probe explain (probe/attribution/): the parts sum to the score and the score is the engine's; heads sum to their
layer's attention part; patching is a forward with the component replaced; integrated gradients are complete."""

from __future__ import annotations

import json

import pytest
import torch

import probe
from probe.config import ScoringOptions
from probe.core.scoring import make_head
from probe.attribution.direct import decompose, forward
from probe.attribution.inputs import response_items
from probe.attribution.model import stack_of
from probe.attribution.patching import patch_effects, prefix_state
from probe.attribution.readers import reader

PROMPT = "What, in one word, is the greatest thing ever?"
RESPONSES = ["Love and peace", "the", "freedom"]
MODES = {"rm": ["reward"], "lm": ["logprob", "judge"]}


def _cases(names):
    return [(n, m) for n in names for m in (MODES["lm"] if n.endswith("-lm") else MODES["rm"])]


TINY = ["llama-rm", "gemma2-rm", "chatml-rm-padeot", "llama-lm", "gemma2-lm", "qwen2-rm", "qwen3-rm", "qwen3-lm",
        "gemma3-rm", "gemma3-lm"]


def _explained(lm, mode, responses=RESPONSES, heads=True):
    opts = ScoringOptions()
    items, _ = response_items(lm, mode, PROMPT, responses, opts)
    stack = stack_of(lm.model)
    out = []
    for it in items:
        head = make_head(lm, mode, opts, response_in_prefix=it.k_fixed)
        rd = reader(lm, head, it.ids, len(it.prefix))
        # the forward decomposed is the model's own, its score its own head's
        cap = forward(stack, it.ids, heads, own=lambda x, h=head, n=len(it.prefix): h.own_forward(lm.model, x, n))
        out.append((it, rd, decompose(stack, rd, cap, 0, heads)))
    return out


@pytest.mark.parametrize("name,mode", _cases(TINY))
def test_parts_sum_to_the_score_the_engine_gives_on_every_tiny_family(tiny_models, name, mode):
    """score = sum(components) + rest within the rounding bound, the score being the model's own forward's (its own
    head on its own states), the residual stream the sum of the parts to Higham's bound, and the engine's score
    (`probe score --responses`) equals the decomposed forward's to the project's float32 rule; every block
    contributes."""
    from probe.core.precision import FLOAT32_RTOL

    for it, rd, dec in _explained(tiny_models[name], mode):
        total = sum(dec.components.values()) + dec.rest_total
        assert abs(dec.score - total) <= dec.tolerance, (name, it.label, dec.score, total, dec.tolerance)
        assert dec.stream_gap <= 1
        assert abs(it.engine_score - dec.score) <= FLOAT32_RTOL * (1 + abs(it.engine_score))
        n_blocks = len(stack_of(tiny_models[name].model).blocks)
        assert len(dec.components) == 1 + 2 * n_blocks


@pytest.mark.parametrize("name", ["llama-rm", "gemma2-rm", "gemma3-lm", "qwen3-rm"])
def test_heads_sum_to_their_layers_attention_part(tiny_models, name):
    """o_proj's columns per head (through Gemma's post-attention norm at its real scale) add up to the layer's part."""
    mode = "logprob" if name.endswith("-lm") else "reward"
    for _, _, dec in _explained(tiny_models[name], mode):
        for layer in range(len(stack_of(tiny_models[name].model).blocks)):
            heads = [v for k, v in dec.heads.items() if k.startswith(f"L{layer}.attn.")]
            part = dec.components[f"L{layer}.attn"]
            assert len(heads) == 4
            assert abs(sum(heads) - part) <= 1e-5 * (1 + sum(abs(h) for h in heads)), (layer, sum(heads), part)


def _hand_patched(lm, mode, it, base, module, head=None):
    """The model's own forward (its head's own reading) with ``module``'s output replaced, over the continuation's
    positions aligned from the right, by its output under ``base``: the module's forward swapped by hand."""
    held = {}
    original = module.forward

    def record(*a, **k):
        out = original(*a, **k)
        held["v"] = (out[0] if isinstance(out, tuple) else out).detach().clone()
        return out

    def replaced(*a, **k):
        out = original(*a, **k)
        t = (out[0] if isinstance(out, tuple) else out).clone()
        n = min(len(it.continuation), len(base.continuation))
        if head is None:
            t[:, -n:] = held["v"][:, -n:]
        return (t, *out[1:]) if isinstance(out, tuple) else t

    def replaced_input(x):
        x = x.clone()
        n = min(len(it.continuation), len(base.continuation))
        h, dh = head
        x[:, -n:, h * dh:(h + 1) * dh] = held["v"][:, -n:, h * dh:(h + 1) * dh]
        return original(x)

    def record_input(x):
        held["v"] = x.detach().clone()
        return original(x)

    own = make_head(lm, mode, ScoringOptions())
    with torch.no_grad():
        module.forward = record if head is None else record_input
        try:
            lm.model(input_ids=torch.tensor([base.ids]))
            module.forward = replaced if head is None else replaced_input
            patched = float(own.own_forward(lm.model, torch.tensor([it.ids]), len(it.prefix))[0])
        finally:
            module.forward = original
        clean = float(own.own_forward(lm.model, torch.tensor([it.ids]), len(it.prefix))[0])
    return clean - patched


@pytest.mark.parametrize("name,mode", [("llama-rm", "reward"), ("gemma2-lm", "logprob"), ("gemma3-lm", "judge")])
def test_patching_equals_a_forward_with_the_component_replaced_by_hand(tiny_models, name, mode):
    lm = tiny_models[name]
    opts = ScoringOptions()
    items, _ = response_items(lm, mode, PROMPT, ["Love and peace", "the cat sat"], opts)
    it, base = items
    stack = stack_of(lm.model)
    rd = reader(lm, make_head(lm, mode, opts), it.ids, len(it.prefix))
    base_cap = forward(stack, base.ids, heads=True)
    names = ["L1.mlp", "L0.attn", "L1.attn.h2"]
    # on the prefix's KV cache, at the continuation's positions only: equal to the whole forward patched by hand
    effects, _, _ = patch_effects(stack, rd, it.ids, len(it.prefix), base_cap, len(base.prefix), names,
                                  prefix_state(stack, it.prefix), batch=3)
    b1, b0 = stack.blocks[1], stack.blocks[0]
    want = {"L1.mlp": _hand_patched(lm, mode, it, base, b1.mlp_out),
            "L0.attn": _hand_patched(lm, mode, it, base, b0.attn_out),
            "L1.attn.h2": _hand_patched(lm, mode, it, base, b1.o_proj, head=(2, b1.head_dim))}
    for k in names:
        assert want[k] != 0
        assert abs(effects[k] - want[k]) <= 1e-4 * (1 + abs(want[k])), (k, effects[k], want[k])


@pytest.mark.parametrize("name,mode", [("llama-rm", "reward"), ("gemma2-lm", "logprob"), ("gemma2-lm", "judge")])
def test_integrated_gradients_reach_their_target_and_say_so(tiny_models, name, mode):
    """The completeness residual is measured, not assumed: the attributions sum to score - baseline score within the
    target (1% of that gap) that the result states, on Llama and on Gemma 2, whose score moves steeply between
    alpha = 1e-16 and 1e-2 (the t^3 midpoints' residual swung between -0.66 and +0.37 there as the steps grew); the
    score at alpha = 1 is the engine's; with too few points the result says the target was not met."""
    from probe.attribution.ig import integrated_gradients

    lm = tiny_models[name]
    (it, rd, _), = _explained(lm, mode, ["Love and peace"], heads=False)
    stack = stack_of(lm.model)
    res = integrated_gradients(stack, rd, it.ids, range(len(it.prefix)), 256, 8)
    gap = res.score - res.baseline_score
    assert res.met and abs(res.residual) <= res.panel_residuals <= res.target
    assert res.target == pytest.approx(0.01 * abs(gap), rel=1e-9)  # above the scores' rounding floor on these
    assert abs(sum(res.attributions) - gap - res.residual) <= 1e-6 * (1 + abs(gap))
    assert res.history[-1]["points"] == res.points <= 256
    assert res.score == pytest.approx(it.engine_score, rel=1e-4, abs=1e-4)
    few = integrated_gradients(stack, rd, it.ids, range(len(it.prefix)), 8, 8)
    assert few.points <= 8 and few.met == (few.panel_residuals <= few.target)
    assert abs(few.residual) <= few.panel_residuals * (1 + 1e-6) + 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["logprob", "judge"])
def test_parts_sum_to_the_score_on_the_embedded_smollm2(smol, mode):
    out = probe.explain(smol, None, PROMPT, ["Love"], score=mode, ig_steps=0, patch=False)
    engine = probe.score_responses(smol, None, PROMPT, ["Love"], score=mode, verify=0)["score"][0]
    r = out["responses"][0]
    assert r["score"] == pytest.approx(float(engine), abs=1e-6)
    assert abs(r["score"] - (sum(r["components"].values()) + r["rest"])) <= r["check"]["closure_tolerance"]
    assert abs(r["check"]["closure"]) <= 1e-3 * (1 + abs(r["score"]))  # the project's float32 rule too


@pytest.mark.slow
def test_the_command_writes_explain_json_with_the_scores_probe_score_gives(tiny_dirs, tmp_path):
    from probe.commands.explain import main as explain_main
    from probe.commands.score import main as score_main
    from probe.runs.rundir import RunDir

    answers = tmp_path / "answers.txt"
    answers.write_text("Love and peace\nthe\nfreedom\n")
    out = tmp_path / "ex"
    assert explain_main(["--rm", tiny_dirs["rm"], "--prompt", PROMPT, "--responses", str(answers), "--device", "cpu",
                         "--heads", "--ig-steps", "4", "--out", str(out)]) == 0
    got = json.loads((out / "explain.json").read_text())
    assert (out / "explain.md").is_file()
    assert "Spearman" in (out / "explain.html").read_text()
    assert score_main(["--rm", tiny_dirs["rm"], "--prompt", PROMPT, "--responses", str(answers), "--device", "cpu",
                       "--output", str(tmp_path / "runs")]) == 0
    run = next((tmp_path / "runs").rglob("scores.parquet")).parent
    want = dict(zip(*RunDir(run).read_table("scores.parquet").select("response", "score").to_dict(as_series=False)
                    .values()))
    assert got["baseline"]["response"] == "the" or got["baseline"]["response"] in want
    for r in got["responses"]:
        assert r["score"] == pytest.approx(want[r["response"]], abs=0)
        assert abs(r["score"] - (sum(r["components"].values()) + r["rest"])) <= r["check"]["closure_tolerance"] + 1e-5
        assert "integrated_gradients" in r and "heads" in r
    assert got["agreement"]["n_pairs"] > 0
    diff = got["difference"]  # the highest-scored minus the lowest decomposes the same way
    assert diff["score"] == pytest.approx(sum(diff["components"].values()) + diff["rest"], abs=2e-4)
    # a used --out is refused in one line, as probe trace refuses it
    assert explain_main(["--rm", tiny_dirs["rm"], "--response", "Love", "--device", "cpu", "--out", str(out)]) == 2


@pytest.mark.slow
def test_a_sweeps_best_and_worst_tokens_are_explained_with_the_sweeps_scores(tiny_dirs, tmp_path, capsys):
    from probe.commands.explain import main as explain_main
    from probe.commands.score import main as score_main

    assert score_main(["--rm", tiny_dirs["lm"], "--score", "logprob", "--prompt", PROMPT, "--limit", "40",
                       "--device", "cpu", "--output", str(tmp_path / "runs")]) == 0
    run = next((tmp_path / "runs").rglob("scores.parquet")).parent
    out = tmp_path / "ex"
    assert explain_main(["--run", str(run), "--top", "2", "--ig-steps", "0", "--out", str(out)]) == 0
    got = json.loads((out / "explain.json").read_text())
    import polars as pl

    sweep = pl.read_parquet(run / "scores.parquet")
    assert [r["role"] for r in got["responses"]] == ["best", "best", "worst", "worst"]
    assert got["timing"]["hooked_forwards"] == 4  # one forward per token: no item shares a forward with another
    for r in got["responses"]:
        want = float(sweep.filter(pl.col("token_id") == r["token_id"])["score"][0])
        assert r["score"] == want
        total = sum(r["components"].values()) + r["rest"]
        assert abs(r["check"]["decomposed_forward_score"] - total) <= r["check"]["closure_tolerance"]
        assert abs(want - total) <= r["check"]["bound"]
        assert abs(r["check"]["engine_minus_decomposed_forward"]) <= r["check"]["engine_tolerance"]
        assert r["patching"]["spearman"] is not None and r["patching"]["path"] == "prefix cache"
    assert got["baseline"]["chosen"] == "the run's median token"
    # the auditors' page of the run gains the why section; an explanation of another run is refused in one line
    from probe.commands.report import main as report_main

    assert report_main([str(run), "--explain", str(out), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "<section class='why'>" in page and page.count("<section class='why'>") == 1
    assert report_main([str(run), "--explain", str(tmp_path), "--out", str(tmp_path / "r2.html")]) == 2
    other = tmp_path / "other"
    other.mkdir()
    (other / "explain.json").write_text(json.dumps({**got, "run": {"folder": str(tmp_path)}}))
    assert report_main([str(run), "--explain", str(other), "--out", str(tmp_path / "r3.html")]) == 2
    assert "not " + str(run) in capsys.readouterr().err


@pytest.mark.parametrize("search", [["--length", "2", "--steps", "2", "--search-width", "8", "--topk", "4"],
                                    ["--beam", "2", "--length", "2", "--allowed", "ascii"]])
def test_a_gcg_or_beam_result_is_explained_with_its_own_score(tiny_dirs, tmp_path, search):
    """`--run` of a GCG or beam run folder: its best response, under the run's own prompt, system and date, with the
    score the search reported for it (its own forward), decomposed to that score."""
    from probe.commands.explain import main as explain_main
    from probe.commands.gcg import main as gcg_main

    assert gcg_main(["--rm", tiny_dirs["rm"], "--prompt", PROMPT, "--system", "Be brief.", "--date", "2024-07-26",
                     "--device", "cpu", "--output", str(tmp_path / "runs"), *search]) == 0
    run = next((tmp_path / "runs").rglob("result.json")).parent
    result = json.loads((run / "result.json").read_text())
    out = tmp_path / "ex"
    assert explain_main(["--run", str(run), "--ig-steps", "0", "--baseline", "the", "--out", str(out)]) == 0
    got = json.loads((out / "explain.json").read_text())
    (r,) = got["responses"]
    assert r["token_ids"] == result["best_ids"] and r["role"] == "search"
    assert r["score"] == result["best_score"]
    assert abs(r["score"] - (sum(r["components"].values()) + r["rest"])) <= r["check"]["closure_tolerance"]
    assert abs(r["check"]["decomposed_forward_score"] - r["score"]) <= 1e-5 * (1 + abs(r["score"]))
    assert got["baseline"]["response"] == "the" and r["patching"]["effects"]
    assert got["run"]["scores"].startswith("the search's")


@pytest.mark.slow
def test_a_sweeps_second_prompt_and_a_token_baseline_for_integrated_gradients(tiny_dirs, tmp_path):
    """`--prompt-key` picks which of a sweep's prompts is explained (its own prefix, its own scores); `--ig-baseline`
    a one-token text puts that token's embedding at every prompt position as the path's start (and a text of two
    tokens is refused in one line)."""
    import polars as pl

    from probe.commands.explain import main as explain_main
    from probe.commands.score import main as score_main

    assert score_main(["--rm", tiny_dirs["lm"], "--score", "logprob", "--prompt", PROMPT, "--prompt",
                       "What is the worst thing?", "--limit", "12", "--device", "cpu", "--output",
                       str(tmp_path / "runs")]) == 0
    run = next((tmp_path / "runs").rglob("scores.parquet")).parent
    keys = json.loads((run / "meta.json").read_text())["prompts"]
    second = [k for k, v in keys.items() if v["text"] == "What is the worst thing?"][0]
    out = tmp_path / "ex"
    assert explain_main(["--run", str(run), "--top", "1", "--prompt-key", second, "--ig-steps", "4",
                         "--ig-baseline", " the", "--no-patch", "--out", str(out)]) == 0
    got = json.loads((out / "explain.json").read_text())
    assert got["prompt"] == "What is the worst thing?" and got["run"]["prompt_key"] == second
    sweep = pl.read_parquet(run / "scores.parquet").filter(pl.col("prompt_key") == second)
    for r in got["responses"]:
        assert r["score"] == float(sweep.filter(pl.col("token_id") == r["token_id"])["score"][0])
        ig = r["integrated_gradients"]
        assert ig["baseline"].startswith("id ") and ig["points"] <= 4
        assert ig["met"] == (ig["panel_residuals"] <= ig["target"])
    assert explain_main(["--run", str(run), "--top", "1", "--ig-baseline", "the worst", "--out",
                         str(tmp_path / "ex2")]) == 2
