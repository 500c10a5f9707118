"""Social data sets where users keep them: Hugging Face Hub ids and local folders laid out as the Hub keeps them.

``--data hf:ORG/NAME[@REVISION]`` reads a Hub data set through the `datasets` library (the optional extra
``pip install 'rm-probe[hub]'``): from the Hub when it is reachable, else from the `datasets` cache. Where neither
works, a snapshot of the repository in the local Hugging Face Hub cache (``huggingface-cli download --repo-type
dataset ORG/NAME``) is read directly, without the network. A Hub id that is nowhere is one line naming the id and
``HF_DATASETS_OFFLINE``.

A local folder (a Hub snapshot, a clone of the data set's repository) is read without the network and without
`datasets`: the configs and splits its README.md declares (``configs: - config_name, data_files: - split, path``),
else the Hub's file naming (``data/<split>-00000-of-00001.parquet``, ``<config>/<split>-*.parquet``,
``<config>/<split>/0000.parquet`` as on the ``refs/convert/parquet`` branch, ``<name>-<split>.parquet``). Parquet,
JSON Lines, JSON and CSV files are read; class labels (stored as integers) are named from the parquet file's own
``huggingface`` metadata or the README's ``dataset_info``. A folder that holds the data set's own published files
instead is read by the data set's loader (`own_files`).

Each data set's default Hub copy is in `DEFAULTS`; `probe/social/hubmap.py` maps a copy's fields and label
encodings to the published file's.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from probe.errors import DataFormatError
from probe.social.io import Part, rows as file_rows

PREFIX = "hf:"
DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv")
EXTRA = "pip install 'rm-probe[hub]'"


@dataclass(frozen=True)
class HubDefault:
    repo: str
    configs: tuple[str, ...] | None  # None: the repository's default config (or all, where they are parts)
    split: str


# Each data set's default Hub copy and evaluation split (--dataset NAME without --data, when the Hub or a cache has
# it). What the reader maps from each copy: probe/social/hubmap.py, and the README's table.
DEFAULTS: dict[str, HubDefault] = {
    "rewardbench": HubDefault("allenai/reward-bench", None, "filtered"),
    "stereoset": HubDefault("McGill-NLP/stereoset", ("intersentence", "intrasentence"), "validation"),
    "crows_pairs": HubDefault("nyu-mll/crows_pairs", None, "test"),
    "xstest": HubDefault("walledai/XSTest", None, "test"),
    # which ETHICS file this split holds was not checked (no Hub here): the paper's Test has 3,885 rows, Hard Test 3,964
    "ethics_cm": HubDefault("hendrycks/ethics", ("commonsense",), "test"),
    "moral_stories": HubDefault("demelin/moral_stories", ("full",), "train"),
    "moralchoice": HubDefault("ninoscherrer/moralchoice", None, "test"),
    "bbq": HubDefault("heegyu/bbq", None, "test"),  # holds BBQ's own data/*.jsonl; every category is read
}
# Known repositories other than the defaults, with their evaluation split (None: every split, where the splits
# are BBQ's categories or a partition of them)
KNOWN_SPLITS = {"allenai/reward-bench-2": "test", "walledai/BBQ": None, "Elfsong/BBQ": None, "chuxuecao/BBQ": None}


@dataclass(frozen=True)
class HubSpec:
    repo: str
    revision: str | None = None

    def __str__(self) -> str:
        return f"{PREFIX}{self.repo}" + (f"@{self.revision}" if self.revision else "")


def parse_spec(text: str) -> HubSpec | None:
    """``hf:ORG/NAME[@REVISION]`` -> HubSpec; anything else -> None."""
    if not str(text).startswith(PREFIX):
        return None
    body = str(text)[len(PREFIX):]
    repo, _, rev = body.partition("@")
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", repo) or (_ and not rev):
        raise DataFormatError(f"--data {text}: expected hf:ORG/NAME or hf:ORG/NAME@REVISION")
    return HubSpec(repo, rev or None)


# --- class-label names ----------------------------------------------------------------------------------------------
def _walk_features(node, path: str, out: dict) -> None:
    """Class-label names in a `datasets` features dict (``Features.to_dict()``, parquet's huggingface metadata)."""
    if isinstance(node, list):  # the older list form [feature] of a sequence
        for sub in node:
            _walk_features(sub, path, out)
    elif isinstance(node, dict):
        kind = node.get("_type")
        if kind == "ClassLabel":
            out[path] = list(node.get("names") or [])
        elif kind in ("Sequence", "List", "LargeList"):
            _walk_features(node.get("feature"), path, out)
        elif kind is None:
            for key, sub in node.items():
                _walk_features(sub, f"{path}.{key}" if path else key, out)


def _walk_card(fields, path: str, out: dict) -> None:
    """Class-label names in a README's ``dataset_info: features:`` (YAML: a list of name + dtype / sequence / list /
    struct, nested as deep as the data)."""
    for f in fields if isinstance(fields, list) else []:
        if isinstance(f, dict) and "name" in f:
            name = f"{path}.{f['name']}" if path else str(f["name"])
            for key in ("dtype", "sequence", "list", "struct"):
                _card_type(f.get(key), name, out)


def _card_type(node, name: str, out: dict) -> None:
    if isinstance(node, list):  # a struct's fields
        _walk_card(node, name, out)
    elif isinstance(node, dict):
        if isinstance(node.get("class_label"), dict):
            names = node["class_label"].get("names") or {}
            out[name] = ([names[k] for k in sorted(names, key=int)] if isinstance(names, dict) else list(names))
        for key in ("sequence", "list", "struct", "dtype"):
            _card_type(node.get(key), name, out)


def _parquet_class_names(path: Path) -> dict:
    import polars as pl

    out: dict = {}
    try:
        meta = json.loads(pl.read_parquet_metadata(path).get("huggingface") or "{}")
    except (ValueError, OSError):
        return out
    _walk_features((meta.get("info") or {}).get("features") or {}, "", out)
    return out


# --- local folders --------------------------------------------------------------------------------------------------
def _card(folder: Path) -> dict:
    readme = folder / "README.md"
    if not readme.is_file():
        return {}
    from probe.textfile import read_text

    text = read_text(readme)
    m = re.match(r"---\s*\n(.*?)\n---\s*(\n|$)", text, re.S)
    if not m:
        return {}
    import yaml

    try:
        card = yaml.safe_load(m[1])
    except yaml.YAMLError as err:
        raise DataFormatError(f"{readme}: the YAML header is not valid ({err})") from None
    return card if isinstance(card, dict) else {}


def _card_class_names(card: dict, config: str) -> dict:
    infos = card.get("dataset_info")
    infos = infos if isinstance(infos, list) else [infos] if isinstance(infos, dict) else []
    out: dict = {}
    for info in infos:
        if isinstance(info, dict) and info.get("config_name", "default") == config:
            _walk_card(info.get("features"), "", out)
    return out


def _globs(folder: Path, patterns) -> list[Path]:
    pats = [patterns] if isinstance(patterns, str) else list(patterns or [])
    files = {p for pat in pats for p in folder.glob(pat) if p.is_file() and p.suffix in DATA_SUFFIXES}
    return sorted(files)


def _declared(folder: Path, card: dict) -> dict[tuple[str, str], list[Path]]:
    """(config, split) -> files, as the README's ``configs`` declare them."""
    out: dict[tuple[str, str], list[Path]] = {}
    for c in card.get("configs") or []:
        if not isinstance(c, dict):
            continue
        name = str(c.get("config_name", "default"))
        files = c.get("data_files")
        if isinstance(files, (str, list)) and all(isinstance(f, str) for f in ([files] if isinstance(files, str)
                                                                              else files)):
            files = [{"split": "train", "path": files}]
        for f in files or []:
            if isinstance(f, dict) and "path" in f:
                out[(name, str(f.get("split", "train")))] = _globs(folder, f["path"])
    return out


SPLIT_WORDS = ("train", "test", "validation", "valid", "dev", "filtered", "raw", "eval")


def _inferred(folder: Path) -> dict[tuple[str, str], list[Path]]:
    """(config, split) -> files, from the Hub's file naming where the README declares nothing."""
    out: dict[tuple[str, str], list[Path]] = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in DATA_SUFFIXES):
        rel = f.relative_to(folder).parts
        if any(part.startswith(".") for part in rel):
            continue
        dirs, stem = rel[:-1], f.name[: -len(f.suffix)]
        m = re.fullmatch(r"(.+?)-\d{5}-of-\d{5}", stem)
        if m:  # data/<split>-00000-of-00001.parquet, <config>/<split>-00000-of-00001.parquet
            split, config = m[1], (dirs[-1] if dirs and dirs[-1] != "data" else "default")
        elif re.fullmatch(r"\d{4,5}", stem) and dirs:  # refs/convert/parquet: <config>/<split>/0000.parquet
            split, config = dirs[-1], (dirs[-2] if len(dirs) > 1 else "default")
        else:
            m = re.fullmatch(rf".*?[-_.]({'|'.join(SPLIT_WORDS)})", stem) or re.fullmatch(
                rf"({'|'.join(SPLIT_WORDS)})", stem)
            if not m:
                continue
            split, config = m[1], (dirs[-1] if dirs and dirs[-1] != "data" else "default")
        out.setdefault((config, split), []).append(f)
    return out


def layout(folder: Path, card: dict | None = None) -> dict[tuple[str, str], list[Path]]:
    """The (config, split) -> files of a folder laid out as a Hub data set (empty when it is not one); ``card``: its
    README's header, where the caller has read it."""
    return _declared(folder, _card(folder) if card is None else card) or _inferred(folder)


def _read_file(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        import polars as pl

        try:
            return pl.read_parquet(path).to_dicts()
        except Exception as err:  # noqa: BLE001 - polars raises several kinds; one clear line instead
            raise DataFormatError(f"{path}: not a readable parquet file ({str(err).splitlines()[0]})") from None
    return [row for _, row in file_rows(path)]


@dataclass(frozen=True)
class Selection:
    """Which configs and splits of a Hub data set to read."""

    configs: tuple[str, ...] | None = None  # None: the only one, or every one where `all_configs`
    split: str | None = None  # None: the default split where there is one, else the only one
    default_split: str | None = None
    all_configs: bool = False  # configs are parts of one whole (StereoSet's two parts, BBQ's categories)
    all_splits: bool = False  # so are splits, where there is no default split (BBQ copies split by category)

    def pick_configs(self, found: list[str], where: str) -> list[str]:
        if self.configs:
            return [_pick(found, want, "subset (config)", where, "--subset") for want in self.configs]
        if len(found) > 1 and not self.all_configs:
            raise DataFormatError(f"{where}: several subsets (configs) ({', '.join(found)}): give --subset")
        whole = [c for c in found if c.lower() != "all"]  # an "all" config repeats the others
        return whole if len(found) > 1 and whole else found

    def pick_splits(self, found: list[str], where: str) -> list[str]:
        if self.split is not None:
            return [_pick(found, self.split, "split", where, "--split")]
        if self.default_split in found:
            return [self.default_split]
        if len(found) == 1 or self.all_splits:
            return found
        raise DataFormatError(f"{where}: several splits ({', '.join(found)}): give --split")


def _pick(available: list[str], wanted: str, what: str, where: str, flag: str) -> str:
    if wanted not in available:
        raise DataFormatError(f"{where}: no {what} {wanted!r}; it has {', '.join(available)} (give {flag})")
    return wanted


def read_folder(folder: Path, sel: Selection = Selection(), origin: str | None = None) -> list[Part]:
    """The parts of a Hub-layout folder that ``sel`` picks."""
    card = _card(folder)
    files = layout(folder, card)
    if not files:
        raise DataFormatError(f"{folder}: not a Hub data set folder (no configs in README.md and no files named as "
                              "the Hub names them, such as data/test-00000-of-00001.parquet)")
    parts = []
    for config in sel.pick_configs(sorted({c for c, _ in files}), str(folder)):
        for use in sel.pick_splits(sorted(s for c, s in files if c == config), f"{folder} ({config})"):
            paths = files[(config, use)]
            if not paths:
                raise DataFormatError(f"{folder}: the README names files for {config}/{use}, but none is there")
            names = _card_class_names(card, config)
            rows: list[dict] = []
            for p in paths:
                if p.suffix == ".parquet":
                    names = {**names, **_parquet_class_names(p)}
                rows += _read_file(p)
            parts.append(Part(origin or str(folder), config, use, tuple(rows), names))
    return parts


_UNREACHABLE = False  # set once this process found the Hub unreachable and went offline


# --- Hub ids --------------------------------------------------------------------------------------------------------
def _offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
               for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


def cached_snapshot(spec: HubSpec) -> tuple[Path, str] | None:
    """(folder, commit) of the repository's snapshot in the local Hub cache, without the network; None if absent."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    env = os.environ  # read now, not at import: HF_HUB_CACHE, else HF_HOME/hub (huggingface_hub's own rule)
    cache = env.get("HF_HUB_CACHE") or (str(Path(env["HF_HOME"]) / "hub") if env.get("HF_HOME") else None)
    try:
        path = Path(snapshot_download(spec.repo, repo_type="dataset", revision=spec.revision, local_files_only=True,
                                      cache_dir=cache))
    except Exception:  # noqa: BLE001 - any failure here means: not in the cache
        return None
    return path, path.name


def _offline_unless_reachable() -> bool:
    """Before `datasets` asks the Hub: where the Hub cannot be reached (checked in 3 s, as for models), turn
    `datasets` and huggingface_hub offline for this process, so an id in no cache fails at once instead of after
    about 30 s of retries. Returns whether this check turned them offline."""
    import sys

    if _offline():
        return False
    from probe.models.loading import hub_or_offline

    if hub_or_offline():
        return False
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    if "datasets" in sys.modules:  # `datasets` reads the variable at import
        sys.modules["datasets"].config.HF_HUB_OFFLINE = True
    return True


def _missing(spec: HubSpec, why: str) -> DataFormatError:
    hint = ("the Hub cannot be reached, so only caches were looked at" if _UNREACHABLE
            else "HF_DATASETS_OFFLINE is set, so only caches were looked at" if _offline()
            else "set HF_DATASETS_OFFLINE=1 to look only at caches")
    return DataFormatError(f"--data {spec}: could not be read ({why}), and no copy is in the datasets cache or the "
                           f"Hub cache; {hint}. Download it where the Hub is reachable "
                           f"(huggingface-cli download --repo-type dataset {spec.repo}) or give --data with a local copy")


def read_hub(spec: HubSpec, sel: Selection = Selection()) -> list[Part]:
    """Parts of a Hub data set: through `datasets` (Hub or its cache), else the Hub cache's snapshot."""
    global _UNREACHABLE
    _UNREACHABLE = _offline_unless_reachable() or _UNREACHABLE
    try:
        import datasets  # noqa: F401
    except ImportError:
        snap = cached_snapshot(spec)
        if snap is None:
            raise DataFormatError(f"--data {spec}: reading a Hub id needs the datasets library ({EXTRA}); no snapshot "
                                  f"of {spec.repo} is in the local Hub cache either") from None
        return read_folder(snap[0], sel, f"{PREFIX}{spec.repo}@{snap[1]}")
    try:
        return _via_datasets(spec, sel)
    except DataFormatError:
        raise
    except Exception as err:  # noqa: BLE001 - datasets raises many kinds for "not reachable, not cached"
        snap = cached_snapshot(spec)
        if snap is not None:
            return read_folder(snap[0], sel, f"{PREFIX}{spec.repo}@{snap[1]}")
        raise _missing(spec, f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}") from None


PARQUET_BRANCH = "refs/convert/parquet"  # the Hub's parquet conversion of a repository that holds a loading script


def _scripted(call, revision: str | None):
    """``call(revision)``; where the repository still holds a loading script (which `datasets` 4+ refuses), the
    same on the Hub's parquet conversion. Returns (result, revision used)."""
    try:
        return call(revision), revision
    except RuntimeError as err:
        if "script" not in str(err).lower():
            raise
        return call(PARQUET_BRANCH), PARQUET_BRANCH


def _via_datasets(spec: HubSpec, sel: Selection) -> list[Part]:
    import datasets

    def kw(rev):
        return {"revision": rev} if rev else {}

    # the revision that can be read (the parquet conversion where the repository holds a script), found once
    names_found, rev = _scripted(lambda r: datasets.get_dataset_config_names(spec.repo, **kw(r)), spec.revision)
    origin = f"{PREFIX}{spec.repo}" + (f"@{rev}" if rev else "")
    parts = []
    for config in sel.pick_configs(sorted(names_found), str(spec)):
        found = datasets.load_dataset(spec.repo, config, **kw(rev))
        for use in sel.pick_splits(sorted(found), f"{spec} ({config})"):
            ds = found[use]
            names: dict = {}
            _walk_features(ds.features.to_dict(), "", names)
            parts.append(Part(origin, config, use, tuple(ds.to_list()), names))
    return parts


def own_files(folder: Path, patterns: tuple[str, ...]) -> list[Path]:
    """The data set's own published files in a folder (a clone of its repository), by their published names."""
    return sorted({p for p in folder.rglob("*") if p.is_file()
                   and any(fnmatch.fnmatch(p.relative_to(folder).as_posix(), pat) or fnmatch.fnmatch(p.name, pat)
                           for pat in patterns)})
