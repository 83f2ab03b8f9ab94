"""Saving and resuming the iterators of window, group_by_window, cache (in memory and in a file) and snapshot
(reading and writing): the state after k elements, through JSON, restored in a fresh iterator of the pipeline
built again (tests/checkpoints.py), continues exactly.

A pipeline built again in ``make()`` has an empty memory cache, as a new process has; a file cache and a
snapshot persist on disk between the builds, as they do between processes.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from dataservice import Dataset
from dataservice.data.snapshots import CHECKPOINTS_DIR, COMMITTED_DIR, snapshot
from dataservice.errors import NotCheckpointableError
from tests.checkpoints import assert_resumes, resumed, state_after, typed

pytestmark = pytest.mark.no_grpc

REPO = Path(__file__).resolve().parents[1]


def position(state: dict, key: str = "") -> dict:
    """The state's position; with ``key``, the first object in it (depth first) that has that key: this
    node's own state under the nodes after it (a repeat's, a flat_map's)."""
    found = state["position"]
    if not key:
        return found
    todo = [found]
    while todo:
        item = todo.pop(0)
        if isinstance(item, dict):
            if key in item:
                return item
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    raise AssertionError(f"no {key!r} in {found!r:.200}")


# The functions that count their calls are module functions writing a module list: a closure over the list
# would make its contents part of the pipeline's identity (the fingerprint digests closures' values).
CALLS: list = []


def _record(x):
    CALLS.append(int(x))
    return x


def _record_double(x):
    CALLS.append(int(x))
    return x * 2


def _record_named(x):
    CALLS.append(int(x))
    return {"x": x, "name": str(int(x)) * 3}


# --- window ------------------------------------------------------------------------------------------------

WINDOWS = [
    # size, shift, stride, drop_remainder
    (3, None, 1, False),   # shift = size: windows do not overlap, the buffer is empty between them
    (3, None, 1, True),
    (4, 1, 1, False),      # overlapping: the next window's elements are in the buffer
    (4, 1, 1, True),
    (5, 2, 3, False),      # stride: a span of 13 elements
    (3, 2, 2, True),
    (2, 5, 1, False),      # shift > span: elements between windows are skipped
    (3, 7, 2, True),
    (1, 1, 1, False),
    (70, 3, 1, False),     # a window longer than the marks' interval
]


@pytest.mark.parametrize("size, shift, stride, drop", WINDOWS,
                         ids=[f"size{s}-shift{h}-stride{t}-{'drop' if d else 'keep'}" for s, h, t, d in WINDOWS])
def test_window_resumes_at_every_window(size, shift, stride, drop):
    def make():
        return Dataset.range(97).map(lambda x: x * 3).window(size, shift, stride, drop).flat_map(
            lambda w: w.batch(size))

    full = assert_resumes(make, cuts=[0])
    assert full, "the pipeline yields batches"
    assert_resumes(make, cuts=range(len(full) + 1))


def test_window_resumes_on_a_longer_input_at_the_default_cuts():
    assert_resumes(lambda: Dataset.range(5_000).window(9, 2, 2).flat_map(lambda w: w.batch(9)))


def test_windows_of_nested_elements_resume():
    def tuples():
        return Dataset.from_tensor_slices((np.arange(40), np.arange(40, dtype=np.float32) / 2)).window(4, 3).flat_map(
            lambda a, b: Dataset.zip(a.batch(4), b.batch(4)))

    def dicts():
        return Dataset.from_tensor_slices({"x": np.arange(60).reshape(30, 2), "s": [str(i) for i in range(30)]}).window(
            5, 2, drop_remainder=True).flat_map(lambda d: Dataset.zip(d["x"].batch(5), d["s"].batch(5)))

    for make in (tuples, dicts):
        full = assert_resumes(make, cuts=[0])
        assert_resumes(make, cuts=range(len(full) + 1))


def test_a_window_handed_out_is_the_consumers_and_the_state_covers_what_comes_next():
    def make():
        return Dataset.range(20).window(4, 2)

    it = iter(make())
    first, second = next(it), next(it)
    state = it.state_dict()
    assert [int(x) for x in second] == [2, 3, 4, 5]
    restored = iter(make())
    restored.load_state_dict(json.loads(json.dumps(state)))
    assert [[int(x) for x in w] for w in restored][:2] == [[4, 5, 6, 7], [6, 7, 8, 9]]
    assert [int(x) for x in first] == [0, 1, 2, 3]  # still readable after the state was taken


def test_window_state_is_a_position_of_the_input_and_does_not_grow_with_the_window():
    def make():
        return Dataset.range(20_000).map(_record).window(2_000, 1)

    sizes = []
    for cut in (3, 9_000):
        it = iter(make())
        for _ in range(cut):
            next(it)
        state = json.loads(json.dumps(it.state_dict()))
        it.close()
        assert set(position(state)) == {"input", "skip"}  # a position: no window of 2,000 elements in it
        sizes.append(len(json.dumps(state)))
        CALLS.clear()
        it = iter(make())
        it.load_state_dict(state)
        first = [int(x) for x in next(it)]
        it.close()
        assert first == list(range(cut, cut + 2_000))
        # A seek: the input is read again from a mark shortly before the window, not from its start.
        assert min(CALLS) >= cut - 1_024 and len(CALLS) <= 2_000 + 1_024
    assert max(sizes) < 512 and abs(sizes[0] - sizes[1]) < 16


def test_window_over_an_input_that_cannot_save_iterates_and_its_state_names_it():
    def gen():
        yield from range(10)

    it = iter(Dataset.from_generator(gen).window(3, 1))
    assert [int(x) for x in next(it)] == [0, 1, 2]
    with pytest.raises(NotCheckpointableError, match="from_generator"):
        it.state_dict()
    assert [[int(x) for x in w] for w in it][-1] == [9]


# --- group_by_window ---------------------------------------------------------------------------------------

def _group_by_size():
    return Dataset.range(100).map(lambda x: x * 7 % 100).group_by_window(
        lambda x: x % 4, lambda key, w: w.batch(3), window_size=5)


def _group_by_size_func():
    return Dataset.range(90).group_by_window(
        lambda x: x % 5, lambda key, w: w.map(lambda v: v + 1000 * key).batch(2),
        window_size_func=lambda key: key + 2)


def _group_nested():
    return Dataset.from_tensor_slices((np.arange(60), np.arange(60, dtype=np.float32) * 0.5)).group_by_window(
        lambda a, b: a % 3, lambda key, w: w.batch(4), window_size=7)


@pytest.mark.parametrize("make", [_group_by_size, _group_by_size_func, _group_nested],
                         ids=["window_size", "window_size_func", "nested"])
def test_group_by_window_resumes_at_every_element(make):
    full = assert_resumes(make, cuts=[0])
    assert_resumes(make, cuts=range(len(full) + 1))  # the last cuts are in the flush of the open groups


def _reduce_in_pairs(key, window):
    CALLS.append(int(key))
    return window.batch(2)


def test_group_by_window_state_holds_the_open_groups_and_rebuilds_the_reduced_window():
    reduced, reduce_func = CALLS, _reduce_in_pairs

    def make():
        return Dataset.range(30).group_by_window(lambda x: x % 3, reduce_func, window_size=4)

    # After the first batch (of key 0's window [0, 3, 6, 9]): its second batch is still to come; keys 1 and 2
    # hold [1, 4, 7] and [2, 5, 8].
    _, state = state_after(make, 1)
    saved = position(state)
    assert saved["groups"] == [[1, 3], [2, 3]] and saved["output"]["key"] == 0 and saved["output"]["count"] == 4
    reduced.clear()
    rest = resumed(make, state)
    assert rest[0] == typed(np.array([6, 9]))
    assert reduced[0] == 0  # reduce_func called again for the window being yielded
    # The state grows with the open groups: more keys open, more elements saved.
    _, later = state_after(lambda: Dataset.range(300).group_by_window(lambda x: x % 50, reduce_func,
                                                                      window_size=9), 0)
    _, more = state_after(lambda: Dataset.range(300).group_by_window(lambda x: x % 50, reduce_func,
                                                                     window_size=9), 10)
    assert len(json.dumps(more)) > len(json.dumps(later))


# --- cache, in memory --------------------------------------------------------------------------------------

def test_memory_cache_resumes_in_both_passes_in_a_new_pipeline():
    def make():  # built again: its memory cache is empty, as in a new process
        return Dataset.range(150).map(lambda x: x * x).cache().repeat(2)

    assert_resumes(make, cuts=[0, 1, 63, 64, 65, 100, 149, 150, 151, 214, 250, 299, 300])


def test_memory_cache_resumes_in_the_process_that_holds_the_cache():
    ds = Dataset.range(150).map(lambda x: x * x).cache()
    full = [typed(x) for x in ds]
    assert assert_resumes(lambda: ds, cuts=[0, 1, 64, 149, 150]) == full
    _, state = state_after(lambda: ds, 70)
    assert position(state, "from") == {**position(state, "from"), "from": "memory", "index": 70}


def test_a_later_pass_restored_in_a_new_process_reads_little_again_and_the_next_pass_fills_the_cache():
    def make():
        return Dataset.range(1_000).map(_record_double).cache().repeat(3)

    CALLS.clear()
    full = [typed(x) for x in make()]
    assert len(CALLS) == 1_000  # filled once, read twice
    head, state = state_after(make, 1_000 + 700)  # in the second pass, reading the memory
    assert position(state, "from")["from"] == "memory" and len(json.dumps(state)) < 4096
    CALLS.clear()
    rest = resumed(make, state)
    assert head + rest == full
    # The rest of the second pass read from the input, from a mark shortly before 700 (not from 0); the third
    # pass filled the cache again, from the first pass's start.
    second, third = CALLS[:CALLS.index(0)], CALLS[CALLS.index(0):]
    assert second == list(range(second[0], 1_000)) and 700 - 1_024 <= second[0] <= 700
    assert third == list(range(1_000))


def test_memory_cache_of_a_shuffle_yields_the_same_order_after_a_restore_in_the_first_pass():
    # The cache freezes the shuffle's first order; a pass restored mid-way does not fill the cache, and the next
    # pass fills it from the first pass's saved start, so it repeats that order (not the shuffle's next one).
    assert_resumes(lambda: Dataset.range(50).shuffle(50, seed=7).cache().repeat(3), cuts=[0, 10, 49, 50, 70, 149])


def test_memory_cache_state_holds_positions_not_elements():
    def make():
        return Dataset.range(100_000).map(lambda x: np.full((64,), x)).cache().repeat(2)

    for cut in (50_000, 150_000):
        _, state = state_after(make, cut)
        assert len(json.dumps(state)) < 4096


def test_memory_cache_over_an_input_that_cannot_save_names_it():
    def gen():
        yield from range(5)

    ds = Dataset.from_generator(gen).cache()
    it = iter(ds)
    next(it)
    with pytest.raises(NotCheckpointableError, match="from_generator"):
        it.state_dict()
    assert [int(x) for x in it] == [1, 2, 3, 4]
    it = iter(ds)  # over the complete cache: a restore in a new process would need the input's position
    next(it)
    with pytest.raises(NotCheckpointableError, match="Dataset.cache"):
        it.state_dict()


# --- cache, in a file --------------------------------------------------------------------------------------

def test_file_cache_resumes_reading_the_completed_file(tmp_path):
    path = str(tmp_path / "cache")

    def make():
        return Dataset.range(40).map(_record_named).cache(path).repeat(2)

    full = [typed(x) for x in make()]
    CALLS.clear()
    assert assert_resumes(make, cuts=[0, 1, 20, 39, 40, 41, 79, 80]) == full
    assert CALLS == []  # every pass read the file, a restored one from its byte offset
    _, state = state_after(make, 45)
    assert position(state, "file")["file"] == "read" and position(state, "file")["offset"] > 0


def test_file_cache_resumes_writing_a_partial_file(tmp_path):
    path = str(tmp_path / "cache")

    def make():
        return Dataset.range(50).map(_record_named).cache(path)

    full = [typed(x) for x in make()]
    for cut in (0, 1, 25, 49, 50):
        os.unlink(path + ".data")
        head, state = state_after(make, cut)
        assert position(state)["file"] == "write"
        if cut:  # the state refers to the partial file: closing the iterator kept it
            assert os.path.exists(os.path.join(tmp_path, position(state)["partial"]))
        CALLS.clear()
        assert head + resumed(make, state) == full
        assert CALLS == list(range(cut, 50))  # the elements before the cut came from the partial file
        assert os.listdir(tmp_path) == ["cache.data"]  # completed; the partial file is gone
        CALLS.clear()
        assert [typed(x) for x in make()] == full and CALLS == []


def test_file_cache_partial_state_reads_the_input_on_when_the_file_was_completed_or_the_partial_is_gone(tmp_path):
    path = str(tmp_path / "cache")

    def make():
        return Dataset.range(30).map(lambda x: x + 1).cache(path)

    full = [typed(x) for x in make()]
    os.unlink(path + ".data")
    head, state = state_after(make, 12)
    assert [typed(x) for x in make()] == full  # another pass completes the file meanwhile
    assert head + resumed(make, state) == full
    os.unlink(path + ".data")
    for partial in glob.glob(path + ".data.tmp-*"):
        os.unlink(partial)
    head, state = state_after(make, 12)
    for partial in glob.glob(path + ".data.tmp-*"):
        os.unlink(partial)
    assert head + resumed(make, state) == full


def test_file_cache_read_state_of_a_changed_file_is_refused(tmp_path):
    path = str(tmp_path / "cache")
    list(Dataset.range(10).cache(path))
    _, state = state_after(lambda: Dataset.range(10).cache(path), 4)
    os.unlink(path + ".data")
    list(Dataset.range(20).cache(path))  # another pipeline wrote the file
    it = iter(Dataset.range(10).cache(path))
    with pytest.raises(ValueError, match="cache file"):
        it.load_state_dict(state)
        next(it)


def test_file_cache_under_repeat_resumes_across_the_completion(tmp_path):
    path = str(tmp_path / "cache")

    def make():
        return Dataset.range(30).map(lambda x: x * x).cache(path).repeat(2)

    full = [typed(x) for x in make()]
    for cut in (5, 29, 30, 31, 50):
        os.unlink(path + ".data")
        head, state = state_after(make, cut)
        assert head + resumed(make, state) == full, cut


# --- snapshot ----------------------------------------------------------------------------------------------

def _pairs(n: int = 2_000) -> Dataset:
    return Dataset.range(n).map(lambda x: (x, np.full((2,), x, np.float32)))


def test_snapshot_reading_resumes(tmp_path):
    def make():
        return _pairs().apply(snapshot(str(tmp_path / "snap")))

    full = [typed(x) for x in make()]  # writes it
    # Cuts around the read-ahead batches (256 elements) and the shards' turns.
    assert assert_resumes(make, cuts=[0, 1, 255, 256, 257, 511, 512, 1_000, 1_999, 2_000]) == full
    _, state = state_after(make, 1_000)
    assert position(state)["mode"] == "read" and len(json.dumps(state)) < 4096


def test_snapshot_reading_with_a_reader_func_and_shard_func_resumes(tmp_path):
    def make():
        return Dataset.range(600).enumerate().apply(snapshot(
            str(tmp_path / "snap"), shard_func=lambda i, x: i % 3,
            reader_func=lambda shards: shards.shuffle(3, seed=2).interleave(lambda s: s, cycle_length=2)))

    list(make())
    assert_resumes(make, cuts=[0, 1, 200, 599, 600])


def test_snapshot_writing_resumes_and_commits_every_element(tmp_path):
    path = str(tmp_path / "snap")

    def make():
        return _pairs().apply(snapshot(path))

    full = [typed(x) for x in make()]
    for cut in (0, 1, 700, 1_999, 2_000):
        shutil.rmtree(path)
        head, state = state_after(make, cut)
        saved = position(state)
        if cut:
            assert saved["mode"] == "write" and saved["count"] == cut
        assert head + resumed(make, state) == full, cut
        run = glob.glob(os.path.join(path, "*"))[0]
        assert os.path.isdir(os.path.join(run, COMMITTED_DIR))
        assert not os.path.exists(os.path.join(run, CHECKPOINTS_DIR))  # of no use once committed
        assert [typed(x) for x in make()] == full  # read from the snapshot the restored pass committed


def test_snapshot_written_in_two_runs_reads_as_one_written_at_once(tmp_path):
    def make(path):
        return Dataset.range(900).enumerate().apply(snapshot(
            path, shard_func=lambda i, x: (i * 7) % 4,
            reader_func=lambda shards: shards.interleave(lambda s: s, cycle_length=4)))

    once = str(tmp_path / "once")
    list(make(once))
    reference = [typed(x) for x in make(once)]
    twice = str(tmp_path / "twice")
    head, state = state_after(lambda: make(twice), 333)
    # A later state of the restored pass (a chunk more per shard), restored in turn.
    it = iter(make(twice))
    it.load_state_dict(state)
    middle = [typed(next(it)) for _ in range(300)]
    second = json.loads(json.dumps(it.state_dict()))
    it.close()
    rest = resumed(lambda: make(twice), second)
    assert len(head + middle + rest) == 900
    assert [typed(x) for x in make(twice)] == reference


def test_snapshot_writing_state_when_the_snapshot_was_committed_meanwhile(tmp_path):
    path = str(tmp_path / "snap")

    def make():
        return _pairs(500).apply(snapshot(path))

    full = [typed(x) for x in make()]
    shutil.rmtree(path)
    head, state = state_after(make, 100)
    assert [typed(x) for x in make()] == full  # another pass commits it
    assert head + resumed(make, state) == full  # the restored pass hands the input on


def test_snapshot_writing_state_whose_chunks_are_gone_is_refused(tmp_path):
    path = str(tmp_path / "snap")

    def make():
        return _pairs(500).apply(snapshot(path))

    _, state = state_after(make, 100)
    run = glob.glob(os.path.join(path, "*"))[0]
    shutil.rmtree(os.path.join(run, CHECKPOINTS_DIR))
    with pytest.raises(ValueError, match="chunks written before the state was taken are gone"):
        iter(make()).load_state_dict(state)


def _triple(x):
    return x * 3


def snapshot_pipeline(path: str) -> Dataset:
    """Built the same in this process and in the writer's (importable functions: the same fingerprints)."""
    return Dataset.range(2000).map(_triple).apply(snapshot(path))


_WRITER = textwrap.dedent("""
    import json, os, sys
    from tests.test_iterator_state_windows import snapshot_pipeline
    path, out, cut = sys.argv[1], sys.argv[2], int(sys.argv[3])
    it = iter(snapshot_pipeline(path))
    for _ in range(cut):
        next(it)
    with open(out, "w") as f:
        json.dump(it.state_dict(), f)
    os._exit(0)  # dies mid-write: no cleanup, its attempt is left to be swept
""")


def test_snapshot_writing_resumes_after_the_writer_process_died(tmp_path):
    path, out = str(tmp_path / "snap"), str(tmp_path / "state.json")
    result = subprocess.run([sys.executable, "-c", _WRITER, path, out, "1234"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    with open(out) as f:
        state = json.load(f)
    run = glob.glob(os.path.join(path, "*"))[0]
    assert os.listdir(os.path.join(run, "attempts"))  # the dead writer's attempt, unswept yet
    rest = resumed(lambda: snapshot_pipeline(path), state)
    assert [x[-1] for x in rest] == [3 * i for i in range(1234, 2000)]
    assert not os.listdir(os.path.join(run, "attempts"))  # swept by the restored writer, which committed
    assert [typed(x)[-1] for x in snapshot_pipeline(path)] == [3 * i for i in range(2000)]


# --- malformed states ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("make, change, match", [
    (lambda path: Dataset.range(20).window(4, 1), lambda p: {**p, "skip": "two"}, "'skip' must be int"),
    (lambda path: Dataset.range(20).window(4, 1), lambda p: {**p, "skip": 10**6}, "input ended before"),
    (lambda path: Dataset.range(20).group_by_window(lambda x: x % 3, lambda k, w: w, window_size=4),
     lambda p: {**p, "groups": [[0, 9]]}, "groups hold"),
    (lambda path: Dataset.range(20).group_by_window(lambda x: x % 3, lambda k, w: w, window_size=4),
     lambda p: {**p, "elements": "not base64!"}, "cannot be decoded"),
    (lambda path: Dataset.range(20).cache(), lambda p: {**p, "from": "disk"}, "'from' must be"),
    (lambda path: Dataset.range(20).cache(path), lambda p: {**p, "partial": "../../etc/passwd"},
     "not a temporary file of this cache"),
    (lambda path: Dataset.range(20).apply(snapshot(path)), lambda p: {**p, "mode": "copy"}, "'mode' must be"),
    (lambda path: Dataset.range(20).apply(snapshot(path)), lambda p: {**p, "shards": [[0, ["x"]]]},
     "each of 'shards'"),
], ids=["window-skip-type", "window-skip-past-the-end", "group-counts", "group-elements", "cache-from",
        "cache-partial-path", "snapshot-mode", "snapshot-shards"])
def test_a_malformed_state_is_a_value_error_naming_the_transformation(tmp_path, make, change, match):
    path = str(tmp_path / "x")
    _, state = state_after(lambda: make(path), 5)
    state["position"] = change(state["position"])
    with pytest.raises(ValueError, match=match) as info:
        iter(make(path)).load_state_dict(state)
    assert any(name in str(info.value) for name in ("Dataset.window", "group_by_window", "Dataset.cache",
                                                    "snapshot(")), str(info.value)
