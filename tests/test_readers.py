"""Tests for dataservice.data.readers: TFRecord, text lines, fixed-length records, SQLite.

The files in tests/fixtures/tfrecord were written and read by TensorFlow
(see tests/fixtures/make_tfrecord_fixtures.py); these tests need no TensorFlow.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import sqlite3
import struct
import zlib

import numpy as np
import pytest

from dataservice.data import (UNKNOWN_CARDINALITY, AUTOTUNE, Dataset, FixedLengthRecordDataset, SqlDataset,
                              TensorSpec, TextLineDataset, TFRecordDataset, TFRecordWriter)
from dataservice.data.serialization import deserialize_dataset, serialize_dataset
from dataservice.errors import DataLossError, InvalidArgumentError, NotSplittableError

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "tfrecord")
with open(os.path.join(FIXTURES, "records.json")) as _f:
    SPEC = json.load(_f)


def _decode(items: list[str]) -> list[bytes]:
    return [base64.b64decode(x) for x in items]


RECORDS = _decode(SPEC["records_base64"])
COMPRESSIONS = [None, "", "GZIP", "ZLIB"]


def write_records(path, records, compression_type=None) -> str:
    with TFRecordWriter(path, compression_type) as writer:
        for record in records:
            writer.write(record)
    return str(path)


def _write(path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def frame_size(record: bytes) -> int:
    return 12 + len(record) + 4


# --- TFRecord: TensorFlow compatibility -----------------------------------------


def test_fixture_records_cover_the_interesting_cases():
    lengths = [len(r) for r in RECORDS]
    assert 0 in lengths and max(lengths) >= 2048


@pytest.mark.parametrize("name", sorted(SPEC["files"]))
def test_reads_tensorflow_written_files(name):
    compression = SPEC["files"][name]["compression_type"]
    assert list(TFRecordDataset(os.path.join(FIXTURES, name), compression_type=compression)) == RECORDS


@pytest.mark.parametrize("name", sorted(SPEC["files"]))
@pytest.mark.parametrize("buffer_size", [1, 5, 13, 100])
def test_reads_tensorflow_files_with_tiny_buffers(name, buffer_size):
    # Records straddle every kind of chunk boundary.
    compression = SPEC["files"][name]["compression_type"]
    ds = TFRecordDataset(os.path.join(FIXTURES, name), compression_type=compression, buffer_size=buffer_size)
    assert list(ds) == RECORDS


def test_uncompressed_writer_output_is_byte_identical_to_tensorflow(tmp_path):
    path = write_records(tmp_path / "ours.tfrecord", RECORDS)
    with open(path, "rb") as ours, open(os.path.join(FIXTURES, "records.tfrecord"), "rb") as theirs:
        assert ours.read() == theirs.read()


def test_parallel_reads_interleave_like_tensorflow():
    spec = SPEC["parallel"]
    files = [os.path.join(FIXTURES, name) for name in spec["files"]]
    ds = TFRecordDataset(files, num_parallel_reads=spec["num_parallel_reads"])
    assert list(ds) == _decode(spec["tensorflow_order_base64"])
    # And the same again: the order is deterministic.
    assert list(ds) == _decode(spec["tensorflow_order_base64"])


def test_parallel_reads_autotune_and_one_read_everything(tmp_path):
    files = [write_records(tmp_path / f"{i}.tfrecord", [f"{i}-{j}".encode() for j in range(50 * i)])
             for i in range(6)]
    expected = sorted(f"{i}-{j}".encode() for i in range(6) for j in range(50 * i))
    assert sorted(TFRecordDataset(files, num_parallel_reads=AUTOTUNE)) == expected
    assert list(TFRecordDataset(files, num_parallel_reads=1)) == list(TFRecordDataset(files))


def test_parallel_reads_stop_early_without_hanging(tmp_path):
    files = [write_records(tmp_path / f"{i}.tfrecord", [b"x" * 10] * 10_000) for i in range(4)]
    assert len(list(TFRecordDataset(files, num_parallel_reads=3).take(5))) == 5


def test_parallel_reads_raise_the_error_of_a_bad_file(tmp_path):
    good = write_records(tmp_path / "good.tfrecord", [b"a", b"b"])
    with pytest.raises(FileNotFoundError, match="missing.tfrecord"):
        list(TFRecordDataset([good, str(tmp_path / "missing.tfrecord")], num_parallel_reads=2))


@pytest.mark.parametrize("value", [0, -2, 1.5, "2"])
def test_num_parallel_reads_is_checked(value):
    with pytest.raises((ValueError, TypeError), match="num_parallel_reads"):
        TFRecordDataset("x.tfrecord", num_parallel_reads=value)


# --- TFRecord: round trips and the writer ------------------------------------


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_round_trip(tmp_path, compression):
    records = [os.urandom(n) for n in (0, 1, 7, 100, 4096, 70_000)] + [b"z" * 3_000_000]
    path = write_records(tmp_path / "f.tfrecord", records, compression)
    assert list(TFRecordDataset(path, compression_type=compression)) == records
    assert list(TFRecordDataset(path, compression_type=compression, buffer_size=4096)) == records


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_compressed_files_really_are_compressed(tmp_path, compression):
    path = write_records(tmp_path / "f", [b"a" * 1000] * 100, compression)
    raw = _read(path)
    assert len(raw) < 10_000
    payload = gzip.decompress(raw) if compression == "GZIP" else zlib.decompress(raw)
    with open(tmp_path / "plain", "wb") as f:
        f.write(payload)
    assert list(TFRecordDataset(str(tmp_path / "plain"))) == [b"a" * 1000] * 100


def test_concatenated_gzip_streams_are_read_in_turn(tmp_path):
    first = write_records(tmp_path / "a", [b"one", b"two"], "GZIP")
    second = write_records(tmp_path / "b", [b"three"], "GZIP")
    with open(tmp_path / "both", "wb") as f:
        f.write(_read(first) + _read(second))
    assert list(TFRecordDataset(str(tmp_path / "both"), compression_type="GZIP")) == [b"one", b"two", b"three"]


def test_writer_accepts_str_and_bytes_like(tmp_path):
    path = tmp_path / "f.tfrecord"
    with TFRecordWriter(path) as writer:
        writer.write("h\u00e9")
        writer.write(bytearray(b"ba"))
        writer.write(memoryview(b"mv"))
        writer.write(np.bytes_(b"np"))
        with pytest.raises(TypeError, match="bytes"):
            writer.write(12)
    assert list(TFRecordDataset(str(path))) == ["h\u00e9".encode(), b"ba", b"mv", b"np"]


def test_writer_flush_and_close(tmp_path):
    path = str(tmp_path / "f.tfrecord")
    writer = TFRecordWriter(path)
    writer.write(b"first")
    writer.flush()
    assert list(TFRecordDataset(path)) == [b"first"]
    writer.close()
    writer.close()  # twice is fine
    with pytest.raises(ValueError, match="closed"):
        writer.write(b"late")


def test_gzip_writer_flush_makes_records_readable(tmp_path):
    path = str(tmp_path / "f.gz")
    writer = TFRecordWriter(path, "GZIP")
    writer.write(b"first")
    writer.flush()
    # The stream is not finished: its records come out, then the truncation is reported.
    it = iter(TFRecordDataset(path, compression_type="GZIP"))
    assert next(it) == b"first"
    with pytest.raises(DataLossError, match="truncated GZIP stream"):
        next(it)
    writer.close()
    assert list(TFRecordDataset(path, compression_type="GZIP")) == [b"first"]


@pytest.mark.parametrize("bad", ["gzip2", "BZIP2", 3])
def test_bad_compression_type_lists_the_accepted_values(bad):
    for make in (lambda: TFRecordDataset("f", compression_type=bad),
                 lambda: TextLineDataset("f", compression_type=bad),
                 lambda: FixedLengthRecordDataset("f", 4, compression_type=bad)):
        with pytest.raises(ValueError, match="GZIP.*ZLIB"):
            make()
    with pytest.raises(ValueError, match="GZIP.*ZLIB"):
        TFRecordWriter("/nonexistent/never-created", bad)


def test_compression_type_is_case_insensitive(tmp_path):
    path = write_records(tmp_path / "f", [b"a"], "gzip")
    assert list(TFRecordDataset(path, compression_type="GZIP")) == [b"a"]


def test_cardinality_is_unknown(tmp_path):
    path = write_records(tmp_path / "f", [b"a"])
    assert TFRecordDataset(path).cardinality() == UNKNOWN_CARDINALITY
    assert TextLineDataset(path).cardinality() == UNKNOWN_CARDINALITY
    assert FixedLengthRecordDataset(path, 1).cardinality() == UNKNOWN_CARDINALITY


@pytest.mark.parametrize("make", [TFRecordDataset, TextLineDataset, lambda p: FixedLengthRecordDataset(p, 4)],
                         ids=["tfrecord", "text", "fixed_length"])
def test_missing_file_raises_at_iteration_naming_it(tmp_path, make):
    path = str(tmp_path / "nope.bin")
    ds = make(path)  # no error yet
    with pytest.raises(FileNotFoundError, match="nope.bin"):
        list(ds)


# --- TFRecord: corruption -------------------------------------------------------


def _corruption_file(tmp_path):
    records = [b"alpha", b"bravo-bravo", b"charlie" * 10, b"delta"]
    path = write_records(tmp_path / "c.tfrecord", records)
    offsets = [sum(frame_size(r) for r in records[:i]) for i in range(len(records))]
    return path, records, offsets, bytearray(_read(path))


def _assert_data_loss(path, offset, match, compression_type=None, expected_before=None):
    got = []
    with pytest.raises(DataLossError, match=match) as info:
        for record in TFRecordDataset(path, compression_type=compression_type):
            got.append(record)
    message = str(info.value)
    assert f"offset {offset} " in message and path in message
    assert info.value.filename == path and info.value.offset == offset
    if expected_before is not None:
        assert got == expected_before


def test_flipped_data_byte_is_reported_at_its_record(tmp_path):
    path, records, offsets, raw = _corruption_file(tmp_path)
    raw[offsets[2] + 12 + 3] ^= 0x01
    _write(path, raw)
    _assert_data_loss(path, offsets[2], "data CRC mismatch", expected_before=records[:2])


def test_flipped_length_byte_is_reported_at_its_record(tmp_path):
    path, records, offsets, raw = _corruption_file(tmp_path)
    raw[offsets[1]] ^= 0x04
    _write(path, raw)
    _assert_data_loss(path, offsets[1], "length CRC mismatch", expected_before=records[:1])


def test_flipped_data_crc_byte_is_reported(tmp_path):
    path, records, offsets, raw = _corruption_file(tmp_path)
    raw[offsets[1] - 1] ^= 0x80  # last byte of record 0's data CRC
    _write(path, raw)
    _assert_data_loss(path, offsets[0], "data CRC mismatch", expected_before=[])


@pytest.mark.parametrize("cut", [1, 5, 12, 20])
def test_truncated_file_is_reported_at_the_cut_record(tmp_path, cut):
    path, records, offsets, raw = _corruption_file(tmp_path)
    _write(path, raw[:offsets[3] + cut])
    _assert_data_loss(path, offsets[3], "truncated record", expected_before=records[:3])


def test_truncated_with_small_buffer(tmp_path):
    path, records, offsets, raw = _corruption_file(tmp_path)
    _write(path, raw[:offsets[2] + 30])
    with pytest.raises(DataLossError, match=f"offset {offsets[2]} "):
        list(TFRecordDataset(path, buffer_size=3))


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_corruption_inside_a_compressed_file_gives_the_uncompressed_offset(tmp_path, compression):
    path, records, offsets, raw = _corruption_file(tmp_path)
    raw[offsets[3] + 14] ^= 0xFF
    packed = gzip.compress(bytes(raw)) if compression == "GZIP" else zlib.compress(bytes(raw))
    _write(path, packed)
    _assert_data_loss(path, offsets[3], "data CRC mismatch", compression, expected_before=records[:3])


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_truncated_compressed_stream(tmp_path, compression):
    path = write_records(tmp_path / "f", [os.urandom(1000) for _ in range(20)], compression)
    raw = _read(path)
    _write(path, raw[:len(raw) // 2])
    with pytest.raises(DataLossError, match=f"truncated {compression} stream") as info:
        list(TFRecordDataset(path, compression_type=compression))
    assert path in str(info.value)


def test_garbage_compressed_stream(tmp_path):
    path = str(tmp_path / "f.gz")
    _write(path, b"this is not gzip at all" * 10)
    with pytest.raises(DataLossError, match="corrupted GZIP stream") as info:
        list(TFRecordDataset(path, compression_type="GZIP"))
    assert path in str(info.value)


def test_empty_files_have_no_records(tmp_path):
    path = str(tmp_path / "empty")
    open(path, "wb").close()
    for compression in COMPRESSIONS:
        assert list(TFRecordDataset(path, compression_type=compression)) == []


# --- splits and pipelines ---------------------------------------------------------


@pytest.fixture
def three_files(tmp_path):
    contents = [[f"file{i}-{j}".encode() for j in range(n)] for i, n in enumerate((3, 4, 5))]
    paths = [write_records(tmp_path / f"part-{i}.tfrecord", c) for i, c in enumerate(contents)]
    return paths, contents


def test_one_split_per_file(three_files):
    paths, contents = three_files
    ds = TFRecordDataset(paths)
    assert ds.is_splittable() and ds.num_splits() == 3
    assert list(ds.iterate_splits([2, 0])) == contents[2] + contents[0]
    assert list(ds.map(lambda r: r.upper()).iterate_splits([1])) == [r.upper() for r in contents[1]]


def test_text_and_fixed_length_split_per_file(tmp_path):
    paths = []
    for i in range(3):
        paths.append(str(tmp_path / f"{i}.txt"))
        _write(paths[-1], f"{i}a\n{i}b\n".encode())
    assert TextLineDataset(paths).num_splits() == 3
    assert list(TextLineDataset(paths).iterate_splits([2, 0])) == [b"2a", b"2b", b"0a", b"0b"]
    assert list(FixedLengthRecordDataset(paths, 3).iterate_splits([1])) == [b"1a\n", b"1b\n"]


def test_filenames_given_as_a_dataset(three_files):
    paths, contents = three_files
    ds = TFRecordDataset(Dataset.from_tensor_slices(np.array(paths)))
    assert list(ds) == contents[0] + contents[1] + contents[2]


def test_list_files_interleave_reads_everything(three_files, tmp_path):
    paths, contents = three_files
    files = Dataset.list_files(str(tmp_path / "part-*.tfrecord"))
    for kwargs in ({}, {"num_parallel_calls": 2}):
        ds = files.interleave(TFRecordDataset, cycle_length=2, **kwargs)
        assert sorted(ds) == sorted(r for c in contents for r in c)


def test_pipelines_with_readers_pickle(three_files, tmp_path):
    paths, contents = three_files
    db = _make_db(tmp_path)
    pipelines = [
        TFRecordDataset(paths, num_parallel_reads=2).map(lambda r: r + b"!").batch(2),
        TextLineDataset(paths[0], compression_type="GZIP").filter(lambda line: True),
        FixedLengthRecordDataset(paths, 4, header_bytes=1).take(2),
        SqlDataset("sqlite", db, "SELECT id, name FROM people ORDER BY id", (np.int64, str)),
        Dataset.list_files(str(tmp_path / "part-*.tfrecord")).interleave(TFRecordDataset),
    ]
    for ds in pipelines:
        again = deserialize_dataset(serialize_dataset(ds))
        assert type(again) is type(ds)
    restored = deserialize_dataset(serialize_dataset(pipelines[0]))
    assert [list(b) for b in restored] == [list(b) for b in pipelines[0]]
    sql = deserialize_dataset(serialize_dataset(pipelines[3]))
    assert list(sql) == list(pipelines[3])


# --- TextLineDataset ----------------------------------------------------------------


def _text_file(tmp_path, content: bytes, compression=None, name="t.txt") -> str:
    path = str(tmp_path / name)
    if compression == "GZIP":
        content = gzip.compress(content)
    elif compression == "ZLIB":
        content = zlib.compress(content)
    _write(path, content)
    return path


@pytest.mark.parametrize("name", sorted(SPEC["text"]["files"]))
@pytest.mark.parametrize("buffer_size", [None, 1, 2, 3, 7])
def test_text_lines_match_tensorflow(name, buffer_size):
    lines = list(TextLineDataset(os.path.join(FIXTURES, name), compression_type=SPEC["text"]["files"][name],
                                 buffer_size=buffer_size))
    assert lines == _decode(SPEC["text"]["tensorflow_lines_base64"])


@pytest.mark.parametrize("content, expected", [
    (b"a\nb\nc\n", [b"a", b"b", b"c"]),
    (b"a\r\nb\r\n", [b"a", b"b"]),
    (b"a\nb", [b"a", b"b"]),
    (b"a\n\n\nb\n", [b"a", b"", b"", b"b"]),
    (b"\n", [b""]),
    (b"", []),
    (b"no newline at all", [b"no newline at all"]),
    (b"ends in cr\r", [b"ends in cr"]),
    (b"x\n\r", [b"x"]),
    (b"in\rside\n", [b"inside"]),  # TensorFlow drops every "\r"
    ("h\u00e9\n".encode(), ["h\u00e9".encode()]),
])
@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_text_lines(tmp_path, content, expected, compression):
    path = _text_file(tmp_path, content, compression)
    assert list(TextLineDataset(path, compression_type=compression)) == expected
    assert list(TextLineDataset(path, compression_type=compression, buffer_size=1)) == expected


def test_text_long_lines_across_many_chunks(tmp_path):
    lines = [os.urandom(50_000).replace(b"\n", b"-").replace(b"\r", b"-") for _ in range(3)]
    path = _text_file(tmp_path, b"\n".join(lines))
    assert list(TextLineDataset(path, buffer_size=1000)) == lines


def test_text_several_files_in_order(tmp_path):
    a = _text_file(tmp_path, b"1\n2\n", name="a.txt")
    b = _text_file(tmp_path, b"3\n4", "GZIP", name="b.txt")
    assert list(TextLineDataset([a, a])) == [b"1", b"2", b"1", b"2"]
    assert list(TextLineDataset(b, compression_type="GZIP")) == [b"3", b"4"]


# --- FixedLengthRecordDataset ---------------------------------------------------------


def test_fixed_length_matches_tensorflow():
    spec = SPEC["fixed_length"]
    ds = FixedLengthRecordDataset(os.path.join(FIXTURES, spec["file"]), spec["record_bytes"],
                                  header_bytes=spec["header_bytes"], footer_bytes=spec["footer_bytes"])
    assert list(ds) == _decode(spec["tensorflow_records_base64"])


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
@pytest.mark.parametrize("buffer_size", [None, 1, 4, 5])
def test_fixed_length_header_footer(tmp_path, compression, buffer_size):
    records = [struct.pack("<i", i) for i in range(100)]
    path = _text_file(tmp_path, b"HEADER" + b"".join(records) + b"FOOT", compression)
    ds = FixedLengthRecordDataset(path, 4, header_bytes=6, footer_bytes=4, compression_type=compression,
                                  buffer_size=buffer_size)
    assert list(ds) == records


def test_fixed_length_bad_size_uncompressed_raises_before_any_record(tmp_path):
    path = _text_file(tmp_path, b"H" + b"abcdefg" + b"F")
    got = []
    # InvalidArgumentError, as TensorFlow: the file's size does not fit the arguments.
    with pytest.raises(InvalidArgumentError, match="record_bytes") as info:
        for record in FixedLengthRecordDataset(path, 3, header_bytes=1, footer_bytes=1):
            got.append(record)
    assert path in str(info.value) and info.value.filename == path
    assert got == []


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_fixed_length_bad_size_compressed(tmp_path, compression):
    path = _text_file(tmp_path, b"abcdefgh", compression)
    got = []
    with pytest.raises(DataLossError, match="offset 6 ") as info:
        for record in FixedLengthRecordDataset(path, 3, compression_type=compression):
            got.append(record)
    assert path in str(info.value)
    assert got == [b"abc", b"def"]


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_fixed_length_file_shorter_than_header_and_footer(tmp_path, compression):
    path = _text_file(tmp_path, b"abc", compression)
    # Uncompressed, the size is known up front (InvalidArgumentError, as TensorFlow); compressed, the
    # stream is found short at its end (DataLossError).
    with pytest.raises(DataLossError if compression else InvalidArgumentError) as info:
        list(FixedLengthRecordDataset(path, 1, header_bytes=2, footer_bytes=2, compression_type=compression))
    assert path in str(info.value)


def test_fixed_length_empty_body(tmp_path):
    path = _text_file(tmp_path, b"HHFF")
    assert list(FixedLengthRecordDataset(path, 5, header_bytes=2, footer_bytes=2)) == []


@pytest.mark.parametrize("kwargs, name", [
    ({"record_bytes": 0}, "record_bytes"),
    ({"record_bytes": -1}, "record_bytes"),
    ({"record_bytes": 4, "header_bytes": -1}, "header_bytes"),
    ({"record_bytes": 4, "footer_bytes": -3}, "footer_bytes"),
])
def test_fixed_length_argument_checks(kwargs, name):
    with pytest.raises(ValueError, match=name):
        FixedLengthRecordDataset("f.bin", **kwargs)


# --- SqlDataset -------------------------------------------------------------------


def _make_db(tmp_path) -> str:
    path = str(tmp_path / "people.db")
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE people (id INTEGER, name TEXT, height REAL, active INTEGER, photo BLOB)")
        conn.executemany("INSERT INTO people VALUES (?, ?, ?, ?, ?)", [
            (1, "Ada", 1.65, 1, b"\x00\x01"),
            (2, "Grace", 1.7, 0, b""),
            (3, "Linus", 1.8, 1, None),
        ])
    conn.close()
    return path


def test_sql_types(tmp_path):
    db = _make_db(tmp_path)
    ds = SqlDataset("sqlite", db, "SELECT id, name, height, active, photo, name FROM people ORDER BY id",
                    (np.int32, np.bytes_, np.float64, np.bool_, bytes, str))
    rows = list(ds)
    assert rows[0] == (1, b"Ada", 1.65, True, b"\x00\x01", "Ada")
    assert [type(v) for v in rows[0]] == [np.int32, bytes, np.float64, np.bool_, bytes, str]
    assert rows[1][3] is np.False_ or rows[1][3] == np.bool_(False)
    assert rows[2][4] == b""  # NULL reads as an empty string, as in TensorFlow
    assert list(ds) == rows  # each iteration runs the query again


def test_sql_single_column_gives_values_not_tuples(tmp_path):
    db = _make_db(tmp_path)
    values = list(SqlDataset("sqlite", db, "SELECT id FROM people ORDER BY id", np.int64))
    assert values == [1, 2, 3] and all(type(v) is np.int64 for v in values)
    names = list(SqlDataset("sqlite", db, "SELECT name FROM people ORDER BY id", str))
    assert names == ["Ada", "Grace", "Linus"]


def test_sql_in_a_pipeline(tmp_path):
    db = _make_db(tmp_path)
    ds = SqlDataset("sqlite", db, "SELECT id, height FROM people ORDER BY id", (np.int64, np.float32))
    assert [int(i) for i, _ in ds.filter(lambda i, h: h > 1.66)] == [2, 3]


def test_sql_bad_query_names_query_and_sqlite_error(tmp_path):
    db = _make_db(tmp_path)
    ds = SqlDataset("sqlite", db, "SELECT nope FROM people", np.int64)
    with pytest.raises(sqlite3.Error, match="no such column: nope") as info:
        list(ds)
    assert "SELECT nope FROM people" in str(info.value)


def test_sql_column_count_mismatch(tmp_path):
    db = _make_db(tmp_path)
    ds = SqlDataset("sqlite", db, "SELECT id, name FROM people", (np.int64, str, str))
    with pytest.raises(ValueError, match="2 columns.*3 types"):
        list(ds)


def test_sql_wrong_driver():
    with pytest.raises(ValueError, match="mysql"):
        SqlDataset("mysql", "db", "SELECT 1", np.int64)


def test_sql_unsupported_type():
    with pytest.raises(TypeError, match="unsupported output type"):
        SqlDataset("sqlite", "db", "SELECT 1", object)


def test_sql_missing_database_is_not_created(tmp_path):
    path = str(tmp_path / "missing.db")
    ds = SqlDataset("sqlite", path, "SELECT 1", np.int64)
    with pytest.raises(FileNotFoundError, match="missing.db"):
        list(ds)
    assert not os.path.exists(path)


def test_sql_unconvertible_value_names_the_column(tmp_path):
    db = _make_db(tmp_path)
    with pytest.raises(ValueError, match="'name'.*'Ada'"):
        list(SqlDataset("sqlite", db, "SELECT name FROM people ORDER BY id", np.int64))


def test_sql_is_not_splittable(tmp_path):
    ds = SqlDataset("sqlite", _make_db(tmp_path), "SELECT id FROM people", np.int64)
    assert not ds.is_splittable()
    with pytest.raises(NotSplittableError, match="SqlDataset"):
        ds.num_splits()
    with pytest.raises(NotSplittableError):
        ds.map(lambda x: x).iterate_splits([0])


def test_sql_reads_many_rows(tmp_path):
    path = str(tmp_path / "big.db")
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x INTEGER)")
        conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(5000)])
    conn.close()
    assert [int(x) for x in SqlDataset("sqlite", path, "SELECT x FROM t ORDER BY x", np.int64)] == list(range(5000))


# --- package surface ----------------------------------------------------------------


def test_readers_package_exports():
    from dataservice.data import readers

    assert set(readers.__all__) == {"FixedLengthRecordDataset", "SqlDataset", "TFRecordDataset",
                                    "TFRecordWriter", "TextLineDataset"}



# --- issue 16: TFRecordWriter.write(dataset), readers of no files -------------------------------

@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_writer_writes_a_dataset_and_finishes_the_file(tmp_path, compression):
    path = str(tmp_path / "d.tfrecord")
    writer = TFRecordWriter(path, compression)
    writer.write(Dataset.from_tensor_slices([b"a", b"bc"]).concatenate(Dataset.from_tensor_slices(["d"])))
    # Readable at once, with the writer still referenced: write(dataset) finished the file.
    assert list(TFRecordDataset(path, compression_type=compression)) == [b"a", b"bc", b"d"]
    writer.write(Dataset.from_tensor_slices([b"only"]))  # a second dataset rewrites the file
    assert list(TFRecordDataset(path, compression_type=compression)) == [b"only"]


def test_writer_refuses_a_dataset_of_anything_but_scalar_strings(tmp_path):
    path = str(tmp_path / "d.tfrecord")
    writer = TFRecordWriter(path)
    for ds in (Dataset.range(3), Dataset.from_tensor_slices([[b"a"], [b"b"]]),
               Dataset.from_tensor_slices(([b"a"], [b"b"]))):
        with pytest.raises(TypeError, match="scalar strings"):
            writer.write(ds)
    with pytest.raises(TypeError, match="expects bytes"):
        writer.write([b"a"])
    unknown = Dataset.from_generator(lambda: iter([b"x", np.zeros(2)]), output_signature=TensorSpec(None, "string"))
    with pytest.raises(InvalidArgumentError):
        writer.write(unknown)


def test_readers_of_no_files_are_empty():
    for ds in (TFRecordDataset([]), TextLineDataset([]), FixedLengthRecordDataset([], 4),
               TFRecordDataset(np.array([], dtype=str))):
        assert list(ds) == [] and ds.num_source_splits() == 0
    with pytest.raises(TypeError, match="filenames must be paths"):
        TFRecordDataset([5])
    with pytest.raises(ValueError, match="got None"):
        TFRecordDataset(None)
