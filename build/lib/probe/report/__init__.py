"""The auditors' reports: the terminal table (text), one run's HTML page (single), several runs side by side
(multi). Page templates are package data (templates/); the provenance table is shared (provenance)."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=None)
def page_template(name: str) -> str:
    """A page template shipped in probe/report/templates/."""
    from importlib.resources import files

    return files("probe.report").joinpath("templates", name).read_text(encoding="utf-8")
