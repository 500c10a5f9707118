"""What a new user reads first: ``probe --help`` and each command's ``--help`` name every command and every default."""

import pytest

from probe.commands.cli import main


def _help(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines: compare with the spaces collapsed


def test_top_level_help_names_every_command_and_list_models(capsys):
    from probe.commands.cli import SUBCOMMANDS

    out = _help(capsys, ["--help"])
    summary = out.split("positional arguments")[0]  # the description, above argparse's own list of subcommands
    for name in SUBCOMMANDS:
        assert name in summary.split("console script:")[1].split(".")[0], name
    assert "probe --list-models" in out


@pytest.mark.parametrize("command", ["score", "gcg", "social"])
def test_a_default_of_zero_is_shown(capsys, command):
    # a default of 0 equals False: it was taken for "no default" and left out of --help
    out = _help(capsys, [command, "--help"])
    seed = out.split("--seed SEED ")[1].split(" --")[0]
    assert "(default: 0)" in seed, seed


def test_boolean_switches_off_by_default_stay_quiet(capsys):
    out = _help(capsys, ["score", "--help"])
    trust = out.split("--trust-remote-code, --no-trust-remote-code ")[1].split(" --")[0]
    assert "default" not in trust, trust


@pytest.mark.parametrize("command", ["score", "gcg", "social", "trace"])
def test_every_command_that_loads_a_model_takes_verbose(capsys, command):
    assert "-v, --verbose" in _help(capsys, [command, "--help"])


def test_chat_template_help_names_every_shipped_template():
    import re

    from probe.commands.score import make_parser
    from probe.models.chat_templates import template_names

    action = next(a for a in make_parser()._actions if "--chat-template" in a.option_strings)
    words = set(re.split(r"[\s,;:()]+", action.help))
    missing = [name for name in template_names() if name not in words]
    assert not missing, missing


def test_probe_version_names_rm_probe_torch_and_transformers(capsys):
    from importlib.metadata import version

    from probe.commands.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out == (f"rm-probe {version('rm-probe')} (torch {version('torch')}, "
                   f"transformers {version('transformers')})")
