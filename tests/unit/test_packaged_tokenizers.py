"""The packaged models' tokenizers (SmolLM2, Gemma 3 270M) read the same ids on every transformers rm-probe allows, a
conversion is checked before it is cached, and a cache folder is read only by the versions that made it (issue 55).

Golden ids (tests/testdata/packaged_tokenizer_ids.json, `write_golden`) are the newest transformers' own conversion
of each GGUF. Older releases convert them wrongly (below 5.18 Gemma's without merges or control tokens; 5.2 SmolLM2's
with every space an unknown token), so rm-probe builds both itself (probe/models/gguf_tokenizer.py) and must give the
newest's file contents and ids on every release.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from probe.errors import ModelLoadError
from probe.models import embedded, gguf_tokenizer
from probe.models.embedded import CHECK_TEXT, PACKAGED, check_tokenizer, gguf_file, packaged_tokenizer_dir

pytestmark = pytest.mark.parity

GOLDEN = Path(__file__).resolve().parents[1] / "testdata" / "packaged_tokenizer_ids.json"
TEXTS = [CHECK_TEXT, " leading  spaces   and \n\n tabs\t\tçé 日本語 🤖", "<start_of_turn>user\nHi<end_of_turn>\n",
         "<|im_start|>user\nHi<|im_end|>\n"]


def _golden():
    return json.loads(GOLDEN.read_text())


def _ids(tok, name: str) -> dict:
    return {"texts": [tok.encode(t, add_special_tokens=False) for t in TEXTS],
            "with_special_tokens": tok(CHECK_TEXT)["input_ids"],
            "controls": {c: tok.encode(c, add_special_tokens=False) for c in PACKAGED[name].controls}}


def content(tokenizer_json: dict) -> str:
    """A digest of what makes a tokenizer's ids: its vocabulary, merges, added tokens and pipeline (not the
    serialization details a tokenizers release adds, such as ``ignore_merges``' default)."""
    model = tokenizer_json["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    added = [(t["id"], t["content"], t["special"], t["normalized"]) for t in tokenizer_json["added_tokens"]]
    parts = [model["type"], model["vocab"], merges, model.get("byte_fallback"), model.get("unk_token"), added,
             tokenizer_json["normalizer"], tokenizer_json["pre_tokenizer"], tokenizer_json["decoder"],
             tokenizer_json["post_processor"]]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def write_golden(tmp: Path) -> None:
    """tests/testdata/packaged_tokenizer_ids.json from transformers' own conversion of each GGUF (run on the newest
    transformers, 5.18 or later)."""
    import transformers
    from transformers import AutoTokenizer

    out = {"transformers": transformers.__version__, "texts": TEXTS, "models": {}}
    for name, model in PACKAGED.items():
        src = gguf_file(model, tmp)
        tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        out["models"][name] = {**_ids(tok, name), "content": content(json.loads(tok.backend_tokenizer.to_str()))}
    GOLDEN.write_text(json.dumps(out, ensure_ascii=False) + "\n")


def test_golden_ids_are_the_newest_transformers_and_the_registry_says_the_same():
    golden = _golden()
    assert golden["transformers"] >= "5.18" and golden["texts"] == TEXTS
    for name, model in PACKAGED.items():
        ids = golden["models"][name]
        assert tuple(ids["texts"][0]) == model.check_ids
        assert all(len(v) == 1 for v in ids["controls"].values()) and set(ids["controls"]) == set(model.controls)
    assert golden["models"]["gemma3-270m"]["controls"]["<start_of_turn>"] == [105]


@pytest.mark.parametrize("name", list(PACKAGED))
def test_the_packaged_tokenizer_reads_the_newest_transformers_ids(name):
    """On this transformers (every minor release: make test-versions), the cached tokenizer as it reloads: control
    tokens one id each, every text the newest transformers' ids (Gemma on 5.17: `<start_of_turn>` was 15 ids, the
    sentence 47)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(packaged_tokenizer_dir(name))
    assert _ids(tok, name) == {k: v for k, v in _golden()["models"][name].items() if k != "content"}


@pytest.mark.parametrize("name", list(PACKAGED))
def test_rm_probes_tokenizer_is_the_newest_transformers_conversion(tmp_path, name):
    """The file rm-probe builds from the GGUF has the contents of the newest transformers' own conversion (the
    golden digest), whatever transformers is installed: it is built with ``tokenizers`` alone."""
    model = PACKAGED[name]
    folder = gguf_tokenizer.write_folder(gguf_tokenizer.read_metadata(gguf_file(model, tmp_path)), tmp_path / "tok")
    assert content(json.loads((folder / "tokenizer.json").read_text())) == _golden()["models"][model.name]["content"]


@pytest.mark.slow
def test_this_transformers_own_gemma_conversion_is_rm_probes_where_it_is_right(tmp_path):
    """Where transformers converts Gemma's GGUF right itself (5.18 on), its conversion and rm-probe's are one file's
    contents; below 5.18 its own is the wrong one rm-probe replaces (the check refuses it)."""
    import transformers
    from packaging.version import Version
    from transformers import AutoTokenizer

    model = PACKAGED["gemma3-270m"]
    src = gguf_file(model, tmp_path)
    theirs = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    if Version(transformers.__version__) >= Version("5.18"):
        ours = gguf_tokenizer.write_folder(gguf_tokenizer.read_metadata(src), tmp_path / "ours")
        assert content(json.loads(theirs.backend_tokenizer.to_str())) == content(
            json.loads((ours / "tokenizer.json").read_text()))
    else:
        theirs.save_pretrained(tmp_path / "theirs")
        with pytest.raises(ModelLoadError, match="<start_of_turn> is 15 ids"):
            check_tokenizer(model, tmp_path / "theirs")


def test_merges_rule_on_a_small_vocabulary():
    """Every split into two vocabulary tokens, by the merged token's position, the longer left piece first."""
    tokens = ["a", "b", "c", "abc", "ab", "bc", "cab"]
    assert gguf_tokenizer.merges(tokens) == [("ab", "c"), ("a", "bc"), ("a", "b"), ("b", "c"), ("c", "ab")]
    assert gguf_tokenizer.respell("   ") == "\u2581" * 3 and gguf_tokenizer.respell(" a") == " a"


def test_gguf_header_reader_reads_what_gguf_reads():
    """probe's own reader of the metadata against the gguf package's, on SmolLM2's file (byte-level: merges)."""
    gguf = pytest.importorskip("gguf")
    path = gguf_file(PACKAGED["smollm2"], Path("."))
    ours = gguf_tokenizer.read_fields(path)
    reader = gguf.GGUFReader(str(path))
    strings = gguf.GGUFValueType.STRING
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        values = [bytes(field.parts[i]).decode() if field.types[-1] == strings else field.parts[i].tolist()[0]
                  for i in field.data]
        want = values if field.types[0] == gguf.GGUFValueType.ARRAY else values[0]
        assert ours[key] == pytest.approx(want) if isinstance(want, float) else ours[key] == want, key
    assert len(ours["tokenizer.ggml.merges"]) > 40000 and set(ours) == {k for k in reader.fields
                                                                        if not k.startswith("GGUF.")}


def _merge_less(folder: Path, out: Path) -> Path:
    """What transformers 5.17's Gemma conversion reloads as: no merges, no added tokens."""
    out.mkdir(exist_ok=True)
    data = json.loads((folder / "tokenizer.json").read_text())
    data["model"]["merges"], data["added_tokens"] = [], []
    (out / "tokenizer.json").write_text(json.dumps(data))
    (out / "tokenizer_config.json").write_text((folder / "tokenizer_config.json").read_text())
    return out


def test_a_wrong_conversion_is_refused_in_one_line_and_not_cached(tmp_path, monkeypatch):
    model = PACKAGED["gemma3-270m"]
    good = packaged_tokenizer_dir(model.name)
    bad = _merge_less(good, tmp_path / "bad")
    with pytest.raises(ModelLoadError, match=r"<start_of_turn> is 15 ids .* where it is one") as err:
        check_tokenizer(model, bad)
    assert "\n" not in str(err.value)
    monkeypatch.setenv("RM_PROBE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_tokenizer, "write_folder", lambda metadata, out, chat_template=None: _merge_less(good, out))
    with pytest.raises(ModelLoadError, match="converted --rm gemma3-270m's tokenizer wrongly"):
        packaged_tokenizer_dir(model.name)
    assert list((tmp_path / "cache").iterdir()) == []  # nothing cached, no half-made folder left


def _fake_made_by(monkeypatch, transformers_version: str):
    made = dict(embedded.made_by(), transformers=transformers_version)
    monkeypatch.setattr(embedded, "made_by", lambda: dict(made))


def test_a_cache_made_by_another_version_is_not_read(tmp_path, monkeypatch):
    """A folder another transformers made has another name; one found under this version's name whose manifest names
    another version (or none: the layout before manifests) is converted anew, never read."""
    monkeypatch.setenv("RM_PROBE_CACHE", str(tmp_path))
    made = []

    def convert(model, src, out):
        made.append(embedded.made_by()["transformers"])
        (out / "tokenizer_config.json").write_text("{}")

    monkeypatch.setattr(embedded, "_write_tokenizer", convert)
    monkeypatch.setattr(embedded, "gguf_file", lambda model, scratch: scratch / model.gguf)
    _fake_made_by(monkeypatch, "5.9.0")
    old = packaged_tokenizer_dir("smollm2")
    assert "transformers5.9.0" in old.name and json.loads((old / "made_by.json").read_text())["transformers"] == "5.9.0"
    assert packaged_tokenizer_dir("smollm2") == old and made == ["5.9.0"]  # read again by the version that made it
    _fake_made_by(monkeypatch, "5.24.0")
    new = packaged_tokenizer_dir("smollm2")
    assert new != old and "transformers5.24.0" in new.name and made == ["5.9.0", "5.24.0"]
    # the same name with another version's manifest, or with none: rebuilt in place
    (new / "made_by.json").write_text(json.dumps(dict(embedded.made_by(), transformers="5.9.0")))
    assert packaged_tokenizer_dir("smollm2") == new and made[-1] == "5.24.0" and len(made) == 3
    assert json.loads((new / "made_by.json").read_text()) == embedded.made_by()
    (new / "made_by.json").unlink()
    assert packaged_tokenizer_dir("smollm2") == new and len(made) == 4


def test_the_folder_name_follows_every_version_that_shapes_it(monkeypatch):
    model = PACKAGED["smollm2"]
    names = set()
    # versions no environment has (an installed one would name this environment's own folder)
    for key, value in (("transformers", "4.0.0"), ("tokenizers", "0.0.1"), ("gguf", "0.0.1"), ("rules", -1)):
        made = dict(embedded.made_by(), **{key: value})
        monkeypatch.setattr(embedded, "made_by", lambda made=made: dict(made))
        names.add(embedded._folder(model).name)
    monkeypatch.undo()
    names.add(embedded._folder(model).name)
    assert len(names) == 5
