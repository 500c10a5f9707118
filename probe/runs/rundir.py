"""Run directories: the only interface between scoring and analysis.

``<root>/<sanitized-model>/<experiment>_<UTC timestamp>/`` holds ``meta.json`` (settings, provenance,
timings, status), ``vocab.parquet``, ``scores.parquet`` and ``checkpoints/``. A directory is never reused
for another run; ``--resume`` continues an unfinished one only when its fingerprint (every setting that
changes a number) matches. Every file is written to a temporary name and renamed into place, so a crash
leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import polars as pl

from probe.errors import ResumeError

META = "meta.json"
SCORES = "scores.parquet"
VOCAB = "vocab.parquet"


def sanitize_model_name(name: str) -> str:
    """``org/model`` or a path -> a safe folder name (``org__model``)."""
    name = name.rstrip("/")
    if os.sep in name and Path(name).exists():
        name = "/".join(Path(name).parts[-2:])
    return re.sub(r"[^A-Za-z0-9._-]+", "__", name).strip("_") or "model"


def model_runs_dir(root: str | Path, model: str) -> Path:
    """The folder that holds one model's runs: ``<root>/<sanitized model id>``."""
    return Path(root) / sanitize_model_name(model)


def utc_stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H-%M-%SZ")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write through ``write`` into a temporary file beside ``path``, fsync it, then rename it over ``path``:
    a reader (or a later --resume) sees the old file or the whole new one, never half of it. The file gets the
    mode an ordinary ``open`` would give it (0666 less the umask), not mkstemp's private 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_umask())
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    _atomic_write(path, lambda fh: fh.write(data))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, default=str) + "\n").encode())


def atomic_write_parquet(path: Path, df: pl.DataFrame) -> None:
    _atomic_write(path, df.write_parquet)


def writable_dir(path: str | Path, flag: str) -> Path:
    """``path`` as a folder results can be written to (created if missing), checked before any model loads."""
    from probe.errors import ProbeError

    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise ProbeError(f"{flag} {path}: is a file, not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".write-test-"):
            pass
    except OSError as err:
        raise ProbeError(f"{flag} {path}: cannot write there ({err.strerror or err}); choose another folder") from None
    return p


def writable_file(path: str | Path, flag: str) -> Path:
    """``path`` as a file that can be written (its folder created if missing), checked before the work starts."""
    from probe.errors import ProbeError

    p = Path(path).expanduser()
    if p.is_dir():
        raise ProbeError(f"{flag} {path}: is a folder; give a file name")
    try:
        writable_dir(p.parent if str(p.parent) else Path("."), flag)
    except ProbeError as err:
        raise ProbeError(f"{flag} {path}: {str(err).split(': ', 1)[1]}") from None
    return p


def fingerprint(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        # generated outputs (figures, results) do not make the code that computes numbers "dirty"
        dirty = subprocess.run(["git", "status", "--porcelain", "--", ":/", ":(exclude,top)figures",
                                ":(exclude,top)results"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def environment() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    from probe.runs.cpu import describe as cpu_threading

    import torch
    import transformers

    def ver(pkg: str) -> str | None:
        try:
            return version(pkg)
        except PackageNotFoundError:
            return None

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "cpu": cpu_threading(),
        "gpus": gpus,
        "cuda": torch.version.cuda,
        "versions": {
            "rm-probe": ver("rm-probe"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "numpy": np.__version__,
            "polars": pl.__version__,
        },
        "git_commit": git_commit(),
        "command": command_line(),
        "argv": list(sys.argv),
    }


def command_line(argv: list[str] | None = None) -> str:
    """The command as it was typed, arguments included: ``python -m probe.exhaustive --prompt '...'`` for a
    module run (whose ``sys.argv[0]`` is the module's file), else the program's name and its arguments."""
    import shlex

    argv = list(sys.argv if argv is None else argv)
    first = Path(argv[0]) if argv and argv[0] else Path("python")
    package_root = Path(__file__).resolve().parents[2]  # the folder that holds probe/
    head = [first.name]
    if first.suffix == ".py":
        try:
            rel = first.resolve().relative_to(package_root).with_suffix("")
            parts = rel.parts[:-1] if rel.parts[-1] == "__main__" else rel.parts
            head = ["python", "-m", ".".join(parts)]
        except ValueError:
            head = ["python", str(first)]
    return shlex.join(head + argv[1:])


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    @classmethod
    def create(cls, root: str | Path, model: str, experiment: str) -> RunDir:
        base = model_runs_dir(root, model)
        base.mkdir(parents=True, exist_ok=True)
        stamp = utc_stamp()
        for n in range(1000):
            path = base / (f"{experiment}_{stamp}" + (f"-{n}" if n else ""))
            try:
                path.mkdir()
                return cls(path)
            except FileExistsError:
                continue
        raise RuntimeError(f"cannot create a run directory under {base}")

    # --- meta -------------------------------------------------------------------------------------
    @property
    def meta_path(self) -> Path:
        return self.path / META

    def read_meta(self) -> dict:
        if not self.path.is_dir():
            raise ResumeError(f"{self.path}: no such run folder")
        if not self.meta_path.is_file():
            raise ResumeError(f"{self.path}: not a run folder (it has no {META}); give a folder that probe score, "
                              "gcg or social wrote")
        try:
            return json.loads(self.meta_path.read_text())
        except OSError as err:
            raise ResumeError(f"{self.path}: cannot read {META} ({err.strerror or type(err).__name__})") from None
        except json.JSONDecodeError as err:
            raise ResumeError(f"{self.path}: {META} is not valid JSON (line {err.lineno}, column {err.colno}: "
                              f"{err.msg}); the run was damaged") from None

    def write_meta(self, meta: dict) -> None:
        atomic_write_json(self.meta_path, meta)

    # --- checkpoints --------------------------------------------------------------------------------
    def shard_path(self, prompt_key: str, shard: int) -> Path:
        return self.path / "checkpoints" / prompt_key / f"shard_{shard:06d}.npy"

    def read_shard(self, prompt_key: str, shard: int, expected_len: int) -> np.ndarray | None:
        path = self.shard_path(prompt_key, shard)
        if not path.is_file():
            return None
        try:
            arr = np.load(path)
        except (OSError, ValueError):
            return None  # unreadable: score it again
        return arr if arr.shape == (expected_len,) else None

    def write_shard(self, prompt_key: str, shard: int, scores: np.ndarray) -> None:
        import io

        buf = io.BytesIO()
        np.save(buf, np.asarray(scores, dtype=np.float32))
        atomic_write_bytes(self.shard_path(prompt_key, shard), buf.getvalue())

    def write_chunks(self, key: str, chunks: dict[int, np.ndarray]) -> None:
        """Finished chunks of rows (chunk number -> its scores) in one file, ``checkpoints/<key>/chunks_<first>.npz``
        (a chunk is finished once, so the first chunk's number names the file)."""
        import io

        order = sorted(chunks)
        buf = io.BytesIO()
        np.savez(buf, chunks=np.asarray(order, dtype=np.int64),
                 scores=np.concatenate([np.asarray(chunks[c], dtype=np.float32) for c in order]))
        atomic_write_bytes(self.path / "checkpoints" / key / f"chunks_{order[0]:06d}.npz", buf.getvalue())

    def read_chunks(self, key: str, sizes: list[int]) -> dict[int, np.ndarray]:
        """Every finished chunk `write_chunks` kept under ``key`` whose file holds chunks of ``sizes`` (rows per chunk
        number); a file that cannot be read or does not fit is left out (those chunks are scored again)."""
        out: dict[int, np.ndarray] = {}
        for path in sorted((self.path / "checkpoints" / key).glob("chunks_*.npz")):
            try:
                with np.load(path) as f:
                    numbers, scores = f["chunks"].tolist(), f["scores"]
            except (OSError, ValueError, KeyError):
                continue
            if not numbers or not all(0 <= c < len(sizes) for c in numbers) or \
                    sum(sizes[c] for c in numbers) != scores.shape[0]:
                continue
            ends = np.cumsum([sizes[c] for c in numbers])
            out |= {c: scores[e - sizes[c] : e] for c, e in zip(numbers, ends)}
        return out

    # --- tables ---------------------------------------------------------------------------------------
    def write_table(self, name: str, df: pl.DataFrame) -> Path:
        path = self.path / name
        atomic_write_parquet(path, df)
        return path

    def read_table(self, name: str) -> pl.DataFrame:
        return pl.read_parquet(self.path / name)


def runs_newest_first(base: Path, experiment: str) -> list[Path]:
    """Run directories ``<experiment>_<UTC stamp>[-n]`` under ``base``, newest first (``-n`` marks runs created
    within the same second, in order)."""
    def created(path: Path) -> tuple[str, int]:
        match = re.fullmatch(r"(.*?)(?:-(\d+))?", path.name)
        return match[1], int(match[2] or 0)

    return sorted((p for p in base.glob(f"{experiment}_*") if p.is_dir()), key=created, reverse=True)


def run_metas(base: Path, experiment: str) -> Iterator[tuple[Path, dict]]:
    """(run directory, its meta.json) for the runs under ``base``, newest first; unreadable ones are passed over."""
    for path in runs_newest_first(base, experiment):
        try:
            yield path, json.loads((path / META).read_text())
        except (OSError, json.JSONDecodeError):
            continue


def find_resumable(root: str | Path, model: str, experiment: str, fp: str, complete: bool = False) -> RunDir | None:
    """The newest unfinished run of this model and experiment with the same fingerprint (``complete``: the
    newest finished one)."""
    for path, meta in run_metas(model_runs_dir(root, model), experiment):
        if (meta.get("status") == "complete") == complete and meta.get("fingerprint") == fp:
            return RunDir(path)
    return None


# settings -> the flag that sets them, for the advice when a resume does not match
SETTING_FLAGS = {"n_tokens": "--limit", "shard_size": "--shard-size", "date": "--date", "mode": "--score",
                 "dtype": "--dtype", "input_method": "--input-method", "revision": "--revision", "spec": "--spec",
                 "label_index": "--label-index", "model": "--rm", "seed": "--seed",
                 "weights.random_head.seed": "--seed", "batch_size": "--batch-size", "device_type": "--device"}


def _short(value, width: int = 48) -> str:
    text = json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= width else text[: width - 3] + "..."


def _flat(settings: dict, above: str = "") -> dict:
    """Nested settings (the weights' identity, a reference model's) as dotted names, so that what differs is named
    down to the value (``weights.random_head.seed``); the prompts' ids stay one setting."""
    out = {}
    for k, v in settings.items():
        name = f"{above}{k}"
        if isinstance(v, dict) and v and name != "prompts":
            out.update(_flat(v, name + "."))
        else:
            out[name] = v
    return out


def settings_diff(stored: dict, now: dict) -> list[str]:
    """One phrase per setting that differs: its name (and flag), the run's value and this command's."""
    stored, now = _flat(stored), _flat(now)
    keys = sorted(k for k in set(stored) | set(now)
                  if json.dumps(stored.get(k), default=str, sort_keys=True) != json.dumps(now.get(k), default=str,
                                                                                         sort_keys=True))
    out = []
    for k in keys:
        flag = f" ({SETTING_FLAGS[k]})" if k in SETTING_FLAGS else ""
        if k == "prompts":
            out.append("prompts: the templated prompt ids differ (other prompts, system prompt, template or date)")
        else:
            out.append(f"{k}{flag}: {_short(stored.get(k))} in the run, {_short(now.get(k))} now")
    return out


COMMAND_OF = {"exhaustive": "probe score", "responses": "probe score --responses", "gcg_max": "probe gcg",
              "gcg_min": "probe gcg --direction min", "beam": "probe gcg --beam K", "social": "probe social"}


def check_resume_target(resume: str | None, experiment: str) -> None:
    """``--resume DIR``, checked before any model loads: the folder exists, is a run, and is a run of this kind
    (a social run is not a sweep). ``--resume`` with no value (``latest``) is looked up later, by settings."""
    if not resume or resume == "latest":
        return
    path = Path(resume).expanduser()
    if not path.is_dir():
        raise ResumeError(f"--resume {resume}: no such folder" if not path.exists() else
                          f"--resume {resume}: a file, not a run folder")
    if not (path / META).is_file():
        raise ResumeError(f"--resume {resume}: not a run folder (it has no {META})")
    found = RunDir(path).read_meta().get("experiment", "exhaustive")
    if found != experiment:
        how = COMMAND_OF.get(found, found)
        def a(word: str) -> str:
            return ("an " if word[:1] in "aeiou" else "a ") + word

        raise ResumeError(f"--resume {resume}: {a(found)} run, not {a(experiment)} run; continue it with {how} "
                          f"--resume {resume}")


def resume_advice(meta: dict) -> str:
    """How to continue a run whose settings differ from the ones given: its own command line (meta.json records
    it) with ``--resume``; ``--resume DIR`` picks the run but does not take its settings."""
    command = (meta.get("environment") or {}).get("command") or ""
    if not command:
        return "Pass the run's settings with --resume to continue it"
    if "probe.batch" in command or " batch " in f" {command} ":
        return f"It is a batch job ({command}): run the batch again to continue it"
    return f"Continue it with its own command: {command}" + ("" if "--resume" in command.split() else " --resume")


def check_resumable(run: RunDir, fp: str, settings: dict) -> dict:
    meta = run.read_meta()
    if meta.get("fingerprint") != fp:
        stored = {k: v for k, v in meta.get("settings", {}).items() if k in settings}
        diff = settings_diff(stored, settings) or ["unknown settings"]
        raise ResumeError(f"{run.path} was made with other settings: {'; '.join(diff)}. {resume_advice(meta)}; or "
                          "start a new run without --resume")
    return meta


def no_match_message(root: str | Path, model: str, experiment: str, settings: dict) -> str:
    """Why ``--resume`` found nothing: the newest unfinished run of this model and experiment, and how its
    settings differ from these (with the flags and values), or that there is none."""
    for path, meta in run_metas(model_runs_dir(root, model), experiment):
        if meta.get("status") != "complete":
            stored = {k: v for k, v in meta.get("settings", {}).items() if k in settings}
            diff = settings_diff(stored, settings)
            return (f"--resume: the newest unfinished {experiment} run of {model}, {path}, was made with other "
                    f"settings: {'; '.join(diff) or 'unknown'}. {resume_advice(meta)}; or run without --resume to "
                    "start a new one")
    return (f"--resume: no unfinished {experiment} run of {model} under {root}; run without --resume to start one")


def open_or_resume(root: str | Path, model: str, experiment: str, settings: dict, resume: str | None,
                   new_meta, kept: Callable[[RunDir], str] | None = None) -> tuple[RunDir, dict]:
    """A new run directory (its meta from ``new_meta(fingerprint)``), or the unfinished one ``resume`` names
    ("latest": the newest with these settings), which says how much of it is kept (``kept(run)``: the command's own
    count, e.g. "3 of 12 shards kept, 9 to score"). A complete run is returned as it is. The run is this process's
    active run until it ends (`interrupted_note`)."""
    fp = fingerprint(settings)
    if resume:
        run = find_resumable(root, model, experiment, fp) if resume == "latest" else RunDir(resume)
        if run is None:
            raise ResumeError(no_match_message(root, model, experiment, settings))
        meta = check_resumable(run, fp, settings)
        if meta.get("status") != "complete":
            meta.setdefault("resumed", []).append({"at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                                                   "command": command_line()})
            meta["status"] = "running"
            n = len(saved_checkpoints(run))
            said = kept(run) if kept is not None else (
                f"{n:,} finished checkpoint file(s) kept" + ("" if n else " (none was finished: it starts over)"))
            print(f"resuming {run.path}: {said}", file=sys.stderr)
            _ACTIVE[:] = [run]
        return run, meta
    run = RunDir.create(root, model, experiment)
    meta = new_meta(fp)
    run.write_meta(meta)
    _ACTIVE[:] = [run]
    return run, meta


def kept_batch_size(given, meta: dict, say: bool = True):
    """The rows per forward of a social or GCG run: a resumed run keeps the batch size it was started with (its
    meta.json's config; not part of its fingerprint), so that what it scores now is batched as what it kept (on a
    GPU in bf16 the batch changes the numbers); another ``--batch-size`` is said (``say``) and set aside."""
    config = meta.get("config") or {}
    if "batch_size" not in config or config["batch_size"] == given:
        return given
    stored = config["batch_size"]
    if say:
        print(f"--resume keeps the run's batch size {stored if stored is not None else '(the default)'} (not "
              f"--batch-size {given if given is not None else '(the default)'}), so that its parts are all batched "
              "alike", file=sys.stderr)
    return stored


# the run this process is writing (open_or_resume), for what an interrupt says and leaves behind
_ACTIVE: list[RunDir] = []


def saved_checkpoints(run: RunDir) -> list[Path]:
    """A run's finished, resumable parts: sweep and response shards, social data sets, GCG restarts, beam
    depths (every file under checkpoints/, none of the temporary ones a crash may leave)."""
    folder = run.path / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".") and ".tmp" not in p.name)


def shards_kept(run: RunDir, keys: list[str], n: int, shard_size: int, unit: str) -> str:
    """What a resumed sweep or response run keeps: finished shards of all, and what is left to score."""
    per = -(-n // shard_size)
    done = {(k, s) for k in keys for s in range(per) if run.shard_path(k, s).is_file()}
    left = sum(min(shard_size, n - s * shard_size) for k in keys for s in range(per) if (k, s) not in done)
    return f"{len(done):,} of {per * len(keys):,} shards kept; {left:,} {unit} scores left"


def interrupted_note(how: str = "interrupted") -> str | None:
    """After Ctrl-C or SIGTERM: marks the active unfinished run ``interrupted`` in its meta.json and says what it
    keeps, truthfully; None where no run was open."""
    if not _ACTIVE:
        return None
    run = _ACTIVE[0]
    try:
        meta = run.read_meta()
    except (OSError, ValueError):
        return None
    if meta.get("status") == "complete":
        return f"the run had finished: {run.path}"
    meta["status"] = how
    meta.setdefault("interruptions", []).append(
        {"at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "how": how})
    run.write_meta(meta)
    kept = len(saved_checkpoints(run))
    if not kept:
        return (f"no part of {run.path} was finished, so nothing is kept to resume; run the same command again "
                "(or with --resume, which starts it over)")
    return f"{kept:,} finished checkpoint file(s) are saved in {run.path}; run the same command with --resume to continue"
