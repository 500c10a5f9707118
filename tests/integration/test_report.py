"""The auditors' report renders in headless Chromium and its filters and search give the rows Python gives."""

import json

import pytest

from experiments.check_report import check, rendered
from tests.fake_runs import hashed_score, write_fake_run
from probe.commands.report import main as report_main

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


@pytest.fixture(scope="module")
def multi_report(tmp_path_factory):
    """Three fake runs: two of one tokenizer (two score functions), one of another tokenizer."""
    root = tmp_path_factory.mktemp("multi")
    prompts = {"greatest": "What is greatest?", "worst": "What is worst?"}
    other = ["love", " Love", "peace", "Black", " Muslim", "gay", "war", "hate"] + [f"v{i}" for i in range(200)]
    runs = [write_fake_run(root, "org/rm-a", TOKENS + ["Black", " Muslim"], prompts, hashed_score),
            write_fake_run(root, "org/rm-b", TOKENS + ["Black", " Muslim"], prompts,
                           lambda key, text: -hashed_score(key, text)),
            write_fake_run(root, "other/lm-c", other, prompts, hashed_score)]
    out = root / "audit.html"
    assert report_main([*(str(r.path) for r in runs), "--out", str(out)]) == 0
    return out, [r.path for r in runs]


def test_multi_model_report_matches_python_in_a_browser(multi_report):
    from experiments.check_report import check_multi

    html, runs = multi_report
    assert len(check_multi(html, runs)) == 4


def test_multi_model_report_sections(multi_report):
    from experiments.check_report import rendered

    html, runs = multi_report
    tables, _ = rendered(html, "prompt=greatest")
    identity = {r[0]: r for r in tables["identity-greatest"]}
    assert {"Black", "Muslim"} <= set(identity)  # the tokens ' Muslim' and 'Black' match single-word terms
    agree = tables["agreement-greatest"]
    assert [r[0] for r in agree] == ["rm-a [reward]", "rm-b [reward]", "lm-c [reward]"]
    assert agree[0][2] == "-1.000"  # rm-b's scores are rm-a's negated: tau-b -1 on their shared vocabulary
    text = html.read_text()
    assert text.count("<details>") == 3 and "strings the models disagree on most" in text
