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
