"""A run's timing in ``meta["timing"]``: per prompt and per session, kept up to date after every shard so that
a killed session's work still counts when the run is resumed."""

from __future__ import annotations

import datetime as dt
import time


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def minutes(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


def shard_timing(t0: float, t1: float, t2: float, n: int) -> dict:
    """Seconds spent on the prefix and self-check (t0..t1) and on the rows (t1..t2) for n rows scored."""
    return {"prefix_and_check_s": round(t1 - t0, 3), "sweep_s": round(t2 - t1, 3), "tokens_scored_now": n,
            "tokens_per_s": round(n / (t2 - t1), 2) if n and t2 > t1 else None}


class SessionTiming:
    """This session's part of a run's timing in ``meta["timing"]``: per prompt (totals over every session, via
    `_accumulate`) and in ``sessions``, updated after every shard so that a killed session's work still counts,
    and the run's totals over all sessions at the end."""

    def __init__(self, meta: dict, started: str, load_s: float, processes: int):
        self.timing = meta["timing"]
        self.session = {"started": started, "load_s": load_s, "processes": processes, "sweep_s": 0.0,
                        "tokens_scored": 0, "wall_s": None}
        self.timing.setdefault("sessions", []).append(self.session)
        self.finished: dict[str, dict] = {}

    def record(self, key: str, before: dict | None, now: dict, t_start: float) -> None:
        self.timing["prompts"][key] = _accumulate(before, now)
        parts = {**self.finished, key: now}.values()
        self.session["sweep_s"] = round(sum(t["sweep_s"] for t in parts), 3)
        self.session["tokens_scored"] = sum(t["tokens_scored_now"] for t in parts)
        self.session["wall_s"] = round(time.perf_counter() - t_start, 3)

    def finish(self, t_start: float) -> None:
        self.session["wall_s"] = round(time.perf_counter() - t_start, 3)
        sessions = self.timing["sessions"]
        sweep_s = sum(x["sweep_s"] for x in sessions)
        scored = sum(x["tokens_scored"] for x in sessions)
        self.timing.update({
            "load_s": self.session["load_s"], "wall_s": round(sum(x["wall_s"] or 0 for x in sessions), 3),
            "sweep_s": round(sweep_s, 3), "tokens_per_s": round(scored / sweep_s, 2) if sweep_s else None,
            "processes": self.session["processes"],
        })


def _accumulate(before: dict | None, now: dict) -> dict:
    """One prompt's timing over every session of a run (an interrupted run resumed later): totals of sweep time
    and tokens, and this session's part."""
    before = before or {}
    sweep_s = before.get("sweep_s", 0.0) + now["sweep_s"]
    scored = before.get("tokens_scored", 0) + now["tokens_scored_now"]
    return {"prefix_and_check_s": now["prefix_and_check_s"], "sweep_s": round(sweep_s, 3), "tokens_scored": scored,
            "tokens_per_s": round(scored / sweep_s, 2) if sweep_s else None,
            "sweep_s_now": now["sweep_s"], "tokens_scored_now": now["tokens_scored_now"]}


def credit_unrecorded(timing: dict, field: str, on_disk: dict[str, int]) -> int:
    """On resume: rows an earlier session scored and saved but never counted, credited to the latest session (the
    one that was stopped), and said so (``<field>_found_on_resume``); returns how many.

    Under torchrun only rank 0 writes meta.json, and it learns the other ranks' counts when a prompt ends: a session
    stopped mid-prompt counted rank 0's shards only, while every rank's finished shards stay on disk (one process
    stopped between a shard and its meta.json likewise). Every row in ``on_disk`` (prompt key -> rows of finished
    checkpoints) was scored once, by an earlier session, so the sessions' counts are at least these. ``timing``:
    a run's ``meta["timing"]``; a sweep's per-prompt totals (``prompts``) are raised to them too."""
    sessions = timing.get("sessions") or []
    prompts = timing.get("prompts")
    if prompts is not None:  # a sweep: per prompt, the total over its sessions
        missing = 0
        for key, n in on_disk.items():
            entry = prompts.setdefault(key, {"sweep_s": 0.0, field: 0})
            if n > entry.get(field, 0):
                missing += n - entry.get(field, 0)
                entry[field] = n
    else:
        missing = max(0, sum(on_disk.values()) - sum(s.get(field, 0) for s in sessions))
    if missing and sessions:
        sessions[-1][field] = sessions[-1].get(field, 0) + missing
        sessions[-1][f"{field}_found_on_resume"] = sessions[-1].get(f"{field}_found_on_resume", 0) + missing
    return missing


def rows_on_disk(run, keys: list[str], n: int, shard_size: int) -> dict[str, int]:
    """Per prompt key, the rows of its finished shards that a resume keeps (`RunDir.read_shard`: one it cannot read
    is scored again, and counted then), of ``n`` rows in shards of ``shard_size``."""
    sizes = [min(shard_size, n - s * shard_size) for s in range(-(-n // shard_size))]
    return {k: sum(m for s, m in enumerate(sizes) if run.read_shard(k, s, m) is not None) for k in keys}
