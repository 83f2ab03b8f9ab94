"""Splits: a splittable source enumerates coarse, ordered splits, and a whole pipeline
can run over any subset of them (what distributed_epoch builds on)."""

import numpy as np
import pytest

from dataservice import Dataset
from tests.elements import values
from dataservice.data import sources
from dataservice.errors import NotSplittableError

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc




def all_splits(ds):
    return values(ds.iterate_splits(range(ds.num_splits())))


# --- sources -----------------------------------------------------------------------

def test_range_splits_are_contiguous_chunks():
    src = Dataset.range(10_000)
    n = src.num_source_splits()
    assert 1 < n < 10_000  # coarse: far fewer splits than elements
    chunks = [values(src.read_split(i)) for i in range(n)]
    assert all(len(c) > 1 for c in chunks)
    assert all(c == list(range(c[0], c[0] + len(c))) for c in chunks)  # each a contiguous run
    assert [x for c in chunks for x in c] == list(range(10_000))  # in order, each element once
    assert max(len(c) for c in chunks) <= sources.MAX_SPLIT_ELEMENTS
    assert all(type(x) is np.int64 for x in src.read_split(0))


def test_large_range_splits_are_capped_at_max_split_elements():
    src = Dataset.range(10 * sources.MAX_SPLIT_ELEMENTS * sources.TARGET_SPLITS)
    first = values(src.read_split(0))
    assert first == list(range(sources.MAX_SPLIT_ELEMENTS))
    last = src.num_source_splits() - 1
    assert values(src.read_split(last))[-1] == src.cardinality() - 1


def test_range_with_step_splits():
    src = Dataset.range(3, 1000, 7)
    chunks = [values(src.read_split(i)) for i in range(src.num_source_splits())]
    assert [x for c in chunks for x in c] == list(range(3, 1000, 7))
    neg = Dataset.range(1000, 0, -3)
    assert all_splits(neg) == list(range(1000, 0, -3))


def test_split_count_is_bounded():
    # Aiming at a bounded number of splits keeps a dispatcher from being the bottleneck.
    assert Dataset.range(10_000).num_source_splits() <= sources.TARGET_SPLITS
    assert Dataset.from_tensor_slices(np.zeros(10_000)).num_source_splits() <= sources.TARGET_SPLITS


def test_small_and_empty_sources():
    small = Dataset.range(10)
    assert 1 <= small.num_source_splits() <= 10
    assert all_splits(small) == list(range(10))
    assert Dataset.range(0).num_source_splits() == 0
    assert all_splits(Dataset.range(0).map(lambda x: x)) == []


def test_from_tensor_slices_splits():
    data = {"x": np.arange(1000).reshape(500, 2), "y": [str(i) for i in range(500)]}
    src = Dataset.from_tensor_slices(data)
    assert src.is_splittable()
    n = src.num_source_splits()
    assert 1 < n < 500
    parts = [values(src.read_split(i)) for i in range(n)]
    assert [x for p in parts for x in p] == values(src)
    assert parts[1][0] == {"x": [2 * len(parts[0]), 2 * len(parts[0]) + 1], "y": str(len(parts[0]))}


def test_list_files_one_split_per_file(tmp_path):
    for name in ("b", "a", "c"):
        (tmp_path / name).write_text(name)
    src = Dataset.list_files(str(tmp_path / "*"))
    assert src.num_source_splits() == 3
    assert [list(src.read_split(i)) for i in range(3)] == [[str(tmp_path / n)] for n in ("a", "b", "c")]
    assert src.is_splittable()


# --- whole pipelines ------------------------------------------------------------------

PIPELINES = {
    "range": lambda: Dataset.range(10_000),
    "map_filter_batch": lambda: Dataset.range(10_000).map(lambda x: x * 3).filter(lambda x: x % 2 == 0).batch(7),
    "slices_enumerate": lambda: Dataset.from_tensor_slices((np.arange(3000), np.arange(3000) * 2)).map(
        lambda a, b: a + b).enumerate(),
    "flat_map": lambda: Dataset.range(500).flat_map(lambda x: Dataset.range(x % 4)),
    "interleave": lambda: Dataset.range(700).interleave(lambda x: Dataset.from_tensors(x).repeat(2),
                                                        cycle_length=1, block_length=2),
    "parallel_map_prefetch": lambda: Dataset.range(5000).map(lambda x: -x, num_parallel_calls=3).prefetch(4),
    "take_while": lambda: Dataset.range(3000).take_while(lambda x: x < 10_000),
    "repeat": lambda: Dataset.range(2500).repeat(3),
    "cache": lambda: Dataset.range(2000).map(lambda x: x + 1).cache(),
    "unbatch": lambda: Dataset.from_tensor_slices(np.arange(4000).reshape(1000, 4)).unbatch(),
}


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_iterate_all_splits_equals_full_iteration(name):
    ds = PIPELINES[name]()
    assert ds.is_splittable()
    assert ds.num_splits() > 1
    assert all_splits(ds) == values(ds)


def test_subsets_of_splits_partition_the_data():
    ds = Dataset.range(10_000).map(lambda x: x + 1)
    n = ds.num_splits()
    even = values(ds.iterate_splits(range(0, n, 2)))
    odd = values(ds.iterate_splits(range(1, n, 2)))
    assert even and odd
    assert sorted(even + odd) == list(range(1, 10_001))
    assert not set(even) & set(odd)


def test_splits_run_in_the_order_given():
    src = Dataset.range(10_000)
    n = src.num_splits()
    order = [n - 1, 0, n // 2]
    expected = [x for i in order for x in values(src.read_split(i))]
    assert values(src.map(lambda x: x).iterate_splits(order)) == expected
    assert values(src.iterate_splits([])) == []


def test_repeat_multiplies_num_splits():
    src = Dataset.range(10_000)
    n = src.num_splits()
    assert src.repeat(3).num_splits() == 3 * n
    assert src.map(lambda x: x).repeat(2).repeat(3).num_splits() == 6 * n
    assert src.repeat(0).num_splits() == 0
    assert src.repeat().num_splits() == -1
    assert Dataset.range(0).repeat().num_splits() == 0
    # Under repeat a split index numbers the splits of every epoch.
    assert values(src.repeat(2).iterate_splits([n])) == values(src.read_split(0))


def test_splits_are_shared_by_the_source_not_the_transformations():
    # take/skip/shard apply to the stream of the splits given, as tf.data's split providers do.
    ds = Dataset.range(10_000).take(5)
    n = ds.num_splits()
    assert values(ds.iterate_splits([n - 1])) == values(Dataset.range(10_000).iterate_splits([n - 1]))[:5]


@pytest.mark.parametrize("make", [
    lambda: Dataset.from_generator(lambda: iter([1, 2, 3])),
    lambda: Dataset.from_generator(lambda: iter([1, 2, 3])).map(lambda x: x).batch(2),
    lambda: Dataset.from_tensors([1, 2, 3]),
    # zip and concatenate are splittable when all their inputs are (tests/test_tf_semantics.py), not otherwise.
    lambda: Dataset.zip((Dataset.range(3), Dataset.from_generator(lambda: iter([1, 2, 3])))),
    lambda: Dataset.range(3).concatenate(Dataset.from_tensors([1, 2, 3])),
], ids=["from_generator", "generator_pipeline", "from_tensors", "zip", "concatenate"])
def test_not_splittable(make):
    ds = make()
    assert not ds.is_splittable()
    with pytest.raises(NotSplittableError, match="not splittable"):
        ds.num_splits()
    with pytest.raises(NotSplittableError, match="not splittable"):
        ds.iterate_splits([0])
    assert isinstance(NotSplittableError("x"), ValueError)


def test_not_splittable_error_names_the_generator():
    def my_records():
        yield 1

    with pytest.raises(NotSplittableError, match="my_records"):
        Dataset.from_generator(my_records).map(lambda x: x).num_splits()
