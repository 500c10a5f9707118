"""The auditors' report renders in headless Chromium and its filters and search give the rows Python gives."""

import json

import pytest

from experiments.check_report import check, rendered
from probe.fake import hashed_score, write_fake_run
from probe.report import main as report_main

TOKENS = ["love", " love", "Love", "hate", "<s>", "</s>", "peace", " war", "\ufffd", " \ufffd", "lovely", "glove",
          "</script><script>document.title='pwned'</script>", "<img src=x onerror=alert(1)>", "12", "!", "\n", " "] + \
         [f"w{i}" for i in range(300)]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    run = write_fake_run(root, "org/fake-rm", TOKENS, {"greatest": "What is greatest?", "worst": "What is worst?"},
                         hashed_score, special=["<s>", "</s>"])
    assert report_main([str(run.path), "--rows", "20"]) == 0
    return run.path / "report.html", run.path


@pytest.mark.parametrize("prompt", ["greatest", "worst"])
def test_filters_and_search_match_python(report, prompt):
    html, run_dir = report
    lines = check(html, run_dir, prompt, rows=20, query="love")
    assert len(lines) == 4


def test_hostile_token_text_stays_text(report):
    html, _ = report
    tables, _ = rendered(html, "q=script")
    cells = [c for row in tables["matches"] for c in row]
    assert any("</script><script>" in c for c in cells)  # shown as text, not executed
    dom_title = "pwned"
    assert dom_title not in html.read_text().split("<title>")[1].split("</title>")[0]


def test_report_embeds_provenance(report):
    html, run_dir = report
    text = html.read_text()
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["model"]["id"] in text and "Provenance" in text and "data:image/png;base64," in text
