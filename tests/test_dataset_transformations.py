"""Transformations, checked against tf.data's documented semantics and examples."""

import collections
import threading

import numpy as np
import pytest

import dataservice
from dataservice import Dataset
from tests.elements import values

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc


# --- map ----------------------------------------------------------------------------

def test_map():
    assert values(Dataset.range(1, 6).map(lambda x: x + 1)) == [2, 3, 4, 5, 6]


def test_map_unpacks_tuple_elements_into_arguments():
    ds = Dataset.from_generator(lambda: [(1, "foo"), (2, "bar"), (3, "baz")])
    assert values(ds.map(lambda x_int, y_str: x_int)) == [1, 2, 3]
    zipped = Dataset.zip((Dataset.range(3), Dataset.range(3, 6)))
    assert values(zipped.map(lambda a, b: a * b)) == [0, 4, 10]


def test_map_passes_dicts_and_namedtuples_whole():
    ds = Dataset.from_generator(lambda: [{"a": 1, "b": "foo"}, {"a": 2, "b": "bar"}])
    assert values(ds.map(lambda d: str(d["a"]) + d["b"])) == ["1foo", "2bar"]
    # tf.data unpacks only plain tuples, not namedtuples.
    Point = collections.namedtuple("Point", "x y")
    points = Dataset.from_generator(lambda: [Point(1, 2), Point(3, 4)])
    assert values(points.map(lambda p: p.x + p.y)) == [3, 7]


def test_map_output_structure_and_normalization():
    out = list(Dataset.range(2).map(lambda x: ((37.0, [42, 16]), "foo", {"k": int(x)})))
    (pair, s, d) = out[1]
    assert type(pair[0]) is np.float64
    assert isinstance(pair[1], np.ndarray) and pair[1].tolist() == [42, 16]
    assert s == "foo"
    assert type(d["k"]) is np.int64 and d["k"] == 1


def test_map_returns_tuple_then_next_map_unpacks_it():
    ds = Dataset.range(3).map(lambda x: (x, x * 10)).map(lambda a, b: a + b)
    assert values(ds) == [0, 11, 22]


def test_map_requires_callable():
    # ValueError, as tf.data ("Argument `func` must be a callable").
    with pytest.raises(ValueError, match="map_func"):
        Dataset.range(3).map(3)


# --- filter -------------------------------------------------------------------------

def test_filter():
    ds = Dataset.from_tensor_slices([1, 2, 3])
    assert values(ds.filter(lambda x: x < 3)) == [1, 2]
    assert values(ds.filter(lambda x: x < 3).filter(lambda x: x == 1)) == [1]
    assert values(ds.filter(lambda x: False)) == []
    pairs = Dataset.zip((Dataset.range(6), Dataset.range(6).map(lambda x: x % 3)))
    assert values(pairs.filter(lambda i, m: m == 0)) == [(0, 0), (3, 0)]


def test_apply():
    def dataset_fn(ds):
        return ds.filter(lambda x: x < 5)

    assert values(Dataset.range(100).apply(dataset_fn)) == [0, 1, 2, 3, 4]
    with pytest.raises(TypeError, match="Dataset"):
        Dataset.range(3).apply(lambda ds: [1, 2])


# --- batch, padded_batch, unbatch ------------------------------------------------------

def test_batch_remainder():
    assert values(Dataset.range(8).batch(3)) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert values(Dataset.range(8).batch(3, drop_remainder=True)) == [[0, 1, 2], [3, 4, 5]]
    assert values(Dataset.range(6).batch(3, drop_remainder=True)) == [[0, 1, 2], [3, 4, 5]]
    assert values(Dataset.range(2).batch(3, drop_remainder=True)) == []
    assert values(Dataset.range(0).batch(3)) == []


def test_batch_stacks_numpy_leaves():
    batches = list(Dataset.range(5).batch(2))
    assert all(isinstance(b, np.ndarray) and b.dtype == np.int64 for b in batches)
    rows = list(Dataset.from_tensor_slices(np.arange(12).reshape(6, 2)).batch(4))
    assert rows[0].shape == (4, 2) and rows[1].shape == (2, 2)
    assert rows[1].tolist() == [[8, 9], [10, 11]]


def test_batch_keeps_nested_structure():
    ds = Dataset.from_tensor_slices({"x": np.arange(6).reshape(3, 2), "y": (["a", "b", "c"], [1.0, 2.0, 3.0])})
    first = next(iter(ds.batch(2)))
    assert type(first) is dict and type(first["y"]) is tuple
    assert first["x"].shape == (2, 2)
    assert first["y"][0].tolist() == ["a", "b"]
    assert first["y"][1].dtype == np.float64 and first["y"][1].tolist() == [1.0, 2.0]


def test_batch_of_different_shapes_is_an_error():
    ds = Dataset.from_generator(lambda: [np.zeros(2), np.zeros(3)])
    with pytest.raises(ValueError, match="different shapes"):
        list(ds.batch(2))


def test_padded_batch_to_batch_maximum_and_fixed_size():
    a = Dataset.range(1, 5).map(lambda x: np.full([x], x))
    assert values(a.padded_batch(2)) == [[[1, 0], [2, 2]], [[3, 3, 3, 0], [4, 4, 4, 4]]]
    assert values(a.padded_batch(2, padded_shapes=5)) == [
        [[1, 0, 0, 0, 0], [2, 2, 0, 0, 0]], [[3, 3, 3, 0, 0], [4, 4, 4, 4, 0]]]
    assert values(a.padded_batch(2, padded_shapes=5, padding_values=-1)) == [
        [[1, -1, -1, -1, -1], [2, 2, -1, -1, -1]], [[3, 3, 3, -1, -1], [4, 4, 4, 4, -1]]]
    assert values(a.padded_batch(3, drop_remainder=True)) == [[[1, 0, 0], [2, 2, 0], [3, 3, 3]]]


def test_padded_batch_nested_components():
    elements = [([1, 2, 3], [10]), ([4, 5], [11, 12])]
    ds = Dataset.from_generator(lambda: iter(elements))
    expected = [([[1, 2, 3, -1], [4, 5, -1, -1]], [[10, 100], [11, 12]])]
    assert values(ds.padded_batch(2, padded_shapes=([4], [None]), padding_values=(-1, 100))) == expected
    # A component's shape may be given as a tuple too.
    assert values(ds.padded_batch(2, padded_shapes=((4,), (None,)), padding_values=(-1, 100))) == expected
    # One padding value for every component.
    a = Dataset.range(1, 3).map(lambda x: np.full([x], x))
    assert values(Dataset.zip((a, a)).padded_batch(2, padding_values=-1)) == [
        ([[1, -1], [2, 2]], [[1, -1], [2, 2]])]


def test_padded_batch_rank_2_component_shapes_in_a_tuple():
    ds = Dataset.from_generator(lambda: [(np.ones((1, 2)), 0), (np.ones((2, 1)), 1)])
    (x, label), = list(ds.padded_batch(2, padded_shapes=((3, None), ())))
    assert x.shape == (2, 3, 2)
    assert x[0].tolist() == [[1, 1], [0, 0], [0, 0]]
    assert label.tolist() == [0, 1]


def test_padded_batch_strings_are_not_truncated():
    ds = Dataset.from_generator(lambda: [("a", [1]), ("hello", [1, 2])])
    (words, ids), = list(ds.padded_batch(2))
    assert words.tolist() == ["a", "hello"]
    assert ids.tolist() == [[1, 0], [1, 2]]
    # Padding string components uses the empty string.
    tokens = Dataset.from_generator(lambda: [["a"], ["bb", "c"]])
    assert values(tokens.padded_batch(2)) == [[["a", ""], ["bb", "c"]]]


def test_padded_batch_too_small_shape_is_an_error():
    ds = Dataset.from_generator(lambda: [[1, 2, 3]])
    with pytest.raises(ValueError, match="larger than the padded shape"):
        list(ds.padded_batch(1, padded_shapes=[2]))


def test_unbatch():
    elements = [[1, 2, 3], [1, 2], [1, 2, 3, 4]]
    ds = Dataset.from_generator(lambda: elements).unbatch()
    assert values(ds) == [1, 2, 3, 1, 2, 1, 2, 3, 4]
    assert all(type(x) is np.int64 for x in ds)


def test_unbatch_inverts_batch_with_structure():
    ds = Dataset.from_tensor_slices({"x": np.arange(10).reshape(5, 2), "y": ["a", "b", "c", "d", "e"]})
    assert values(ds.batch(2).unbatch()) == values(ds)


def test_unbatch_of_scalars_is_an_error():
    with pytest.raises(ValueError, match="unbatch"):
        Dataset.range(3).unbatch()  # at construction, as tf.data
    lazy = Dataset.range(3).map(lambda x: x).unbatch()  # the spec needs an element: refused when iterated
    with pytest.raises(ValueError, match="unbatch"):
        list(lazy)


def test_unbatch_of_different_batch_sizes_is_refused_at_construction():
    with pytest.raises(ValueError, match="leading dimensions differ"):
        Dataset.zip((Dataset.from_tensors(np.zeros((3, 2))), Dataset.from_tensors(np.zeros(4)))).unbatch()


# --- shuffle ---------------------------------------------------------------------------

def test_shuffle_is_a_permutation_and_seeded_order_is_reproducible():
    first = values(Dataset.range(100).shuffle(100, seed=42))
    assert sorted(first) == list(range(100))
    assert first != list(range(100))
    assert values(Dataset.range(100).shuffle(100, seed=42)) == first
    assert values(Dataset.range(100).shuffle(100, seed=43)) != first


def test_shuffle_reshuffles_each_iteration_by_default():
    ds = Dataset.range(50).shuffle(50, seed=1)
    epochs = [values(ds) for _ in range(3)]
    assert all(sorted(e) == list(range(50)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3
    # The sequence of epochs is reproducible with the seed.
    again = Dataset.range(50).shuffle(50, seed=1)
    assert [values(again) for _ in range(3)] == epochs


def test_shuffle_without_reshuffling_repeats_its_order():
    ds = Dataset.range(50).shuffle(50, seed=1, reshuffle_each_iteration=False)
    assert values(ds) == values(ds)
    unseeded = Dataset.range(50).shuffle(50, reshuffle_each_iteration=False)
    assert values(unseeded) == values(unseeded)


def test_repeat_after_shuffle_reshuffles_each_epoch():
    ds = Dataset.range(20).shuffle(20, seed=5).repeat(3)
    out = values(ds)
    epochs = [out[i * 20:(i + 1) * 20] for i in range(3)]
    assert all(sorted(e) == list(range(20)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3

    fixed = values(Dataset.range(20).shuffle(20, seed=5, reshuffle_each_iteration=False).repeat(3))
    assert fixed[:20] == fixed[20:40] == fixed[40:]
    assert sorted(fixed[:20]) == list(range(20))


def test_shuffle_buffer_bounds_displacement():
    # An element can only be emitted once it has entered the buffer.
    out = values(Dataset.range(100).shuffle(10, seed=3))
    assert sorted(out) == list(range(100))
    assert all(x <= i + 9 for i, x in enumerate(out))
    assert values(Dataset.range(10).shuffle(1, seed=3)) == list(range(10))


def test_shuffle_and_repeat():
    ds = Dataset.range(10).apply(dataservice.shuffle_and_repeat(10, count=3, seed=2))
    out = values(ds)
    epochs = [out[i * 10:(i + 1) * 10] for i in range(3)]
    assert all(sorted(e) == list(range(10)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3
    forever = Dataset.range(4).apply(dataservice.shuffle_and_repeat(4, seed=2))
    assert sorted(values(forever.take(12))) == sorted(list(range(4)) * 3)


# --- repeat, take, skip, take_while, shard, enumerate --------------------------------

def test_repeat():
    ds = Dataset.from_tensor_slices([1, 2, 3])
    assert values(ds.repeat(3)) == [1, 2, 3] * 3
    assert values(ds.repeat(0)) == []
    assert values(ds.repeat(1)) == [1, 2, 3]
    assert values(ds.repeat().take(7)) == [1, 2, 3, 1, 2, 3, 1]
    assert values(ds.repeat(-1).take(4)) == [1, 2, 3, 1]
    # Repeating an empty dataset forever ends instead of spinning.
    assert values(Dataset.range(0).repeat()) == []


def test_repeat_reruns_the_input():
    calls = []

    def gen():
        calls.append(1)
        yield from range(2)

    assert values(Dataset.from_generator(gen).repeat(3)) == [0, 1] * 3
    assert len(calls) == 3


def test_take_and_skip():
    assert values(Dataset.range(10).take(3)) == [0, 1, 2]
    assert values(Dataset.range(10).take(0)) == []
    assert values(Dataset.range(10).take(-1)) == list(range(10))
    assert values(Dataset.range(3).take(10)) == [0, 1, 2]
    assert values(Dataset.range(10).skip(7)) == [7, 8, 9]
    assert values(Dataset.range(10).skip(0)) == list(range(10))
    assert values(Dataset.range(10).skip(20)) == []
    assert values(Dataset.range(10).skip(-1)) == []
    assert values(Dataset.range(10).skip(2).take(3)) == [2, 3, 4]


def test_take_stops_pulling_from_its_input():
    pulled = []

    def gen():
        for i in range(100):
            pulled.append(i)
            yield i

    assert values(Dataset.from_generator(gen).take(3)) == [0, 1, 2]
    assert pulled == [0, 1, 2]


def test_take_while():
    assert values(Dataset.range(10).take_while(lambda x: x < 5)) == [0, 1, 2, 3, 4]
    assert values(Dataset.range(10).take_while(lambda x: True)) == list(range(10))
    assert values(Dataset.range(10).take_while(lambda x: False)) == []
    # It stops at the first failing element, unlike filter.
    ds = Dataset.from_tensor_slices([1, 2, 5, 1, 2])
    assert values(ds.take_while(lambda x: x < 3)) == [1, 2]
    pairs = Dataset.zip((Dataset.range(5), Dataset.range(5)))
    assert values(pairs.take_while(lambda a, b: a + b < 4)) == [(0, 0), (1, 1)]
    # It ends an infinite input.
    assert values(Dataset.range(3).repeat().take_while(lambda x: x < 2)) == [0, 1]


def test_shard():
    a = Dataset.range(10)
    assert values(a.shard(num_shards=3, index=0)) == [0, 3, 6, 9]
    assert values(a.shard(num_shards=3, index=1)) == [1, 4, 7]
    assert values(a.shard(num_shards=3, index=2)) == [2, 5, 8]
    assert values(a.shard(1, 0)) == list(range(10))


def test_enumerate():
    ds = Dataset.from_tensor_slices([1, 2, 3]).enumerate(start=5)
    assert values(ds) == [(5, 1), (6, 2), (7, 3)]
    assert all(type(i) is np.int64 for i, _ in ds)
    nested = list(Dataset.from_tensor_slices(np.array([(7, 8), (9, 10)])).enumerate())
    assert values(nested) == [(0, [7, 8]), (1, [9, 10])]
    # Each iteration counts from the start again.
    ds = Dataset.range(2).enumerate()
    assert values(ds) == values(ds) == [(0, 0), (1, 1)]


# --- flat_map, interleave ------------------------------------------------------------

def test_flat_map():
    ds = Dataset.from_tensor_slices([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    assert values(ds.flat_map(lambda x: Dataset.from_tensor_slices(x))) == list(range(1, 10))
    ragged = Dataset.range(4).flat_map(lambda x: Dataset.range(x))
    assert values(ragged) == [0, 0, 1, 0, 1, 2]


def test_flat_map_requires_a_dataset():
    with pytest.raises(TypeError, match="must return a Dataset"):
        list(Dataset.range(3).flat_map(lambda x: [x]))


INTERLEAVE_DOC_EXPECTED = [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 3, 3, 4, 4,
                           5, 5, 5, 5, 5, 5]


def test_interleave_cycle_and_block_order_documented_example():
    ds = Dataset.range(1, 6).interleave(lambda x: Dataset.from_tensors(x).repeat(6),
                                       cycle_length=2, block_length=4)
    assert values(ds) == INTERLEAVE_DOC_EXPECTED


def test_interleave_block_length_defaults_to_one():
    ds = Dataset.range(3).interleave(lambda x: Dataset.from_tensors(x).repeat(2), cycle_length=3)
    assert values(ds) == [0, 1, 2, 0, 1, 2]


def test_interleave_refills_a_slot_from_the_input_when_an_element_ends():
    # As tf.data's InterleaveDataset: slot 0's element (1 -> [10]) is found exhausted on
    # its next turn, which moves on to slot 1; the turn after that opens input 2 in slot 0.
    ds = Dataset.from_tensor_slices([1, 3, 2]).interleave(
        lambda n: Dataset.range(n).map(lambda i: n * 10 + i), cycle_length=2, block_length=1)
    assert values(ds) == [10, 30, 31, 20, 32, 21]


def test_interleave_cycle_length_one_is_flat_map():
    fn = lambda x: Dataset.range(x)  # noqa: E731
    assert values(Dataset.range(5).interleave(fn, cycle_length=1, block_length=3)) == \
        values(Dataset.range(5).flat_map(fn))


def test_interleave_with_empty_inner_datasets():
    ds = Dataset.range(6).interleave(lambda x: Dataset.range(x % 2 * 2), cycle_length=2)
    assert values(ds) == [0, 1, 0, 1, 0, 1]


def test_interleave_rejects_bad_lengths():
    fn = lambda x: Dataset.from_tensors(x)  # noqa: E731
    with pytest.raises(dataservice.errors.InvalidArgumentError, match="cycle_length"):
        Dataset.range(3).interleave(fn, cycle_length=0)
    with pytest.raises(dataservice.errors.InvalidArgumentError, match="block_length"):
        Dataset.range(3).interleave(fn, cycle_length=2, block_length=0)


# --- prefetch ------------------------------------------------------------------------

def test_prefetch():
    assert values(Dataset.range(3).prefetch(2)) == [0, 1, 2]
    assert values(Dataset.range(100).map(lambda x: x * 2).prefetch(dataservice.AUTOTUNE)) == \
        [2 * i for i in range(100)]
    assert values(Dataset.range(0).prefetch(1)) == []


def test_prefetch_zero_reads_on_the_consumer_thread():
    # As tf.data, prefetch(0) prefetches nothing: no thread, the input's iterator itself.
    before = set(threading.enumerate())
    it = iter(Dataset.range(10 ** 9).prefetch(0))
    assert next(it) == 0
    assert not [t for t in threading.enumerate() if t not in before and t.name == "dataservice-prefetch"]
    assert values(Dataset.range(3).prefetch(0)) == [0, 1, 2]


def test_prefetch_stops_its_thread_when_abandoned():
    before = set(threading.enumerate())
    it = iter(Dataset.range(10 ** 9).prefetch(4))
    assert next(it) == 0
    started = [t for t in threading.enumerate() if t not in before and t.name == "dataservice-prefetch"]
    assert len(started) == 1
    it.close()
    started[0].join(timeout=10)
    assert not started[0].is_alive()


# --- unique ----------------------------------------------------------------------------

def test_unique():
    ds = Dataset.from_tensor_slices([1, 37, 2, 37, 2, 1])
    assert values(ds.unique()) == [1, 37, 2]
    words = Dataset.from_tensor_slices(["b", "a", "b", "c", "a"])
    assert values(words.unique()) == ["b", "a", "c"]
    assert values(Dataset.from_tensor_slices([b"x", b"x", b"y"]).unique()) == [b"x", b"y"]
    # Each iteration starts with an empty set of seen values.
    u = Dataset.range(3).repeat(2).unique()
    assert values(u) == values(u) == [0, 1, 2]


def test_unique_refuses_other_dtypes_at_construction():
    # As tf.data: int32, int64 and string only, refused when the pipeline is built.
    for data in (np.zeros((2, 2)), np.ones(3), np.array([True, False]), np.array([1, 2], np.int16)):
        with pytest.raises(TypeError, match="unique"):
            Dataset.from_tensor_slices(data).unique()
    with pytest.raises(dataservice.errors.InvalidArgumentError, match="single component"):
        Dataset.zip((Dataset.range(2), Dataset.range(2))).unique()


def test_unique_of_vectors_compares_whole_tensors():
    ds = Dataset.from_tensor_slices(np.array([[1, 2], [1, 2], [2, 1], [1, 2]])).unique()
    assert values(ds) == [[1, 2], [2, 1]]
    strings = Dataset.from_tensor_slices(np.array([["a", "b"], ["a", "b"], ["b", "a"]])).unique()
    assert values(strings) == [["a", "b"], ["b", "a"]]


def test_unique_over_a_lazy_spec_checks_the_first_element():
    calls = []

    def f(x):
        calls.append(x)
        return x / 2

    ds = Dataset.range(4).map(f).unique()  # the spec needs an element: nothing runs yet
    assert calls == []
    with pytest.raises(TypeError, match="float64"):
        list(ds)
    assert values(Dataset.range(4).map(lambda x: x % 2).unique()) == [0, 1]


# --- what tf.data accepts and refuses (issue 16) --------------------------------------

def test_every_negative_count_means_all():
    assert values(Dataset.range(5).take(-7)) == [0, 1, 2, 3, 4]
    assert Dataset.range(5).take(-7).cardinality() == -7  # tf.data's min(5, -7): no count, see test_dataset_cardinality
    assert values(Dataset.range(5).skip(-7)) == []
    assert values(Dataset.range(2).repeat(-3).take(5)) == [0, 1, 0, 1, 0]
    assert Dataset.range(2).repeat(-3).cardinality() == dataservice.INFINITE_CARDINALITY
    assert values(dataservice.shuffle_and_repeat(2, count=-5, seed=1)(Dataset.range(2)).take(6)) != []


def test_skip_everything_reads_nothing():
    # As tf.data: skip(-1) is empty at once, even over an infinite input, and never calls the input.
    pulled = []

    def gen():
        for i in range(3):
            pulled.append(i)
            yield i

    assert values(Dataset.from_generator(gen).skip(-1)) == []
    assert pulled == []
    assert values(Dataset.range(3).repeat().skip(-1).take(2)) == []


def test_shuffle_takes_any_int64_seed():
    def order(seed):
        return values(Dataset.range(50).shuffle(50, seed=seed, reshuffle_each_iteration=False))

    assert sorted(order(-3)) == list(range(50))
    assert order(-3) == order(-3)
    assert order(-3) != order(3)  # not the same seed as its absolute value


def test_shuffle_buffer_unknown_cardinality_buffers_the_whole_input():
    # -2 (UNKNOWN_CARDINALITY) buffers everything, as tf.data: the last element can come out first.
    firsts = {values(Dataset.range(20).shuffle(dataservice.UNKNOWN_CARDINALITY, seed=s))[0] for s in range(40)}
    assert max(firsts) >= 10
    assert sorted(values(Dataset.range(20).shuffle(-2))) == list(range(20))


def _vectors(dtype):
    return Dataset.from_generator(lambda: iter([np.full(n, n, dtype) for n in (1, 2, 3)]),
                                  output_signature=dataservice.TensorSpec([None], dtype))


def test_padded_batch_refuses_a_padding_value_of_another_dtype_at_construction():
    for dtype, value in ((np.int64, -1.5), (np.int64, np.int32(-1)), (np.int32, np.int64(-1)),
                         (np.float64, np.float32(1)), (np.float32, 1), (np.int64, b"x")):
        with pytest.raises(TypeError, match="does not match the dtype"):
            _vectors(dtype).padded_batch(2, padding_values=value)
    with pytest.raises(ValueError, match="scalars"):
        _vectors(np.int64).padded_batch(2, padding_values=np.array([1, 2]))


def test_padded_batch_python_literals_fit_any_width():
    # Python literals have no width here (they are 64-bit, TensorFlow's are 32-bit): an int pads any
    # integer component, a float any floating one.
    assert values(_vectors(np.int32).padded_batch(3, padding_values=-1))[0][0] == [1, -1, -1]
    assert values(_vectors(np.int64).padded_batch(3, padding_values=-1))[0][0] == [1, -1, -1]
    batch = next(iter(_vectors(np.float32).padded_batch(3, padding_values=0.5)))
    assert batch.dtype == np.float32 and batch[0].tolist() == [1.0, 0.5, 0.5]


def test_padded_batch_over_a_lazy_spec_checks_the_first_batch():
    calls = []

    def f(x):
        calls.append(x)
        return np.full([x], x)

    ds = Dataset.range(1, 4).map(f).padded_batch(2, padding_values=-1.5)
    assert calls == []  # building it ran nothing
    with pytest.raises(TypeError, match="does not match the dtype int64"):
        list(ds)
    assert values(Dataset.range(1, 3).map(f).padded_batch(2, padding_values=-1)) == [[[1, -1], [2, 2]]]


def test_concatenate_refuses_other_structures_and_dtypes_at_construction():
    a = Dataset.range(3)
    for other in (Dataset.zip((a, a)), Dataset.from_tensor_slices(["x"]),
                  Dataset.from_tensor_slices(np.arange(2, dtype=np.int32))):
        with pytest.raises(TypeError, match="Incompatible dataset elements"):
            a.concatenate(other)
    # Shapes may differ: the spec is the most specific one both fit.
    assert a.batch(2).concatenate(a).element_spec == dataservice.TensorSpec(None, np.int64)


def test_concatenate_over_a_lazy_spec_checks_the_first_elements():
    calls = []

    def f(x):
        calls.append(x)
        return x.astype(np.int32)

    ds = Dataset.range(3).concatenate(Dataset.range(3).map(f))
    assert calls == []  # building it ran nothing
    it = iter(ds)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(TypeError, match="Incompatible dataset elements"):
        next(it)
    same = Dataset.range(2).map(lambda x: x + 1).concatenate(Dataset.range(2))
    assert values(same) == [1, 2, 0, 1]


def test_zip_errors_are_tensorflows():
    with pytest.raises(TypeError, match="at least one dataset"):
        Dataset.zip()
    with pytest.raises(dataservice.errors.InvalidArgumentError, match="empty structure"):
        Dataset.zip(())
    with pytest.raises(TypeError, match="not both"):
        Dataset.zip(Dataset.range(2), datasets=Dataset.range(3))
    assert values(Dataset.zip(datasets=(Dataset.range(2), Dataset.range(3)))) == [(0, 0), (1, 1)]


def test_reduce_refuses_a_function_that_is_not_callable_before_reading():
    pulled = []

    def gen():
        pulled.append(1)
        yield 1

    with pytest.raises(ValueError, match="reduce_func"):
        Dataset.from_generator(gen).reduce(np.int64(0), 5)
    assert pulled == []


def test_unique_keeps_the_spec():
    ds = Dataset.from_tensor_slices(np.array([[1, 2], [1, 2]], np.int32)).unique()
    assert ds.element_spec == dataservice.TensorSpec((2,), np.int32)
    assert Dataset.from_tensor_slices([b"a", b"a"]).unique().element_spec == dataservice.TensorSpec((), "string")
