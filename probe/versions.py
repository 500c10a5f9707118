"""The torch and transformers versions rm-probe is tested with, and one warning for a version outside them.

CI runs the engine-parity tests (every family x head x path against the model's own forward) on three version sets
(README, "Where it runs"; the sets are `.ci/matrix/*.txt`): the lowest that ``pyproject.toml`` allows, the GPU
machine's, and the newest CI installs; `make test-versions` runs them on every transformers minor release in the
range (experiments/results/versions.md). A version outside the span from the lowest to the newest tested series runs,
but nothing has checked it: the model's own forward still checks every run (the self-check), but a version may pick
another attention implementation or cache layout (transformers 5.17 runs Gemma 2 with SDPA, which drops its
soft-cap: probe/models/attention.py), so it is said once per process.
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)

# package -> (lowest tested, newest tested series): the lowest is pyproject.toml's lower bound
# (.ci/matrix/lowest.txt), the newest a release series whose every patch release counts as tested
TESTED = {"torch": ("2.6.0", "2.13"), "transformers": ("5.2.0", "5.24")}


def outside(package: str, version: str) -> bool:
    """Whether ``version`` of ``package`` lies outside the tested span (local builds such as +cu130 ignored)."""
    from packaging.version import Version

    low, high = TESTED[package]
    have = Version(version.split("+")[0])
    series = Version(high).release
    return have < Version(low) or have.release[: len(series)] > series


def tested_span(package: str) -> str:
    low, high = TESTED[package]
    return f"{low} to {high}.x"


@functools.cache
def check_versions() -> tuple[str, ...]:
    """Warn once per process for each of torch and transformers outside the tested span; return the warnings."""
    import torch
    import transformers

    said = []
    for package, version in (("torch", torch.__version__), ("transformers", transformers.__version__)):
        if outside(package, version):
            said.append(f"{package} {version} is outside the versions rm-probe is tested with "
                        f"({tested_span(package)}; README, 'Where it runs'): every run still checks its scores "
                        "against the model's own forward, but this version's loading and attention are untested")
            log.warning("%s", said[-1])
    return tuple(said)
