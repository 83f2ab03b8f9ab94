"""Saving and resuming the iterators of file and database sources: list_files, the record file readers
(plain and compressed, one file at a time or several at once), SqlDataset, Dataset.load and the
catalogue's readers. The harness is tests/checkpoints.py.

An uncompressed file is restored by a seek: the no-replay tests overwrite every byte before the saved
offset and still get the exact tail.
"""

import gzip
import json
import os
import sqlite3
import zlib

import numpy as np
import pytest

from dataservice.data import Dataset
from dataservice.data import saved as saved_module
from dataservice.data import save_format
from dataservice.data.checkpoint import restore_input, save_input
from dataservice.data.dataset import IteratorContext
from dataservice.data.options import AUTOTUNE, Options
from dataservice.data.readers import (FixedLengthRecordDataset, SqlDataset, TextLineDataset, TFRecordDataset,
                                      TFRecordWriter)
from dataservice.data.sources import SplittableSource
from dataservice.errors import DataLossError
from tests.checkpoints import assert_resumes, resumed, state_after, typed

pytestmark = pytest.mark.no_grpc


def _all_cuts(make):
    n = sum(1 for _ in make())
    return range(n + 1)


def _compress(data: bytes, compression: str) -> bytes:
    if compression == "GZIP":
        return gzip.compress(data)
    if compression == "ZLIB":
        return zlib.compress(data)
    return data


# --- list_files -------------------------------------------------------------------------------------------

@pytest.fixture
def listed(tmp_path):
    for i in range(12):
        (tmp_path / f"f{i:02d}.txt").write_bytes(b"x")
    return str(tmp_path / "*.txt")


@pytest.mark.parametrize("shuffle,seed", [(False, None), (True, 7)], ids=["sorted", "seeded"])
def test_list_files_resumes_at_every_cut(listed, shuffle, seed):
    make = lambda: Dataset.list_files(listed, shuffle=shuffle, seed=seed)  # noqa: E731
    assert_resumes(make, cuts=_all_cuts(make))


def test_list_files_unseeded_resumes_exactly_once_and_saves_its_seed_not_its_order(listed):
    make = lambda: Dataset.list_files(listed, shuffle=True)  # noqa: E731
    assert_resumes(make, ordered=False, cuts=_all_cuts(make))
    _, state = state_after(make, 3)
    position = state["position"]
    assert position["index"] == 3 and isinstance(position["seed"], int) and "epoch" not in position
    # The restored iterator continues the saved order, not a new one: the same tail every time.
    assert resumed(make, state) == resumed(make, state)


def test_list_files_restores_the_epoch_and_the_next_repetition_reshuffles(listed):
    original = Dataset.list_files(listed, shuffle=True, seed=3)
    epochs = [[typed(x) for x in original] for _ in range(2)]  # epochs 0 and 1
    assert epochs[0] != epochs[1]  # each iterator reshuffles
    it = iter(original)  # epoch 2
    head = [typed(next(it)) for _ in range(5)]
    state = json.loads(json.dumps(it.state_dict()))
    assert state["position"] == {"index": 5, "epoch": 2}
    third = head + [typed(x) for x in it]
    fourth = [typed(x) for x in original]

    rebuilt = Dataset.list_files(listed, shuffle=True, seed=3)  # a fresh node: its counter at 0
    restored = iter(rebuilt)
    restored.load_state_dict(state)
    assert head + [typed(x) for x in restored] == third
    assert rebuilt._epoch == 3  # the next iterator continues with the following epoch
    assert [typed(x) for x in rebuilt] == fourth


def test_list_files_under_repeat_resumes_across_repetitions(listed):
    make = lambda: Dataset.list_files(listed, shuffle=True, seed=5).repeat(3)  # noqa: E731
    full = assert_resumes(make, cuts=[0, 1, 11, 12, 13, 20, 30, 35, 36])
    assert full[:12] != full[12:24]


def test_list_files_malformed_states_name_the_field(listed):
    _, state = state_after(lambda: Dataset.list_files(listed, shuffle=True, seed=1), 2)
    for key, value in (("index", 13), ("index", "2"), ("epoch", -1), ("epoch", None)):
        bad = json.loads(json.dumps(state))
        bad["position"][key] = value
        with pytest.raises(ValueError, match=repr(key)):
            iter(Dataset.list_files(listed, shuffle=True, seed=1)).load_state_dict(bad)


# --- the record file readers ------------------------------------------------------------------------------

def _records(n, base=0):
    # Lengths vary (0 to 40 bytes): offsets are not a multiple of anything.
    return [(b"r%d-" % (base + i)) * (i % 5) for i in range(n)]


def _write_tfrecords(path, records, compression=""):
    with TFRecordWriter(str(path), compression or None) as w:
        for r in records:
            w.write(r)
    return str(path)


def _write_lines(path, data, compression=""):
    path.write_bytes(_compress(data, compression))
    return str(path)


@pytest.fixture(params=["", "GZIP", "ZLIB"], ids=["plain", "gzip", "zlib"])
def compression(request):
    return request.param


@pytest.fixture
def record_files(tmp_path, compression):
    """Four TFRecord files, one of them empty."""
    sizes = [17, 0, 9, 23]
    return [_write_tfrecords(tmp_path / f"r{k}.tfrecord", _records(n, 100 * k), compression)
            for k, n in enumerate(sizes)]


@pytest.fixture
def text_files(tmp_path, compression):
    """Text files with "\\r\\n" and lone "\\r", empty lines, an empty file, a last line without a newline."""
    datas = [b"".join(b"line %d %s\n" % (i, b"y" * (i % 7)) for i in range(15)),
             b"",
             b"a\r\nbb\r\n\r\nccc\rc\ndd",
             b"\n\nlast line\r\n",
             b"only\r"]
    return [_write_lines(tmp_path / f"t{k}.txt", d, compression) for k, d in enumerate(datas)]


@pytest.fixture
def fixed_files(tmp_path, compression):
    """Fixed-length files with a 3-byte header and a 2-byte footer; one holds no record."""
    bodies = [[b"%05d" % i for i in range(13)], [], [b"%05d" % (100 + i) for i in range(8)]]
    paths = []
    for k, body in enumerate(bodies):
        path = tmp_path / f"f{k}.bin"
        path.write_bytes(_compress(b"HDR" + b"".join(body) + b"FT", compression))
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("buffer_size", [None, 7, 64])
@pytest.mark.parametrize("parallel", [None, 1, 2, 3])
def test_tfrecord_resumes_at_every_cut(record_files, compression, buffer_size, parallel):
    make = lambda: TFRecordDataset(record_files, compression, buffer_size, num_parallel_reads=parallel)  # noqa: E731
    assert_resumes(make, cuts=_all_cuts(make))


@pytest.mark.parametrize("buffer_size", [None, 5, 64])
@pytest.mark.parametrize("parallel", [None, 2])
def test_text_lines_resume_at_every_cut(text_files, compression, buffer_size, parallel):
    make = lambda: TextLineDataset(text_files, compression, buffer_size, num_parallel_reads=parallel)  # noqa: E731
    assert_resumes(make, cuts=_all_cuts(make))


@pytest.mark.parametrize("buffer_size", [None, 4, 64])
@pytest.mark.parametrize("parallel", [None, 2])
def test_fixed_length_records_resume_at_every_cut(fixed_files, compression, buffer_size, parallel):
    make = lambda: FixedLengthRecordDataset(fixed_files, 5, header_bytes=3, footer_bytes=2,  # noqa: E731
                                            buffer_size=buffer_size, compression_type=compression,
                                            num_parallel_reads=parallel)
    assert_resumes(make, cuts=_all_cuts(make))


def test_parallel_reads_under_autotune_resume(record_files, compression):
    make = lambda: TFRecordDataset(record_files, compression, num_parallel_reads=AUTOTUNE)  # noqa: E731
    assert_resumes(make)


def test_parallel_reads_state_names_slots_and_files(record_files, compression):
    make = lambda: TFRecordDataset(record_files, compression, num_parallel_reads=2)  # noqa: E731
    _, state = state_after(make, 3)
    position = state["position"]
    assert set(position) == {"slots", "next_slot", "next_file"}
    # slot 0 reads file 0; slot 1 found file 1 empty and went on to file 2
    assert position["next_file"] == 3 and position["next_slot"] == 0
    assert [slot[0] for slot in position["slots"]] == [0, 2]


def test_no_files_and_empty_files_resume(tmp_path):
    empty = str(tmp_path / "empty.tfrecord")
    open(empty, "wb").close()
    for make in (lambda: TFRecordDataset([]), lambda: TFRecordDataset([empty, empty]),
                 lambda: TextLineDataset([empty], num_parallel_reads=2)):
        assert assert_resumes(make) == []


@pytest.fixture
def every_source(tmp_path):
    """A maker of each kind of source, over small real files."""
    records = [_write_tfrecords(tmp_path / f"j{k}.tfrecord", _records(30, 100 * k), "GZIP") for k in range(2)]
    lines = _write_lines(tmp_path / "j.txt", b"".join(b"%d\r\n" % i for i in range(50)))
    fixed = tmp_path / "j.bin"
    fixed.write_bytes(b"".join(b"%04d" % i for i in range(40)))
    db = str(tmp_path / "j.sqlite")
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE t (v INTEGER)")
    con.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(40)])
    con.commit()
    con.close()
    Dataset.range(40).map(lambda x: {"x": x}).save(str(tmp_path / "saved"))
    return {
        "list_files": lambda: Dataset.list_files(str(tmp_path / "j*"), shuffle=True, seed=2),
        "tfrecord": lambda: TFRecordDataset(records, "GZIP", num_parallel_reads=2).map(lambda r: r + b"!"),
        "text": lambda: TextLineDataset(lines, buffer_size=16),
        "fixed": lambda: FixedLengthRecordDataset(str(fixed), 4),
        "sql": lambda: SqlDataset("sqlite", db, "SELECT v FROM t", np.int16),
        "load": lambda: Dataset.load(str(tmp_path / "saved")),
    }


@pytest.mark.parametrize("kind", ["list_files", "tfrecord", "text", "fixed", "sql", "load"])
def test_a_state_through_a_json_file_restores_in_a_fresh_pipeline(every_source, tmp_path, kind):
    make = every_source[kind]
    it = iter(make())
    head = [typed(next(it)) for _ in range(3)]
    with open(tmp_path / "state.json", "w") as f:
        json.dump(it.state_dict(), f)
    tail = [typed(x) for x in it]
    it.close()
    with open(tmp_path / "state.json") as f:
        state = json.load(f)
    fresh = iter(make())
    fresh.load_state_dict(state)
    assert [typed(x) for x in fresh] == tail and head + tail == [typed(x) for x in make()]
    assert len(json.dumps(state)) < 4096


def test_parallel_reads_under_autotune_keep_the_saved_number_of_files_at_once(record_files, compression,
                                                                              monkeypatch):
    from dataservice.data.readers import file_source

    make = lambda: TFRecordDataset(record_files, compression, num_parallel_reads=AUTOTUNE)  # noqa: E731
    monkeypatch.setattr(file_source, "default_parallelism", lambda: 3)
    full = [typed(x) for x in make()]
    head, state = state_after(make, 10)
    assert len(state["position"]["slots"]) == 3
    monkeypatch.setattr(file_source, "default_parallelism", lambda: 2)  # restored on a smaller machine
    assert head + resumed(make, state) == full


def test_reader_state_is_small_and_a_position(tmp_path):
    path = _write_tfrecords(tmp_path / "big.tfrecord", [b"z" * 1000] * 3000)
    _, state = state_after(lambda: TFRecordDataset([path] * 3, num_parallel_reads=3), 4000)
    assert len(json.dumps(state)) < 4096
    _, state = state_after(lambda: TFRecordDataset([path] * 3), 4000)
    assert state["position"] == {"file": 1, "offset": 1000 * 1016}


# --- no replay: what is before the saved offset is never read ---------------------------------------------

def _overwrite_before(path, offset):
    with open(path, "r+b") as f:
        f.write(b"\xa5" * offset)


def _no_replay(make, path, n):
    cut = n * 95 // 100
    head, state = state_after(make, cut)
    full = [typed(x) for x in make()]
    offset = state["position"]["offset"]
    assert 0 < offset < os.path.getsize(path)
    _overwrite_before(path, offset)
    try:
        garbled = [typed(x) for x in make()]
    except Exception:  # a record file fails at its first record
        garbled = None
    assert garbled != full
    assert resumed(make, state) == full[cut:]


def test_uncompressed_tfrecord_restores_without_reading_before_its_offset(tmp_path):
    records = [b"%06d" % i * (1 + i % 3) for i in range(5000)]
    path = _write_tfrecords(tmp_path / "r.tfrecord", records)
    _no_replay(lambda: TFRecordDataset(path, buffer_size=4096), path, len(records))


def test_uncompressed_text_restores_without_reading_before_its_offset(tmp_path):
    path = str(tmp_path / "t.txt")
    with open(path, "wb") as f:
        f.write(b"".join(b"%d,%s\r\n" % (i, b"v" * (i % 9)) if i % 2 else b"%d\n" % i for i in range(6000)))
    _no_replay(lambda: TextLineDataset(path, buffer_size=1000), path, 6000)


def test_uncompressed_fixed_length_restores_without_reading_before_its_offset(tmp_path):
    path = str(tmp_path / "f.bin")
    with open(path, "wb") as f:
        f.write(b"HEAD" + b"".join(b"%08d" % i for i in range(4000)) + b"F")
    make = lambda: FixedLengthRecordDataset(path, 8, header_bytes=4, footer_bytes=1, buffer_size=999)  # noqa: E731
    cut = 3800
    head, state = state_after(make, cut)
    assert state["position"] == {"file": 0, "offset": 4 + 8 * cut}
    _overwrite_before(path, 4 + 8 * cut)
    assert resumed(make, state) == [typed(b"%08d" % i) for i in range(cut, 4000)]


def test_parallel_reads_restore_without_reading_before_their_offsets(tmp_path):
    paths = [_write_tfrecords(tmp_path / f"r{k}.tfrecord", [b"%d-%d" % (k, i) for i in range(3000)]) for k in range(2)]
    make = lambda: TFRecordDataset(paths, num_parallel_reads=2, buffer_size=2048)  # noqa: E731
    full = [typed(x) for x in make()]
    head, state = state_after(make, 5700)
    for path, (file, offset) in zip(paths, state["position"]["slots"]):
        assert offset > 0
        _overwrite_before(path, offset)
    assert resumed(make, state) == full[5700:]


# --- malformed reader states ------------------------------------------------------------------------------

def _bad(state, **changes):
    bad = json.loads(json.dumps(state))
    bad["position"].update(changes)
    return bad


def test_reader_malformed_states_are_value_errors_naming_the_field(record_files, compression):
    make = lambda: TFRecordDataset(record_files, compression)  # noqa: E731
    _, state = state_after(make, 5)
    cases = [({"file": "0"}, "'file'"), ({"offset": 1.5}, "'offset'"), ({"offset": -1}, "'offset'"),
             ({"file": 9}, "'file'"), ({"file": 4, "offset": 3}, "'file'")]
    if not compression:
        cases.append(({"offset": 10**9}, "'offset'.*beyond the end"))
    for change, match in cases:
        with pytest.raises(ValueError, match=match):
            iter(make()).load_state_dict(_bad(state, **change))


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])  # uncompressed: refused by load_state_dict (above)
def test_compressed_offset_beyond_the_stream_is_a_value_error_at_the_first_element(record_files, compression):
    make = lambda: TFRecordDataset(record_files, compression)  # noqa: E731
    _, state = state_after(make, 5)
    it = iter(make())
    it.load_state_dict(_bad(state, offset=10**6))
    with pytest.raises(ValueError, match="'offset'"):
        next(it)


def test_fixed_length_offset_off_a_record_is_refused(fixed_files, compression):
    make = lambda: FixedLengthRecordDataset(fixed_files, 5, 3, 2, compression_type=compression)  # noqa: E731
    _, state = state_after(make, 2)
    assert state["position"] == {"file": 0, "offset": 13}
    for offset in (2, 14):
        with pytest.raises(ValueError, match="'offset'"):
            iter(make()).load_state_dict(_bad(state, offset=offset))


def test_parallel_reads_malformed_states(record_files, compression):
    make = lambda: TFRecordDataset(record_files, compression, num_parallel_reads=2)  # noqa: E731
    _, state = state_after(make, 5)
    for change, match in [({"slots": [None]}, "'slots'"), ({"slots": [[0, 0], [1]]}, "'slots'"),
                          ({"next_slot": 2}, "'next_slot'"), ({"next_file": 5}, "'next_file'"),
                          ({"slots": [[7, 0], None]}, "'file'"), ({"slots": [[3, 0], None]}, "'slots'"),
                          ({"next_slot": "1"}, "'next_slot'")] + \
            ([] if compression else [({"slots": [[0, 10**9], None]}, "'offset'")]):
        with pytest.raises(ValueError, match=match):
            iter(make()).load_state_dict(_bad(state, **change))


def test_reading_provided_splits_resumes_with_a_new_provider_of_the_same_splits(record_files, compression):
    # A distributed_epoch worker's group: a restored read's worker seeks there (ElementRun.mark).
    for source, splits in ((TFRecordDataset(record_files, compression), [0, 2]), (Dataset.range(10_000), [1, 0, 3])):
        def provided():
            return source._iterator(IteratorContext(options=Options(), split_provider=iter(splits)))
        whole = [np.asarray(x).tobytes() for x in provided()]
        for cut in (0, 1, len(whole) // 2, len(whole) - 1, len(whole)):
            it = provided()
            head = [np.asarray(next(it)).tobytes() for _ in range(cut)]
            state = json.loads(json.dumps(save_input(it, source)))
            again = provided()
            restore_input(again, source, state)
            assert head + [np.asarray(x).tobytes() for x in again] == whole, (source, cut)


# --- a splittable source's generic reading ----------------------------------------------------------------

class _Lists(SplittableSource):
    _op_name = "lists"

    def __init__(self, sizes, as_generator):
        self._sizes = sizes
        self._as_generator = as_generator

    def num_source_splits(self):
        return len(self._sizes)

    def read_split(self, index):
        values = [np.int32(100 * index + i) for i in range(self._sizes[index])]
        return (v for v in values) if self._as_generator else iter(values)


@pytest.mark.parametrize("as_generator", [False, True])
def test_a_splittable_source_resumes_in_its_split(as_generator):
    make = lambda: _Lists([3, 0, 5, 1], as_generator)  # noqa: E731
    assert_resumes(make, cuts=_all_cuts(make))
    _, state = state_after(make, 4)
    assert state["position"] == {"split": 2, "offset": 1}
    for change, match in (({"split": 5}, "'split'"), ({"offset": "1"}, "'offset'")):
        with pytest.raises(ValueError, match=match):
            iter(make()).load_state_dict(_bad(state, **change))
    it = iter(make())
    it.load_state_dict(_bad(state, offset=9))
    with pytest.raises(ValueError, match="'offset' 9"):
        next(it)


# --- SqlDataset -------------------------------------------------------------------------------------------

@pytest.fixture
def database(tmp_path):
    path = str(tmp_path / "db.sqlite")
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (id INTEGER, name TEXT, score REAL)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", [(i, f"n{i}", i / 4) for i in range(2500)])
    con.commit()
    con.close()
    return path


def test_sql_rows_resume(database):
    make = lambda: SqlDataset("sqlite", database, "SELECT id, name, score FROM t ORDER BY id DESC",  # noqa: E731
                              (np.int64, np.bytes_, np.float32))
    assert_resumes(make, cuts=[0, 1, 1023, 1024, 1025, 2048, 2499, 2500])
    _, state = state_after(make, 1500)
    assert state["position"] == {"rows": 1500}
    single = lambda: SqlDataset("sqlite", database, "SELECT name FROM t WHERE id < 7", str)  # noqa: E731
    assert_resumes(single, cuts=range(8))


def test_sql_states_that_do_not_fit(database):
    make = lambda: SqlDataset("sqlite", database, "SELECT id FROM t", np.int64)  # noqa: E731
    _, state = state_after(make, 3)
    with pytest.raises(ValueError, match="'rows'"):
        iter(make()).load_state_dict(_bad(state, rows="3"))
    it = iter(make())
    it.load_state_dict(_bad(state, rows=2501))
    with pytest.raises(ValueError, match="'rows' 2501"):
        next(it)


def test_sql_conversion_error_after_a_restore_still_yields_the_rows_before(tmp_path):
    path = str(tmp_path / "db.sqlite")
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (v TEXT)")
    con.executemany("INSERT INTO t VALUES (?)", [(str(i),) for i in range(10)] + [("oops",)])
    con.commit()
    con.close()
    make = lambda: SqlDataset("sqlite", path, "SELECT v FROM t", np.int32)  # noqa: E731
    _, state = state_after(make, 4)
    it = iter(make())
    it.load_state_dict(state)
    assert [int(next(it)) for _ in range(6)] == [4, 5, 6, 7, 8, 9]
    with pytest.raises(ValueError, match="oops"):
        next(it)


# --- Dataset.load -----------------------------------------------------------------------------------------

@pytest.fixture
def small_chunks(monkeypatch):
    # Several records per chunk file and several chunk files per shard.
    monkeypatch.setattr(save_format, "RECORD_ELEMENTS", 7)
    monkeypatch.setattr(saved_module, "CHUNK_BYTES", 300)


@pytest.mark.parametrize("compression", [None, "GZIP", "AUTO"])
@pytest.mark.parametrize("shard_func", [None, "uneven"])
def test_load_resumes_at_every_cut(tmp_path, small_chunks, compression, shard_func):
    ds = Dataset.range(60).map(lambda x: (x, str(x)))
    func = None if shard_func is None else (lambda x, s: 0 if x < 45 else (1 if x % 2 else 2))
    ds.save(str(tmp_path / "s"), compression=compression, shard_func=func)
    make = lambda: Dataset.load(str(tmp_path / "s"))  # noqa: E731
    assert len(save_format.read_metadata(str(tmp_path / "s"))["chunks"]) > 3
    assert_resumes(make, cuts=range(61))


def test_load_of_one_shard_and_its_state(tmp_path, small_chunks):
    Dataset.range(40).save(str(tmp_path / "s"), shard_func=lambda x: 0)
    make = lambda: Dataset.load(str(tmp_path / "s"))  # noqa: E731
    assert_resumes(make, cuts=range(41))
    _, state = state_after(make, 9)
    assert state["position"][0] == 0 and state["position"][2] == 2  # chunk 0, the second record, 2 taken


def test_load_shards_resume(tmp_path, small_chunks):
    Dataset.range(50).save(str(tmp_path / "s"), shard_func=lambda x: x % 3)
    saved = Dataset.load(str(tmp_path / "s"))
    shards = list(saved_module.ShardDatasets(saved))
    for shard in shards:
        assert_resumes(lambda: shard)
    # The shards are datasets (compared by identity): their order, then.
    make = lambda: saved_module.ShardDatasets(saved)  # noqa: E731
    for k in range(4):
        _, state = state_after(make, k)
        it = iter(make())
        it.load_state_dict(state)
        assert [shard._shard for shard in it] == [0, 1, 2][k:]


def test_load_restores_at_its_record_without_reading_the_records_before(tmp_path):
    Dataset.range(20_000).save(str(tmp_path / "s"), shard_func=lambda x: 0)
    make = lambda: Dataset.load(str(tmp_path / "s"))  # noqa: E731
    _, state = state_after(make, 19_000)
    chunk, record, skip = state["position"]
    assert record > 0 and skip > 0
    path = os.path.join(str(tmp_path / "s"), save_format.read_metadata(str(tmp_path / "s"))["chunks"][0]["file"])
    _overwrite_before(path, record)
    it = iter(make())
    it.load_state_dict(state)
    assert [int(x) for x in it] == list(range(19_000, 20_000))
    with pytest.raises(DataLossError):
        list(make())


def test_load_malformed_states(tmp_path, small_chunks):
    Dataset.range(30).save(str(tmp_path / "s"), shard_func=lambda x: x % 2)
    make = lambda: Dataset.load(str(tmp_path / "s"))  # noqa: E731
    _, state = state_after(make, 5)
    for change, match in [({"next": 2}, "'next'"), ({"shards": [None]}, "'shards'"),
                          ({"shards": [[0, 0], None]}, "shard's position"), ({"shards": [[99, 0, 0], None]}, "'chunk'"),
                          ({"next": "0"}, "'next'")]:
        with pytest.raises(ValueError, match=match):
            iter(make()).load_state_dict(_bad(state, **change))
    it = iter(make())
    it.load_state_dict(_bad(state, shards=[[0, 10**9, 0], None]))
    with pytest.raises(ValueError, match="'record' offset"):
        next(it)


def test_load_wait_reads_a_growing_save_exactly_once_after_a_restore(tmp_path):
    directory = tmp_path / "d"
    (directory / "chunks").mkdir(parents=True)
    for group in range(4):
        with save_format.ChunkWriter(str(directory / "chunks" / f"chunk_{group}"), None) as w:
            for i in range(10):
                w.write(np.int64(group * 100 + i))
    (directory / "DONE").write_bytes(b"")
    make = lambda: saved_module.GrowingSave(str(directory), {"compression": None})  # noqa: E731
    full = assert_resumes(make, cuts=range(41))
    assert len(full) == 40
    _, state = state_after(make, 25)
    assert state["position"]["read"] == [[0, 2]] and state["position"]["chunk"] == 2
    for change, match in [({"read": [[2, 1]]}, "'read'"), ({"chunk": 0}, "'chunk'"), ({"skip": -1}, "'skip'")]:
        with pytest.raises(ValueError, match=match):
            iter(make()).load_state_dict(_bad(state, **change))


# --- the catalogue's readers ------------------------------------------------------------------------------

def test_catalogue_sources_resume(tmp_path):
    from dataservice.catalogue.reading import _DecodedRecords, _FileInstructionsSource
    from dataservice.catalogue.splits import FileInstruction
    from dataservice.data import specs

    paths = [_write_tfrecords(tmp_path / f"c{k}.tfrecord", _records(n, 100 * k)) for k, n in enumerate([6, 0, 4])]
    instructions = [FileInstruction(p, 0, n, n) for p, n in zip(paths, [6, 0, 4])]
    assert_resumes(lambda: _FileInstructionsSource(instructions), cuts=range(4))

    spec = specs.TensorSpec((), specs.string)
    make = lambda: _DecodedRecords(TFRecordDataset(paths).map(lambda r: r + b"."), 10, spec, "c")  # noqa: E731
    assert_resumes(make, cuts=range(11))
    _, state = state_after(make, 7)
    assert state["position"]["records"] == 7

    # A restored pass still checks the whole count: too few records is data loss, after a restore too.
    short = lambda: _DecodedRecords(TFRecordDataset(paths), 11, spec, "c")  # noqa: E731
    _, state = state_after(short, 8)
    it = iter(short())
    it.load_state_dict(state)
    assert len([next(it) for _ in range(2)]) == 2
    with pytest.raises(DataLossError, match="read 10 records"):
        next(it)


@pytest.mark.parametrize("shuffle_files,seed,pipelines", [(False, None, 1), (True, 3, 1), (True, None, 1),
                                                         (True, 4, 2)],
                         ids=["in-order", "shuffled-seeded", "shuffled-unseeded", "sharded"])
def test_catalogue_read_file_instructions_resumes(tmp_path, shuffle_files, seed, pipelines):
    from dataservice.catalogue.reading import InputContext, ReadConfig, read_file_instructions
    from dataservice.catalogue.splits import FileInstruction
    from dataservice.data import specs

    sizes = [40, 7, 0, 33, 25]
    paths = [_write_tfrecords(tmp_path / f"s{k}.tfrecord", [b"%d-%d" % (k, i) for i in range(n)])
             for k, n in enumerate(sizes)]
    instructions = [FileInstruction(p, 2 if n > 5 else 0, n - 4 if n > 5 else n, n) for p, n in zip(paths, sizes)]
    context = InputContext(num_input_pipelines=pipelines, input_pipeline_id=pipelines - 1)
    config = ReadConfig(input_context=context, shuffle_seed=seed, interleave_cycle_length=3,
                        interleave_block_length=4)
    spec = specs.TensorSpec((), specs.string)
    make = lambda: read_file_instructions(instructions, lambda r: r + b"!", spec, read_config=config,  # noqa: E731
                                          shuffle_files=shuffle_files, what="test")
    n = sum(1 for _ in make())
    assert n == 89 or pipelines > 1
    assert_resumes(make, ordered=seed is not None or not shuffle_files,
                   cuts=sorted({0, 1, 5, 17, 30, n // 2, n - 1, n} - {k for k in (17, 30) if k > n}))
