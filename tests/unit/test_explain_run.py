"""`probe explain --run` explains the input the run scored, or refuses in one line: a --ref sweep (an implicit reward
is no one forward's score), an --input-method paper sweep (its rows are not prefix + token ids), a GCG run made
with --chat-template (explained under that template, to the score it reported); an empty --prompt is refused."""

from __future__ import annotations

import json

import pytest

import probe
from probe.commands.explain import main as explain_main
from probe.commands.score import main as score_main
from probe.core.precision import FLOAT32_RTOL
from probe.errors import ProbeError
from tests import tiny

PROMPT = "What, in one word, is the greatest thing ever?"


def _run(root):
    return next(root.rglob("meta.json")).parent


def test_a_ref_sweep_is_refused_in_one_line(tiny_dirs, tmp_path, capsys):
    """A --ref sweep's score is beta x a log-ratio of two models: before, its token reported at 2.115 was
    decomposed as the policy's log-probability, -30.53."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref = tmp_path / "ref"
    tiny.perturbed_copy(AutoModelForCausalLM.from_pretrained(tiny_dirs["lm"]), seed=5).save_pretrained(ref)
    AutoTokenizer.from_pretrained(tiny_dirs["lm"]).save_pretrained(ref)
    assert score_main(["--rm", tiny_dirs["lm"], "--ref", str(ref), "--beta", "0.5", "--score", "logprob", "--prompt",
                       PROMPT, "--limit", "8", "--verify", "0", "--device", "cpu", "--no-progress",
                       "--output", str(tmp_path / "runs")]) == 0
    capsys.readouterr()
    out = tmp_path / "ex"
    assert explain_main(["--run", str(_run(tmp_path / "runs")), "--top", "1", "--ig-steps", "0", "--out",
                         str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "implicit reward (--ref" in err[0] and "beta 0.5" in err[0]
    assert not out.exists()


def test_a_paper_method_sweep_is_refused_in_one_line(tiny_dirs, tmp_path, capsys):
    """--input-method paper decodes, re-renders and re-tokenizes each row: before, 118 of 300 decompositions were
    not the scores the run reported."""
    assert score_main(["--rm", tiny_dirs["lm"], "--score", "logprob", "--input-method", "paper", "--prompt", PROMPT,
                       "--limit", "8", "--verify", "0", "--device", "cpu", "--no-progress",
                       "--output", str(tmp_path / "runs")]) == 0
    capsys.readouterr()
    assert explain_main(["--run", str(_run(tmp_path / "runs")), "--top", "1", "--ig-steps", "0", "--out",
                         str(tmp_path / "ex")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--input-method paper" in err[0]


RAW_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}Question: {{ m['content'] }}\n"
                "{% else %}Answer: {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")


def test_a_gcg_run_made_with_a_chat_template_is_explained_under_it(tiny_dirs, tmp_path):
    """A GCG run made with --chat-template is explained under that template (before: re-rendered with the
    tokenizer's own, 5.674 reported and 9.123 decomposed), the forward decomposed scoring what the run reported."""
    from probe.commands.gcg import main as gcg_main

    template = tmp_path / "raw.jinja"
    template.write_text(RAW_TEMPLATE)
    assert gcg_main(["--rm", tiny_dirs["rm"], "--prompt", PROMPT, "--chat-template", str(template), "--length", "2",
                     "--steps", "1", "--search-width", "4", "--topk", "4", "--device", "cpu", "--no-progress",
                     "--output", str(tmp_path / "runs")]) == 0
    run = _run(tmp_path / "runs")
    result = json.loads((run / "result.json").read_text())
    out = tmp_path / "ex"
    assert explain_main(["--run", str(run), "--ig-steps", "16", "--ig-target", "0.25", "--no-atp", "--baseline", "the",
                         "--out", str(out)]) == 0
    got = json.loads((out / "explain.json").read_text())
    (r,) = got["responses"]
    ig = r["integrated_gradients"]  # --ig-target: the residual aimed at, a quarter of the gap here; --no-atp: none
    assert ig["points"] <= 16 and ig["target"] >= 0.25 * abs(ig["score"] - ig["baseline_score"]) * (1 - 1e-12)
    assert ig["met"] == (ig["panel_residuals"] <= ig["target"]) and r["patching"]["atp"] is None
    assert r["score"] == result["best_score"]
    assert abs(r["check"]["decomposed_forward_score"] - r["score"]) <= FLOAT32_RTOL * (1 + abs(r["score"]))
    assert abs(r["check"]["engine_minus_decomposed_forward"]) <= r["check"]["engine_tolerance"]
    assert abs(r["score"] - (sum(r["components"].values()) + r["rest"])) <= r["check"]["bound"]
    assert got["run"]["inputs"]["chat_template"] == str(template)


def test_an_empty_prompt_is_refused(tiny_dirs, tiny_models, tmp_path, capsys):
    """--prompt "" was read as not given: the paper's prompt explained, and recorded in explain.json."""
    assert explain_main(["--rm", tiny_dirs["rm"], "--prompt", "", "--response", "Love", "--device", "cpu",
                         "--out", str(tmp_path / "ex")]) == 2
    assert "--prompt is empty" in capsys.readouterr().err
    assert not (tmp_path / "ex").exists()
    with pytest.raises(ProbeError, match="prompt is empty"):
        probe.explain(tiny_models["llama-rm"], None, "  ", ["Love"], score="reward", ig_steps=0)


@pytest.mark.parametrize("flag", ["--out", "--responses", "--run", "--prompt-key", "--ig-baseline", "--unit-test"])
def test_an_empty_value_of_any_named_setting_is_refused(tiny_dirs, tmp_path, capsys, flag):
    """Each of these given as "" was read as not given (the default folder, the paper's prompt key, a zero baseline)
    or reached a traceback: now one line naming the flag, before any model loads, and no folder."""
    args = ["--rm", tiny_dirs["rm"], "--device", "cpu", "--out", str(tmp_path / "ex"), flag, ""]
    if flag not in ("--responses", "--run"):
        args += ["--response", "Love"]
    assert explain_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{flag} is empty" in err[0], err
    assert not (tmp_path / "ex").exists()
