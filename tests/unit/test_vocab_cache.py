"""The vocabulary table once per tokenizer (probe/core/vocab_cache.py, issue 75): kept in rm-probe's cache under the
tokenizer's content hash, read back bit for bit, rebuilt where the tokenizer, the flagging code or the file changed,
built by a child process beside the sweep without changing any file a run writes."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import sys
import threading

import polars as pl
import pytest

from probe.core import vocab, vocab_cache
from probe.core.vocab_cache import VocabJob, table_key, vocab_table, wordfreq_version


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty rm-probe cache of the test's own."""
    monkeypatch.setenv("RM_PROBE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "vocab"


@pytest.fixture
def builds(monkeypatch):
    """How many tables were built in this process (a cache hit builds none)."""
    calls = []
    real = vocab.build_vocab_table

    def counted(tokenizer, n_ids=None, **kw):
        calls.append(n_ids)
        return real(tokenizer, n_ids, **kw)

    monkeypatch.setattr(vocab, "build_vocab_table", counted)
    return calls


def _bytes(table: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    table.write_parquet(buf)
    return buf.getvalue()


def _same(a: pl.DataFrame, b: pl.DataFrame) -> bool:
    """Equal bit for bit: values, nulls, dtypes, and the Parquet a run writes from them."""
    return a.schema == b.schema and a.equals(b) and _bytes(a) == _bytes(b)


def test_a_second_table_is_read_from_the_cache_the_same_as_a_fresh_build(tokenizers, cache, builds):
    tok = tokenizers["llama3"]
    fresh = vocab.build_vocab_table(tok)
    first = vocab_table(tok)
    assert len(builds) == 2 and len(list(cache.glob("*.table"))) == 1
    again = vocab_table(tok)
    assert len(builds) == 2  # read, not built
    assert _same(again, fresh) and _same(first, fresh)
    assert _same(vocab_table(tok, 700), vocab.build_vocab_table(tok, 700))  # another id count: its own entry
    assert len(list(cache.glob("*.table"))) == 2


def test_another_tokenizer_misses_and_a_moved_copy_hits(tokenizers, cache, builds, tmp_path):
    from transformers import AutoTokenizer

    vocab_table(tokenizers["llama3"])
    gemma = vocab_table(tokenizers["gemma"])
    assert len(builds) == 2 and _same(gemma, vocab.build_vocab_table(tokenizers["gemma"]))
    tokenizers["llama3"].save_pretrained(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "elsewhere" / "renamed")
    one = AutoTokenizer.from_pretrained(tmp_path / "a")
    other = AutoTokenizer.from_pretrained(tmp_path / "elsewhere" / "renamed")
    key = table_key(one, len(one), wordfreq_version())
    assert key == table_key(other, len(other), wordfreq_version())  # the content, not the name or the path
    vocab_table(one)
    n = len(builds)
    assert _same(vocab_table(other), vocab.build_vocab_table(other)) and len(builds) == n + 1  # +1: the reference


def test_a_changed_tokenizer_file_misses(tokenizers, cache, builds, tmp_path):
    from transformers import AutoTokenizer

    tokenizers["llama3"].save_pretrained(tmp_path / "tok")
    before = AutoTokenizer.from_pretrained(tmp_path / "tok")
    old = vocab_table(before)
    data = json.loads((tmp_path / "tok" / "tokenizer.json").read_text())
    ids = data["model"]["vocab"]
    a, b = "Ġknow", "Ġsecond"
    ids[a], ids[b] = ids[b], ids[a]  # two pieces trade ids: a valid tokenizer that decodes those two ids otherwise
    (tmp_path / "tok" / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    after = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert table_key(after, len(after), wordfreq_version()) != table_key(before, len(before), wordfreq_version())
    n = len(builds)
    new = vocab_table(after)
    assert len(builds) == n + 1 and _same(new, vocab.build_vocab_table(after))
    changed = new.join(old, on="token_id", suffix="_old").filter(pl.col("piece") != pl.col("piece_old"))
    assert sorted(changed["piece"]) == sorted([a, b])


def test_the_flagging_code_and_wordfreq_are_in_the_key(tokenizers, tmp_path, monkeypatch):
    tok = tokenizers["llama3"]
    key = table_key(tok, len(tok), "3.1.1")
    assert key == table_key(tok, len(tok), "3.1.1")
    assert key != table_key(tok, len(tok), None)  # without wordfreq the W flag is null: another table
    assert key != table_key(tok, len(tok) - 1, "3.1.1")
    copies = []
    for path in vocab_cache.FLAGGING_FILES:
        copies.append(tmp_path / path.name)
        shutil.copy(path, copies[-1])
    monkeypatch.setattr(vocab_cache, "FLAGGING_FILES", tuple(copies))
    assert table_key(tok, len(tok), "3.1.1") == key
    for copy in copies:  # an edit of the rule or of the shipped word list: every cached table misses
        text = copy.read_text()
        copy.write_text(text + "\n# changed\n")
        assert table_key(tok, len(tok), "3.1.1") != key
        copy.write_text(text)


def test_without_wordfreq_the_cached_table_has_its_word_flag_empty(tokenizers, cache, monkeypatch):
    tok = tokenizers["llama3"]
    with_words = vocab_table(tok)
    monkeypatch.setitem(sys.modules, "wordfreq", None)  # import wordfreq raises ImportError
    vocab._warn_no_wordfreq.cache_clear()
    without = vocab_table(tok)
    vocab._warn_no_wordfreq.cache_clear()
    assert without["is_word"].null_count() == without.height and with_words["is_word"].null_count() == 0
    assert len(list(cache.glob("*.table"))) == 2


@pytest.mark.parametrize("damage", ["cut in half", "one byte flipped", "empty", "not ours", "another key's"])
def test_a_damaged_or_half_written_file_is_rebuilt(tokenizers, cache, builds, caplog, damage):
    tok = tokenizers["llama3"]
    fresh = vocab.build_vocab_table(tok)
    vocab_table(tok)
    (path,) = cache.glob("*.table")
    data = path.read_bytes()
    if damage == "cut in half":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "one byte flipped":
        path.write_bytes(data[:-100] + bytes([data[-100] ^ 1]) + data[-99:])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "not ours":
        path.write_bytes(b"PAR1" + data[200:])
    else:
        vocab_table(tokenizers["gemma"])
        (other,) = (p for p in cache.glob("*.table") if p != path)
        shutil.copy(other, path)
    n = len(builds)
    with caplog.at_level(logging.WARNING, logger="probe.core.vocab_cache"):
        table = vocab_table(tok)
    assert len(builds) == n + 1 and "damaged or incomplete: building it again" in caplog.text
    assert _same(table, fresh)
    assert vocab_cache.read(path, path.stem, len(tok)) is not None  # replaced by a whole file
    assert _same(vocab_table(tok), fresh) and len(builds) == n + 1


def test_a_cache_folder_that_cannot_be_written_costs_the_saving_not_the_table(tokenizers, tmp_path, monkeypatch,
                                                                              caplog):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("RM_PROBE_CACHE", str(tmp_path / "a-file" / "cache"))  # a folder under a file: never made
    vocab_cache._NOT_KEPT.clear()
    with caplog.at_level(logging.WARNING, logger="probe.core.vocab_cache"):
        table = vocab_table(tokenizers["llama3"])
        with VocabJob(tokenizers["llama3"], background=True) as job:  # the child writes to a temporary file then
            beside = job.result()
    assert _same(table, vocab.build_vocab_table(tokenizers["llama3"])) and _same(beside, table)
    assert job.source == "child" and caplog.text.count("cannot be kept") == 1
    vocab_cache._NOT_KEPT.clear()


def test_the_child_builds_the_same_table_and_keeps_it(tokenizers, cache, builds):
    tok = tokenizers["gemma"]
    with VocabJob(tok, background=True) as job:
        assert job.source == "child"
        table = job.result()
    assert not builds  # built by the child, not here
    assert _same(table, vocab.build_vocab_table(tok))
    again = VocabJob(tok, background=True)
    assert again.source == "cache" and again.done() and _same(again.result(), table)


def test_a_child_that_fails_leaves_the_table_to_this_process(tokenizers, cache, builds, monkeypatch, caplog):
    monkeypatch.setattr(sys, "executable", shutil.which("false"))  # the child exits 1 at once
    with caplog.at_level(logging.WARNING, logger="probe.core.vocab_cache"):
        job = VocabJob(tokenizers["llama3"], background=True)
        table = job.result()
    assert "child process failed (exit 1" in caplog.text and len(builds) == 1
    assert _same(table, vocab.build_vocab_table(tokenizers["llama3"]))


def test_concurrent_use_by_threads_and_processes(tokenizers, cache, caplog):
    """Two child processes and four threads want one table of an empty cache at once: each gets the fresh table,
    no reader sees half a file, and one whole file is left, no temporary one."""
    tok = tokenizers["chatml"]
    fresh = vocab.build_vocab_table(tok)
    jobs = [VocabJob(tok, background=True) for _ in range(2)]
    got, errors = [], []

    def use():
        try:
            for _ in range(3):
                got.append(vocab_table(tok))
        except Exception as err:  # noqa: BLE001 (reported by the assertion below)
            errors.append(err)

    with caplog.at_level(logging.WARNING, logger="probe.core.vocab_cache"):
        threads = [threading.Thread(target=use) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got += [j.result() for j in jobs]
    assert not errors and len(got) == 14 and all(_same(t, fresh) for t in got)
    assert "damaged" not in caplog.text
    assert [p.suffix for p in cache.iterdir()] == [".table"]


def test_a_run_folder_is_the_same_bits_whether_its_table_was_built_before_beside_or_read(tiny_dirs, tmp_path,
                                                                                        monkeypatch):
    """The command's files with the table built in the process before the sweep and not kept (as before issue 75),
    built by a child beside the sweep, and read from the cache: vocab.parquet, scores.parquet, the shards and meta.json
    (less its times and output folder) byte for byte."""
    from probe.commands.score import run
    from probe.config import ScoreVocabConfig

    def sweep(name: str):
        rd = run(ScoreVocabConfig(rm=tiny_dirs["rm"], prompt=("What is best?", "Name a colour."),
                                  output=str(tmp_path / name), device="cpu", limit=300, shard_size=128,
                                  progress=False))
        files = {p.relative_to(rd.path).as_posix(): p.read_bytes() for p in rd.path.rglob("*") if p.is_file()}
        meta = json.loads(files.pop("meta.json"))
        for key in ("created", "finished", "timing"):
            meta.pop(key)
        meta["config"].pop("output")
        return files, meta

    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("RM_PROBE_CACHE", str(tmp_path / "a-file" / "no-cache"))
    monkeypatch.setattr(vocab_cache, "INLINE_IDS", 10**9)
    before = sweep("before")
    monkeypatch.setenv("RM_PROBE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(vocab_cache, "INLINE_IDS", 0)  # the tiny vocabulary built by the child, as a large one is
    sources = []
    real = VocabJob.result

    def result(job):
        sources.append(job.source)
        return real(job)

    monkeypatch.setattr(VocabJob, "result", result)
    beside, cached = sweep("beside"), sweep("cached")
    assert sources == ["child", "cache"]
    assert sorted(before[0]) == sorted(beside[0]) and {"vocab.parquet", "scores.parquet"} <= set(before[0])
    assert beside == before and cached == before


def test_probe_sweep_gives_the_same_table_with_and_without_the_cache(tiny_models, cache, monkeypatch):
    import probe

    lm = tiny_models["llama-rm"]
    monkeypatch.setattr(vocab_cache, "INLINE_IDS", 0)
    first = probe.sweep(lm, None, "What is best?", limit=200, verify=2)
    second = probe.sweep(lm, None, "What is best?", limit=200, verify=2)
    monkeypatch.setenv("RM_PROBE_CACHE", str(cache.parent / "other"))
    monkeypatch.setattr(vocab_cache, "INLINE_IDS", 10**9)
    plain = probe.sweep(lm, None, "What is best?", limit=200, verify=2)
    assert _same(first, plain) and _same(second, plain)


def test_a_job_closed_early_stops_its_child_and_still_gives_the_table(tokenizers, cache, caplog):
    tok = tokenizers["llama3"]
    job = VocabJob(tok, background=True)
    child, tmp = job._child, job._tmp
    job.close()
    assert child.poll() is not None and not os.path.exists(tmp)  # stopped, its files gone
    with caplog.at_level(logging.WARNING, logger="probe.core.vocab_cache"):
        table = job.result()  # built here instead
    assert _same(table, vocab.build_vocab_table(tok))
