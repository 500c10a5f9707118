import logging

import pytest

from probe.models.loading import load_model
from probe.models.registry import DEFAULT, REGISTRY, RewardModelSpec, lookup


def test_lookup_order():
    assert lookup("RLHFlow/ArmoRM-Llama3-8B-v0.1") == (REGISTRY["RLHFlow/ArmoRM-Llama3-8B-v0.1"], "id")
    assert lookup("/models/RLHFlow/ArmoRM-Llama3-8B-v0.1")[1] == "path"
    assert lookup("/data/ArmoRM-Llama3-8B-v0.1")[1] == "path name"
    spec, how = lookup("someone/finetune", ["LlamaForRewardModelWithGating"])
    assert how == "architecture" and spec.reader == "gated"
    assert lookup("someone/else", ["LlamaForSequenceClassification"]) == (DEFAULT, "default")


def test_the_papers_ten_models_are_registered(paper_release):
    import csv

    table = paper_release / "table_1_reward_models.csv"
    rows = list(csv.DictReader(table.open()))
    assert len(rows) == 10
    for r in rows:
        assert f"{r['Developer']}/{r['Model Name']}" in REGISTRY, r
    gated = [k for k, s in REGISTRY.items() if s.reader == "gated" and "/" in k]
    assert sorted(gated) == ["RLHFlow/ArmoRM-Llama3-8B-v0.1", "nicolinho/QRM-Gemma-2-27B", "nicolinho/QRM-Llama3.1-8B"]


def test_spec_validation():
    with pytest.raises(ValueError, match="gating_pattern"):
        RewardModelSpec("x", reader="gated")


def test_unknown_reward_model_says_which_spec(tiny_dirs, caplog):
    with caplog.at_level(logging.WARNING):
        load_model(tiny_dirs["rm"], kind="reward", device="cpu")
    assert "not in the registry" in caplog.text and "'default'" in caplog.text


@pytest.mark.parametrize("ref", ["someorg/Refused-RM", "/nowhere/models/someorg/Refused-RM"])
def test_a_family_rm_probe_does_not_read_is_refused_in_one_line_before_anything_loads(ref, monkeypatch):
    """A registry entry with ``unsupported`` (none today: every family RewardBench runs is read) is refused before the
    path is resolved or a config read; a default head would give numbers of no meaning."""
    from probe.errors import ModelLoadError
    from probe.models import loading

    monkeypatch.setitem(REGISTRY, "someorg/Refused-RM", RewardModelSpec(
        "someorg/Refused-RM", reader="forward", unsupported="its head is not read by rm-probe yet"))
    monkeypatch.setattr(loading, "_source", lambda r: pytest.fail("resolved the model before refusing it"))
    with pytest.raises(ModelLoadError, match=r"not supported: .*") as err:
        loading.load_model(ref, kind="reward", device="cpu")
    assert "\n" not in str(err.value) and "rm-probe" in str(err.value)
    assert not [spec.name for spec in REGISTRY.values() if spec.unsupported and spec.name != "someorg/Refused-RM"]
