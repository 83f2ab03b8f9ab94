"""``element_spec``: every source and transformation, as tf.data computes it, and ``from_dataset_id``.

The expected specs are written by hand from tf.data's rules (TensorFlow is not installed here).
One difference is deliberate: dtypes are those of the elements this library yields, so a Python
``int`` is int64 and a ``float`` float64 (tf.data makes them int32 and float32); strings are
``string`` as in tf.data, whether ``bytes`` or ``str``.

Where tf.data knows a spec statically, the tests prove nothing runs: a function that raises when
called, files that do not exist or cannot be parsed, a database that is not there.
"""

from __future__ import annotations

import collections
import sqlite3

import numpy as np
import pytest

from dataservice import (Dataset, FixedLengthRecordDataset, Options, SqlDataset, TensorSpec, TextLineDataset,
                         TFRecordDataset, TFRecordWriter, distribute, from_dataset_id, register_dataset,
                         shuffle_and_repeat)
from dataservice.data import specs
from dataservice.errors import InvalidArgumentError
from dataservice.data.serialization import registered_element_spec, serialize_dataset
from dataservice.data.specs import string
from dataservice.proto import pipeline_pb2
from dataservice.service.dispatcher_client import DispatcherClient
from tests.cluster import TestCluster, run_with_deadline

Point = collections.namedtuple("Point", "x y")

INT64 = TensorSpec((), np.int64)
FLOAT64 = TensorSpec((), np.float64)
STRING = TensorSpec((), string)

#: Bounds every test that talks to a cluster.
DEADLINE_S = 60.0


def boom(*args):
    raise AssertionError("called: the spec should have been known without running the function")


def assert_elements_fit(ds: Dataset) -> None:
    """Every element of ``ds`` has the structure of its element_spec, and each component fits its spec."""
    spec = ds.element_spec
    for element in ds:
        assert specs._same_kind(spec, specs.spec_from_value(element)), (spec, element)
        for s, value in zip(specs.structure.flatten(spec), specs.structure.flatten(element)):
            assert s.is_compatible_with(value), (s, value)


# --- TensorSpec -------------------------------------------------------------------------------

def test_tensor_spec_reads_like_tf():
    spec = TensorSpec((None, 3), np.float32)
    assert spec.shape == (None, 3) and spec.dtype == np.float32 and spec.name is None
    assert repr(spec) == "TensorSpec(shape=(None, 3), dtype=float32, name=None)"
    assert repr(TensorSpec(None, np.int64, name="x")) == "TensorSpec(shape=<unknown>, dtype=int64, name='x')"
    assert TensorSpec([2]).dtype == np.float32  # tf's default dtype
    assert TensorSpec(3, np.int8).shape == (3,)  # as tf.TensorShape(3)


def test_tensor_spec_equality_and_hash():
    assert TensorSpec((2,), np.int64) == TensorSpec([2], "int64")
    assert TensorSpec((2,), np.int64) != TensorSpec((2,), np.int32)
    assert TensorSpec((2,), np.int64) != TensorSpec((None,), np.int64)
    assert TensorSpec((), np.int64, name="a") != TensorSpec((), np.int64)
    assert len({TensorSpec((2,), np.int64), TensorSpec([2], np.dtype("int64"))}) == 1


@pytest.mark.parametrize("dtype", [string, "string", bytes, str, np.bytes_, np.str_, np.dtype("S3"), "U"])
def test_string_dtypes(dtype):
    spec = TensorSpec((), dtype)
    assert spec.dtype is string and spec.dtype == "string"
    assert repr(spec) == "TensorSpec(shape=(), dtype=string, name=None)"


def test_tensor_spec_rejects_bad_arguments():
    with pytest.raises(TypeError, match="dimensions must be ints"):
        TensorSpec((2.5,))
    with pytest.raises(ValueError, match=">= 0"):
        TensorSpec((-1,))
    with pytest.raises(TypeError, match="shape must be"):
        TensorSpec("abc")
    with pytest.raises(TypeError, match="dtype"):
        TensorSpec((), None)
    with pytest.raises(TypeError, match="dtype"):
        TensorSpec((), "no-such-dtype")
    with pytest.raises(TypeError, match="name"):
        TensorSpec((), np.int64, name=3)


def test_tensor_spec_compatibility():
    spec = TensorSpec((None, 3), np.float32)
    assert spec.is_compatible_with(np.zeros((5, 3), np.float32))
    assert not spec.is_compatible_with(np.zeros((5, 4), np.float32))
    assert not spec.is_compatible_with(np.zeros((5, 3), np.float64))
    assert spec.is_compatible_with(TensorSpec(None, np.float32))
    assert TensorSpec((), string).is_compatible_with(b"x") and TensorSpec((), string).is_compatible_with("x")
    assert TensorSpec.from_value(np.int32(1)) == TensorSpec((), np.int32)
    assert TensorSpec.from_value([b"a", b"b"]) == TensorSpec((2,), string)
    assert TensorSpec.from_value(object()) == TensorSpec((), object)  # any other Python object


def test_most_specific_common_supertype():
    a, b = TensorSpec((2, 3), np.int64), TensorSpec((4, 3), np.int64)
    assert a.most_specific_common_supertype([b]) == TensorSpec((None, 3), np.int64)
    assert a.most_specific_common_supertype([TensorSpec((2,), np.int64)]) == TensorSpec(None, np.int64)
    assert a.most_specific_common_supertype([TensorSpec((2, 3), np.int32)]) is None


def test_tf_like_specs_are_converted():
    class FakeTfDType:  # what from_dataset_id may be given by code written for tf
        name = "int32"
        as_numpy_dtype = np.int32

    class FakeTfSpec:
        shape, dtype, name = (None, 2), FakeTfDType(), None

    assert specs.as_structure({"a": FakeTfSpec()}) == {"a": TensorSpec((None, 2), np.int32)}


# --- sources ------------------------------------------------------------------------------------

def test_range():
    assert Dataset.range(10).element_spec == INT64
    assert Dataset.range(1, 5, 2, dtype=np.float32).element_spec == TensorSpec((), np.float32)


def test_from_tensor_slices():
    assert Dataset.from_tensor_slices(np.zeros((4, 2, 3), np.float32)).element_spec == \
        TensorSpec((2, 3), np.float32)
    assert Dataset.from_tensor_slices([1, 2, 3]).element_spec == INT64  # tf: int32
    assert Dataset.from_tensor_slices([b"a", b"b"]).element_spec == STRING
    assert Dataset.from_tensor_slices(["a", "b"]).element_spec == STRING
    assert Dataset.from_tensor_slices(([1, 2], [[1.0], [2.0]])).element_spec == (INT64, TensorSpec((1,), np.float64))
    assert Dataset.from_tensor_slices({"b": np.arange(2), "a": [b"x", b"y"]}).element_spec == \
        {"b": INT64, "a": STRING}
    spec = Dataset.from_tensor_slices(Point(np.arange(3), np.zeros((3, 2)))).element_spec
    assert type(spec) is Point and spec == Point(INT64, TensorSpec((2,), np.float64))


def test_from_tensors():
    assert Dataset.from_tensors(42).element_spec == INT64  # tf: int32
    assert Dataset.from_tensors(np.zeros((2, 3), np.uint8)).element_spec == TensorSpec((2, 3), np.uint8)
    assert Dataset.from_tensors((37.0, [42, 16], "foo")).element_spec == \
        (FLOAT64, TensorSpec((2,), np.int64), STRING)
    assert Dataset.from_tensors({"a": b"x", "b": Point(1, 2.0)}).element_spec == \
        {"a": STRING, "b": Point(INT64, FLOAT64)}


def test_from_generator_with_output_signature_does_not_call_it():
    signature = (TensorSpec((), np.int32), TensorSpec((None,), np.float32))
    ds = Dataset.from_generator(boom, output_signature=signature)
    assert ds.element_spec == signature


def test_from_generator_with_output_types_and_shapes():
    assert Dataset.from_generator(boom, output_types=np.int64).element_spec == TensorSpec(None, np.int64)
    ds = Dataset.from_generator(boom, output_types=(np.int64, bytes), output_shapes=((), (None, 2)))
    assert ds.element_spec == (INT64, TensorSpec((None, 2), string))
    ds = Dataset.from_generator(boom, output_types={"a": np.float32}, output_shapes={"a": [3]})
    assert ds.element_spec == {"a": TensorSpec((3,), np.float32)}


def test_from_generator_declarations_are_checked():
    with pytest.raises(TypeError, match="must not be given with output_signature"):
        Dataset.from_generator(boom, output_types=np.int64, output_signature=INT64)
    with pytest.raises(TypeError, match="output_shapes needs output_types"):
        Dataset.from_generator(boom, output_shapes=())
    with pytest.raises(ValueError, match="output_shapes must match"):
        Dataset.from_generator(boom, output_types=(np.int64, np.int64), output_shapes=((),))
    with pytest.raises(TypeError, match="output_signature must be a TensorSpec"):
        Dataset.from_generator(boom, output_signature=[INT64])


def test_from_generator_elements_are_converted_to_the_signature():
    def gen():
        yield 1, [1.5, 2.5]
        yield 2, [3.5]

    ds = Dataset.from_generator(gen, output_signature=(TensorSpec((), np.int32), TensorSpec((None,), np.float32)))
    elements = list(ds)
    assert [type(a) for a, _ in elements] == [np.int32, np.int32]
    assert [b.dtype for _, b in elements] == [np.float32, np.float32]
    assert [b.tolist() for _, b in elements] == [[1.5, 2.5], [3.5]]


def test_from_generator_mismatches_name_the_component():
    def gen():
        yield np.zeros(3)

    with pytest.raises(ValueError, match=r"Dataset.from_generator\('.*gen'\) yielded an element whose value has "
                                         r"shape \(3,\) where the output_signature says \(2,\)"):
        list(Dataset.from_generator(gen, output_signature=TensorSpec((2,), np.float64)))

    def pairs():
        yield 1, b"x"

    # InvalidArgumentError (a ValueError), as tf.data raises for what a generator yields (issue 16).
    with pytest.raises(InvalidArgumentError, match=r"component \[1\] \(bytes\) cannot be converted to the "
                                                   r"output_signature's dtype int64"):
        list(Dataset.from_generator(pairs, output_signature=(INT64, INT64)))
    with pytest.raises(InvalidArgumentError, match="does not match the output_signature's structure"):
        list(Dataset.from_generator(pairs, output_signature=INT64))
    with pytest.raises(InvalidArgumentError, match="does not match the output_signature's structure"):
        list(Dataset.from_generator(pairs, output_signature={"a": INT64, "b": STRING}))


def test_from_generator_without_signature_reads_its_first_element_once():
    calls = []

    def gen():
        calls.append(1)
        yield np.zeros((2, 2), np.float32), "label"
        raise AssertionError("read past the first element")

    assert Dataset.from_generator(gen).element_spec == (TensorSpec((None, None), np.float32), STRING)
    assert calls == [1]


def test_list_files(tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_bytes(b"")
    assert Dataset.list_files(str(tmp_path / "*.txt")).element_spec == STRING


def test_file_readers_do_not_open_their_files(tmp_path):
    missing = str(tmp_path / "missing")
    assert TFRecordDataset(missing).element_spec == STRING
    assert TFRecordDataset([missing, missing], compression_type="GZIP", num_parallel_reads=2).element_spec == STRING
    assert TextLineDataset(missing).element_spec == STRING
    assert FixedLengthRecordDataset(missing, record_bytes=4).element_spec == STRING


def test_sql_dataset_does_not_run_its_query(tmp_path):
    missing = str(tmp_path / "no.db")
    ds = SqlDataset("sqlite", missing, "SELECT name, age, height, ok FROM people",
                    (np.bytes_, np.int32, np.float64, np.bool_))
    assert ds.element_spec == (STRING, TensorSpec((), np.int32), FLOAT64, TensorSpec((), np.bool_))
    assert SqlDataset("sqlite", missing, "SELECT name FROM people", str).element_spec == STRING


def test_sql_elements_fit_their_spec(tmp_path):
    path = str(tmp_path / "people.db")
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE people (name TEXT, age INTEGER)")
        db.execute("INSERT INTO people VALUES ('Ada', 36)")
    assert_elements_fit(SqlDataset("sqlite", path, "SELECT name, age FROM people", (np.bytes_, np.int32)))


# --- transformations ----------------------------------------------------------------------------

def test_map_with_output_signature_does_not_call_the_function():
    signature = {"image": TensorSpec((28, 28), np.float32), "label": INT64}
    ds = Dataset.range(10).map(boom, output_signature=signature)
    assert ds.element_spec == signature
    ds = ds.batch(32, drop_remainder=True).prefetch(2)
    assert ds.element_spec == {"image": TensorSpec((32, 28, 28), np.float32), "label": TensorSpec((32,), np.int64)}


def test_map_with_output_signature_converts_and_checks():
    ds = Dataset.range(3).map(lambda x: (x, x * 0.5), output_signature=(TensorSpec((), np.int32), FLOAT64))
    assert [(type(a), float(b)) for a, b in ds] == [(np.int32, 0.0), (np.int32, 0.5), (np.int32, 1.0)]
    with pytest.raises(ValueError, match=r"Dataset.map\(.*<lambda>\) returned an element whose value has shape "
                                         r"\(2,\) where the output_signature says \(3,\)"):
        list(Dataset.range(3).map(lambda x: [x, x], output_signature=TensorSpec((3,), np.int64)))


def test_map_without_signature_calls_the_function_once_on_the_first_element():
    seen = []

    def f(x):
        seen.append(int(x))
        return 37.0, ["Foo", "Bar", "Baz"], np.array([1.0, 2.0], dtype=np.float32)

    ds = Dataset.range(5, 10).map(f, num_parallel_calls=4)
    # tf.data: float32 for 37.0, and (3,), (2,): its tracing knows the dimensions are constant; one
    # element cannot tell, so every dimension is None (declare output_signature for static ones).
    expected = (FLOAT64, TensorSpec((None,), string), TensorSpec((None,), np.float32))
    assert ds.element_spec == expected
    assert ds.element_spec == expected  # computed once, kept
    assert seen == [5]


def test_map_unpacks_tuples_as_iteration_does():
    ds = Dataset.zip((Dataset.range(3), Dataset.range(3))).map(lambda a, b: {"sum": a + b})
    assert ds.element_spec == {"sum": INT64}


def test_map_errors_name_the_map():
    with pytest.raises(ZeroDivisionError, match=r"raised in Dataset.map\(.*<lambda>\)"):
        Dataset.range(3).map(lambda x: 1 // 0).element_spec
    with pytest.raises(ValueError, match="is empty"):
        Dataset.range(0).map(lambda x: x).element_spec


@pytest.mark.parametrize("transform", [
    lambda ds: ds.filter(boom),
    lambda ds: ds.shuffle(10, seed=1),
    lambda ds: ds.repeat(3),
    lambda ds: ds.repeat(),
    lambda ds: ds.take(2),
    lambda ds: ds.skip(2),
    lambda ds: ds.take_while(boom),
    lambda ds: ds.shard(2, 1),
    lambda ds: ds.prefetch(4),
    lambda ds: ds.cache(),
    lambda ds: ds.with_options(Options()),
    lambda ds: ds.apply(shuffle_and_repeat(4, seed=1)),
], ids=["filter", "shuffle", "repeat", "repeat()", "take", "skip", "take_while", "shard", "prefetch", "cache",
        "with_options", "shuffle_and_repeat"])
def test_transformations_that_keep_the_spec(transform):
    source = Dataset.from_tensor_slices((np.zeros((6, 2), np.float32), [b"a"] * 6))
    assert transform(source).element_spec == (TensorSpec((2,), np.float32), STRING)


def test_cache_to_a_file_keeps_the_spec_and_writes_nothing(tmp_path):
    ds = Dataset.range(5).cache(str(tmp_path / "c")).map(lambda x: x * 2)
    assert ds.element_spec == INT64
    assert list(tmp_path.iterdir()) == []  # the inspection's pass stopped early: no cache, no temporary file


def test_batch():
    ds = Dataset.from_tensor_slices((np.zeros((10, 3), np.float32), np.arange(10)))
    assert ds.batch(4).element_spec == (TensorSpec((None, 3), np.float32), TensorSpec((None,), np.int64))
    assert ds.batch(4, drop_remainder=True).element_spec == (TensorSpec((4, 3), np.float32), TensorSpec((4,), np.int64))
    assert ds.batch(2).batch(3, drop_remainder=True).element_spec[1] == TensorSpec((3, None), np.int64)
    assert Dataset.from_generator(boom, output_types=np.int64).batch(2).element_spec == TensorSpec(None, np.int64)


def test_padded_batch():
    ds = Dataset.from_generator(boom, output_signature=(TensorSpec((None,), np.int64), TensorSpec((2,), np.float32)))
    assert ds.padded_batch(4).element_spec == (TensorSpec((None, None), np.int64), TensorSpec((None, 2), np.float32))
    assert ds.padded_batch(4, padded_shapes=((5,), (2,)), drop_remainder=True).element_spec == \
        (TensorSpec((4, 5), np.int64), TensorSpec((4, 2), np.float32))
    assert ds.padded_batch(4, padded_shapes=((-1,), (3,))).element_spec == \
        (TensorSpec((None, None), np.int64), TensorSpec((None, 3), np.float32))
    with pytest.raises(ValueError, match=r"padded shape \(1,\) is not compatible with the shape \(2,\)"):
        ds.padded_batch(4, padded_shapes=((5,), (1,))).element_spec
    with pytest.raises(ValueError, match=r"padded shape \(5, 5\) is not compatible"):
        ds.padded_batch(4, padded_shapes=((5, 5), (2,))).element_spec


def test_padded_batch_elements_fit_their_spec():
    ds = Dataset.range(1, 6).map(lambda x: np.arange(x), output_signature=TensorSpec((None,), np.int64))
    assert_elements_fit(ds.padded_batch(2))
    assert_elements_fit(ds.padded_batch(2, padded_shapes=(8,)))


def test_unbatch():
    ds = Dataset.from_tensor_slices(np.zeros((4, 3, 2), np.uint8)).batch(2, drop_remainder=True)
    assert ds.unbatch().element_spec == TensorSpec((3, 2), np.uint8)
    assert ds.unbatch().unbatch().element_spec == TensorSpec((2,), np.uint8)
    assert Dataset.from_generator(boom, output_types=np.int64).unbatch().element_spec == TensorSpec(None, np.int64)
    with pytest.raises(ValueError, match="cannot unbatch an input with scalar components"):
        Dataset.range(3).unbatch().element_spec


def test_enumerate():
    assert Dataset.from_tensor_slices([b"a"]).enumerate(5).element_spec == (INT64, STRING)


def test_zip():
    a, b = Dataset.range(3), Dataset.from_tensor_slices([b"x", b"y"])
    assert Dataset.zip(a, b).element_spec == (INT64, STRING)
    assert Dataset.zip((a, b)).element_spec == (INT64, STRING)
    assert Dataset.zip(a).element_spec == INT64  # one argument: the structure itself
    assert Dataset.zip((a,)).element_spec == (INT64,)
    assert Dataset.zip({"n": a, "s": (b, a)}).element_spec == {"n": INT64, "s": (STRING, INT64)}
    spec = Dataset.zip(Point(a, b)).element_spec
    assert type(spec) is Point and spec == Point(INT64, STRING)


def test_concatenate_takes_the_most_specific_compatible_spec():
    def rows(n):
        return Dataset.from_tensors(np.zeros((n, 3), np.float32))

    assert Dataset.range(3).concatenate(Dataset.range(5)).element_spec == INT64
    assert rows(2).concatenate(rows(4)).element_spec == TensorSpec((None, 3), np.float32)
    assert rows(2).concatenate(rows(2)).element_spec == TensorSpec((2, 3), np.float32)
    assert rows(2).concatenate(Dataset.from_tensors(np.zeros(3, np.float32))).element_spec == \
        TensorSpec(None, np.float32)


def test_concatenate_of_incompatible_datasets_raises():
    with pytest.raises(TypeError, match="Incompatible dataset elements"):
        Dataset.range(3).concatenate(Dataset.from_tensors(1.0)).element_spec
    with pytest.raises(TypeError, match="Incompatible dataset elements"):
        Dataset.range(3).concatenate(Dataset.zip((Dataset.range(3), Dataset.range(3)))).element_spec
    pairs = Dataset.zip((Dataset.range(3), Dataset.range(3)))
    with pytest.raises(TypeError, match="Incompatible dataset elements"):
        pairs.concatenate(Dataset.zip(Point(Dataset.range(3), Dataset.range(3)))).element_spec


def test_interleave_and_flat_map_take_the_spec_of_the_returned_dataset(tmp_path):
    # Files that would raise DataLossError if read: the function is called, the datasets it returns are not read.
    for i in range(3):
        (tmp_path / f"train-{i}.tfrecord").write_bytes(b"not a tfrecord file")
    files = Dataset.list_files(str(tmp_path / "train-*.tfrecord"))
    assert files.interleave(TFRecordDataset, cycle_length=4).element_spec == STRING
    assert files.interleave(TFRecordDataset, cycle_length=4, num_parallel_calls=2).element_spec == STRING
    assert files.flat_map(TFRecordDataset).batch(8).element_spec == TensorSpec((None,), string)
    ds = Dataset.range(3).flat_map(lambda x: Dataset.from_tensors((x, np.zeros(2, np.float32))).repeat(2))
    assert ds.element_spec == (INT64, TensorSpec((2,), np.float32))


def test_interleave_function_must_return_a_dataset():
    with pytest.raises(TypeError, match="must return a Dataset"):
        Dataset.range(3).interleave(lambda x: x).element_spec


def test_a_node_that_does_not_say_is_inspected():
    class Squares(Dataset):
        def _iterator(self, ctx):
            return (np.int64(i * i) for i in range(3))

    assert Squares().element_spec == INT64
    assert Squares().batch(2).element_spec == TensorSpec((None,), np.int64)


def test_inspection_runs_a_copy_so_later_iteration_is_unchanged():
    def pipeline():
        return Dataset.range(50).shuffle(50, seed=7).map(lambda x: x + 1).repeat(2)

    expected = [int(x) for x in pipeline()]
    ds = pipeline()
    assert ds.element_spec == INT64  # reads the first element of a copy of the shuffle
    assert [int(x) for x in ds] == expected  # the shuffle's first epoch is still the first


def test_element_spec_does_not_change_the_serialized_pipeline():
    ds = Dataset.range(20).shuffle(20, seed=1).map(lambda x: x * 2)
    before = serialize_dataset(ds)
    assert ds.element_spec == INT64  # inspected
    assert serialize_dataset(ds) == before  # same bytes, same dataset id


def test_iterator_has_the_datasets_element_spec():
    ds = Dataset.range(10).batch(3, drop_remainder=True)
    it = iter(ds)
    assert it.element_spec == TensorSpec((3,), np.int64)
    assert ds.as_numpy_iterator().element_spec == TensorSpec((3,), np.int64)
    assert next(it).tolist() == [0, 1, 2]


@pytest.mark.parametrize("make", [
    lambda: Dataset.range(10).map(lambda x: (x, np.full((2, 2), x, np.float32), str(x))).batch(3),
    lambda: Dataset.from_tensor_slices({"a": np.arange(6), "b": [b"x"] * 6}).batch(4, drop_remainder=True).unbatch(),
    lambda: Dataset.range(1, 5).map(lambda x: np.arange(x)).padded_batch(2),
    lambda: Dataset.zip((Dataset.range(4), Dataset.range(4).map(lambda x: [x, x]))).enumerate(),
    lambda: Dataset.from_tensors(np.zeros((2, 2))).concatenate(Dataset.from_tensors(np.zeros((3, 2)))),
], ids=["map-batch", "slices-unbatch", "padded_batch", "zip-enumerate", "concatenate"])
def test_elements_fit_their_spec(make):
    assert_elements_fit(make())


# --- the static spec recorded at registration --------------------------------------------------

def test_the_static_spec_is_recorded_in_the_pipeline_definition():
    ds = Dataset.range(10).map(boom, output_signature=Point(INT64, TensorSpec((None, 3), np.float32))).batch(2)
    definition = pipeline_pb2.PipelineDef.FromString(serialize_dataset(ds))
    assert definition.HasField("element_spec")
    spec = specs.decode(definition.element_spec)
    assert spec == Point(TensorSpec((None,), np.int64), TensorSpec((None, None, 3), np.float32))
    assert type(spec).__name__ == "Point" and spec._fields == ("x", "y")


def test_registration_never_runs_the_pipeline():
    ds = Dataset.range(10).map(boom)
    definition = pipeline_pb2.PipelineDef.FromString(serialize_dataset(ds))
    assert not definition.HasField("element_spec")
    assert definition.element_spec_unknown == \
        "Dataset.map(boom) has no output_signature: its element_spec needs one element of its input"
    with pytest.raises(ValueError, match=r"not known without running its pipeline: Dataset.map\(boom\) has no "
                                         r"output_signature.*Pass element_spec= to from_dataset_id"):
        registered_element_spec(serialize_dataset(ds))


class _SpecRaises(Dataset):
    """A source whose spec cannot be computed (as a pipeline whose element_spec raises)."""

    def _iterator(self, ctx):
        return iter(())

    def _element_spec(self):
        raise TypeError("no spec for this source")


def test_static_spec_of_a_pipeline_whose_spec_raises_is_unknown_with_the_reason():
    spec, why = specs.static_element_spec(_SpecRaises().take(3))
    assert spec is None and why == "TypeError: no spec for this source"


@pytest.mark.parametrize("spec", [
    INT64,
    TensorSpec(None, np.float32, name="features"),
    (TensorSpec((None, 28, 28), np.uint8), STRING, TensorSpec((), object)),
    {"b": {"c": TensorSpec((3,), np.bool_)}, "a": (INT64,)},
    {7: TensorSpec((), np.dtype(">i4")), 3: {}},
    Point(INT64, Point(STRING, TensorSpec((2,), np.complex64))),
    (),
])
def test_encoding_round_trips(spec):
    decoded = specs.decode(pipeline_pb2.ElementSpecDef.FromString(specs.encode(spec).SerializeToString()))
    assert decoded == spec
    assert list(specs.structure.flatten(decoded)) == list(specs.structure.flatten(spec))
    if isinstance(spec, dict):
        assert list(decoded) == list(spec)  # the dict's own order


def test_what_cannot_be_encoded_is_recorded_as_unknown():
    ds = Dataset.from_generator(boom, output_signature={(1, 2): INT64})
    definition = pipeline_pb2.PipelineDef.FromString(serialize_dataset(ds))
    assert not definition.HasField("element_spec")
    assert "the dict key (1, 2) cannot be encoded" in definition.element_spec_unknown


# --- from_dataset_id and distribute ------------------------------------------------------------

@pytest.fixture(scope="module")
def one_worker():
    with TestCluster(num_workers=1) as cluster:
        yield cluster


def test_the_seed_example_works_as_written(one_worker):
    def run():
        dataset = Dataset.range(10)
        dataset_id = register_dataset(one_worker.target, dataset)
        dataset = from_dataset_id(processing_mode="parallel_epochs", service=one_worker.target,
                                  dataset_id=dataset_id, element_spec=dataset.element_spec)
        return dataset.element_spec, [int(x) for x in dataset.as_numpy_iterator()]

    assert run_with_deadline(run, DEADLINE_S) == (INT64, list(range(10)))


def test_from_dataset_id_learns_the_spec_from_the_dispatcher(one_worker):
    signature = {"x": TensorSpec((3,), np.float32), "y": INT64}

    def run():
        ds = Dataset.range(12).map(lambda i: {"x": np.full(3, i, np.float32), "y": i}, output_signature=signature)
        dataset_id = register_dataset(one_worker.target, ds.batch(4, drop_remainder=True))
        reader = from_dataset_id("distributed_epoch", one_worker.target, dataset_id)
        return reader.element_spec, iter(reader).element_spec, [b["y"].tolist() for b in reader]

    spec, iterator_spec, batches = run_with_deadline(run, DEADLINE_S)
    assert spec == iterator_spec == {"x": TensorSpec((4, 3), np.float32), "y": TensorSpec((4,), np.int64)}
    assert sorted(batches) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_from_dataset_id_with_a_chosen_id(one_worker):
    def run():
        register_dataset(one_worker.target, Dataset.list_files(__file__), dataset_id="spec-files")
        return from_dataset_id("parallel_epochs", one_worker.target, "spec-files").element_spec

    assert run_with_deadline(run, DEADLINE_S) == STRING


def test_from_dataset_id_never_unpickles_the_pipeline(one_worker):
    # A definition whose pickle no process could load: only the proto is read.
    spec = (TensorSpec((None, 224, 224, 3), np.uint8), INT64)
    blob = pipeline_pb2.PipelineDef(pipeline=b"\x80\x05 not a pickle", versions={"python": "0.0.0"},
                                    element_spec=specs.encode(spec)).SerializeToString(deterministic=True)

    def run():
        client = DispatcherClient(one_worker.dispatcher_address, timeout_ms=10_000)
        try:
            dataset_id = client.register_dataset(blob, -2)
        finally:
            client.close()
        return from_dataset_id("parallel_epochs", one_worker.target, dataset_id).element_spec

    assert run_with_deadline(run, DEADLINE_S) == spec


def test_from_dataset_id_says_why_a_spec_is_unknown(one_worker):
    def run():
        dataset_id = register_dataset(one_worker.target, Dataset.range(5).map(lambda x: x * 2))
        reader = from_dataset_id("parallel_epochs", one_worker.target, dataset_id)
        with pytest.raises(ValueError, match=r"Dataset.map\(.*<lambda>\) has no output_signature.*Pass "
                                             r"element_spec= to from_dataset_id"):
            reader.element_spec
        given = from_dataset_id("parallel_epochs", one_worker.target, dataset_id, element_spec=INT64)
        return given.element_spec, sorted(int(x) for x in given)

    assert run_with_deadline(run, DEADLINE_S) == (INT64, [0, 2, 4, 6, 8])


def test_from_dataset_id_checks_a_given_spec():
    with pytest.raises(TypeError, match="element_spec must be a TensorSpec or a tuple/dict of them, got a list"):
        from_dataset_id("parallel_epochs", "localhost:1", 1, element_spec=[INT64])
    with pytest.raises(TypeError, match="element_spec must be a TensorSpec"):
        from_dataset_id("parallel_epochs", "localhost:1", 1, element_spec=np.int64)


def test_a_distributed_dataset_has_its_inputs_spec_computed_locally():
    # No worker: a spec that needed the service would hang; the input's is computed in this process.
    def run():
        with TestCluster(num_workers=0) as cluster:
            ds = Dataset.range(10).map(lambda x: (x, str(x)))
            distributed = ds.apply(distribute("parallel_epochs", cluster.target))
            return distributed.element_spec, distributed.batch(2).element_spec

    assert run_with_deadline(run, DEADLINE_S) == ((INT64, STRING), (TensorSpec((None,), np.int64),
                                                                    TensorSpec((None,), string)))


def test_an_element_is_never_read_from_the_service_to_learn_a_spec():
    def run():
        with TestCluster(num_workers=0) as cluster:
            distributed = Dataset.range(10).apply(distribute("parallel_epochs", cluster.target))
            with pytest.raises(ValueError, match="reads from the service"):
                distributed.map(lambda x: x + 1).element_spec
            return distributed.map(boom, output_signature=INT64).element_spec

    assert run_with_deadline(run, DEADLINE_S) == INT64


def test_a_tfrecord_pipeline_spec_reaches_the_reader(one_worker, tmp_path):
    path = str(tmp_path / "a.tfrecord")
    with TFRecordWriter(path) as w:
        for i in range(5):
            w.write(b"record %d" % i)

    def run():
        dataset_id = register_dataset(one_worker.target, TFRecordDataset(path).batch(2))
        reader = from_dataset_id("parallel_epochs", one_worker.target, dataset_id)
        return reader.element_spec, sum(len(b) for b in reader)

    assert run_with_deadline(run, DEADLINE_S) == (TensorSpec((None,), string), 5)
