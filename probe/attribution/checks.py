"""Every explanation closes or is refused: the checks `probe explain` holds each item to, in the dtype it runs in.

1. The residual stream is the sum of the parts read (``Decomposition.stream_gap``: each position's and
   coordinate's ``resid - sum(parts)`` against Higham's bound for that many additions in the model's dtype).
2. ``sum(parts) + rest`` is the score of the forward it decomposes (the model's own forward and head), within
   `closure_tolerance` (probe/attribution/direct.py); with ``--heads``, a layer's heads sum to its attention part.
3. That forward's score is the one the run or ``probe score`` reported: float32 to the project's rule (``1e-3 x
   (1 + |score|)``, probe/core/precision.py); bf16 and fp16 to twice the rounding noise measured on this forward
   (`measured_noise`: the model run again with every module's output moved within one unit of its dtype), the
   self-check's own rule.

Any failure refuses the whole command in one line (exit 2) naming the item, the gap, its bound and the likely
cause: an explanation whose parts do not add up is never written.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from probe.attribution.direct import Decomposition
from probe.errors import ProbeError


class NotExplained(ProbeError):
    """An item whose parts do not add up to its score, or whose score is not the one reported: refused."""


def measured_noise(model: torch.nn.Module, own: Callable[[], float], score: float) -> float:
    """The rounding noise of this forward's score (`probe.core.precision.rounding_noise`): how far it moves when
    every module's output is moved within one unit of its dtype, the largest over the seeds."""
    from probe.core.precision import rounding_noise

    return rounding_noise(model, lambda: np.array([own()]), np.array([score]))


def reported_tolerance(score: float, dtype: torch.dtype, noise: float | None) -> float:
    """How far the reported score may be from the decomposed forward's (`probe.core.precision.tolerance`)."""
    from probe.core.precision import tolerance

    return float(tolerance(np.array([score]), dtype, noise)[0])


def enforce(label: str, dec: Decomposition, settings: str, reported: float | None = None,
            reported_bound: float | None = None, source: str = "the score reported", heads: bool = False) -> None:
    """Refuse ``label``'s explanation in one line where a check fails (module docstring)."""
    dtype = dec.dtype.replace("torch.", "")
    cause = f" ({settings})" if settings else ""
    if not math.isfinite(dec.stream_gap) or dec.stream_gap > 1:
        p, k, gap, bound = dec.stream_where
        raise NotExplained(
            f"probe explain: {label!r}: the residual stream is not the sum of the parts the blocks wrote (off by "
            f"{gap:.3g} at position {p}, coordinate {k}, against a {dtype} bound of {bound:.2g}): this architecture "
            f"scales or adds to its stream otherwise than read here{cause}; not explained")
    if not math.isfinite(dec.closure) or abs(dec.closure) > dec.tolerance:
        total = dec.score - dec.closure
        raise NotExplained(
            f"probe explain: {label!r}: the forward scores {dec.score:+.6g} but its parts plus rest sum to "
            f"{total:+.6g} (off by {dec.closure:+.3g}, bound {dec.tolerance:.2g} in {dtype}): the head's scale or "
            f"transform is not the one read here{cause}; not explained")
    if heads and dec.heads and dec.heads_closure > dec.heads_tolerance:
        raise NotExplained(
            f"probe explain: {label!r}: a layer's heads sum to {dec.heads_closure:.3g} away from its attention part "
            f"(bound {dec.heads_tolerance:.2g} in {dtype}): the attention's output projection is not read as this "
            f"model computes it; explain without --heads")
    if reported is not None and reported_bound is not None:
        gap = reported - dec.score
        if not math.isfinite(gap) or abs(gap) > reported_bound:
            raise NotExplained(
                f"probe explain: {label!r}: {source} is {reported:+.6g}, the forward decomposed scores "
                f"{dec.score:+.6g} (off by {gap:+.3g}, bound {reported_bound:.2g} in {dtype}): the input explained "
                "is not the one that was scored (template, system turn, date, --ref, principle, input method, spec); "
                "not explained")


def closure_line(r: dict) -> str:
    """``score = parts + rest`` as it holds: the gap and the bound it is held to (an explain.json written before
    the bound was recorded: its closure and the tolerance it had)."""
    c = r["check"]
    head = f"score {r['score']:+.4f} = parts {sum(r['components'].values()):+.4f} + rest {r['rest']:+.4f}"
    if "bound" not in c:
        return f"{head} (closure {c.get('closure', float('nan')):.2e}, allowed {c.get('closure_tolerance', 0):.1e})"
    return (f"{head} (to {abs(c['score_minus_parts_and_rest']):.1e}, within the "
            f"{c['dtype'].replace('torch.', '')} bound {c['bound']:.1e})")
