"""dataservice.snapshot: written on the first pass, read on every later one (in this process or another),
never read when incomplete, safe under concurrent writers; shard_func, reader_func and every compression.

Calls of the upstream pipeline are counted in a file (one line per call, with the caller's pid): the
pipeline may run in a subprocess, and what a pass reads from the snapshot must not run it at all.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

import dataservice as ds
from dataservice import errors
from dataservice.data import save_format
from dataservice.data.serialization import serialize_dataset
from dataservice.data.snapshots import ATTEMPTS_DIR, COMMITTED_DIR, snapshot_fingerprint, sweep_stale_attempts
from tests.cluster import run_with_deadline, wait_until

# The module, dataservice.data.snapshots (dataservice.data.snapshot is the function).
snapshot_module = importlib.import_module("dataservice.data.snapshots")

#: How long a gated map function waits for its gate before failing (a test never lets it get there).
GATE_TIMEOUT_S = 60.0


def counted_double(counter: str, n: int, gate: str | None = None):
    """``x -> 2x``, appending the caller's pid to ``counter`` on each call; with ``gate``, the call for
    element ``n // 2`` waits until the file ``gate`` exists (so a writer can be held mid-write)."""

    def double(x):
        with open(counter, "a") as f:
            f.write(f"{os.getpid()}\n")
        if gate is not None and x == n // 2:
            deadline = time.monotonic() + GATE_TIMEOUT_S
            while not os.path.exists(gate):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"gate {gate} never opened")
                time.sleep(0.01)
        return x * 2

    return double


def pipeline(path: str, counter: str, n: int, gate: str | None = None, compression: str | None = "AUTO",
             factor: int = 1) -> ds.Dataset:
    """The pipeline every test snapshots: ``range(n)`` doubled (counted), times ``factor``."""
    dataset = ds.Dataset.range(n).map(counted_double(counter, n, gate))
    if factor != 1:
        dataset = dataset.map(lambda x: x * factor)
    return dataset.apply(ds.snapshot(path, compression=compression))


def calls(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def calls_by_pid(counter: Path) -> dict[int, int]:
    by_pid: dict[int, int] = {}
    for line in counter.read_text().splitlines():
        by_pid[int(line)] = by_pid.get(int(line), 0) + 1
    return by_pid


def run_dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir()) if path.exists() else []


def committed(path: Path) -> list[Path]:
    return [d / COMMITTED_DIR for d in run_dirs(path) if (d / COMMITTED_DIR).is_dir()]


def lock_files(path: Path) -> list[Path]:
    return sorted(path.glob(f"*/{ATTEMPTS_DIR}/*.lock"))


def ints(dataset) -> list[int]:
    return [int(x) for x in dataset]


#: A subprocess that builds ``pipeline(*argv)`` from this module and prints what it read, as JSON.
CHILD = """
import json, sys
from tests.test_snapshot import pipeline
path, counter, n, gate = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] or None
dataset = pipeline(path, counter, n, gate)
print("started", flush=True)
print(json.dumps([int(x) for x in dataset]), flush=True)
"""


def child_result(proc, timeout_s: float = 60.0) -> list[int]:
    return json.loads(proc.wait_for_line(r"^\[", timeout_s=timeout_s).string)


# --- write once, read after ----------------------------------------------------------------

def test_second_pass_reads_the_snapshot_without_running_upstream(tmp_path):
    counter, path = tmp_path / "calls", tmp_path / "snap"
    dataset = pipeline(str(path), str(counter), 100)
    expected = [2 * i for i in range(100)]
    assert run_with_deadline(lambda: ints(dataset), 30) == expected
    assert calls(counter) == 100
    assert len(committed(path)) == 1
    assert run_with_deadline(lambda: ints(dataset), 30) == expected
    # The same pipeline built again finds the snapshot too.
    assert run_with_deadline(lambda: ints(pipeline(str(path), str(counter), 100)), 30) == expected
    assert calls(counter) == 100


def test_default_read_keeps_the_written_order_and_cardinality(tmp_path):
    counter, path = tmp_path / "calls", tmp_path / "snap"
    # Not a multiple of the shard count: the round-robin shards differ in length.
    dataset = pipeline(str(path), str(counter), 1001)
    first = run_with_deadline(lambda: ints(dataset), 30)
    assert run_with_deadline(lambda: ints(dataset), 30) == first == [2 * i for i in range(1001)]
    assert dataset.cardinality() == 1001


@pytest.mark.slow
def test_a_subprocess_reads_the_snapshot_written_here(tmp_path, procs):
    counter, path = tmp_path / "calls", tmp_path / "snap"
    expected = run_with_deadline(lambda: ints(pipeline(str(path), str(counter), 200)), 30)
    assert calls(counter) == 200
    child = procs.python(CHILD, str(path), str(counter), "200", "")
    assert child_result(child) == expected
    assert child.popen.wait(timeout=30) == 0
    assert calls(counter) == 200  # the subprocess ran no upstream call
    assert len(run_dirs(path)) == 1


@pytest.mark.slow
def test_fingerprint_does_not_depend_on_the_modules_a_process_loaded(tmp_path, procs):
    code = ("import sys, json\nfrom tests.test_snapshot import pipeline\n"
            "from dataservice.data.snapshots import snapshot_fingerprint\n"
            "print(snapshot_fingerprint(pipeline(sys.argv[1], sys.argv[2], 10)._input), flush=True)\n")
    mine = snapshot_fingerprint(pipeline(str(tmp_path), str(tmp_path / "c"), 10)._input)
    # This process has imported many user modules (the tests, conftest) that the child has not.
    child = procs.python(code, str(tmp_path), str(tmp_path / "c"))
    assert child.wait_for_line(r"^[0-9a-f]{64}$").string.strip() == mine


def test_fingerprint_is_stable_and_iterating_does_not_change_the_pipeline_bytes(tmp_path):
    counter, path = tmp_path / "calls", tmp_path / "snap"
    a, b = pipeline(str(path), str(counter), 10), pipeline(str(path), str(counter), 10)
    assert snapshot_fingerprint(a._input) == snapshot_fingerprint(b._input)
    before = serialize_dataset(a)
    run_with_deadline(lambda: ints(a), 30)
    assert serialize_dataset(a) == before


def test_a_changed_pipeline_makes_a_new_snapshot(tmp_path):
    counter, path = tmp_path / "calls", tmp_path / "snap"
    assert run_with_deadline(lambda: ints(pipeline(str(path), str(counter), 50)), 30) == [2 * i for i in range(50)]
    changed = pipeline(str(path), str(counter), 50, factor=3)
    assert run_with_deadline(lambda: ints(changed), 30) == [6 * i for i in range(50)]
    assert calls(counter) == 100  # the changed pipeline ran, rather than reading the first snapshot
    assert len(committed(path)) == 2
    assert run_with_deadline(lambda: ints(changed), 30) == [6 * i for i in range(50)]
    assert calls(counter) == 100


# --- incomplete writes ---------------------------------------------------------------------

def test_a_pass_stopped_early_is_not_committed_and_the_next_pass_writes_it_all(tmp_path):
    counter, path = tmp_path / "calls", tmp_path / "snap"
    dataset = pipeline(str(path), str(counter), 100)
    it = iter(dataset)
    assert [int(next(it)) for _ in range(10)] == [2 * i for i in range(10)]
    it.close()
    assert committed(path) == [] and lock_files(path) == []
    assert list((run_dirs(path)[0] / ATTEMPTS_DIR).iterdir()) == []  # the attempt was removed
    assert run_with_deadline(lambda: ints(dataset), 30) == [2 * i for i in range(100)]
    assert calls(counter) == 10 + 100
    assert run_with_deadline(lambda: ints(dataset), 30) == [2 * i for i in range(100)]
    assert calls(counter) == 110


def test_a_pass_that_raises_is_not_committed(tmp_path):
    path = tmp_path / "snap"

    def fail_at_5(x):
        if x == 5:
            raise ValueError("bad element 5")
        return x

    with pytest.raises(ValueError, match="bad element 5"):
        ints(ds.Dataset.range(10).map(fail_at_5).apply(ds.snapshot(str(path))))
    assert committed(path) == [] and lock_files(path) == []


@pytest.mark.slow
def test_a_writer_killed_mid_write_is_not_read_as_complete(tmp_path, procs):
    counter, path, gate = tmp_path / "calls", tmp_path / "snap", tmp_path / "gate"
    n = 200
    child = procs.python(CHILD, str(path), str(counter), str(n), str(gate))
    # The child holds at element n/2 (the gate stays shut) with half its chunks written.
    wait_until(lambda: calls(counter) > n // 2 and lock_files(path), 60, "the child writing mid-way")
    attempts = lock_files(path)[0].parent
    assert sweep_stale_attempts(str(attempts)) == []  # a live writer's attempt is left alone
    child.kill9()
    assert committed(path) == []
    dataset = pipeline(str(path), str(counter), n, str(gate))
    gate.touch()
    assert run_with_deadline(lambda: ints(dataset), 60) == [2 * i for i in range(n)]
    assert calls_by_pid(counter)[os.getpid()] == n  # this process wrote it all again
    assert len(committed(path)) == 1
    assert list(attempts.iterdir()) == []  # the killed writer's attempt was swept
    assert run_with_deadline(lambda: ints(dataset), 30) == [2 * i for i in range(n)]
    assert calls_by_pid(counter)[os.getpid()] == n


# --- concurrent writers --------------------------------------------------------------------

@pytest.mark.slow
def test_two_processes_writing_the_same_snapshot_at_once(tmp_path, procs):
    counter, path, gate = tmp_path / "calls", tmp_path / "snap", tmp_path / "gate"
    n = 300
    children = [procs.python(CHILD, str(path), str(counter), str(n), str(gate), name=f"writer{i}") for i in range(2)]
    # Both hold mid-write at once; then both finish, one commits and the other finds it committed.
    wait_until(lambda: len(lock_files(path)) == 2, 60, "two writers mid-write")
    gate.touch()
    expected = [2 * i for i in range(n)]
    for child in children:
        assert child_result(child) == expected
        assert child.popen.wait(timeout=30) == 0
    assert sorted(calls_by_pid(counter).values()) == [n, n]
    assert len(committed(path)) == 1 and lock_files(path) == []
    assert list((run_dirs(path)[0] / ATTEMPTS_DIR).iterdir()) == []
    assert run_with_deadline(lambda: ints(pipeline(str(path), str(counter), n, str(gate))), 30) == expected
    assert calls(counter) == 2 * n


def test_two_passes_writing_at_once_in_one_process(tmp_path):
    counter, path = tmp_path / "calls", tmp_path / "snap"
    dataset = pipeline(str(path), str(counter), 100)
    pairs = run_with_deadline(lambda: [(int(a), int(b)) for a, b in ds.Dataset.zip(dataset, dataset)], 30)
    assert pairs == [(2 * i, 2 * i) for i in range(100)]
    assert calls(counter) == 200
    assert len(committed(path)) == 1 and lock_files(path) == []
    assert run_with_deadline(lambda: ints(dataset), 30) == [2 * i for i in range(100)]
    assert calls(counter) == 200


# --- shard_func and reader_func, as in tf.data's documentation ---------------------------------

def test_shard_func_and_reader_func_as_in_the_seed(tmp_path):
    NUM_SHARDS, NUM_CORES, AUTOTUNE = 4, 2, ds.AUTOTUNE
    counter, path = tmp_path / "calls", tmp_path / "snap"
    seen = []

    def user_reader_func(datasets):
        seen.append(datasets.cardinality())
        # shuffle the datasets splits
        datasets = datasets.shuffle(NUM_CORES)
        # read datasets in parallel and interleave their elements
        return datasets.interleave(lambda x: x, num_parallel_calls=AUTOTUNE)

    def build():
        dataset = ds.Dataset.range(103).map(counted_double(str(counter), 103))
        dataset = dataset.enumerate()
        dataset = dataset.apply(ds.snapshot(str(path), shard_func=lambda x, y: x % NUM_SHARDS,
                                            reader_func=user_reader_func))
        dataset = dataset.map(lambda x, y: y)
        return dataset

    expected = [2 * i for i in range(103)]
    assert run_with_deadline(lambda: ints(build()), 30) == expected  # the writing pass passes elements through
    (snap,) = committed(path)
    metadata = save_format.read_metadata(str(snap))
    assert [s["index"] for s in metadata["shards"]] == [0, 1, 2, 3]
    assert [sum(c["num_elements"] for c in s["chunks"]) for s in metadata["shards"]] == [26, 26, 26, 25]
    for shard in metadata["shards"]:  # each shard holds exactly its elements, in order
        indices = [int(i) for c in shard["chunks"]
                   for i, _ in save_format.read_chunk(str(snap / c["file"]), metadata["compression"])]
        assert indices == list(range(shard["index"], 103, NUM_SHARDS))
    got = run_with_deadline(lambda: ints(build()), 30)
    assert sorted(got) == expected
    assert seen == [NUM_SHARDS]  # reader_func ran on the reading pass only, over one Dataset per shard
    assert calls(counter) == 103


def test_more_shards_than_open_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshot_module, "MAX_OPEN_CHUNKS", 3)
    path = tmp_path / "snap"
    dataset = ds.Dataset.range(200).apply(ds.snapshot(str(path), shard_func=lambda x: x % 10))
    assert sorted(run_with_deadline(lambda: ints(dataset), 30)) == list(range(200))
    (snap,) = committed(path)
    metadata = save_format.read_metadata(str(snap))
    assert len(metadata["shards"]) == 10 and all(len(s["chunks"]) > 1 for s in metadata["shards"])
    shards = {}
    for x in run_with_deadline(lambda: ints(dataset), 30):
        shards.setdefault(x % 10, []).append(x)
    assert shards == {k: list(range(k, 200, 10)) for k in range(10)}  # a shard's chunks are read in order


# --- compression and elements ----------------------------------------------------------------

def _elements():
    return ds.Dataset.range(20).map(lambda i: {"image": (np.arange(12).reshape(4, 3) / 7 + i).astype(np.float32),
                                                "label": (i, b"bytes-%d" % i, f"str-{i}")})


@pytest.mark.parametrize("compression", ["AUTO", "GZIP", "ZLIB", None])
def test_every_compression_round_trips(tmp_path, compression):
    path = tmp_path / "snap"
    dataset = _elements().apply(ds.snapshot(str(path), compression=compression))
    written = run_with_deadline(lambda: list(dataset), 30)
    read = run_with_deadline(lambda: list(dataset), 30)
    assert len(read) == len(written) == 20
    for w, r in zip(written, read):
        assert r["image"].dtype == np.float32 and r["image"].shape == (4, 3)
        np.testing.assert_array_equal(r["image"], w["image"])
        assert [type(v) for v in r["label"]] == [type(v) for v in w["label"]] and r["label"] == w["label"]
    (snap,) = committed(path)
    assert save_format.read_metadata(str(snap))["compression"] == save_format.resolve_compression(compression)


def test_a_snapshot_is_read_with_the_compression_it_was_written_with(tmp_path):
    path = tmp_path / "snap"
    assert ints(ds.Dataset.range(30).apply(ds.snapshot(str(path), compression="GZIP"))) == list(range(30))
    # The compression is not part of the pipeline's fingerprint: this finds the GZIP snapshot and reads it as such.
    assert ints(ds.Dataset.range(30).apply(ds.snapshot(str(path), compression=None))) == list(range(30))
    assert len(committed(path)) == 1


# --- bad input, and where a snapshot does not apply --------------------------------------------

def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="BROTLI"):
        ds.snapshot(str(tmp_path), compression="BROTLI")
    with pytest.raises(TypeError, match="path"):
        ds.snapshot(42)
    with pytest.raises(TypeError, match="shard_func"):
        ds.snapshot(str(tmp_path), shard_func="x % 4")
    with pytest.raises(TypeError, match="reader_func"):
        ds.snapshot(str(tmp_path), reader_func=3)
    with pytest.raises(ValueError, match="shard_func must return a shard index >= 0, got -1"):
        ints(ds.Dataset.range(3).apply(ds.snapshot(str(tmp_path / "a"), shard_func=lambda x: -1)))
    with pytest.raises(TypeError, match="shard_func must return an int shard index, got 0.5"):
        ints(ds.Dataset.range(3).apply(ds.snapshot(str(tmp_path / "b"), shard_func=lambda x: 0.5)))
    assert committed(tmp_path / "a") == committed(tmp_path / "b") == []
    dataset = ds.Dataset.range(3).apply(ds.snapshot(str(tmp_path / "c"), reader_func=lambda datasets: [1]))
    assert ints(dataset) == [0, 1, 2]
    with pytest.raises(TypeError, match="reader_func must return a Dataset, got list"):
        ints(dataset)


def test_a_pipeline_that_cannot_be_serialized_is_named(tmp_path):
    import threading

    lock = threading.Lock()
    dataset = ds.Dataset.range(3).map(lambda x: (lock, x)[1]).apply(ds.snapshot(str(tmp_path)))
    with pytest.raises(errors.PipelineSerializationError, match="fingerprint of the serialized upstream"):
        ints(dataset)


def test_under_splits_the_snapshot_passes_elements_through(tmp_path):
    path = tmp_path / "snap"
    dataset = ds.Dataset.range(100).apply(ds.snapshot(str(path)))
    assert sorted(int(x) for x in dataset.iterate_splits(range(dataset.num_splits()))) == list(range(100))
    assert not path.exists()  # a subset of splits is not the whole output: nothing written
