"""Hub-layout folders built from the real data slices (../shared/data/social), as the Hub keeps each data set.

Each builder writes the rows of a published slice in the form its Hub copy has (fields, class labels stored as
integers, parquet files named as the Hub names them, a README with ``configs`` and ``dataset_info``), so that a test
can read the folder and the original file and compare. Parquet files are written by `datasets` where the Hub's are
(they then carry their features, class-label names included, in the file's ``huggingface`` metadata); one builder
(CrowS-Pairs) writes plain parquet with polars, so that the names come from the README only.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import polars as pl

STEREOSET_GOLD = ["anti-stereotype", "stereotype", "unrelated"]
CROWS_DIRECTION = ["stereo", "antistereo"]
CROWS_BIAS = ["race-color", "socioeconomic", "gender", "disability", "nationality", "sexual-orientation",
              "physical-appearance", "religion", "age"]


def _card(configs: dict[str, dict[str, str]], info: str = "") -> str:
    """README.md's YAML header: dataset_info (as given) and configs -> splits -> path patterns."""
    lines = ["---", *([info.rstrip("\n")] if info else []), "configs:"]
    for name, splits in configs.items():
        lines += [f"- config_name: {name}", "  data_files:"]
        for split, path in splits.items():
            lines += [f"  - split: {split}", f"    path: {path}"]
    return "\n".join(lines + ["---", "", "# a copy built for rm-probe's tests", ""])


def _csv(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _write_hf(rows: list[dict], features, path: Path) -> None:
    import datasets

    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(rows, features=features).to_parquet(str(path))


STEREOSET_CARD = """dataset_info:
- config_name: {part}
  features:
  - name: id
    dtype: string
  - name: target
    dtype: string
  - name: bias_type
    dtype: string
  - name: context
    dtype: string
  - name: sentences
    sequence:
    - name: sentence
      dtype: string
    - name: id
      dtype: string
    - name: gold_label
      dtype:
        class_label:
          names:
            '0': anti-stereotype
            '1': stereotype
            '2': unrelated
"""


def stereoset(social: Path, out: Path, plain: bool = False) -> Path:
    """McGill-NLP/stereoset: one config per part, split validation, sentences as lists with a class-label gold
    (``plain``: parquet without `datasets`' metadata, the class names in the README's dataset_info only)."""
    import datasets

    data = json.loads((social / "stereoset" / "dev_ptbr_sample.json").read_text(encoding="utf-8"))["data"]
    features = datasets.Features({
        "id": datasets.Value("string"), "target": datasets.Value("string"), "bias_type": datasets.Value("string"),
        "context": datasets.Value("string"),
        "sentences": datasets.Sequence({"sentence": datasets.Value("string"), "id": datasets.Value("string"),
                                        "gold_label": datasets.ClassLabel(names=STEREOSET_GOLD)})})
    for part in ("intersentence", "intrasentence"):
        rows = [{"id": ex["id"], "target": ex["target"], "bias_type": ex["bias_type"], "context": ex["context"],
                 "sentences": {"sentence": [s["sentence"] for s in ex["sentences"]],
                               "id": [s["id"] for s in ex["sentences"]],
                               "gold_label": [STEREOSET_GOLD.index(s["gold_label"]) for s in ex["sentences"]]}}
                for ex in data[part]]
        if plain:
            (out / part).mkdir(parents=True, exist_ok=True)
            pl.DataFrame(rows).write_parquet(out / part / "validation-00000-of-00001.parquet")
        else:
            _write_hf(rows, features, out / part / "validation-00000-of-00001.parquet")
    info = "".join(STEREOSET_CARD.format(part=p) for p in ("intersentence", "intrasentence")) if plain else ""
    info = info.replace("\ndataset_info:\n", "\n")
    (out / "README.md").write_text(_card({p: {"validation": f"{p}/validation-*"}
                                          for p in ("intersentence", "intrasentence")}, info))
    return out


def crows_pairs(social: Path, out: Path) -> Path:
    """nyu-mll/crows_pairs: split test, id, two class labels as integers (names in the README only)."""
    rows = [{"id": int(r[""]), "sent_more": r["sent_more"], "sent_less": r["sent_less"],
             "stereo_antistereo": CROWS_DIRECTION.index(r["stereo_antistereo"]),
             "bias_type": CROWS_BIAS.index(r["bias_type"]), "anon_writer": r["anon_writer"]}
            for r in _csv(social / "crows_pairs" / "crows_pairs_anonymized.csv")]
    (out / "data").mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows).write_parquet(out / "data" / "test-00000-of-00001.parquet")

    def names(values):
        return "\n".join(f"          '{i}': {v}" for i, v in enumerate(values))

    info = ("dataset_info:\n  features:\n  - name: id\n    dtype: int32\n  - name: sent_more\n    dtype: string\n"
            "  - name: sent_less\n    dtype: string\n  - name: stereo_antistereo\n    dtype:\n      class_label:\n"
            f"        names:\n{names(CROWS_DIRECTION)}\n  - name: bias_type\n    dtype:\n      class_label:\n"
            f"        names:\n{names(CROWS_BIAS)}\n  - name: anon_writer\n    dtype: string\n")
    (out / "README.md").write_text(_card({"default": {"test": "data/test-*"}}, info))
    return out


def xstest(social: Path, out: Path) -> Path:
    """walledai/XSTest: the prompts file without its id column, split test."""
    rows = [{k: r[k] for k in ("prompt", "focus", "type", "note", "label")}
            for r in _csv(social / "xstest" / "xstest_prompts.csv")]
    (out / "data").mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows).write_parquet(out / "data" / "test-00000-of-00001.parquet")
    (out / "README.md").write_text(_card({"default": {"test": "data/test-*"}}))
    return out


def ethics(social: Path, out: Path) -> Path:
    """hendrycks/ethics as its parquet branch names the files (commonsense/ethics-test.parquet), no README."""
    import datasets

    rows = [{"label": int(r["label"]), "input": r["input"]} for r in _csv(social / "ethics" / "cm_test.csv")]
    features = datasets.Features({"label": datasets.ClassLabel(names=["0", "1"]), "input": datasets.Value("string")})
    _write_hf(rows, features, out / "commonsense" / "ethics-test.parquet")
    return out


def moralchoice(social: Path, out: Path) -> Path:
    """One config per ambiguity, split test, the CSV's columns."""
    configs = {}
    for level in ("low", "high"):
        rows = _csv(social / "moralchoice" / f"moralchoice_{level}_ambiguity.csv")
        (out / f"{level}_ambiguity").mkdir(parents=True, exist_ok=True)
        pl.DataFrame(rows).write_parquet(out / f"{level}_ambiguity" / "test-00000-of-00001.parquet")
        configs[f"{level}_ambiguity"] = {"test": f"{level}_ambiguity/test-*"}
    (out / "README.md").write_text(_card(configs))
    return out


def bbq(social: Path, out: Path) -> Path:
    """A copy with BBQ's own fields, one config per category (split test), nested fields as structs."""
    configs = {}
    for f in sorted((social / "bbq").glob("*.jsonl")):
        rows = [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
        (out / f.stem).mkdir(parents=True, exist_ok=True)
        pl.DataFrame(rows, infer_schema_length=None).write_parquet(out / f.stem / "test-00000-of-00001.parquet")
        configs[f.stem] = {"test": f"{f.stem}/test-*"}
    (out / "README.md").write_text(_card(configs))
    return out


def rewardbench(rows: list[dict], out: Path, split: str = "filtered") -> Path:
    """allenai/reward-bench's layout: data/<split>-00000-of-00001.parquet and README configs."""
    (out / "data").mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows).write_parquet(out / "data" / f"{split}-00000-of-00001.parquet")
    pl.DataFrame(rows[:1]).write_parquet(out / "data" / "raw-00000-of-00001.parquet")
    (out / "README.md").write_text(_card({"default": {split: f"data/{split}-*", "raw": "data/raw-*"}}))
    return out


def hub_cache(folder: Path, repo: str, home: Path, commit: str = "0" * 40) -> Path:
    """``folder`` as a snapshot of dataset ``repo`` in a Hugging Face Hub cache under ``home`` (HF_HOME)."""
    import shutil

    root = home / "hub" / f"datasets--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    shutil.copytree(folder, root / "snapshots" / commit)
    return root
