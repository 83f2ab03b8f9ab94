"""Dataset.window, Dataset.group_by_window and the iterator API (get_next, get_next_as_optional, Optional):
what the TensorFlow parity cases (tests/tf_parity/cases_windows.py, cases_iterators.py) do not cover —
pickling, laziness, specs, our own error messages and the deliberate differences."""

import collections
import pickle

import cloudpickle
import numpy as np
import pytest

from dataservice import Dataset, errors
from dataservice.data import DatasetSpec, Optional, TensorSpec, deserialize_dataset, serialize_dataset
from dataservice.data import specs

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc


def windows(ds):
    return [[int(x) for x in w] for w in ds]


# --- window -------------------------------------------------------------------------------------

def test_windowed_pipeline_survives_cloudpickle():
    ds = Dataset.range(12).map(lambda x: x * 2).window(3, 2, 2, True).flat_map(lambda w: w.batch(3))
    copy = cloudpickle.loads(cloudpickle.dumps(ds))
    assert [b.tolist() for b in copy] == [b.tolist() for b in ds] == [[0, 4, 8], [4, 8, 12], [8, 12, 16],
                                                                      [12, 16, 20]]


def test_windowed_pipeline_survives_serialize_dataset():
    ds = Dataset.range(10).window(4, 3).flat_map(lambda w: w.batch(4))
    restored = deserialize_dataset(serialize_dataset(ds))
    assert [b.tolist() for b in restored] == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9], [9]]


def test_window_itself_pickles_with_its_values():
    w = next(iter(Dataset.from_tensor_slices(np.arange(6.0)).window(3)))
    copy = cloudpickle.loads(cloudpickle.dumps(w))
    assert [float(x) for x in copy] == [0.0, 1.0, 2.0]
    assert copy.element_spec == TensorSpec((), np.float64)


def test_window_reads_lazily_from_an_infinite_input():
    taken = Dataset.range(3).repeat().window(2, 1).take(4)
    assert windows(taken) == [[0, 1], [1, 2], [2, 0], [0, 1]]


def test_a_window_can_be_iterated_again_and_knows_its_length():
    w = next(iter(Dataset.range(5).window(3)))
    assert len(w) == 3 and w.cardinality() == 3
    assert [int(x) for x in w] == [int(x) for x in w] == [0, 1, 2]


def test_windows_of_namedtuples_are_namedtuples_of_datasets():
    Pair = collections.namedtuple("Pair", "x y")
    ds = Dataset.zip(Pair(Dataset.range(4), Dataset.range(10, 14))).window(2)
    first = next(iter(ds))
    assert isinstance(first, Pair)
    assert [int(v) for v in first.y] == [10, 11]
    assert isinstance(ds.element_spec, Pair) and ds.element_spec.x == DatasetSpec(TensorSpec((), np.int64))


def test_window_element_spec_is_static_and_recorded_at_registration():
    ds = Dataset.from_tensor_slices({"a": np.zeros((6, 2), np.float32)}).window(2)
    spec, why = specs.static_element_spec(ds)
    assert why == "" and spec == {"a": DatasetSpec(TensorSpec((2,), np.float32))}
    # Nothing was read: a spec from the input's static one, with a shape the data has.
    assert ds.element_spec["a"].element_spec.shape == (2,)


def test_window_spec_through_flat_map_keeps_the_static_shapes():
    ds = Dataset.from_tensor_slices(np.zeros((7, 3), np.float32)).window(2, drop_remainder=True)
    assert ds.flat_map(lambda w: w.batch(2, drop_remainder=True)).element_spec == TensorSpec((2, 3), np.float32)


def test_concatenating_windowed_datasets():
    ds = Dataset.range(4).window(2).concatenate(Dataset.range(10, 13).window(3))
    assert ds.element_spec == DatasetSpec(TensorSpec((), np.int64))
    assert windows(ds) == [[0, 1], [2, 3], [10, 11, 12]]
    with pytest.raises(TypeError, match="concatenate"):
        _ = Dataset.range(4).window(2).concatenate(Dataset.range(3)).element_spec


@pytest.mark.parametrize("args, kind, match", [
    ((0,), errors.InvalidArgumentError, "size must be greater than zero, got 0"),
    ((2, -1), errors.InvalidArgumentError, "shift must be greater than zero, got -1"),
    ((2, 1, 0), errors.InvalidArgumentError, "stride must be greater than zero, got 0"),
    (("2",), TypeError, "size must be an int"),
    ((True,), TypeError, "size must be an int"),
    ((2, None, None), ValueError, "stride must be an int, got None"),
])
def test_window_argument_errors_name_the_argument(args, kind, match):
    with pytest.raises(kind, match=match):
        Dataset.range(4).window(*args)


def test_window_drop_remainder_must_be_a_bool():
    with pytest.raises(TypeError, match="drop_remainder must be a bool"):
        Dataset.range(4).window(2, drop_remainder=1)


def test_an_input_error_surfaces_when_its_window_is_read():
    def check(x):
        if x == 3:
            raise KeyError("bad element")
        return x

    it = iter(Dataset.range(6).map(check).window(2))
    assert [int(x) for x in next(it)] == [0, 1]
    with pytest.raises(KeyError, match="bad element"):
        next(it)


# --- group_by_window ---------------------------------------------------------------------------------

def test_group_by_window_pipeline_survives_cloudpickle():
    ds = Dataset.range(10).group_by_window(lambda x: x % 3, lambda k, w: w.batch(2).map(lambda b: b + k), 2)
    copy = cloudpickle.loads(cloudpickle.dumps(ds))
    assert [b.tolist() for b in copy] == [b.tolist() for b in ds]
    assert [b.tolist() for b in ds][:3] == [[0, 3], [2, 5], [4, 7]]


def test_reduce_func_sees_a_numpy_int64_key_and_a_window_of_the_input_spec():
    seen = []

    def reduce_func(key, window):
        seen.append((type(key), window.element_spec, window.cardinality()))
        return window

    list(Dataset.range(4).group_by_window(lambda x: x % 2, reduce_func, 2))
    assert seen == [(np.int64, TensorSpec((), np.int64), 2)] * 2


def test_window_size_func_is_called_once_per_key():
    calls = []

    def size(key):
        calls.append(int(key))
        return 2

    out = [b.tolist() for b in Dataset.range(12).group_by_window(lambda x: x % 3, lambda k, w: w.batch(5),
                                                                 window_size_func=size)]
    assert sorted(calls) == [0, 1, 2]
    assert out == [[0, 3], [1, 4], [2, 5], [6, 9], [7, 10], [8, 11]]


def test_reduce_func_must_return_a_dataset():
    ds = Dataset.range(4).group_by_window(lambda x: x % 2, lambda k, w: k, 2)
    with pytest.raises(TypeError, match="reduce_func must return a Dataset, got int64"):
        list(ds)


@pytest.mark.parametrize("key_func, shown", [(lambda x: 0.5, "float 0.5"), (lambda x: "a", "str 'a'"),
                                             (lambda x: np.array([1, 2]), r"shape \(2,\)")])
def test_key_func_must_return_a_scalar_integer(key_func, shown):
    with pytest.raises(ValueError, match=f"key_func must return a scalar integer.*{shown}"):
        list(Dataset.range(4).group_by_window(key_func, lambda k, w: w, 2))


def test_key_func_errors_name_the_transformation():
    ds = Dataset.range(4).group_by_window(lambda x: {}[x], lambda k, w: w, 2)
    with pytest.raises(KeyError, match="group_by_window"):
        list(ds)


def test_group_by_window_arguments_are_checked_when_built():
    with pytest.raises(TypeError, match="key_func must be callable"):
        Dataset.range(4).group_by_window(3, lambda k, w: w, 2)
    with pytest.raises(ValueError, match="reduce_func must be callable"):
        Dataset.range(4).group_by_window(lambda x: x, None, 2)
    with pytest.raises(TypeError, match="window_size must be an int"):
        Dataset.range(4).group_by_window(lambda x: x, lambda k, w: w, 2.5)


def test_group_by_window_element_spec_of_an_empty_input():
    ds = Dataset.range(0).group_by_window(lambda x: x, lambda k, w: w.batch(3, drop_remainder=True), 3)
    assert ds.element_spec == TensorSpec((3,), np.int64)
    assert list(ds) == []


# --- the iterator API --------------------------------------------------------------------------------

def test_out_of_range_error_ends_a_python_loop():
    it = iter(Dataset.range(3))
    got = []
    while True:
        try:
            got.append(int(it.get_next()))
        except StopIteration as exc:  # OutOfRangeError is one (TensorFlow's is not: a deliberate difference)
            assert isinstance(exc, errors.OutOfRangeError)
            break
    assert got == [0, 1, 2]


def test_iterator_is_the_one_for_loops_use():
    it = iter(Dataset.range(4))
    assert iter(it) is it
    assert [int(it.get_next()), int(next(it))] == [0, 1]
    assert [int(x) for x in it] == [2, 3]
    with pytest.raises(errors.OutOfRangeError, match="End of sequence"):
        it.get_next()


def test_get_next_as_optional_does_not_compute_the_spec_until_asked():
    calls = []

    def f(x):
        calls.append(int(x))
        return x

    it = iter(Dataset.range(2).map(f))
    opts = [it.get_next_as_optional() for _ in range(3)]
    assert [o.has_value() for o in opts] == [True, True, False] and calls == [0, 1]
    assert opts[2].element_spec == TensorSpec((), np.int64)  # map traced on a fresh copy now
    assert calls == [0, 1, 0]


def test_optional_from_value_and_empty():
    opt = Optional.from_value((1, [2.0, 3.0], b"x"))
    assert opt.has_value() is True
    value = opt.get_value()
    assert value[0] == 1 and value[1].tolist() == [2.0, 3.0] and value[2] == b"x"
    assert opt.element_spec == (TensorSpec((), np.int64), TensorSpec((2,), np.float64), TensorSpec((), "string"))
    empty = Optional.empty({"a": TensorSpec((None,), np.int32)})
    assert empty.has_value() is False and empty.element_spec == {"a": TensorSpec((None,), np.int32)}
    with pytest.raises(errors.InvalidArgumentError, match="does not have a value"):
        empty.get_value()
    with pytest.raises(TypeError, match="element_spec"):
        Optional.empty(None)
    assert repr(empty) == "Optional(<no value>)"


# --- DatasetSpec -------------------------------------------------------------------------------------

def test_dataset_spec_equality_hash_pickle_and_compatibility():
    a = DatasetSpec({"x": TensorSpec((2,), np.float32), "y": TensorSpec((), "string")})
    b = DatasetSpec({"y": TensorSpec((), "string"), "x": TensorSpec((2,), np.float32)})
    assert a == b and hash(a) == hash(b)
    assert pickle.loads(pickle.dumps(a)) == a
    assert a != DatasetSpec({"x": TensorSpec((3,), np.float32), "y": TensorSpec((), "string")})
    assert a != TensorSpec((2,), np.float32)
    loose = DatasetSpec({"x": TensorSpec((None,), np.float32), "y": TensorSpec((), "string")})
    assert loose.is_compatible_with(a) and not a.is_compatible_with(DatasetSpec(TensorSpec((), np.int64)))
    assert DatasetSpec(TensorSpec((), np.int64)).is_compatible_with(Dataset.range(3))
    common = DatasetSpec(TensorSpec((2,), np.int64)).most_specific_common_supertype(
        [DatasetSpec(TensorSpec((3,), np.int64))])
    assert common == DatasetSpec(TensorSpec((None,), np.int64))
    assert DatasetSpec(TensorSpec((), np.int64)).most_specific_common_supertype(
        [DatasetSpec(TensorSpec((), np.float32))]) is None
    assert repr(DatasetSpec(TensorSpec((), np.int64))) == \
        "DatasetSpec(TensorSpec(shape=(), dtype=int64, name=None), TensorShape([]))"


def test_dataset_spec_refuses_what_is_not_a_spec():
    with pytest.raises(TypeError, match="DatasetSpec's element_spec"):
        DatasetSpec([1, 2])
    with pytest.raises(TypeError, match="takes a Dataset"):
        DatasetSpec.from_value(3)


def test_a_map_returning_datasets_has_a_dataset_spec():
    ds = Dataset.range(3).map(lambda x: Dataset.range(x))
    assert ds.element_spec == DatasetSpec(TensorSpec((), np.int64))
    assert [[int(v) for v in inner] for inner in ds] == [[], [0], [0, 1]]


def test_batched_windows_keep_a_dataset_spec_with_the_batch_dimension():
    batched = Dataset.range(5).window(2).batch(2, drop_remainder=True)
    assert batched.element_spec == DatasetSpec(TensorSpec((), np.int64), (2,))
    assert batched.unbatch().element_spec == DatasetSpec(TensorSpec((), np.int64))
    assert windows(batched.unbatch()) == [[0, 1], [2, 3]]


def test_padded_batch_of_windows_is_refused_as_in_tensorflow():
    with pytest.raises(TypeError, match="padded_batch is not supported for datasets of datasets"):
        _ = Dataset.range(5).window(2).padded_batch(2).element_spec
