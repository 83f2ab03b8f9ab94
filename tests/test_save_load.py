"""Dataset.save / Dataset.load (tf.data's save/load): round trips, the seed's examples, compression,
corruption, atomicity, shard_func / reader_func, and a loaded dataset in distributed_epoch."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from fractions import Fraction

import numpy as np
import pytest

import dataservice
from dataservice import AUTOTUNE, Dataset, TensorSpec, distribute
from dataservice.data import save_format, saved
from dataservice.errors import DataLossError, ElementSerializationError
from tests.cluster import TestCluster, run_with_deadline, wait_until

DEADLINE_S = 60


def assert_exact(actual, expected, where="element"):
    """Same structure, types, dtypes, shapes and values (NaN equal to NaN)."""
    assert type(actual) is type(expected), f"{where}: {type(actual).__name__} != {type(expected).__name__}"
    if isinstance(expected, tuple):
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_exact(a, e, f"{where}[{i}]")
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), where
        for k in expected:
            assert_exact(actual[k], expected[k], f"{where}[{k!r}]")
    elif isinstance(expected, (np.ndarray, np.generic)):
        assert actual.dtype == expected.dtype, f"{where}: {actual.dtype} != {expected.dtype}"
        assert np.shape(actual) == np.shape(expected), where
        assert np.array_equal(actual, expected, equal_nan=expected.dtype.kind in "fc"), where
    else:
        assert actual == expected, where


def every_kind(i: int) -> dict:
    """One element holding every kind the wire format carries, its values depending on ``i``."""
    return {
        "int8": np.int8(-i % 128), "uint16": np.uint16(i * 7), "int32": np.int32(-i), "int64": np.int64(i << 40),
        "float16": np.float16(i / 3), "float32": np.float32(i / 7), "float64": np.float64(np.pi * i),
        "nan": np.float64("nan"), "complex": np.complex64(i + 1j), "bool": np.bool_(i % 2 == 0),
        "bytes": b"\x00bytes\xff" * (i % 4), "str": "h\u00e9llo \u2603" * (i % 3),
        "array0d": np.array(i * 1.5, np.float32), "array_nd": np.arange(24, dtype=np.int16).reshape(2, 3, 4) + i,
        "empty": np.zeros((0, 5), np.float64), "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)) * i,
        "nested": (np.int64(i), (b"x", {"deep": np.array([i, i + 1], np.uint8)}), "s"),
    }


def test_every_element_kind_round_trips_exactly_with_every_compression(tmp_path):
    expected = [every_kind(i) for i in range(40)]
    for compression in save_format.COMPRESSIONS:
        path = tmp_path / f"kinds-{compression}"
        Dataset.from_generator(lambda: iter(expected)).save(str(path), compression=compression)
        loaded = Dataset.load(str(path))
        got = list(loaded)
        assert len(got) == loaded.cardinality() == 40
        for i, (a, e) in enumerate(zip(got, expected)):
            assert_exact(a, e, f"{compression} element {i}")
        assert loaded.element_spec["nested"][1][1]["deep"] == TensorSpec((None,), np.uint8)


def test_big_arrays_scalars_and_python_objects_round_trip(tmp_path):
    rng = np.random.default_rng(3)
    big = [rng.standard_normal((1024, 1024 + i)).astype(np.float32) for i in range(3)]  # over a record each
    Dataset.from_tensor_slices(np.arange(3)).map(lambda i: big[int(i)]).save(str(tmp_path / "big"), "AUTO")
    got = list(Dataset.load(tmp_path / "big"))
    for a, e in zip(got, big):
        assert_exact(a, e)
        a += 1  # loaded arrays are writable, as elements from the service are
    assert len(got) == 3

    scalars = [np.float64(x) for x in rng.standard_normal(20_000)]
    Dataset.from_tensor_slices(np.array(scalars)).save(str(tmp_path / "scalars"))
    assert_exact(tuple(Dataset.load(tmp_path / "scalars")), tuple(scalars))

    objects = [None, frozenset({3}), Fraction(1, 3)]  # no numpy form: pickled, as on the wire
    Dataset.from_generator(lambda: iter(objects)).save(str(tmp_path / "objects"))
    assert list(Dataset.load(tmp_path / "objects")) == objects


def test_large_saves_roll_over_into_several_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(saved, "CHUNK_BYTES", 64 << 10)
    monkeypatch.setattr(save_format, "RECORD_BYTES", 16 << 10)
    ds = Dataset.range(200).map(lambda i: np.full(1000, i, np.int64))
    ds.save(str(tmp_path / "s"))
    metadata = save_format.read_metadata(str(tmp_path / "s"))
    assert len(metadata["chunks"]) > 4
    assert sum(c["num_elements"] for c in metadata["chunks"]) == metadata["num_elements"] == 200
    loaded = Dataset.load(tmp_path / "s")
    assert loaded.num_source_splits() == len(metadata["chunks"])
    assert [int(x[0]) for x in loaded] == list(range(200))  # round robin over shards restores the order


# --- the seed's three examples, with our names ---------------------------------------------------

def test_seed_example_1_simple_dataset(tmp_path):
    dataset = Dataset.from_tensor_slices([1, 2, 3, 4, 5])
    save_path = str(tmp_path / "my_dataset")
    dataservice.save(dataset, save_path)
    loaded_dataset = dataservice.load(save_path)
    assert [element.item() for element in loaded_dataset] == [1, 2, 3, 4, 5]
    assert loaded_dataset.element_spec == dataset.element_spec == TensorSpec((), np.int64)
    assert loaded_dataset.cardinality() == 5


def test_seed_example_2_transformations_are_preserved(tmp_path):
    dataset = Dataset.range(10)
    dataset = dataset.map(lambda x: x * 2)
    dataset = dataset.filter(lambda x: x % 3 != 0)
    dataset = dataset.shuffle(buffer_size=5)
    dataset = dataset.batch(2)
    save_path = str(tmp_path / "transformed_dataset")
    dataset.save(save_path)
    loaded_dataset = Dataset.load(save_path)
    batches = [batch.tolist() for batch in loaded_dataset]
    assert [len(b) for b in batches] == [2, 2, 2]
    assert sorted(x for b in batches for x in b) == [2, 4, 8, 10, 14, 16]
    assert loaded_dataset.element_spec == TensorSpec((None,), np.int64)
    # Saved once: every read gives the same (shuffled) order, the pipeline never runs again.
    assert [b.tolist() for b in loaded_dataset] == batches


def test_seed_example_3_gzip(tmp_path):
    dataset = Dataset.range(100000).map(lambda x: x * x)
    save_path = str(tmp_path / "large_dataset")
    dataservice.save(dataset, save_path, compression="GZIP")
    loaded_dataset = dataservice.load(save_path, compression="GZIP")
    assert [int(e) for e in loaded_dataset.take(10)] == [i * i for i in range(10)]
    assert loaded_dataset.cardinality() == 100000
    assert sum(1 for _ in loaded_dataset) == 100000
    assert save_format.read_metadata(save_path)["compression"] == "GZIP"
    uncompressed = tmp_path / "plain"
    dataset.save(str(uncompressed))
    size = lambda p: sum(os.path.getsize(os.path.join(p, f)) for f in os.listdir(p))  # noqa: E731
    assert size(save_path) < size(uncompressed) / 2


# --- compression ---------------------------------------------------------------------------------

def test_compression_none_reads_as_written_and_a_mismatch_is_refused(tmp_path):
    path = str(tmp_path / "g")
    Dataset.range(100).save(path, compression="GZIP")
    assert [int(x) for x in Dataset.load(path)] == list(range(100))  # None: as the metadata says
    assert len(list(Dataset.load(path, compression="gzip"))) == 100
    for wrong in ("ZLIB", "AUTO", "LZ4"):
        with pytest.raises(ValueError, match=r"saved with compression 'GZIP', but compression='.*' was asked"):
            Dataset.load(path, compression=wrong)
    with pytest.raises(ValueError, match="compression must be one of"):
        Dataset.load(path, compression="BZIP2")
    with pytest.raises(ValueError, match="compression must be one of"):
        Dataset.range(3).save(str(tmp_path / "x"), compression="snappy")

    auto = str(tmp_path / "auto")
    Dataset.range(100).save(auto, compression="AUTO")
    assert save_format.read_metadata(auto)["compression"] == save_format.resolve_compression("AUTO") == "LZ4"
    assert len(list(Dataset.load(auto, compression="AUTO"))) == 100


def test_chunks_read_with_the_wrong_codec_raise_data_loss_never_garbage(tmp_path):
    path = tmp_path / "z"
    Dataset.range(1000).save(str(path), compression="ZLIB")
    metadata_file = path / "metadata.json"
    for codec in ("GZIP", "LZ4", "ZSTD", None):
        metadata = json.loads(metadata_file.read_text())
        metadata["compression"] = codec  # a metadata file edited by hand, or chunks copied between saves
        metadata_file.write_text(json.dumps(metadata))
        with pytest.raises(DataLossError, match=r"chunk-.*\.tfrecord") as info:
            list(Dataset.load(str(path)))
        assert info.value.filename.startswith(str(path)) and info.value.offset == 0


# --- corruption and atomicity --------------------------------------------------------------------

def test_a_corrupted_chunk_raises_naming_the_file_and_offset(tmp_path):
    path = tmp_path / "c"
    Dataset.range(50_000).save(str(path))
    chunk = sorted(path.glob("chunk-*"))[0]
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(DataLossError) as info:
        list(Dataset.load(str(path)))
    assert str(chunk) in str(info.value) and "offset" in str(info.value)
    assert info.value.filename == str(chunk) and 0 <= info.value.offset < len(data)

    chunk.write_bytes(bytes(data[:len(data) - 10]))  # truncated as well
    with pytest.raises(DataLossError, match="truncated|CRC"):
        list(Dataset.load(str(path)))


def test_a_save_that_fails_midway_leaves_nothing_loadable(tmp_path):
    def elements():
        for i in range(10_000):
            if i == 5_000:
                raise RuntimeError("the pipeline broke")
            yield np.full(100, i)

    path = tmp_path / "failed"
    with pytest.raises(RuntimeError, match="the pipeline broke"):
        Dataset.from_generator(elements).save(str(path))
    with pytest.raises(FileNotFoundError, match="metadata.json is missing"):
        Dataset.load(str(path))
    assert os.listdir(path) == []  # every temporary chunk removed

    Dataset.range(10).save(str(path))
    with pytest.raises(RuntimeError):
        Dataset.from_generator(elements).save(str(path))
    assert [int(x) for x in Dataset.load(str(path))] == list(range(10))  # the previous save, whole
    Dataset.range(3).save(str(path))
    assert [int(x) for x in Dataset.load(str(path))] == [0, 1, 2]
    assert len(list(path.glob("chunk-*"))) == len(save_format.read_metadata(str(path))["chunks"])

    with pytest.raises(ValueError, match="not a dataservice saved dataset"):
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "metadata.json").write_text('{"something": "else"}')
        Dataset.load(str(tmp_path / "other"))
    with pytest.raises(FileNotFoundError, match="no such directory"):
        Dataset.load(str(tmp_path / "nowhere"))


def make_locked_record(x):
    return {"id": x, "lock": threading.Lock()}


def test_an_element_that_cannot_be_serialized_names_its_transformation_and_component(tmp_path):
    path = tmp_path / "locked"
    with pytest.raises(ElementSerializationError) as info:
        Dataset.range(5).map(make_locked_record).prefetch(2).save(str(path))
    assert info.value.where == "Dataset.map(make_locked_record)"
    assert (info.value.path, info.value.component_type) == ("['lock']", "_thread.lock")
    assert str(info.value).startswith("Dataset.map(make_locked_record) produced an element that cannot be "
                                      "serialized: its component ['lock'] is a _thread.lock")
    with pytest.raises(FileNotFoundError, match="metadata.json is missing"):
        Dataset.load(str(path))


KILLED_SAVE = """
import sys, time, numpy as np
from dataservice import Dataset
def slow(i):
    if i == 300:
        print("saving", flush=True)
    if i >= 300:
        time.sleep(0.01)
    return np.full(5000, i)
Dataset.range(100_000).map(slow).save(sys.argv[1])
"""


@pytest.mark.slow
def test_a_save_killed_with_sigkill_is_not_loadable_as_complete(tmp_path, procs):
    path = tmp_path / "killed"
    proc = procs.python(KILLED_SAVE, str(path))
    proc.wait_for_line("^saving$")
    wait_until(lambda: list(path.glob("chunk-*.tmp-*")), 20, "a chunk being written")
    proc.send(signal.SIGKILL)
    wait_until(lambda: proc.popen.poll() is not None, 10, "the killed save to exit")
    with pytest.raises(FileNotFoundError, match="metadata.json is missing"):
        Dataset.load(str(path))
    Dataset.range(5).save(str(path))  # a later save there completes, and clears the killed one's files
    assert [int(x) for x in Dataset.load(str(path))] == list(range(5))
    assert not list(path.glob("*.tmp-*"))


# --- shard_func, reader_func, element_spec ---------------------------------------------------------

def test_shard_func_picks_the_shard_files(tmp_path):
    path = str(tmp_path / "sharded")
    Dataset.range(100).enumerate().save(path, shard_func=lambda i, x: i % 3)
    metadata = save_format.read_metadata(path)
    assert metadata["shards"] == [0, 1, 2] and metadata["sharding"] == "shard_func"
    per_shard = {c["shard"]: c["num_elements"] for c in metadata["chunks"]}
    assert per_shard == {0: 34, 1: 33, 2: 33}
    loaded = Dataset.load(path)
    assert loaded.num_source_splits() == 3
    assert [int(i) for i, _ in loaded.read_split(1)][:3] == [1, 4, 7]
    assert sorted(int(x) for _, x in loaded) == list(range(100))

    Dataset.range(10).save(str(tmp_path / "one"), shard_func=lambda x: np.int64(7))
    assert save_format.read_metadata(str(tmp_path / "one"))["shards"] == [7]
    with pytest.raises(TypeError, match=r"<lambda>\) must return an int shard index, got 'a'"):
        Dataset.range(3).save(str(tmp_path / "bad"), shard_func=lambda x: "a")
    with pytest.raises(ValueError, match="shard index >= 0"):
        Dataset.range(3).save(str(tmp_path / "bad"), shard_func=lambda x: -1)
    with pytest.raises(ZeroDivisionError, match=r"raised in save\(shard_func=.*<lambda>\)"):
        Dataset.range(3).save(str(tmp_path / "bad"), shard_func=lambda x: 1 // 0)


def test_reader_func_as_in_the_seed(tmp_path):
    NUM_SHARDS, NUM_CORES = 4, 2
    path = str(tmp_path / "r")
    dataset = Dataset.range(1000).map(lambda x: x * 10).enumerate()
    dataset.save(path, shard_func=lambda x, y: x % NUM_SHARDS)

    def user_reader_func(datasets):
        datasets = datasets.shuffle(NUM_CORES)
        return datasets.interleave(lambda x: x, num_parallel_calls=AUTOTUNE)

    loaded = Dataset.load(path, reader_func=user_reader_func).map(lambda x, y: y)
    assert sorted(int(y) for y in loaded) == [x * 10 for x in range(1000)]
    shards = []
    dataservice.load(path, reader_func=lambda ds: shards.append(ds.cardinality()) or ds.flat_map(lambda s: s))
    assert shards == [NUM_SHARDS]
    with pytest.raises(TypeError, match="must return a Dataset"):
        Dataset.load(path, reader_func=lambda ds: [1])


def test_element_spec_is_stored_and_a_given_one_is_checked(tmp_path):
    path = str(tmp_path / "spec")
    ds = Dataset.range(8).map(lambda x: {"a": np.zeros((3, 2), np.float32) + np.float32(x), "b": (x, b"s")}).batch(4)
    ds.save(path)
    loaded = Dataset.load(path)
    assert loaded.element_spec == ds.element_spec
    declared = {"a": TensorSpec((4, 3, 2), np.float32), "b": (TensorSpec((4,), np.int64), TensorSpec((4,), bytes))}
    assert Dataset.load(path, element_spec=declared).element_spec == declared
    with pytest.raises(ValueError, match="does not match the saved elements"):
        Dataset.load(path, element_spec={"a": TensorSpec((None, 3, 2), np.float64), "b": declared["b"]})
    with pytest.raises(ValueError, match="does not match the saved elements"):
        Dataset.load(path, element_spec=TensorSpec((), np.int64))

    with pytest.raises(ValueError, match="infinite"):
        Dataset.range(3).repeat().save(str(tmp_path / "inf"))


# --- distributed_epoch ---------------------------------------------------------------------------

def test_a_loaded_dataset_runs_in_distributed_epoch(tmp_path, monkeypatch):
    monkeypatch.setattr(saved, "CHUNK_BYTES", 1)  # a chunk per record
    monkeypatch.setattr(save_format, "RECORD_BYTES", 16 << 10)
    path = str(tmp_path / "dist")
    Dataset.range(20_000).map(lambda x: (x, np.full(4, x, np.int32))).save(path, compression="AUTO")
    loaded = Dataset.load(path)
    assert loaded.num_splits() > 4

    def run():
        with TestCluster(num_workers=2) as cluster:
            ds = loaded.map(lambda x, a: x + int(a[0])).apply(distribute("distributed_epoch", cluster.target))
            return sorted(int(x) for x in ds)

    started = time.monotonic()
    assert run_with_deadline(run, DEADLINE_S) == [2 * x for x in range(20_000)]
    assert time.monotonic() - started < DEADLINE_S
