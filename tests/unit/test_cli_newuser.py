"""Bad input a new user types, found by using the commands as the README teaches: one line, exit 2, what to do."""

import pytest


def _one_line(capsys):
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    return err[0]


def test_trace_misspelt_score_mode_is_named_as_such(capsys, tmp_path):
    from probe.commands.trace import main

    assert main(["--score", "rewrd", "--response", "Love", "--out", str(tmp_path / "t")]) == 2
    line = _one_line(capsys)
    assert "not a score mode" in line and "auto, reward or logprob" in line and "judge" not in line, line
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("mode", ["judge", "rating", "judge-pair"])
def test_trace_judge_modes_keep_their_reason(capsys, tmp_path, mode):
    from probe.commands.trace import main

    assert main(["--score", mode, "--response", "Love", "--out", str(tmp_path / "t")]) == 2
    assert "judge's question" in _one_line(capsys)


def test_a_hub_data_set_on_an_unreachable_hub_fails_at_once(tmp_path, monkeypatch):
    """As for models: the Hub checked once (3 s), then `datasets` offline, not 30 s of retries before the line."""
    import socket

    import datasets
    from huggingface_hub import constants

    from probe.errors import DataFormatError
    from probe.social import hub
    from probe.social.loaders import load

    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf"))
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "0")  # restored after the test: the check sets them
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "_UNREACHABLE", False, raising=False)

    def unreachable(*args, **kwargs):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    with pytest.raises(DataFormatError, match="the Hub cannot be reached, so only caches were looked at") as err:
        load("crows_pairs", "hf:nyu-mll/crows_pairs")
    assert "\n" not in str(err.value) and "hf:nyu-mll/crows_pairs" in str(err.value)
    assert datasets.config.HF_HUB_OFFLINE is True


@pytest.mark.parametrize("rows", ["0", "-5"])
def test_report_rows_below_one_is_refused_before_reading_runs(capsys, tmp_path, rows):
    from probe.commands.report import main

    assert main([str(tmp_path / "no-run"), "--rows", rows, "--out", str(tmp_path / "r.html")]) == 2
    assert "--rows must be >= 1" in _one_line(capsys) and not (tmp_path / "r.html").exists()


def test_list_models_takes_words_to_filter_by(capsys):
    """``probe --list-models skywork`` was argparse's "invalid choice: 'skywork'" for COMMAND."""
    from probe.commands.cli import main
    from probe.models.registry import REGISTRY

    assert main(["--list-models", "SKYWORK", "qwen3"]) == 0
    heads = [ln.split("  [")[0] for ln in capsys.readouterr().out.splitlines() if not ln.startswith(" ")]
    want = sorted(n for n, s in REGISTRY.items() if "skywork" in n.lower() and "qwen3" in f"{n} {s.family}".lower())
    assert want and sorted(heads) == want
    assert main(["--list-models", "no-such-family"]) == 2
    assert "no registry entry's id, family or reader contains that" in _one_line(capsys)


def test_gcg_patience_below_one_is_refused(capsys, tmp_path):
    """``--patience 0`` ran one step and stopped, as if "no patience" meant "stop at once"."""
    from probe.commands.gcg import main

    assert main(["--patience", "0", "--output", str(tmp_path / "out"), "--no-progress"]) == 2
    assert "--patience must be >= 1" in _one_line(capsys) and not (tmp_path / "out").exists()


def _unfinished_run(root, command):
    import json

    from probe.runs.rundir import model_runs_dir

    run = model_runs_dir(root, "org/m") / "exhaustive_2026-01-01T00-00-00Z"
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({
        "experiment": "exhaustive", "status": "interrupted", "fingerprint": "old", "settings": {"n_tokens": 20000},
        "environment": {"command": command}}))
    return run


def test_a_resume_with_other_settings_gives_the_runs_own_command(tmp_path):
    """The advice was "pass its settings (or --resume DIR)", but --resume DIR does not take the run's settings: it
    is refused the same way. The run's own command line, from its meta.json, continues it."""
    from probe.runs.rundir import RunDir, ResumeError, check_resumable, no_match_message

    command = "python -m probe.exhaustive --limit 20000 --prompt 'Hi?'"
    run = _unfinished_run(tmp_path, command)
    msg = no_match_message(tmp_path, "org/m", "exhaustive", {"n_tokens": 25000})
    assert "20000 in the run, 25000 now" in msg and f"its own command: {command} --resume;" in msg, msg
    assert f"--resume {run}" not in msg
    with pytest.raises(ResumeError) as err:
        check_resumable(RunDir(run), "new", {"n_tokens": 25000})
    assert f"its own command: {command} --resume;" in str(err.value)


def test_a_batch_jobs_run_is_continued_by_the_batch(tmp_path):
    from probe.runs.rundir import no_match_message

    _unfinished_run(tmp_path, "python -m probe.batch jobs.yaml")
    msg = no_match_message(tmp_path, "org/m", "exhaustive", {"n_tokens": 25000})
    assert "run the batch again" in msg and "jobs.yaml --resume" not in msg, msg


PROMPT = "What, in one word, is the greatest thing ever?"


@pytest.fixture(scope="module")
def tiny_lm(tiny_dirs):
    import probe

    return probe.load(tiny_dirs["lm"], device="cpu", score="logprob")


@pytest.mark.parametrize("call", ["sweep", "score_responses", "trace", "load"])
def test_api_misspelt_score_mode_is_an_error(tiny_lm, tiny_dirs, call):
    """``probe.sweep(lm, None, prompt, score="rewrd")`` returned scores of another head, silently."""
    import probe
    from probe.errors import ProbeError

    with pytest.raises(ProbeError, match=r"score='rewrd': not a score mode \(use auto, reward, logprob"):
        if call == "load":
            probe.load(tiny_dirs["lm"], device="cpu", score="rewrd")
        elif call == "sweep":
            probe.sweep(tiny_lm, None, PROMPT, limit=4, verify=0, score="rewrd")
        else:
            getattr(probe, call)(tiny_lm, None, PROMPT, ["Love"], score="rewrd")


@pytest.mark.parametrize("call", ["score_responses", "trace"])
def test_api_a_lone_string_is_one_response_not_its_characters(tiny_lm, call):
    """``probe.score_responses(lm, None, prompt, "Love")`` scored 'L', 'o', 'v' and 'e'."""
    import probe

    one = getattr(probe, call)(tiny_lm, None, PROMPT, "Love")
    listed = getattr(probe, call)(tiny_lm, None, PROMPT, ["Love"])
    assert set(one["response"].to_list()) == {"Love"}
    assert one.drop(*[c for c in one.columns if c == "method"]).equals(listed.drop(
        *[c for c in listed.columns if c == "method"]))
