"""Issue 56: a resume or a batch job with another --seed (two random heads: two null models), a pairwise social item
whose options end in whitespace (each order rendered from its text), and two runs of one model id side by side
(social suite tables, the value analysis)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from probe.errors import ProbeError
from tests.unit.test_pairwise import PROMPT, REFERENCE, slic, slic_dir  # noqa: F401  (module fixtures)


# --- 2. a pairwise model in probe social: the second order rendered from the option's text ----------------------------
def _own_forward_score(lm, text: str) -> float:
    """SlicPairPM's score of ``text`` against the reference, each order rendered from the texts by the pipeline's own
    input (`PairwiseConversation.render_ids`) and run through the model's own forward: the mean over both orders of
    P(candidate chosen) = sigmoid(logit A - logit B) at the last position."""
    from probe.core.pairwise import PairwiseConversation

    a, b = (lm.tokenizer.encode(x, add_special_tokens=False)[0] for x in "AB")
    p = []
    for order in (0, 1):
        ids = PairwiseConversation(PROMPT, lm.pairwise, order=order).render_ids(lm.tokenizer, text)
        with torch.no_grad():
            logits = lm.model(torch.tensor([ids])).logits[0, -1].double()
        d = float(logits[a] - logits[b])
        p.append(1 / (1 + np.exp(-d)) if order == 0 else 1 / (1 + np.exp(d)))
    return float(np.mean(p))


def test_pairwise_social_options_ending_in_whitespace_are_rendered_in_each_order(slic):  # noqa: F811
    """Llama 3's template trims the user turn: in the second order the candidate ends it, so 'foam\\n' and 'foam '
    lose their whitespace there. The social scores equal both orders rendered from the text (the old path moved the
    first order's ids, newline and space included, into the second order)."""
    from probe.core.pairwise import PairwiseConversation
    from probe.social.items import Item
    from probe.social.scoring import score_items

    options = ("The kettle is full of foam\n", "The kettle is full of foam ", "The kettle is full of foam")
    second = [PairwiseConversation(PROMPT, slic.pairwise, order=1).render_ids(slic.tokenizer, o) for o in options]
    assert second[0] == second[2] == second[1]  # the premise: the template trims the whitespace in the second order
    item = Item("pairs", "safety", "ws-1", PROMPT, options, ("a", "b", "c"))
    df = score_items(slic, "reward", [item], verify=2)
    want = [_own_forward_score(slic, o) for o in options]
    np.testing.assert_allclose(df.sort("option")["score"].to_numpy(), want, rtol=1e-5, atol=1e-6)
    assert abs(want[0] - want[2]) > 1e-6  # the first order still sees the newline: the options differ


# --- 1. --seed draws a random head: part of what identifies a run ------------------------------------------------------
RESPONSES = ["Love", "The Beatles", "nature and life", "self-sacrifice", "Water", "Music", "Time", "Art", "Peace",
             "Kindness"]


def _unfinish(run: Path, shard: Path) -> None:
    """The run as a kill leaves it: unfinished, one shard missing."""
    meta = json.loads((run / "meta.json").read_text())
    meta["status"] = "interrupted"
    (run / "meta.json").write_text(json.dumps(meta))
    shard.unlink()


def _response_args(tiny_dirs, tmp_path, *extra):
    (tmp_path / "r.txt").write_text("\n".join(RESPONSES) + "\n")
    return ["--rm", tiny_dirs["lm"], "--score", "reward", "--allow-random-head", "--device", "cpu", "--responses",
            str(tmp_path / "r.txt"), "--prompt", PROMPT, "--output", str(tmp_path / "out"), "--no-progress",
            "--shard-size", "5", "--verify", "0", *extra]


def test_a_response_run_is_not_resumed_with_another_seeds_random_head(tiny_dirs, tmp_path, capsys):
    """A random head is drawn from --seed: the seed is in the run's weights identity, so --resume with another seed
    is refused in one line naming it (before: the kept shards of seed 0's head beside new ones of seed 1's), and
    the same seed resumes to the same numbers."""
    from probe.commands.score import main

    assert main(_response_args(tiny_dirs, tmp_path)) == 0
    (run,) = (tmp_path / "out").glob("*/responses_*")
    meta = json.loads((run / "meta.json").read_text())
    assert meta["settings"]["weights"]["random_head"] == {"parameters": ["score.weight"], "seed": 0}
    assert meta["model"]["weights"]["random_head"]["seed"] == 0
    whole = pl.read_parquet(run / "scores.parquet")
    _unfinish(run, next((run / "checkpoints").rglob("shard_*.npy")))
    capsys.readouterr()
    for resume in (["--resume", str(run)], ["--resume"]):
        assert main(_response_args(tiny_dirs, tmp_path, "--seed", "1", *resume)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "weights.random_head.seed (--seed): 0 in the run, 1 now" in err[0], err
    assert main(_response_args(tiny_dirs, tmp_path, "--resume")) == 0
    assert pl.read_parquet(run / "scores.parquet").equals(whole)
    # a new run with another seed is another null model: other numbers
    assert main(_response_args(tiny_dirs, tmp_path, "--seed", "1")) == 0
    (other,) = set((tmp_path / "out").glob("*/responses_*")) - {run}
    assert not np.allclose(pl.read_parquet(other / "scores.parquet")["score"].to_numpy(), whole["score"].to_numpy())


def test_a_sweep_with_another_seed_is_not_resumed(tiny_dirs, tmp_path, capsys):
    from probe.commands.score import main

    args = ["--rm", tiny_dirs["lm"], "--score", "reward", "--allow-random-head", "--device", "cpu", "--prompt", PROMPT,
            "--limit", "40", "--shard-size", "20", "--verify", "2", "--output", str(tmp_path / "out"), "--no-progress"]
    assert main(args) == 0
    (run,) = (tmp_path / "out").glob("*/exhaustive_*")
    _unfinish(run, next((run / "checkpoints").rglob("shard_*.npy")))
    capsys.readouterr()
    assert main([*args, "--seed", "3", "--resume", str(run)]) == 2
    assert "weights.random_head.seed (--seed): 0 in the run, 3 now" in capsys.readouterr().err


def test_a_batch_job_with_another_seed_is_not_skipped_as_done(tiny_dirs, tmp_path):
    """probe batch: a job that differs from a finished one only by its seed (a random head) is a new job; without a
    random head the seed is not part of the job (the verification sample alone), as before."""
    import yaml

    from probe.commands.batch import read_jobs, state
    from probe.commands.score import run

    def jobs(seed: int, random_head: bool = True):
        data = {"defaults": {"device": "cpu", "output": str(tmp_path / "out"), "limit": 30, "shard_size": 30,
                             "verify": 0, "progress": False, "seed": seed},
                "prompts": [PROMPT],
                "models": [{"rm": tiny_dirs["lm"], "score": "reward", "allow_random_head": True} if random_head else
                           {"rm": tiny_dirs["rm"]}]}
        (tmp_path / "jobs.yaml").write_text(yaml.safe_dump(data))
        return read_jobs(tmp_path / "jobs.yaml")

    (job0,), (job1,) = jobs(0), jobs(1)
    run(job0)
    assert state(job0)[0] == "complete" and state(job1) == ("new", None)
    (plain0,), (plain1,) = jobs(0, False), jobs(1, False)
    assert plain0.job_key() == plain1.job_key()


def test_a_social_run_is_not_resumed_with_another_seed(tiny_dirs, social_data, tmp_path, capsys):
    """probe social: the random head's seed is in the weights identity, the bootstrap's (not 0) in the settings; a
    resume with another seed is refused in one line, a suite's --resume starts a new run for the other seed."""
    from probe.commands.social import main

    args = ["--rm", tiny_dirs["lm"], "--score", "reward", "--allow-random-head", "--dataset", "crows_pairs", "--data",
            str(social_data / "crows_pairs" / "crows_pairs_anonymized.csv"), "--limit", "3", "--device", "cpu",
            "--no-progress", "--output", str(tmp_path / "s")]
    assert main(args) == 0
    (run,) = (tmp_path / "s").glob("*/social_*")
    meta = json.loads((run / "meta.json").read_text())
    meta["status"] = "interrupted"
    (run / "meta.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert main([*args, "--seed", "2", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the line naming the model loaded
    assert err.startswith("error:") and "weights.random_head.seed (--seed): 0 in the run, 2 now" in err, err
    assert "seed (--seed): null in the run, 2 now" in err  # the bootstrap's seed too
    assert main([*args, "--resume", str(run)]) == 0
    assert json.loads((run / "meta.json").read_text())["status"] == "complete"


# --- 3. two runs of one model id side by side ---------------------------------------------------------------------------
def test_labels_tell_runs_of_one_model_apart_by_what_differs():
    from probe.analysis.sweeps import labels_for

    def meta(mode="reward", revision=None, seed=None, method=None, dtype="torch.float32"):
        weights = {"files_sha256": "x", **({"random_head": {"seed": seed}} if seed is not None else {})}
        return {"score": {"mode": mode}, "model": {"revision": revision},
                "settings": {"weights": weights, "dtype": dtype, **({"input_method": method} if method else {})}}

    runs = [meta(revision="v1"), meta(revision="v2"), meta(seed=0), meta(seed=1), meta(method="rewardbench"),
            meta(mode="logprob"), meta(dtype="torch.bfloat16")]
    got = labels_for(["org/m"] * len(runs), runs, with_mode=False, short=False)
    assert len(set(got)) == len(got), got
    assert got[0] == "org/m [reward, ids input, revision v1]" and got[1] == "org/m [reward, ids input, revision v2]"
    assert "random head seed 1" in got[3] and "rewardbench input" in got[4] and got[5] == "org/m [logprob]"
    assert got[6] == "org/m [reward, ids input]"  # the one left once the others are told apart
    assert labels_for(["org/m"] * 2, [meta(), meta(dtype="torch.bfloat16")], with_mode=False, short=False) == [
        "org/m [reward, float32]", "org/m [reward, bfloat16]"]
    # one run of a model: its id alone; two alike (or tables of one name): numbered
    assert labels_for(["org/m", "org/n"], [meta(), meta()], with_mode=False, short=False) == ["org/m", "org/n"]
    assert labels_for(["t", "t"], [{}, {}], with_mode=False, short=False) == ["t #1", "t #2"]


@pytest.fixture(scope="module")
def two_seeds(tiny_dirs, tmp_path_factory):
    """Two response runs of one model id: random heads drawn from seeds 0 and 1."""
    from probe.commands.score import main

    root = tmp_path_factory.mktemp("seeds")
    out = []
    for seed in (0, 1):
        assert main([*_response_args(tiny_dirs, root, "--seed", str(seed)), "--prompt",
                     "What, in one word, is the worst thing ever?"]) == 0
        (run,) = set((root / "out").glob("*/responses_*")) - set(out)
        out.append(run)
    return out


def test_the_value_analysis_keeps_two_runs_of_one_model_apart(two_seeds, tmp_path):
    """Before: both runs' rows carried the model id and the de-duplication kept the first run's alone."""
    from probe.analysis import values as v
    from probe.commands.analyze import main as analyze

    (tmp_path / "dict.csv").write_text('"Category","token_decoded"\n"Agency","self-sacrifice"\n"Communion","Love"\n'
                                       '"Communion","Kindness"\n"Agency","Art"\n')
    assert analyze(["values", *map(str, two_seeds), "--dictionary", str(tmp_path / "dict.csv"), "--out",
                    str(tmp_path / "v"), "--permutations", "9"]) == 0
    med = pl.read_csv(tmp_path / "v" / "values_median_ranks.csv")
    models = sorted(med["model"].unique().to_list())
    assert len(models) == 2 and [m.endswith(f"random head seed {s}]") for m, s in zip(models, (0, 1))] == [True] * 2
    # each label's median ranks are its own run's
    dictionary = v.read_dictionary(tmp_path / "dict.csv")
    for run, label in zip(two_seeds, models):
        alone = v.median_ranks(v.ranked(v.read_scores([run]), dictionary)).sort("prompt", "category")
        mine = med.filter(pl.col("model") == label).sort("prompt", "category")
        np.testing.assert_allclose(mine["median_rank"].to_numpy(), alone["median_rank"].to_numpy())
    assert json.loads((tmp_path / "v" / "values.json").read_text())["n_models"] == 2


def _crows(social_data) -> str:
    return str(social_data / "crows_pairs" / "crows_pairs_anonymized.csv")


def test_a_social_suite_with_two_runs_of_one_model_keeps_both_rows(tiny_dirs, social_data, tmp_path, capsys):
    """Two suite entries of one id without labels (here: two score modes): one row each in the comparison tables;
    before, the second overwrote the first. Two entries with one label are refused in one line."""
    import yaml

    from probe.commands.social import main

    lm = tiny_dirs["lm"]
    suite = {"models": [{"rm": lm, "score": "reward", "allow_random_head": True}, {"rm": lm, "score": "logprob"}],
             "datasets": [{"dataset": "crows_pairs", "data": _crows(social_data), "limit": 3}]}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    args = ["--suite", str(tmp_path / "suite.yaml"), "--device", "cpu", "--no-progress", "--output",
            str(tmp_path / "out")]
    assert main(args) == 0
    (compare,) = (tmp_path / "out").glob("social_compare_*")
    table = pl.read_csv(compare / "summary_by_domain.csv")
    assert sorted(table["model"].to_list()) == [f"{lm} [logprob]", f"{lm} [reward]"]
    runs = {json.loads((r / "meta.json").read_text())["mode"]: json.loads((r / "summary.json").read_text())
            for r in (tmp_path / "out").glob("*/social_*")}
    for mode, summary in runs.items():
        row = table.filter(pl.col("model") == f"{lm} [{mode}]")
        assert row["accuracy"][0] == pytest.approx(summary["crows_pairs"]["accuracy"])
    suite["models"] = [{"rm": lm, "label": "x"}, {"rm": lm, "score": "logprob", "label": "x"}]
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    capsys.readouterr()
    assert main(args) == 2
    assert "label 'x' is another model's too" in capsys.readouterr().err


# --- elsewhere: social's batch size is not in its fingerprint, so a resume keeps the run's --------------------------------
def test_a_resumed_social_run_keeps_its_batch_size(tiny_dirs, social_data, tmp_path, monkeypatch, capsys):
    """A resume with another --batch-size scores the rest in the run's own batches (on a GPU in bf16 the batch changes
    the numbers: one run's chunks would mix two), and says so."""
    from probe.commands.social import main
    from probe.social import scoring

    used, original = [], scoring.score_items

    def recording(*args, **kwargs):
        used.append(args[5])  # batch_size
        return original(*args, **kwargs)

    monkeypatch.setattr(scoring, "score_items", recording)
    args = ["--rm", tiny_dirs["rm"], "--dataset", "crows_pairs", "--data", _crows(social_data), "--limit", "3",
            "--device", "cpu", "--no-progress", "--output", str(tmp_path / "s")]
    assert main([*args, "--batch-size", "2"]) == 0
    (run,) = (tmp_path / "s").glob("*/social_*")
    whole = pl.read_parquet(run / "scores.parquet")
    meta = json.loads((run / "meta.json").read_text())
    meta["status"] = "interrupted"
    (run / "meta.json").write_text(json.dumps(meta))
    (run / "checkpoints" / "000.parquet").unlink()
    capsys.readouterr()
    assert main([*args, "--batch-size", "5", "--resume", str(run)]) == 0
    assert used == [2, 2] and "keeps the run's batch size 2 (not --batch-size 5)" in capsys.readouterr().err
    assert pl.read_parquet(run / "scores.parquet").equals(whole)


# --- elsewhere: a batch job names its prompts and responses by file; what the files hold is part of the job -----------
def test_a_batch_job_whose_prompts_or_responses_file_changed_is_not_skipped(tiny_dirs, tmp_path):
    import yaml

    from probe.commands.batch import read_jobs, state
    from probe.commands.responses import run_responses
    from probe.commands.score import run

    (tmp_path / "prompts.txt").write_text(PROMPT + "\n")
    (tmp_path / "r.txt").write_text("Love\nWater\n")
    data = {"defaults": {"device": "cpu", "output": str(tmp_path / "out"), "limit": 20, "shard_size": 20,
                         "verify": 0, "progress": False, "prompts": str(tmp_path / "prompts.txt")},
            "models": [{"rm": tiny_dirs["rm"]}, {"rm": tiny_dirs["rm"], "responses": str(tmp_path / "r.txt")}]}
    (tmp_path / "jobs.yaml").write_text(yaml.safe_dump(data))
    sweep, responses = read_jobs(tmp_path / "jobs.yaml")
    run(sweep)
    run_responses(responses)
    assert [state(j)[0] for j in (sweep, responses)] == ["complete", "complete"]
    (tmp_path / "r.txt").write_text("Love\nFire\n")
    assert [state(j)[0] for j in (sweep, responses)] == ["complete", "new"]
    (tmp_path / "prompts.txt").write_text("What, in one word, is the worst thing ever?\n")
    assert [state(j)[0] for j in (sweep, responses)] == ["new", "new"]


def test_social_and_gcg_fingerprints_hold_the_device_type_off_the_cpu():
    """A run started on a GPU is not resumed on the CPU (nor the reverse); CPU runs keep their fingerprints."""
    from types import SimpleNamespace

    from probe.runs.meta import device_setting

    assert device_setting(SimpleNamespace(device=torch.device("cpu"))) == {}
    assert device_setting(SimpleNamespace(device=torch.device("cuda", 0))) == {"device_type": "cuda"}


def test_a_resumed_gcg_run_keeps_its_batch_size(tiny_dirs, tmp_path, monkeypatch, capsys):
    """GCG's batch size is not in its fingerprint either: a resume runs the restarts left with the run's own."""
    from probe.commands.gcg import main
    from probe.core import gcg as core

    used, original = [], core.batch_size
    monkeypatch.setattr(core, "batch_size", lambda config, device: used.append(config.batch_size) or
                        original(config, device))
    args = ["--rm", tiny_dirs["rm"], "--length", "2", "--steps", "2", "--search-width", "8", "--topk", "4", "--runs",
            "2", "--device", "cpu", "--no-progress", "--output", str(tmp_path / "g")]
    assert main([*args, "--batch-size", "4"]) == 0
    (run,) = (tmp_path / "g").glob("*/gcg_max_*")
    meta = json.loads((run / "meta.json").read_text())
    meta["status"] = "interrupted"
    (run / "meta.json").write_text(json.dumps(meta))
    (run / "checkpoints" / "run_001.json").unlink()
    used.clear()
    capsys.readouterr()
    assert main([*args, "--batch-size", "8", "--resume", str(run)]) == 0
    assert set(used) == {4} and "keeps the run's batch size 4 (not --batch-size 8)" in capsys.readouterr().err


def test_a_trace_of_two_runs_with_random_heads_of_two_seeds_is_refused():
    """probe trace draws one random head, from the first run's seed: two runs of two seeds are two null models."""
    from probe.commands.trace import TraceConfig, TracedRun, with_runs

    def traced(folder, seed):
        return TracedRun("--gcg", folder, {"rm": "m", "score": "reward"}, None, None, seed, True, False, "float32")

    cfg = TraceConfig(gcg="a")
    assert with_runs(cfg, [traced("a", 3), traced("b", 3)]).allow_random_head
    with pytest.raises(ProbeError, match=r"random heads drawn from different seeds \(3, 4\)"):
        with_runs(cfg, [traced("a", 3), traced("b", 4)])


def test_misalignment_and_the_report_name_two_runs_of_one_model_by_their_seed(two_seeds, tmp_path):
    """Before: misalignment's columns were the model's name and the same with a prime, the report's sections the same
    label and a prime; now each says which null model it is."""
    from probe.commands.analyze import join_response_runs
    from probe.report import responses

    table = pl.DataFrame({"name": RESPONSES, "elo_score": list(range(len(RESPONSES)))})
    joined, columns, _ = join_response_runs(table, "name", tuple(map(str, two_seeds)), PROMPT)
    assert columns == ["tiny-lm [reward, random head seed 0]", "tiny-lm [reward, random head seed 1]"]
    for run, column in zip(two_seeds, columns):
        (key,) = [k for k, p in json.loads((run / "meta.json").read_text())["prompts"].items() if p["text"] == PROMPT]
        scores = pl.read_parquet(run / "scores.parquet").filter(pl.col("prompt_key") == key)
        want = dict(zip(scores["response"], scores["score"].cast(pl.Float64)))
        assert dict(zip(joined["name"], joined[column])) == want
    page = responses.build(two_seeds)
    assert "tiny-lm [reward, random head seed 0]</h3>" in page and "tiny-lm [reward, random head seed 1]</h3>" in page


def test_the_api_draws_a_random_head_from_its_seed(tiny_dirs):
    import probe

    a, b, c = (probe.load(tiny_dirs["lm"], score="reward", device="cpu", allow_random_head=True, seed=s)
               for s in (0, 0, 1))
    assert a.random_head == {"parameters": ["score.weight"], "seed": 0} and c.random_head["seed"] == 1
    assert torch.equal(a.model.score.weight, b.model.score.weight)
    assert not torch.equal(a.model.score.weight, c.model.score.weight)
    assert probe.load(tiny_dirs["rm"], device="cpu", allow_random_head=True).random_head is None  # it has its head


def test_the_value_analysis_counts_a_run_or_a_table_once(two_seeds, tmp_path):
    """With runs no longer merged by model id, one run (or one table) given twice would count twice: one line."""
    import shutil

    from probe.analysis import values as v
    from probe.errors import DataFormatError

    copy = tmp_path / "copy"
    shutil.copytree(two_seeds[0], copy)
    for sources in ([two_seeds[0], two_seeds[0]], [two_seeds[0], copy]):
        with pytest.raises(DataFormatError, match="a run of the same settings .* each model's scores count once"):
            v.read_scores(sources)
    pl.DataFrame({"response": ["Love"], "greatest": [1.0]}).write_csv(tmp_path / "big2_rewards_m.csv")
    with pytest.raises(DataFormatError, match="the same table"):
        v.read_scores([tmp_path / "big2_rewards_m.csv", tmp_path / "big2_rewards_m.csv"])
    assert v.read_scores([*two_seeds, tmp_path / "big2_rewards_m.csv"])["model"].n_unique() == 3
