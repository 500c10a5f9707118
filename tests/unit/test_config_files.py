"""``--config`` files, ``probe batch`` job files and ``probe social`` suites are checked as the command line checks
its flags: a value of the wrong type is refused in one line naming the file and the setting (exit 2), never
coerced (``limit: 2.5``) or iterated (``prompt: "What is good?"`` is one prompt, as one --prompt is). An empty or
blank value of a setting that names something is refused on the command line too."""

import pytest

from probe.commands.cli import main
from probe.errors import DataFormatError


def _main(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err.strip()


def _one_line(err: str) -> str:
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("text, setting", [
    ("prompt: 5\n", "prompt"),
    ("prompt: 7\nlimit: 8\n", "prompt"),
    ("score: bogus\n", "score"),
    ("limit: 2.5\n", "limit"),
    ('limit: "abc"\n', "limit"),
    ("limit: 0\n", "limit"),
    ("progress: 1\n", "progress"),
    ("score:\n", "score"),
    ("prompt: []\n", "prompt"),
    ("revision: 1234567\n", "revision"),
    ("top: true\n", "top"),
    ("beta: x\n", "beta"),
    ("- limit: 3\n", None),
    ("", None),
])
def test_a_config_value_of_the_wrong_type_is_refused(capsys, tmp_path, text, setting):
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    code, err = _main(capsys, "score", "--rm", "smollm2", "--config", str(path), "--dry-run")
    assert code == 2
    _one_line(err)
    assert str(path) in err
    if setting:
        assert f": {setting}" in err


def _config(*argv):
    from probe.commands.args import config_from_args
    from probe.commands.score import make_parser
    from probe.config import ScoreVocabConfig

    return config_from_args(ScoreVocabConfig, make_parser().parse_args(list(argv)))


def test_a_config_gives_what_the_same_flags_give(tmp_path):
    path = tmp_path / "settings.yaml"
    path.write_text('prompt: "What is good?"\ndate: 2024-07-26\nlimit: 8\nprogress: false\n')
    from_file = _config("--config", str(path))
    from_flags = _config("--prompt", "What is good?", "--date", "2024-07-26", "--limit", "8", "--no-progress")
    assert from_file == from_flags
    assert from_file.prompt == ("What is good?",)  # one prompt, not one per character


@pytest.mark.parametrize("args", [
    ("--rm", ""), ("--rm", " "), ("--responses", ""), ("--prompts", " "), ("--systems", ""), ("--output", ""),
    ("--response-column", ""), ("--device", ""), ("--chat-template", ""), ("--revision", ""),
    ("--device-map", ""), ("--device-memory", "0"), ("--device-memory", "nan"), ("--device-memory", "-1"),
])
def test_an_empty_value_on_the_command_line_is_refused(capsys, args):
    code, err = _main(capsys, "score", "--dry-run", "--limit", "3", *args)
    assert code == 2
    assert args[0] in _one_line(err)


@pytest.mark.parametrize("argv", [
    ("trace", "--response", "hi", "--out", ""), ("report", "x", "--out", ""), ("analyze", "top", "x", "--out", " "),
    ("social", "--dataset", "crows_pairs", "--split", " "), ("gcg", "--init", ""), ("gcg", "--output", ""),
])
def test_an_empty_value_of_other_commands_is_refused(capsys, argv):
    code, err = _main(capsys, *argv)
    assert code == 2
    assert argv[-2] in _one_line(err)


def _jobs(tmp_path, text):
    path = tmp_path / "jobs.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, where", [
    ("models:\n  - dtype: float32\n", r"models\[1\]: no rm"),
    ("defaults:\n  colour: red\nmodels:\n  - rm: smollm2\n  - rm: gemma3-270m\n", r"defaults: unknown settings"),
    ("models:\n  - rm: smollm2\n    limit: 2.5\n", r"models\[1\]: limit: 2.5"),
    ('defaults:\n  limit: "abc"\nmodels:\n  - rm: smollm2\n', r"defaults: limit: 'abc'"),
    ("defaults:\n  score: bogus\nmodels:\n  - rm: smollm2\n", r"defaults: score: 'bogus'"),
    ("defaults:\n  limit: 0\nmodels:\n  - rm: smollm2\n", r"defaults: limit: --limit must be >= 1"),
    ("prompts: [5]\nmodels:\n  - rm: smollm2\n", r"prompts\[1\]: 5"),
    ("models:\n  - null\n", r"models\[1\]: null"),
    ("models: []\n", r"'models' list"),
    ("model:\n  - rm: smollm2\n", r"'models' list"),
])
def test_a_job_file_is_checked_as_the_command_line(tmp_path, text, where):
    from probe.commands.batch import read_jobs

    path = _jobs(tmp_path, text)
    with pytest.raises(DataFormatError, match=where) as err:
        read_jobs(path)
    assert str(path) in str(err.value)


def test_a_job_files_one_prompt_is_one_prompt(tmp_path):
    from probe.commands.batch import read_jobs

    (job,) = read_jobs(_jobs(tmp_path, 'prompts: "What is good?"\nmodels:\n  - smollm2\n'))
    assert job.prompt == ("What is good?",)


@pytest.mark.parametrize("text, where", [
    ("models:\n  - rm: smollm2\n    score: bogus\ndatasets:\n  - dataset: crows_pairs\n",
     r"models\[1\]: score: 'bogus'"),
    ("models:\n  - rm: 5\ndatasets:\n  - dataset: crows_pairs\n", r"models\[1\]: rm: 5"),
    ("models:\n  - rm: smollm2\n    beta: 0\ndatasets:\n  - dataset: crows_pairs\n", r"models\[1\]: --beta 0"),
    ("datasets:\n  - dataset: crows_pairs\n    limit: 2.5\n", r"datasets\[1\]: limit: 2.5"),
    ("datasets:\n  - dataset: crows_pairs\n    limit: 0\n", r"datasets\[1\]: limit: 0"),
    ("datasets:\n  - dataset: crows_pairs\n    split: 1\n", r"datasets\[1\]: split: 1"),
])
def test_a_social_suite_is_checked_as_the_command_line(capsys, tmp_path, text, where):
    import re

    path = tmp_path / "suite.yaml"
    path.write_text(text)
    code, err = _main(capsys, "social", "--suite", str(path), "--output", str(tmp_path / "out"))
    assert code == 2
    assert re.search(where, _one_line(err)), err


def test_one_text_given_as_the_prompts_is_one_prompt():
    """The API's ``prompt="What is good?"`` is one prompt, as one --prompt is (it was one per character)."""
    from probe.config import ScoreVocabConfig

    assert ScoreVocabConfig(prompt="What is good?").prompt == ("What is good?",)
    assert ScoreVocabConfig(prompt=("a?", "b?")).prompt == ("a?", "b?")
