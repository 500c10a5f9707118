"""The report's numbers, recomputed by the test from scores.parquet and meta.json: the best and worst rows, the
agreement, percentile and identity-rank cells of the multi-model page, and the provenance table's values (not
compared with the functions that built the page)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import numpy as np
import polars as pl
import pytest
from scipy import stats as sps

from probe.report import multi, single
from tests.fake_runs import hashed_score, write_fake_run

PROMPTS = {"greatest": "What is greatest?"}
TOKENS = ["love", "hate", "peace", "war", "joy", "Black", "black", " Black", "women", "Muslims", "Islam", "Jews",
          " women", "gay"] + [f"w{i}" for i in range(120)]


class Tables(HTMLParser):
    """Every <table id=...> of a page as a list of rows of cell texts."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._id, self._row, self._cell = None, None, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self._id = attrs.get("id") or attrs.get("class")
            self.tables[self._id] = []
        elif tag == "tr" and self._id is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[self._id].append(self._row)
            self._row = None
        elif tag == "table":
            self._id = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def _tables(page: str) -> dict[str, list[list[str]]]:
    parser = Tables()
    parser.feed(page)
    return parser.tables


def _data(page: str) -> dict:
    return json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S)[1]
                      .replace("<\\/", "</"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return [write_fake_run(root, f"org/m{i}", TOKENS, PROMPTS, lambda k, t, i=i: hashed_score(f"{k}{i % 2}{i}", t))
            for i in range(3)]


def _scores(run) -> pl.DataFrame:
    return pl.read_parquet(run.path / "scores.parquet").sort("token_id")


def test_multi_model_page_cells_recomputed(runs):
    page = multi.build([r.path for r in runs], rows=8)
    tables, data = _tables(page), _data(page)
    s = [_scores(r) for r in runs]
    labels = data["labels"]
    n = len(TOKENS)
    # agreement: Kendall tau-b on the token ids (one tokenizer), formatted to 3 places
    agree = tables["agreement-greatest"]
    assert agree[0][1:] == [f"tau-b {lab}" for lab in labels]
    for i, row in enumerate(agree[1:]):
        for j, cell in enumerate(row[1:]):
            want = 1.0 if i == j else sps.kendalltau(s[i]["score"], s[j]["score"]).statistic
            assert cell == f"{want:.3f}", (i, j)
    # disagreement: rank percentiles (average ties), 0 = best, 100 = worst; the largest spread first
    pct = [100 * (sps.rankdata(-d["score"].to_numpy(), method="average") - 1) / (n - 1) for d in s]
    spread = np.max(pct, 0) - np.min(pct, 0)
    rows = tables["disagreement-greatest"][1:]
    assert [r[0] for r in rows] == [TOKENS[k] for k in np.argsort(-spread, kind="stable")[: len(rows)]]
    for r in rows:
        k = TOKENS.index(r[0])
        assert float(r[1]) == pytest.approx(round(spread[k], 1))
        assert [float(c) for c in r[2:]] == pytest.approx([round(p[k], 1) for p in pct])
    # identity terms: the best rank among tokens whose word form is the term, out of the vocabulary
    ident = {r[0]: r[2:] for r in tables["identity-greatest"][1:]}
    assert {"Black", "Muslims", "Jews", "Islam"} <= set(ident)
    for term in ("Black", "Muslims", "Jews", "Islam"):
        for d, cell in zip(s, ident[term]):
            forms = d.filter(pl.col("decoded").str.strip_chars().str.to_lowercase() == term.lower())
            best = int(forms["rank"].min())
            assert cell == f"{best:,} / {n:,} ({100 * best / n:.1f}%)", term
    # the best and worst rows of every model: ids, ranks and scores as scores.parquet has them
    for d, t in zip(s, data["prompts"]["greatest"]["tables"]):
        ranked = d.sort("rank", "token_id")
        best, worst = t["all"]["best"], t["all"]["worst"]
        assert [r[2] for r in best] == ranked["token_id"].head(8).to_list()
        assert [r[0] for r in best] == ranked["rank"].head(8).to_list()
        assert [r[2] for r in worst] == ranked.reverse()["token_id"].head(8).to_list()
        np.testing.assert_allclose([r[1] for r in best], ranked["score"].head(8).to_numpy(), rtol=1e-6)


def test_single_page_scores_and_provenance_recomputed(runs):
    run = runs[0]
    meta = run.read_meta()
    meta["environment"].update(git_commit="0123456789abcdef0123456789abcdef01234567",
                               command=["python", "-m", "probe.exhaustive", "--rm", "org/m0"])
    meta["model"].update(dtype="torch.bfloat16", device="cuda:0")
    meta["prompts"]["greatest"].update(prefix_ids=[1, 2, 3, 4], prefix_text="<s>user: What is greatest?",
                                       suffix_ids=[9, 10], suffix_text="</s>")
    run.write_meta(meta)
    page = single.build(run.path, rows=10)
    d = _scores(run)
    prov = {r[0]: r[1] for r in _tables(page)["prov"] if len(r) == 2}
    assert prov["model"].startswith("org/m0")
    assert prov["git commit"] == "0123456789abcdef0123456789abcdef01234567"
    assert prov["command"] == "python -m probe.exhaustive --rm org/m0"
    assert prov["scored"] == f"{d.height:,} tokens per prompt"
    assert prov["dtype / device"] == "torch.bfloat16 / cuda:0"
    assert "prefix (4 ids): '<s>user: What is greatest?'" in prov["prompt greatest"]
    assert "suffix ids [9, 10]: '</s>'" in prov["prompt greatest"]
    # the embedded rows: ids in rank order, each score the same float32, each rank 1 + the number of better scores
    got = _data(page)["prompts"]["greatest"]
    values = d["score"].to_numpy()
    by_id = dict(zip(d["token_id"].to_list(), values))
    order = sorted(by_id, key=lambda t: (-by_id[t], t))
    assert got["ids"] == order
    assert np.array_equal(np.float32(got["scores"]), np.float32([by_id[t] for t in order]))
    assert got["ranks"] == [1 + int((values > by_id[t]).sum()) for t in order]
