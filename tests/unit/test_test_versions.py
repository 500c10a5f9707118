"""experiments/test_versions.py (make test-versions): which releases it runs, and how it reads pytest's result."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

from experiments import test_versions


def test_the_newest_patch_of_every_minor_release_in_the_range(monkeypatch):
    listing = ("transformers (5.24.0)\nAvailable versions: 6.0.0, 5.24.0, 5.23.0rc1, 5.22.2, 5.22.1, 5.10.4, 5.10.10, "
               "5.2.0, 5.1.0, 5.0.0, 4.57.6\n  INSTALLED: 5.24.0\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: SimpleNamespace(stdout=listing))
    assert test_versions.minor_releases("pip") == ["5.2.0", "5.10.10", "5.22.2", "5.24.0"]


def test_pytests_closing_line_and_failures():
    out = ("....F\n=== short test summary info ===\nFAILED tests/unit/test_a.py::test_x[gemma3] - AssertionError: no\n"
           "ERROR tests/unit/test_b.py::test_y - ValueError\n"
           "2 failed, 190 passed, 63 skipped, 1 error in 301.2s (0:05:01)\n")
    assert test_versions.summary(out) == {
        "passed": 190, "failed": 3, "skipped": 63,
        "failures": ["tests/unit/test_a.py::test_x[gemma3]", "tests/unit/test_b.py::test_y"]}
    assert test_versions.summary("7 passed in 1.0s\n")["failed"] == 0


def test_a_run_that_stopped_before_its_tests_is_not_a_pass(tmp_path, monkeypatch):
    """pytest's exit 3 (a session-start error: 5.2's wrong SmolLM2 conversion was one) has no counts: the table says
    it stopped, never 0 failed."""
    monkeypatch.setattr(test_versions, "OUT", tmp_path / "versions")
    row = {"transformers": "5.2.0", "torch": "2.13.0+cpu", "tokenizers": "0.22.2", "tests_s": 45, "exit": 3,
           **test_versions.summary("INTERNALERROR> ModelLoadError\n")}
    test_versions.write({"5.2.0": row}, ["5.2.0", "5.3.0"], "torch==2.13.0")
    table = (tmp_path / "versions.md").read_text()
    assert "| 5.2.0 | 2.13.0+cpu | 0.22.2 | | | | | pytest stopped (exit 3)" in table and "| 5.3.0 | not run |" in table
