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


def test_bad_prompt_file_row(capsys, tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("good: What is best?\nbad: 42\n")
    _assert_clean_error(*_run(capsys, tmp_path, "--prompts", str(f)), tmp_path, r"p\.yaml: prompt 'bad' is a int")
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
