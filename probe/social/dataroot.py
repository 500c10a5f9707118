"""Where the slices of the published social data sets live: ``$RM_PROBE_SOCIAL_DATA``, else
``../shared/data/social`` beside the checkout (what the tests and experiments read).

A suite file names a file under that folder as ``$RM_PROBE_SOCIAL_DATA/bbq/Age.jsonl`` (``${RM_PROBE_SOCIAL_DATA}``
also reads); the suite loader puts the folder in its place, so one suite file runs in any clone. Other data paths
(absolute, relative to the suite file, ``hf:`` ids) are read as before.
"""

from __future__ import annotations

import os
from pathlib import Path

from probe.errors import DataFormatError

ENV = "RM_PROBE_SOCIAL_DATA"
PLACEHOLDERS = ("${" + ENV + "}", "$" + ENV)


def default_root() -> Path:
    """../shared/data/social beside the checkout this package is in."""
    return Path(__file__).resolve().parents[3] / "shared" / "data" / "social"


def social_data_root() -> Path:
    """$RM_PROBE_SOCIAL_DATA where set (relative to the working directory), else `default_root`."""
    return Path(os.environ.get(ENV) or default_root()).expanduser().resolve()


def expand(data: str, where: str) -> str | None:
    """``data`` with a leading placeholder replaced by the social data root; None where it has none. One line
    (naming ``where``, e.g. the suite entry) where the root or the file under it does not exist."""
    head = next((p for p in PLACEHOLDERS if data == p or data.startswith(p + "/")), None)
    if head is None:
        return None
    root = social_data_root()
    if os.environ.get(ENV):
        source = f"{ENV}={os.environ[ENV]}"
    else:
        source = f"{ENV} is not set, so the default ../shared/data/social beside the checkout"
    if not root.is_dir():
        raise DataFormatError(f"{where}: {data}: {source} ({root}) is not a folder; set {ENV} to the folder of "
                              "the social data slices")
    path = root / data[len(head):].lstrip("/")
    if not path.exists():
        raise DataFormatError(f"{where}: {data}: {path} does not exist ({source})")
    return str(path)
