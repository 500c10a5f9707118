"""The vocabulary table once per tokenizer, kept in rm-probe's cache and built while the model works.

`build_vocab_table` decodes, re-encodes and flags every id: 2.9 s for SmolLM2's 49,152 ids on this project's CPU,
and the second GPU run measured it, with the self-check and Parquet, at 13.1 s beside a 9.3 s engine loop on Llama
3.1's 128,256 ids. Its result depends only on the tokenizer, the flagging code and the libraries that decode, so it
is kept in ``<rm-probe cache>/vocab/<key>.table`` (``$RM_PROBE_CACHE``, else ``$XDG_CACHE_HOME/rm-probe``), the
key a SHA-256 of:

* the tokenizer's content: the files ``save_pretrained`` writes (tokenizer.json, its config, a SentencePiece model)
  and the source of its class where that is not transformers' own (remote code, rm-probe's GGUF reader); never its
  name or path, so a renamed or moved copy hits and an edited file misses;
* the flagging code's version: the bytes of probe/core/vocab.py and probe/data/short_words.txt, and ``FORMAT``;
* the versions of transformers, tokenizers and wordfreq (None where wordfreq is missing: the W flag is then null);
* the number of ids.

A file is the table as Parquet behind a header of its key and the payload's SHA-256, written to a temporary name,
fsynced and renamed into place (runs/rundir.py): two processes building one table at once each write a whole file
and the last rename wins, and a reader sees a whole file or none. A file that does not check out (cut short,
damaged, another key's) is rebuilt and replaced. A cache folder that cannot be written costs the saving, never
the run: the table is then built each time.

`VocabJob` starts the table before the sweep loop and `result` joins it where the table is first needed (writing
the results): a hit reads the file at once; a miss of at least ``INLINE_IDS`` ids is built by a child process
(``python -m probe.core.vocab_cache``, at a lower priority, the tokenizer pickled to it), not a thread: most of
the build holds the GIL (transformers' Python around the Rust tokenizer: 2.1 s of the 2.9 s above), and a thread
holding it delays every kernel launch of a GPU loop by up to the 5 ms switch interval. Whatever goes wrong in the
child (a tokenizer class it cannot import, no memory) falls back to building the table here when it is needed.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import io
import json
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import weakref
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import polars as pl

from probe.core import vocab

log = logging.getLogger(__name__)

FORMAT = 1  # bump when a file's layout or the key's parts change
MAGIC = b"rm-probe vocabulary table\n"
# below this a table is built here: 8,192 ids take about 0.5 s on this project's CPU (60 us an id, SmolLM2), less than
# a child process spends importing polars and transformers (about 1 s) before it starts
INLINE_IDS = 8192
FLAGGING_FILES = (Path(vocab.__file__), Path(vocab.__file__).parents[1] / "data" / "short_words.txt")


def cache_dir() -> Path:
    from probe.models.embedded import cache_root

    return cache_root() / "vocab"


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def wordfreq_version() -> str | None:
    """wordfreq's version where it is installed here (the build reads its word list), else None."""
    if "wordfreq" in sys.modules and sys.modules["wordfreq"] is None:  # blocked, as tests do to stand for its absence
        return None
    import importlib.util

    try:
        found = importlib.util.find_spec("wordfreq") is not None
    except (ImportError, ValueError):
        found = False
    return (_version("wordfreq") or "unknown") if found else None


def tokenizer_digest(tokenizer) -> str | None:
    """SHA-256 of what ``tokenizer`` is: the files it saves and the source of any class of its own; None where it
    cannot be saved (its table is then built each time)."""
    h = hashlib.sha256(f"{len(tokenizer)}\n".encode())
    for cls in type(tokenizer).__mro__:
        h.update(f"{cls.__module__}.{cls.__qualname__}\n".encode())
        top = cls.__module__.split(".")[0]
        if top != "transformers" and top not in sys.stdlib_module_names:  # its own code decodes: its bytes count
            try:
                h.update(Path(inspect.getsourcefile(cls)).read_bytes())
            except (TypeError, OSError):
                return None
    with tempfile.TemporaryDirectory(prefix="rm-probe-tokenizer-") as tmp:
        try:
            tokenizer.save_pretrained(tmp)
        except Exception as err:  # noqa: BLE001 (whatever a tokenizer class raises: no cache, the table still builds)
            log.debug("the tokenizer cannot be saved (%s): its vocabulary table is not cached", err)
            return None
        for path in sorted(p for p in Path(tmp).rglob("*") if p.is_file()):
            data = path.read_bytes()
            h.update(f"{path.relative_to(tmp).as_posix()}\n{len(data)}\n".encode())
            h.update(data)
    return h.hexdigest()


def flagging_digest() -> str:
    h = hashlib.sha256(f"format {FORMAT}\n".encode())
    for path in FLAGGING_FILES:
        h.update(path.read_bytes())
    return h.hexdigest()


def table_key(tokenizer, n_ids: int, wordfreq: str | None) -> str | None:
    """The cache key of ``tokenizer``'s first ``n_ids`` ids (module docstring); None where the tokenizer cannot be
    hashed."""
    content = tokenizer_digest(tokenizer)
    if content is None:
        return None
    parts = {"tokenizer": content, "flagging": flagging_digest(), "n_ids": n_ids, "wordfreq": wordfreq,
             "transformers": _version("transformers"), "tokenizers": _version("tokenizers")}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------------------------------------ files
def encode(key: str, table: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    table.write_parquet(buf)
    payload = buf.getvalue()
    return MAGIC + f"{key}\n{hashlib.sha256(payload).hexdigest()}\n".encode() + payload


def decode(data: bytes, key: str, n_ids: int) -> pl.DataFrame | None:
    """The table in ``data`` if it is a whole file of ``key`` with ``n_ids`` rows in the table's schema, else None."""
    if not data.startswith(MAGIC):
        return None
    head = data[len(MAGIC) :].split(b"\n", 2)
    if len(head) != 3 or head[0].decode(errors="replace") != key:
        return None
    payload = head[2]
    if hashlib.sha256(payload).hexdigest().encode() != head[1]:
        return None
    try:
        table = pl.read_parquet(io.BytesIO(payload))
    except Exception:  # noqa: BLE001 (a payload whose digest matched but that polars cannot read: not ours)
        return None
    if dict(table.schema) != vocab.VOCAB_SCHEMA or table.height != n_ids:
        return None
    return table


def read(path: Path, key: str, n_ids: int) -> pl.DataFrame | None:
    """The cached table at ``path``; None where there is none or it does not check out (said, and rebuilt)."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        log.warning("the cached vocabulary table %s cannot be read (%s): building it again", path, err)
        return None
    table = decode(data, key, n_ids)
    if table is None:
        log.warning("the cached vocabulary table %s is damaged or incomplete: building it again", path)
    return table


def write(path: Path, key: str, table: pl.DataFrame) -> bool:
    """``table`` into ``path`` whole or not at all (a temporary file, fsynced, renamed); False where the folder
    cannot be written."""
    from probe.runs.rundir import atomic_write_bytes

    try:
        atomic_write_bytes(path, encode(key, table))
    except OSError as err:
        _warn_not_kept(path.parent, err)
        return False
    return True


_NOT_KEPT: set[Path] = set()


def _warn_not_kept(folder: Path | None, err: OSError | None = None) -> None:
    """Said once per folder and process."""
    if folder is not None and folder not in _NOT_KEPT:
        _NOT_KEPT.add(folder)
        log.warning("the vocabulary table cannot be kept in %s (%s): it is built again by each run", folder,
                    err or "not writable")


def _consistent(table: pl.DataFrame, wordfreq: str | None) -> bool:
    """The W flag is null exactly when the key says wordfreq is missing (an installed wordfreq that fails to import
    builds a table the key does not describe: it is used, not kept)."""
    return (wordfreq is None) == (table["is_word"].null_count() == table.height and table.height > 0)


# ------------------------------------------------------------------------------------------------ the job
class VocabJob:
    """``tokenizer``'s vocabulary table for its first ``n_ids`` ids (all where None), on its way: read from the cache,
    built here (under ``INLINE_IDS`` ids, or ``background=False``), or built by a child process while the caller
    scores; `result` waits for it and closes the job. A job left unfinished (a run stopped by an error) stops its
    child when it is collected or this process exits; `close`, or a ``with`` block, stops it at once."""

    def __init__(self, tokenizer, n_ids: int | None = None, background: bool | None = None):
        self.tokenizer, self.n_ids = tokenizer, len(tokenizer) if n_ids is None else n_ids
        self.wordfreq = wordfreq_version()
        if self.wordfreq is None:
            vocab._warn_no_wordfreq()  # said here, once, where the build may happen in the child
        self.key = table_key(tokenizer, self.n_ids, self.wordfreq)
        self.path = cache_dir() / f"{self.key}.table" if self.key else None
        self.source = "cache"  # where the table came from: cache, here, child
        self._table = read(self.path, self.key, self.n_ids) if self.path else None
        self._child: subprocess.Popen | None = None
        self._tmp: str | None = None
        self._cleanup = None
        if self._table is not None:
            return
        if background is None:
            background = self.n_ids >= INLINE_IDS
        if not (background and self._start()):
            self._table = self._build_here()

    def _build_here(self) -> pl.DataFrame:
        self.source = "here"
        table = vocab.build_vocab_table(self.tokenizer, self.n_ids)
        if self.path and _consistent(table, self.wordfreq):
            write(self.path, self.key, table)
        return table

    def _start(self) -> bool:
        """The child that builds the table into the cache (or a temporary file where the cache cannot be written);
        False where the tokenizer cannot be handed to it."""
        self._tmp = tempfile.mkdtemp(prefix="rm-probe-vocab-")
        try:
            with open(os.path.join(self._tmp, "tokenizer.pickle"), "wb") as fh:
                pickle.dump(self.tokenizer, fh, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as err:  # noqa: BLE001 (an unpicklable tokenizer class: built here instead)
            log.debug("the tokenizer cannot be pickled (%s): its vocabulary table is built in this process", err)
            _remove(None, self._tmp)
            self._tmp = None
            return False
        if self.path and _writable(self.path.parent):
            self.out = self.path
        else:
            _warn_not_kept(self.path.parent if self.path else None)
            self.out = Path(self._tmp) / "table"
        cmd = [sys.executable, "-m", "probe.core.vocab_cache", "--tokenizer", os.path.join(self._tmp, "tokenizer.pickle"),
               "--n-ids", str(self.n_ids), "--key", self.key or "-", "--out", str(self.out)]
        if self.wordfreq is None:
            cmd.append("--no-wordfreq")
        # the child imports what this process imports: the same folders first on its path
        paths = [os.path.abspath(p or os.curdir) for p in sys.path]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
        with open(os.path.join(self._tmp, "stderr"), "wb") as err:
            self._child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                           env=env, close_fds=True)
        self.source = "child"
        self._cleanup = weakref.finalize(self, _remove, self._child, self._tmp)
        return True

    def done(self) -> bool:
        return self._table is not None or (self._child is not None and self._child.poll() is not None)

    def result(self) -> pl.DataFrame:
        """The table: waits for the child where one builds it; builds it here if the child failed."""
        if self._table is None:
            code = self._child.wait()
            table = None
            if code == 0:
                try:
                    table = decode(self.out.read_bytes(), self.key or "-", self.n_ids)
                except OSError:
                    table = None
            if table is None:
                try:
                    err = Path(self._tmp, "stderr").read_text(errors="replace").strip().splitlines()
                except OSError:  # closed before: the child was stopped and its files removed
                    err = ["stopped"]
                log.warning("the vocabulary table's child process failed (exit %s: %s): building it here", code,
                            err[-1] if err else "no message")
                table = self._build_here()
            self._table = table
            self.close()
        return self._table

    def close(self) -> None:
        """Stop the child if it still runs and remove its temporary files."""
        if self._cleanup is not None:
            self._cleanup()

    def __enter__(self) -> VocabJob:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK | os.X_OK)


def _remove(child: subprocess.Popen | None, tmp: str | None) -> None:
    import shutil

    if child is not None and child.poll() is None:
        child.kill()
        child.wait()
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)


def vocab_table(tokenizer, n_ids: int | None = None) -> pl.DataFrame:
    """``tokenizer``'s vocabulary table (`build_vocab_table`), from the cache where it is there, else built here and
    kept."""
    return VocabJob(tokenizer, n_ids, background=False).result()


# ------------------------------------------------------------------------------------------------ the child
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="build one vocabulary table into a file (VocabJob's child)")
    ap.add_argument("--tokenizer", required=True, help="a pickled tokenizer")
    ap.add_argument("--n-ids", type=int, required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-wordfreq", action="store_true", help="build as where wordfreq is missing (the W flag null)")
    args = ap.parse_args(argv)
    try:
        os.nice(10)  # the model's process first: this one fills the time it leaves
    except OSError:
        pass
    if args.no_wordfreq:
        sys.modules["wordfreq"] = None  # type: ignore[assignment]
    with open(args.tokenizer, "rb") as fh:
        tokenizer = pickle.load(fh)
    table = vocab.build_vocab_table(tokenizer, args.n_ids)
    if not _consistent(table, None if args.no_wordfreq else "installed") and args.key != "-":
        print("wordfreq did not import here: the table does not match its key", file=sys.stderr)
        return 1
    from probe.runs.rundir import atomic_write_bytes

    atomic_write_bytes(Path(args.out), encode(args.key, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
