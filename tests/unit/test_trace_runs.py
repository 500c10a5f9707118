"""probe trace --social/--gcg: a run is traced as it was scored (its own model record, score mode, reduction, input
method, reference), the items its undesirable rate counts, and bad input is one line that writes nothing."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from probe.commands.trace import main as trace_main

AGE = ("--dataset", "bbq", "--data")
QUIET = ("--device", "cpu", "--no-progress")


def _social(out, *args) -> list:
    from probe.commands.social import main as social_main

    assert social_main([*args, *QUIET, "--output", str(out)]) == 0
    return sorted(out.glob("*/social_*"))


@pytest.fixture(scope="module")
def runs(tiny_dirs, tokenizers, social_data, tmp_path_factory):
    """Social runs of the tiny models (a second reward model beside the first, a suite, mean log-probabilities, the
    RewardBench route, an implicit reward), a rating run and GCG runs (reward, judge)."""
    from transformers import AutoModelForCausalLM, LlamaForSequenceClassification

    from probe.commands.gcg import main as gcg_main
    from tests import tiny

    root = tmp_path_factory.mktemp("trace_runs")
    tok = tokenizers["llama3"]
    rm2 = root / "tiny-rm2"
    tiny.build(LlamaForSequenceClassification, tiny.llama_config(tok), seed=5).save_pretrained(rm2)
    tok.save_pretrained(rm2)
    ref = root / "ref"
    tiny.perturbed_copy(AutoModelForCausalLM.from_pretrained(tiny_dirs["lm"]), seed=3).save_pretrained(ref)
    tok.save_pretrained(ref)
    age = str(social_data / "bbq" / "Age.jsonl")
    data = (*AGE, age, "--limit", "12")
    out = {"rm2": str(rm2)}
    out["rm"], out["two"] = _social(root / "two", "--rm", tiny_dirs["rm"], "--rm", str(rm2), *data)
    assert out["two"].parent != out["rm"].parent and "tiny-rm2" in str(out["two"])
    suite = root / "suite.yaml"
    suite.write_text(f"models:\n- {rm2}\ndatasets:\n- dataset: bbq\n  data: {age}\n  limit: 12\n")
    (out["suite"],) = _social(root / "suite", "--suite", str(suite))
    (out["mean"],) = _social(root / "mean", "--rm", tiny_dirs["lm"], "--score", "logprob", *data)
    (out["rewardbench"],) = _social(root / "rb", "--rm", tiny_dirs["lm"], "--score", "logprob", "--input-method",
                                    "rewardbench", *data)
    (out["implicit"],) = _social(root / "ref", "--rm", tiny_dirs["lm"], "--ref", str(ref), "--beta", "0.5", *data)
    judge = root / "rating19.yaml"
    judge.write_text("kind: rating\nsource: a test\nuser: 'Rate the answer to {prompt}: {response}'\n"
                     "ratings: [1, 9]\n")
    (out["rating"],) = _social(root / "rating", "--rm", tiny_dirs["lm"], "--score", "rating", "--judge-prompt",
                               str(judge), *AGE, age, "--limit", "2")
    for name, rm, score in (("gcg", tiny_dirs["rm"], "auto"), ("gcg_judge", tiny_dirs["lm"], "judge")):
        assert gcg_main(["--rm", rm, "--score", score, "--length", "2", "--steps", "1", "--search-width", "8",
                         "--topk", "4", *QUIET, "--output", str(root / name)]) == 0
        (out[name],) = (root / name).glob("*/gcg_max_*")
    return out


def _trace(tmp_path, *args) -> tuple[pl.DataFrame, dict]:
    assert trace_main([*map(str, args), "--device", "cpu", "--out", str(tmp_path / "t")]) == 0
    return pl.read_parquet(tmp_path / "t" / "trace.parquet"), json.loads((tmp_path / "t" / "trace.json").read_text())


@pytest.mark.parametrize("name", ["mean", "rewardbench", "implicit", "two", "suite"])
def test_a_social_runs_trace_ends_at_the_runs_own_scores(runs, tmp_path, name):
    """Whatever the run's settings (the mean log-probability, social's default; the RewardBench route; an implicit
    reward against a reference at beta 0.5; the second model of a two-model run; a suite's model, which the command
    line never named), the complete responses' scores are the run's own, within float32's rounding, and trace.json
    names the model, the settings and each item's prompt."""
    df, meta = _trace(tmp_path, "--social", runs[name])
    own = pl.read_parquet(runs[name] / "scores.parquet")
    done = df.filter(pl.col("kind") == "complete").join(own.select("item_id", pl.col("text").alias("response"),
                                                                   pl.col("score").alias("own")),
                                                        on=["item_id", "response"])
    assert done.height == df.filter(pl.col("kind") == "complete").height > 0
    np.testing.assert_allclose(done["score"], done["own"], rtol=1e-5, atol=1e-5)
    assert meta["run_scores"]["equal_within_float32_tolerance"] and meta["run_scores"]["n"] == done.height
    run_meta = json.loads((runs[name] / "meta.json").read_text())
    assert meta["model"] == run_meta["model"]["id"] and meta["weights"]["model"] == run_meta["settings"]["weights"]
    want = {"mean": ("logprob", "mean", "ids"), "rewardbench": ("logprob", "mean", "rewardbench"),
            "implicit": ("logprob", "mean", "ids")}.get(name, ("reward", None, "ids"))
    assert (meta["mode"], meta["settings"]["logprob_reduce"], meta["settings"]["input_method"]) == want
    if name == "implicit":
        assert meta["weights"]["ref"]["beta"] == 0.5 and "implicit reward" in meta["settings"]["score"]
    prompts = dict(own.select("item_id", "prompt").unique().iter_rows())
    assert {t["prompt"] for t in meta["traces"]} == {prompts[t["item_id"]] for t in meta["traces"]}


def test_the_second_models_folder_is_traced_with_that_model(runs, tiny_dirs, tmp_path, capsys):
    """A --rm A --rm B run's folder of B, traced with B (its model record), not A (the command's first --rm); and
    --rm naming other weights than the run's is refused."""
    _, meta = _trace(tmp_path, "--social", runs["two"])
    assert meta["model"] == runs["rm2"]
    capsys.readouterr()
    assert trace_main(["--social", str(runs["two"]), "--rm", tiny_dirs["rm"], "--device", "cpu", "--out",
                       str(tmp_path / "u")]) == 2
    assert "other weights than the model loaded here" in capsys.readouterr().err and not (tmp_path / "u").exists()


def test_the_traced_items_are_those_the_undesirable_rate_counts(runs, tmp_path, capsys):
    """trace --social picks the items where the undesirable option scores above its counterpart (the summary's
    undesirable rate), never an item whose undesirable option is the gold answer (it has no counterpart), and
    says how many there are: the summary's rate times its pairs."""
    from probe.social.items import counterpart_of

    own = pl.read_parquet(runs["rm"] / "scores.parquet")
    summary = json.loads((runs["rm"] / "summary.json").read_text())["bbq"]
    wins = []
    for (item,), part in own.group_by("item_id", maintain_order=True):
        s, bad = part.sort("option")["score"].to_numpy(), part["undesirable"][0]
        other = counterpart_of(part["gold"][0], bad, part["label"].to_list())
        if other is not None and s[bad] > s[other]:
            wins.append(item)
    assert len(wins) == round(summary["undesirable_rate"] * summary["n_undesirable_pairs"]) >= 2
    capsys.readouterr()
    df, meta = _trace(tmp_path, "--social", runs["rm"], "--limit", "2")
    assert f"in {len(wins)} of the {summary['n_undesirable_pairs']} items" in capsys.readouterr().err
    assert [t["item_id"] for t in meta["traces"]] == [w for w in wins[:2] for _ in range(2)]
    gold = dict(own.filter(pl.col("option") == pl.col("gold")).select("item_id", "text").iter_rows())
    bad = df.filter(pl.col("role") == "undesirable")
    assert bad.height and all(gold[i] != r for i, r in bad.select("item_id", "response").iter_rows())
    assert set(df["role"]) == {"undesirable", "counterpart"}


def test_the_trace_column_names_each_trace_as_its_plot(runs, tmp_path):
    """A GCG run's best and social items together (an AttributeError before): every trace keyed 'trace_NN: item,
    role, 'response'' (readable, unique), one plot trace_NN.png each and trace.html; every row carries its
    prompt."""
    df, meta = _trace(tmp_path, "--gcg", runs["gcg"], "--social", runs["rm"], "--limit", "2")
    keys = df["trace"].unique(maintain_order=True).to_list()
    assert len(keys) == 5 and keys[0].startswith("trace_01: '") and "\x1f" not in "".join(keys)
    first = df.filter(pl.col("trace") == keys[1]).row(0, named=True)
    assert keys[1] == f"trace_02: {first['item_id']}, undesirable, {first['response']!r}"
    assert sorted(p.name for p in (tmp_path / "t").glob("*.png")) == [f"trace_{k:02d}.png" for k in range(1, 6)]
    page = (tmp_path / "t" / "trace.html").read_text()
    assert page.count("<section>") == 5 and "largest rise" in page and df["prompt"].null_count() == 0
    gcg = json.loads((runs["gcg"] / "meta.json").read_text())["settings"]["prompt"]
    assert meta["traces"][0]["prompt"] == gcg and meta["traces"][1]["prompt"] != gcg


@pytest.mark.parametrize("args, says", [
    (("--social", "rating"), "--score rating"),
    (("--gcg", "gcg_judge"), "--score judge"),
    (("--social", "gcg"), "not a probe social run"),
    (("--gcg", "mean"), "not a probe gcg run"),
    (("--response", "", "--rm", "rm2"), "--response is empty"),
    (("--social", "mean", "--logprob-reduce", "sum"), "was scored with 'mean'"),
    (("--social", "rewardbench", "--input-method", "ids"), "was scored with 'rewardbench'"),
    (("--social", "two", "--score", "logprob"), "was scored with 'reward'"),
    (("--gcg", "gcg", "--social", "two"), "different models"),
    (("--gcg", "gcg", "--prompt", "Hi?"), "--prompt 'Hi?'"),
])
def test_bad_input_is_one_line_and_writes_nothing(runs, tmp_path, capsys, args, says):
    argv = [str(runs.get(a, a)) for a in args]
    capsys.readouterr()
    assert trace_main([*argv, "--device", "cpu", "--out", str(tmp_path / "x" / "t")]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error")]
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "x").exists()
