"""Issue 73: best and worst lists drawn from one ranking never share an item (misalignment, ``analyze top``'s word
files, the multi-run report's page data, the single-run page, contrast's movers), YAML numbers in exponent form are
numbers (config, job and suite files), an empty ``--prompt`` (and other empty or out-of-range values that were read
as not given) is refused in one line, and the two suspicions settled: a job file's ``defaults: {prompt}`` silently
replaced its ``prompts`` (now refused), and a stopped torchrun session's other ranks' shards were never counted in
``tokens_scored`` (now credited on resume)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from probe.analysis.contrast import contrast
from probe.analysis.misalignment import misalignment
from probe.commands.analyze import main as analyze_main
from probe.errors import DataFormatError, ProbeError
from tests.fake_runs import fake_vocab, hashed_score, write_fake_run

SIX = "name,elo_score,m1,m2\nLove,10,1,2\nPeace,9,3,1\nWar,1,6,5\nHate,2,5,6\nMusic,7,2,3\nGod,8,4,4\n"
# by hand: human ranks Love 1, Peace 2, God 3, Music 4, Hate 5, War 6; m1 ranks War 1, Hate 2, God 3, Peace 4,
# Music 5, Love 6; m2 ranks Hate 1, War 2, God 3, Music 4, Love 5, Peace 6; the median of two ranks is their mean
RANK_DIFF = {"Love": 4.5, "Peace": 3.0, "War": -4.5, "Hate": -3.5, "Music": 0.5, "God": 0.0}
PROMPT = "What is the greatest thing ever?"


# --- 1. misalignment: the undervalued and overvalued lists ------------------------------------------------------
def test_misalignment_lists_are_disjoint_and_on_their_side():
    """Six items: before, head(6) of each side listed all six as undervalued and all six as overvalued (War, -4.5,
    among the undervalued). Now the items models rank below humans, then those they rank above; God (0) is in
    neither."""
    res = misalignment(pl.read_csv(SIX.encode()), "elo_score", ["m1", "m2"])
    assert dict(zip(res.items["name"], res.items["rank_diff"])) == RANK_DIFF
    assert res.most_undervalued(20) == ["Love", "Peace", "Music"]
    assert res.most_overvalued(20) == ["War", "Hate"]
    assert res.most_undervalued(2) == ["Love", "Peace"] and res.most_overvalued(1) == ["War"]
    assert res.counts() == {"undervalued": 3, "overvalued": 2, "level": 1}


def test_misalignment_cli_lists_are_disjoint_with_their_sizes(tmp_path, capsys):
    table = tmp_path / "six.csv"
    table.write_text(SIX)
    assert analyze_main(["misalignment", "--table", str(table), "--model", "m1", "--model", "m2",
                         "--out", str(tmp_path / "m")]) == 0
    got = json.loads((tmp_path / "m" / "misalignment.json").read_text())
    assert got["most_undervalued"] == ["Love", "Peace", "Music"] and got["most_overvalued"] == ["War", "Hate"]
    assert not set(got["most_undervalued"]) & set(got["most_overvalued"])
    assert got["n_items_by_side"] == {"undervalued": 3, "overvalued": 2, "level": 1}
    out = capsys.readouterr().out
    assert "most undervalued (3 of the 3 items models rank below humans, furthest first): Love, Peace, Music" in out
    assert "most overvalued (2 of the 2 items models rank above humans, furthest first): War, Hate" in out
    assert "1 item ranked as humans rank them (in neither list)" in out


# --- 2. analyze top's files, the report pages, contrast: one ranking, two disjoint ends -------------------------
def _score_cli(args: list[str]) -> int:
    from probe.commands.score import main

    return main(args)


@pytest.fixture(scope="module")
def run200(tiny_dirs, tmp_path_factory):
    """A 200-id sweep of the tiny reward model (a few of its ids are English words)."""
    out = tmp_path_factory.mktemp("run200")
    assert _score_cli(["--rm", tiny_dirs["rm"], "--device", "cpu", "--limit", "200", "--prompt", PROMPT, "--output",
                       str(out), "--no-progress", "--verify", "0"]) == 0
    (run,) = out.glob("*/exhaustive_*")
    return run


def test_analyze_top_word_files_are_disjoint_on_a_200_id_run(run200, tmp_path, capsys):
    """Before, best_words.csv and worst_words.csv both held all the run's words (the terminal said "best 2 of 4")."""
    scores = pl.read_parquet(run200 / "scores.parquet")
    vocab = pl.read_parquet(run200 / "vocab.parquet")
    n_words = int(vocab.filter(pl.col("token_id").is_in(scores["token_id"].implode()))["is_word"].sum())
    assert 2 <= n_words < 2 * 20  # the premise: fewer words than two tables of --top 20
    assert analyze_main(["top", str(run200), "--out", str(tmp_path / "top")]) == 0
    shown = capsys.readouterr().out
    files = {tag: pl.read_csv(next((tmp_path / "top").glob(f"*__{tag}.csv")))
             for tag in ("best", "worst", "best_words", "worst_words")}
    k = n_words // 2
    assert files["best_words"].height == files["worst_words"].height == k
    assert not set(files["best_words"]["token_id"]) & set(files["worst_words"]["token_id"])
    assert f"best {k} of {n_words} (words only)" in shown and f"worst {k} of {n_words} (words only)" in shown
    assert files["best"].height == files["worst"].height == 20
    assert not set(files["best"]["token_id"]) & set(files["worst"]["token_id"])
    ranked = scores.sort("score", descending=True)
    assert files["best"]["token_id"].to_list() == ranked["token_id"].head(20).to_list()
    summary = json.loads((tmp_path / "top" / "summary.json").read_text())["summary"]
    (entry,) = summary.values()
    assert entry["n_words"] == n_words and entry["per_side_words"] == k and entry["n_tokens"] == 200


def _few_word_runs(root: Path) -> list:
    """Two runs of 60 made-up tokens of which 4 are English words: fewer than two tables of 25."""
    tokens = [f"zq{i}x" for i in range(56)] + ["love", "peace", "war", "music"]
    return [write_fake_run(root, f"org/m{i}", tokens, {"greatest": PROMPT},
                           lambda k, t, i=i: hashed_score(f"{k}{i}", t)) for i in range(2)]


def test_multi_report_page_data_best_and_worst_are_disjoint(tmp_path):
    """Before, the words' best and worst tables each held all 4 words (25 rows asked of each); the all-tokens tables
    (25 of 60 each) were disjoint before too, and say how many there are."""
    from probe.analysis.sweeps import load_sweep
    from probe.report.multi import report_data

    runs = _few_word_runs(tmp_path)
    assert pl.read_parquet(runs[0].path / "vocab.parquet")["is_word"].sum() == 4  # the premise
    data = report_data([load_sweep(r.path) for r in runs], 25)
    for t in data["prompts"]["greatest"]["tables"]:
        for view, n, k in (("all", 60, 25), ("words", 4, 2)):
            best, worst = ({r[2] for r in t[view][side]} for side in ("best", "worst"))
            assert len(best) == len(worst) == k and not best & worst, view
            assert t[view]["of"] == n


def _page_tables(page: Path, hash_: str) -> dict:
    """The single-run page's best and worst tables as its script renders them (node, with a minimal DOM)."""
    harness = page.parent / "render.js"
    harness.write_text(r"""
const fs = require('fs');
const html = fs.readFileSync(process.argv[2], 'utf8');
const data = html.match(/<script id="data" type="application\/json">([\s\S]*?)<\/script>/)[1];
const script = html.match(/<script>\n([\s\S]*?)<\/script>/)[1];
function node() { return {textContent: '', className: '', value: '', checked: false, style: {}, dataset: {},
  children: [], rows: [], appendChild(x) { this.children.push(x); if (!this.value && x.value) this.value = x.value; },
  addEventListener() {}, set innerHTML(v) { this.rows = []; },
  insertRow() { const r = node(); r.insertCell = () => { const c = node(); r.children.push(c); return c; };
                this.rows.push(r); return r; }}; }
const els = {};
global.document = {getElementById: id => id === 'data' ? {textContent: data} : (els[id] = els[id] || node()),
                   createElement: () => node(), querySelectorAll: () => []};
global.location = {hash: process.argv[3]};
eval(script);
const ids = t => els[t].rows.slice(1).map(r => Number(r.children[3].textContent));
console.log(JSON.stringify({best: ids('best'), worst: ids('worst'), bestHead: els.bestHead.textContent,
                            worstHead: els.worstHead.textContent}));
""")
    out = subprocess.run(["node", str(harness), str(page), hash_], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's script")
def test_single_page_best_and_worst_tables_are_disjoint(tmp_path):
    """The single-run page's words-only tables: before, best and worst each listed all 4 words."""
    from probe.report.single import build

    run = _few_word_runs(tmp_path)[0]
    page = tmp_path / "report.html"
    page.write_text(build(run.path, rows=50))
    words = _page_tables(page, "#words=1")
    assert len(words["best"]) == len(words["worst"]) == 2 and not set(words["best"]) & set(words["worst"])
    assert words["bestHead"] == "Best 2 of 4" and words["worstHead"] == "Worst 2 of 4"
    ranked = pl.read_parquet(run.path / "scores.parquet").sort("rank", "token_id")
    ids = ranked.filter(pl.col("decoded").is_in(["love", "peace", "war", "music"]))["token_id"].to_list()
    assert words["best"] == ids[:2] and words["worst"] == ids[::-1][:2]
    every = _page_tables(page, "")
    assert len(every["best"]) == len(every["worst"]) == 30 and every["bestHead"] == "Best 30 of 60"
    assert every["best"] == ranked["token_id"].head(30).to_list()


def test_contrast_top_and_bottom_and_movers_are_disjoint():
    """All strings tied: the k best and the k worst were the same k strings (two stable sorts keep ties in one
    order). Two identical rankings: the movers listed every string twice, each with a rank change of 0."""
    v = fake_vocab([f"w{i}" for i in range(10)])
    a = v.with_columns(pl.Series("score", [10.0 - i for i in range(10)]))
    res = contrast(a, a, k=3, n_moved=10)
    assert res.moved.height == 0 and res.top_overlap == res.bottom_overlap == 1
    from probe.analysis.contrast import ends  # (new: the two ends of one ranking)

    top, bottom = ends(np.full(6, 3.5), 3)
    assert top == {0, 1, 2} and bottom == {3, 4, 5}


def test_the_plot_labels_no_token_as_both_best_and_worst(tmp_path, monkeypatch):
    """A four-token run: the distribution panel labelled its best three and worst three, two of them twice."""
    from probe.report import audit

    run = write_fake_run(tmp_path, "org/m", ["a1", "b2", "c3", "d4"], {"greatest": PROMPT})
    labels = []
    import matplotlib.axes

    original = matplotlib.axes.Axes.annotate
    monkeypatch.setattr(matplotlib.axes.Axes, "annotate",
                        lambda self, text, *a, **kw: labels.append(text) or original(self, text, *a, **kw))
    audit.plot_png(pl.read_parquet(run.path / "scores.parquet"), {}, "greatest")
    assert len(labels) == 4 and len(set(labels)) == 4


# --- 3. YAML numbers in exponent form ----------------------------------------------------------------------------
def test_yaml_reads_exponent_numbers_as_numbers(tmp_path):
    from probe.textfile import read_yaml

    f = tmp_path / "n.yaml"
    f.write_text("a: 1e-3\nb: 1E5\nc: 1.5e3\nd: .5e1\ne: '1e-3'\nf: 2.5\ng: 1_000\nh: e5\ni: 1e-3x\n")
    assert read_yaml(f) == {"a": 0.001, "b": 1e5, "c": 1500.0, "d": 5.0, "e": "1e-3", "f": 2.5, "g": 1000, "h": "e5",
                            "i": "1e-3x"}


def test_beta_1e_3_in_a_config_a_job_and_a_suite_is_0_001(tmp_path):
    """Before: "beta: '1e-3' is not a number (--beta X)" in each, while --beta 1e-3 was taken."""
    from probe.commands.args import config_from_args
    from probe.commands.batch import read_jobs
    from probe.commands.score import make_parser
    from probe.commands.social import suite_models
    from probe.config import ScoreVocabConfig, SocialConfig

    cfg = tmp_path / "c.yaml"
    cfg.write_text("rm: org/policy\nref: org/reference\nbeta: 1e-3\ndevice_memory: 8e1\n")
    config = config_from_args(ScoreVocabConfig, make_parser().parse_args(["--config", str(cfg)]))
    assert config.beta == 0.001 and config.device_memory == 80.0
    job = tmp_path / "job.yaml"
    job.write_text("defaults: {ref: org/reference, beta: 1e-3}\nmodels: [org/policy]\n")
    assert read_jobs(job)[0].beta == 0.001
    suite = tmp_path / "suite.yaml"
    suite.write_text("models:\n  - {rm: org/policy, ref: org/reference, beta: 5e-2}\ndatasets:\n  - {dataset: pairs}\n")
    assert suite_models(SocialConfig(suite=str(suite)))[0]["beta"] == 0.05


def test_analyze_rbo_p_in_exponent_form(tmp_path):
    from probe.commands.analyze import AnalysisConfig, make_parser
    from probe.commands.args import config_from_args

    cfg = tmp_path / "a.yaml"
    cfg.write_text("rbo_p: 8e-1\n")  # YAML 1.1 read 9.5e-1 (a dot, a signed exponent) but not 8e-1
    ns = make_parser().parse_args(["agreement", "x", "y", "--config", str(cfg)])
    ns.runs = tuple(ns.runs)
    assert config_from_args(AnalysisConfig, ns).rbo_p == 0.8


@pytest.fixture(scope="module")
def ref_lm(tiny_dirs, tokenizers, tmp_path_factory):
    """A second tiny causal LM of the same tokenizer, another seed: a reference model whose log-ratio is not 0."""
    from transformers import LlamaForCausalLM

    from tests import tiny

    path = tmp_path_factory.mktemp("ref") / "tiny-ref"
    tok = tokenizers["llama3"]
    tiny.build(LlamaForCausalLM, tiny.llama_config(tok), seed=1).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_cli_config_beta_1e_3_scales_the_implicit_reward(tiny_dirs, ref_lm, tmp_path):
    """probe score --config with beta: 1e-3: the run records 0.001 and its scores are 0.001 x those of beta 1."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("beta: 1e-3\n")
    common = ["--rm", tiny_dirs["lm"], "--ref", ref_lm, "--device", "cpu", "--limit", "8", "--prompt", PROMPT,
              "--no-progress", "--verify", "0"]
    assert _score_cli([*common, "--config", str(cfg), "--output", str(tmp_path / "small")]) == 0
    assert _score_cli([*common, "--output", str(tmp_path / "one")]) == 0
    (small,), (one,) = (tmp_path / "small").glob("*/exhaustive_*"), (tmp_path / "one").glob("*/exhaustive_*")
    assert json.loads((small / "meta.json").read_text())["settings"]["beta"] == 0.001
    a = pl.read_parquet(small / "scores.parquet").sort("token_id")["score"].to_numpy().astype(np.float64)
    b = pl.read_parquet(one / "scores.parquet").sort("token_id")["score"].to_numpy().astype(np.float64)
    assert np.abs(b).max() > 0
    # both float32 log-ratios of the same forwards, one scaled by 0.001 before its float32 rounding
    np.testing.assert_allclose(a, 0.001 * b, rtol=4 * np.finfo(np.float32).eps, atol=0)


# --- 4. empty values refused in one line -------------------------------------------------------------------------
def test_trace_with_an_empty_prompt_is_refused(tiny_dirs, tmp_path, capsys):
    """Before: exit 0 and a trace of the paper's prompt, which the user did not give."""
    from probe.commands.trace import main

    out = tmp_path / "t"
    assert main(["--rm", tiny_dirs["rm"], "--device", "cpu", "--prompt", "", "--response", "Love",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --prompt is empty: give a value, or leave the flag out for its default"
    assert not out.exists()


@pytest.mark.parametrize("args, flag", [(["--top", "-1"], "--top"), (["--top", "0"], "--top"),
                                        (["--permutations", "0"], "--permutations")])
def test_analyze_counts_below_one_are_refused(tmp_path, capsys, args, flag):
    """--top -1 wrote every token but the last as "best" (head(-1)); --permutations 0 gave p = 1."""
    run = write_fake_run(tmp_path, "org/m", ["a", "b", "c", "d"], {"greatest": PROMPT})
    assert analyze_main(["top", str(run.path), *args, "--out", str(tmp_path / "o")]) == 2
    assert f"{flag} must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_batch_size_0_and_label_index_below_0_are_refused():
    """GCG's --batch-size 0 was read as not given (the default); --label-index -1 passed the config and raised a
    traceback from the registry when the model loaded."""
    from probe.config import GCGConfig, ScoreVocabConfig

    with pytest.raises(ValueError, match="--batch-size must be >= 1"):
        GCGConfig(batch_size=0)
    with pytest.raises(ValueError, match="--batch-size must be >= 1"):
        GCGConfig(batch_size=-2)
    with pytest.raises(ValueError, match="--label-index must be >= 0"):
        ScoreVocabConfig(label_index=-1)
    assert ScoreVocabConfig(label_index=0).label_index == 0


def test_the_apis_batch_size_0_is_refused(tiny_dirs):
    import probe

    lm = probe.load(tiny_dirs["lm"], device="cpu", score="logprob")
    with pytest.raises(ProbeError, match="batch_size=0"):
        probe.score_responses(lm, None, PROMPT, ["Love"], batch_size=0)


def test_a_judge_prompts_empty_system_is_an_empty_system_turn(tmp_path):
    """system: "" in a judge prompt file was read as null: the template's own system prompt ran instead."""
    from probe.core.judges import load_judge_prompt

    f = tmp_path / "judge.yaml"
    f.write_text('kind: rating\nsource: a test\nsystem: ""\nuser: "Rate {response} for {prompt}"\nratings: [1, 9]\n')
    assert load_judge_prompt(str(f), "rating").system == ""
    f.write_text('kind: rating\nsource: a test\nsystem: null\nuser: "Rate {response} for {prompt}"\nratings: [1, 9]\n')
    assert load_judge_prompt(str(f), "rating").system is None


def test_a_suites_empty_data_and_empty_model_are_refused(tmp_path):
    """data: "" resolved to the suite file's own folder; a model entry with no value ran the embedded model."""
    from probe.commands.social import suite_entries, suite_models
    from probe.config import SocialConfig

    suite = tmp_path / "suite.yaml"
    suite.write_text('datasets:\n  - {dataset: pairs, data: ""}\n')
    with pytest.raises(DataFormatError, match=r"datasets\[1\]: data is empty"):
        suite_entries(SocialConfig(suite=str(suite)))
    for models in ("models:\n  - \n", "models:\n  - {rm: }\n", "models:\n  - {rm: org/m}\n  - \n"):
        suite.write_text(models + "datasets:\n  - {dataset: pairs}\n")
        with pytest.raises(DataFormatError, match=r"models\[\d\]: no model"):
            suite_models(SocialConfig(suite=str(suite)))
    suite.write_text("models:\ndatasets:\n  - {dataset: pairs}\n")
    with pytest.raises(DataFormatError, match="models is empty"):
        suite_models(SocialConfig(suite=str(suite)))


# --- 5. the suspicions ------------------------------------------------------------------------------------------
def test_a_job_files_default_prompt_and_its_prompts_are_refused_together(tmp_path):
    """Suspicion 1, confirmed: with both, every job silently scored the defaults' prompt and not the file's prompts."""
    from probe.commands.batch import read_jobs

    job = tmp_path / "job.yaml"
    job.write_text("prompts: ['Name a colour.']\ndefaults: {prompt: 'Name a fruit.'}\nmodels: [org/m]\n")
    with pytest.raises(DataFormatError, match="prompts and defaults: prompt both"):
        read_jobs(job)
    # each alone, and a model's own prompt for that model, are what they say
    job.write_text("defaults: {prompt: 'Name a fruit.'}\nmodels: [org/m]\n")
    assert read_jobs(job)[0].prompt == ("Name a fruit.",)
    job.write_text("prompts: ['Name a colour.']\nmodels: [org/m, {rm: org/n, prompt: 'Name a fruit.'}]\n")
    assert [j.prompt for j in read_jobs(job)] == [("Name a colour.",), ("Name a fruit.",)]


def test_a_job_with_a_prompts_file_scores_that_files_prompts_only(tmp_path):
    """Without a prompts key, the paper's three were added to a job's prompts file (--prompts FILE alone: the file's)."""
    from probe.commands.batch import read_jobs
    from probe.core.prompts import PAPER_PROMPTS, grid_for

    (tmp_path / "p.yaml").write_text("colour: Name a colour.\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"defaults: {{prompts: {tmp_path / 'p.yaml'}}}\nmodels: [org/m]\n")
    assert [p.key for p in grid_for(read_jobs(job)[0])] == ["colour"]
    job.write_text("models: [org/m]\n")  # no file: the paper's three, keyed by their texts as before
    assert read_jobs(job)[0].prompt == tuple(PAPER_PROMPTS.values())


def _sweep_args(tiny_dirs, out: Path, *extra: str) -> list[str]:
    return ["--rm", tiny_dirs["rm"], "--device", "cpu", "--limit", "96", "--shard-size", "16", "--prompt", PROMPT,
            "--output", str(out), "--no-progress", "--verify", "0", *extra]


def test_shards_a_stopped_session_left_uncounted_are_counted_on_resume(tiny_dirs, tmp_path, monkeypatch):
    """Suspicion 2, confirmed: under torchrun only rank 0 writes meta.json, and it learns the other ranks' counts when
    the prompt ends; a session stopped mid-prompt counted rank 0's shards only. Here: a session that recorded 2 shards
    (32 tokens) and left 4 (64) on disk, as rank 0 and rank 1 would. Before, the run's tokens_scored was 64 of 96."""
    from probe.commands.score import main
    from tests.unit.test_sweep import Crash, crash_after

    assert main(_sweep_args(tiny_dirs, tmp_path / "full")) == 0
    (full,) = (tmp_path / "full").glob("*/exhaustive_*")
    crash_after(monkeypatch, 2)
    with pytest.raises(Crash):
        main(_sweep_args(tiny_dirs, tmp_path / "cut"))
    monkeypatch.undo()
    (cut,) = (tmp_path / "cut").glob("*/exhaustive_*")
    (key,) = json.loads((cut / "meta.json").read_text())["prompts"]
    for s in (2, 3):  # the other rank's shards, on disk and in no count
        shutil.copy(full / "checkpoints" / key / f"shard_{s:06d}.npy", cut / "checkpoints" / key)
    assert json.loads((cut / "meta.json").read_text())["timing"]["prompts"][key]["tokens_scored"] == 32
    assert main(_sweep_args(tiny_dirs, tmp_path / "cut", "--resume")) == 0
    timing = json.loads((cut / "meta.json").read_text())["timing"]
    assert timing["prompts"][key]["tokens_scored"] == 96
    assert [s["tokens_scored"] for s in timing["sessions"]] == [64, 32]  # the last session scored shards 4 and 5
    assert timing["sessions"][0]["tokens_scored_found_on_resume"] == 32
    assert pl.read_parquet(cut / "scores.parquet").equals(pl.read_parquet(full / "scores.parquet"))


def test_response_shards_a_stopped_session_left_uncounted_are_counted_on_resume(tiny_dirs, tmp_path, monkeypatch):
    """The same for a response run: 12 responses x 2 prompts in shards of 5; a session that counted 2 shards (10
    responses) and left 3 (15) on disk."""
    from probe.commands.score import main
    from tests.unit.test_responses import _args
    from tests.unit.test_sweep import Crash, crash_after

    assert main(_args(tiny_dirs, tmp_path, "full")) == 0
    (full,) = (tmp_path / "full").glob("*/responses_*")
    crash_after(monkeypatch, 2)
    with pytest.raises(Crash):
        main(_args(tiny_dirs, tmp_path, "cut"))
    monkeypatch.undo()
    (cut,) = (tmp_path / "cut").glob("*/responses_*")
    (cut / "checkpoints" / "worst_ever_one").mkdir()
    shutil.copy(full / "checkpoints" / "worst_ever_one" / "shard_000000.npy", cut / "checkpoints" / "worst_ever_one")
    assert main(_args(tiny_dirs, tmp_path, "cut", "--resume")) == 0
    sessions = json.loads((cut / "meta.json").read_text())["timing"]["sessions"]
    assert [s["responses_scored"] for s in sessions] == [15, 9] and sum(s["responses_scored"] for s in sessions) == 24
    assert pl.read_parquet(cut / "scores.parquet").equals(pl.read_parquet(full / "scores.parquet"))


@pytest.mark.slow
def test_a_torchrun_sweep_stopped_by_a_dying_rank_counts_every_token_once(tiny_dirs, tmp_path):
    """Suspicion 2 under torchrun itself: rank 1 dies before its third shard (its first two are on disk, never in
    rank 0's count); resumed by one process, the run's tokens_scored is every token once (96), as its sessions'."""
    from probe.commands.score import main
    from tests.unit.test_rows_torchrun import killed_torchrun

    killed_torchrun(tmp_path, "probe.commands.score", _sweep_args(tiny_dirs, tmp_path / "cut"), 1, 3,
                    "probe.runs.rundir:RunDir.write_shard")
    (cut,) = (tmp_path / "cut").glob("*/exhaustive_*")
    (key,) = json.loads((cut / "meta.json").read_text())["prompts"]
    assert (cut / "checkpoints" / key / "shard_000003.npy").is_file()  # rank 1's second shard
    assert main(_sweep_args(tiny_dirs, tmp_path / "cut", "--resume")) == 0
    timing = json.loads((cut / "meta.json").read_text())["timing"]
    assert timing["prompts"][key]["tokens_scored"] == 96
    assert sum(s["tokens_scored"] for s in timing["sessions"]) == 96
