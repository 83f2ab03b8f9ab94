"""cardinality() of every source and transformation, as tf.data computes it.

tf.data's rules (its kernels' CardinalityInternal): a known count propagates
through element-wise transformations; filter, take_while, unique, interleave,
flat_map and from_generator are unknown whatever their input; repeat() of any
non-empty input is infinite, even of an unknown one; skip and batch keep an
infinite or unknown input's value. unbatch multiplies a known count by the batch
size its input's element_spec gives (from_tensors of a known shape, batch with
drop_remainder=True), and is unknown when the spec has none. take(n) with any
negative n takes every element, but reports tf.data's min(count, n) (n of an
infinite input): a negative number that is no count.
"""

import numpy as np
import pytest

from dataservice import INFINITE_CARDINALITY as INF
from dataservice import UNKNOWN_CARDINALITY as UNK
from dataservice import Dataset, Options

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc


def finite():
    return Dataset.range(10)


def infinite():
    return Dataset.range(10).repeat()


def unknown():
    return Dataset.range(10).filter(lambda x: x % 2 == 0)


def test_constants():
    assert INF == -1 and UNK == -2


def test_documented_example():
    ds = Dataset.range(42)
    assert ds.cardinality() == 42
    ds = ds.repeat()
    assert ds.cardinality() == INF
    ds = ds.filter(lambda x: True)
    assert ds.cardinality() == UNK


def test_sources(tmp_path):
    for i in range(3):
        (tmp_path / f"{i}.txt").write_text("")
    assert Dataset.range(10).cardinality() == 10
    assert Dataset.range(2, 11, 3).cardinality() == 3
    assert Dataset.range(5, 1).cardinality() == 0
    assert Dataset.from_tensor_slices(np.zeros((7, 2))).cardinality() == 7
    assert Dataset.from_tensor_slices({"a": [1, 2], "b": [3, 4]}).cardinality() == 2
    assert Dataset.from_tensors([1, 2, 3]).cardinality() == 1
    assert Dataset.from_generator(lambda: iter([1, 2])).cardinality() == UNK
    assert Dataset.list_files(str(tmp_path / "*.txt")).cardinality() == 3
    assert Dataset.list_files(str(tmp_path / "*.txt"), shuffle=True, seed=1).cardinality() == 3


# (transformation, cardinality over finite range(10), over infinite, over unknown)
CASES = [
    ("map", lambda ds: ds.map(lambda x: x), 10, INF, UNK),
    ("map_parallel", lambda ds: ds.map(lambda x: x, num_parallel_calls=2), 10, INF, UNK),
    ("filter", lambda ds: ds.filter(lambda x: True), UNK, UNK, UNK),
    ("batch", lambda ds: ds.batch(3), 4, INF, UNK),
    ("batch_drop", lambda ds: ds.batch(3, drop_remainder=True), 3, INF, UNK),
    ("batch_exact", lambda ds: ds.batch(5), 2, INF, UNK),
    ("padded_batch", lambda ds: ds.padded_batch(4), 3, INF, UNK),
    ("padded_batch_drop", lambda ds: ds.padded_batch(4, drop_remainder=True), 2, INF, UNK),
    ("unbatch", lambda ds: ds.batch(2).unbatch(), UNK, INF, UNK),
    ("unbatch_drop_remainder", lambda ds: ds.batch(2, drop_remainder=True).unbatch(), 10, INF, UNK),
    ("unbatch_drop_remainder_3", lambda ds: ds.batch(3, drop_remainder=True).unbatch(), 9, INF, UNK),
    ("shuffle", lambda ds: ds.shuffle(4, seed=1), 10, INF, UNK),
    ("repeat_3", lambda ds: ds.repeat(3), 30, INF, UNK),
    ("repeat_0", lambda ds: ds.repeat(0), 0, 0, 0),
    ("repeat_forever", lambda ds: ds.repeat(), INF, INF, INF),
    ("take_3", lambda ds: ds.take(3), 3, 3, UNK),
    ("take_20", lambda ds: ds.take(20), 10, 20, UNK),
    ("take_all", lambda ds: ds.take(-1), 10, INF, UNK),
    ("take_negative", lambda ds: ds.take(-5), -5, -5, UNK),
    ("skip_3", lambda ds: ds.skip(3), 7, INF, UNK),
    ("skip_20", lambda ds: ds.skip(20), 0, INF, UNK),
    ("skip_all", lambda ds: ds.skip(-1), 0, INF, UNK),
    ("skip_negative", lambda ds: ds.skip(-4), 0, INF, UNK),
    ("repeat_negative", lambda ds: ds.repeat(-3), INF, INF, INF),
    ("take_while", lambda ds: ds.take_while(lambda x: True), UNK, UNK, UNK),
    ("shard_3_0", lambda ds: ds.shard(3, 0), 4, INF, UNK),
    ("shard_3_2", lambda ds: ds.shard(3, 2), 3, INF, UNK),
    ("enumerate", lambda ds: ds.enumerate(), 10, INF, UNK),
    ("flat_map", lambda ds: ds.flat_map(lambda x: Dataset.from_tensors(x)), UNK, UNK, UNK),
    ("interleave", lambda ds: ds.interleave(lambda x: Dataset.from_tensors(x), cycle_length=2), UNK, UNK, UNK),
    ("prefetch", lambda ds: ds.prefetch(2), 10, INF, UNK),
    ("prefetch_0", lambda ds: ds.prefetch(0), 10, INF, UNK),
    ("cache", lambda ds: ds.cache(), 10, INF, UNK),
    ("unique", lambda ds: ds.unique(), UNK, UNK, UNK),
    ("apply", lambda ds: ds.apply(lambda d: d.take(4)), 4, 4, UNK),
    ("with_options", lambda ds: ds.with_options(Options()), 10, INF, UNK),
    ("concatenate_finite", lambda ds: ds.concatenate(Dataset.range(5)), 15, INF, UNK),
    ("concatenate_unknown", lambda ds: ds.concatenate(unknown()), UNK, INF, UNK),
    ("concatenate_infinite", lambda ds: ds.concatenate(infinite()), INF, INF, INF),
    ("zip_finite", lambda ds: Dataset.zip((ds, Dataset.range(4))), 4, 4, UNK),
    ("zip_infinite", lambda ds: Dataset.zip((ds, infinite())), 10, INF, UNK),
    ("zip_unknown", lambda ds: Dataset.zip((infinite(), ds, unknown())), UNK, UNK, UNK),
]


@pytest.mark.parametrize("name, transform, over_finite, over_infinite, over_unknown", CASES,
                         ids=[c[0] for c in CASES])
def test_transformation_cardinality(name, transform, over_finite, over_infinite, over_unknown):
    assert transform(finite()).cardinality() == over_finite
    assert transform(infinite()).cardinality() == over_infinite
    assert transform(unknown()).cardinality() == over_unknown


@pytest.mark.parametrize("name, transform, over_finite", [(c[0], c[1], c[2]) for c in CASES if c[2] >= 0],
                         ids=[c[0] for c in CASES if c[2] >= 0])
def test_known_cardinality_matches_iteration(name, transform, over_finite):
    ds = transform(finite())
    assert len(list(ds)) == over_finite == len(ds)


def test_take_of_a_negative_count_takes_all_and_reports_tf_cardinality():
    # tf.data (take_dataset_op.cc): min(input's, n); n over an infinite input; unknown stays unknown.
    ds = Dataset.range(10).take(-5)
    assert ds.cardinality() == -5
    assert [int(x) for x in ds] == list(range(10))
    # tf.data's __len__ makes list(ds) raise ValueError here; ours says TypeError, so list() iterates.
    assert len(list(ds)) == 10
    with pytest.raises(TypeError, match=r"cardinality is -5.*take\(-5\)"):
        len(ds)
    assert [int(x) for x in Dataset.range(3).repeat().take(-7).take(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert Dataset.range(3).repeat().take(-7).cardinality() == -7
    assert Dataset.range(10).take(-1).cardinality() == 10


def test_repeat_of_empty_input_is_empty():
    assert Dataset.range(0).repeat().cardinality() == 0
    assert Dataset.range(0).repeat(5).cardinality() == 0
    assert list(Dataset.range(0).repeat()) == []


def test_batch_cardinality_with_remainder():
    for n in range(0, 12):
        for size in (1, 3, 4):
            for drop in (False, True):
                ds = Dataset.range(n).batch(size, drop_remainder=drop)
                assert ds.cardinality() == len(list(ds)), (n, size, drop)


def test_shard_cardinality_matches_iteration():
    for n in range(0, 12):
        for shards in (1, 2, 3, 5):
            for index in range(shards):
                ds = Dataset.range(n).shard(shards, index)
                assert ds.cardinality() == len(list(ds)), (n, shards, index)


def test_unbatch_cardinality_from_the_static_batch_size():
    assert Dataset.from_tensors(np.arange(6).reshape(3, 2)).unbatch().cardinality() == 3
    assert Dataset.from_tensors(np.zeros((3, 2))).repeat(2).unbatch().cardinality() == 6
    both = Dataset.zip((Dataset.from_tensors(np.zeros((3, 2))), Dataset.range(3).batch(3)))
    assert both.unbatch().cardinality() == 3  # one component's size is enough
    assert Dataset.from_tensors(np.zeros((0, 2))).unbatch().cardinality() == UNK  # as tf.data
    # A spec that needs an element (map without output_signature) gives no batch size; nothing runs.
    calls = []
    lazy = Dataset.range(6).batch(2, drop_remainder=True).map(lambda b: calls.append(b) or b).unbatch()
    assert lazy.cardinality() == UNK and calls == []
