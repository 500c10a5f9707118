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
