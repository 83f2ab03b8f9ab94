"""User errors surface at the iterator with their type and message, chained, naming the
transformation; wrong arguments fail at construction naming the argument."""

import sys

import numpy as np
import pytest

import dataservice
from dataservice import Dataset, errors

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc


class ParseError(Exception):
    pass


class TwoArgError(Exception):
    def __init__(self, code, detail):
        super().__init__(f"{code}: {detail}")
        self.code = code


def fails_on(n, exc_type=ParseError):
    def bad_record(x):
        if x == n:
            raise exc_type(f"bad record {int(x)}")
        return x
    return bad_record


def collect_until_error(ds):
    out = []
    it = iter(ds)
    with pytest.raises(Exception) as info:
        for x in it:
            out.append(x)
    return out, info.value


MAP = "Dataset.map(fails_on.<locals>.bad_record)"


@pytest.mark.parametrize("name, build, where", [
    ("map", lambda f: Dataset.range(5).map(f), MAP),
    ("map_parallel", lambda f: Dataset.range(5).map(f, num_parallel_calls=2), MAP),
    ("map_nondeterministic", lambda f: Dataset.range(5).map(f, num_parallel_calls=2, deterministic=False),
     MAP),
    ("filter", lambda f: Dataset.range(5).filter(f), "Dataset.filter(fails_on.<locals>.bad_record)"),
    ("take_while", lambda f: Dataset.range(5).take_while(lambda x: f(x) >= 0), "Dataset.take_while"),
    ("flat_map", lambda f: Dataset.range(5).flat_map(lambda x: Dataset.from_tensors(f(x))), "Dataset.flat_map"),
    ("interleave", lambda f: Dataset.range(5).interleave(lambda x: Dataset.from_tensors(f(x)), cycle_length=2),
     "Dataset.interleave"),
    ("interleave_parallel",
     lambda f: Dataset.range(5).interleave(lambda x: Dataset.from_tensors(f(x)), cycle_length=2,
                                           num_parallel_calls=2), "Dataset.interleave"),
    ("from_generator", lambda f: Dataset.from_generator(lambda: (f(i) for i in range(5))),
     "Dataset.from_generator"),
    ("prefetched_map", lambda f: Dataset.range(5).map(f).prefetch(2), MAP),
    ("inner_map", lambda f: Dataset.range(5).flat_map(lambda x: Dataset.from_tensors(x).map(f)),
     MAP),
    ("batched_map", lambda f: Dataset.range(5).map(f).batch(2), MAP),
])
def test_user_error_keeps_type_and_message_and_names_the_transformation(name, build, where):
    with pytest.raises(ParseError) as info:
        list(build(fails_on(3)))
    err = info.value
    assert type(err) is ParseError
    assert "bad record 3" in str(err)
    assert where in str(err)
    assert isinstance(err.__cause__, ParseError) and str(err.__cause__) == "bad record 3"


def test_elements_before_the_error_are_delivered():
    out, err = collect_until_error(Dataset.range(5).map(fails_on(3)))
    assert out == [0, 1, 2]
    assert isinstance(err, ParseError)


def test_builtin_exception_types_are_kept():
    with pytest.raises(ZeroDivisionError, match="Dataset.map"):
        list(Dataset.range(3).map(lambda x: 1 // 0))
    with pytest.raises(KeyError, match="missing"):
        list(Dataset.from_tensors({"a": 1}).map(lambda d: d["missing"]))
    with pytest.raises(TypeError, match=r"Dataset\.map"):
        list(Dataset.range(3).map(lambda a, b: a))  # scalars are not unpacked


def test_exception_that_cannot_be_rebuilt_is_raised_as_is():
    def raises_two_arg(x):
        raise TwoArgError(7, "corrupt")

    with pytest.raises(TwoArgError) as info:
        list(Dataset.range(3).map(raises_two_arg))
    assert info.value.code == 7
    assert "7: corrupt" in str(info.value)
    if sys.version_info >= (3, 11):
        assert any("Dataset.map(" in note and "raises_two_arg)" in note for note in info.value.__notes__)


def test_error_in_generator_creation():
    def broken():
        raise OSError("cannot open source")

    with pytest.raises(OSError, match="cannot open source.*Dataset.from_generator"):
        list(Dataset.from_generator(broken))


def test_a_pipeline_can_be_iterated_again_after_an_error():
    ds = Dataset.range(5).map(fails_on(3))
    with pytest.raises(ParseError):
        list(ds)
    assert list(ds.take(3)) == [0, 1, 2]


# --- argument validation at construction --------------------------------------------

@pytest.mark.parametrize("build, argument", [
    (lambda: Dataset.range(5).batch(0), "batch_size"),
    (lambda: Dataset.range(5).batch(-2), "batch_size"),
    (lambda: Dataset.range(5).padded_batch(0), "batch_size"),
    (lambda: Dataset.range(5).shuffle(0), "buffer_size"),
    (lambda: Dataset.range(5).shuffle(-1), "buffer_size"),
    (lambda: Dataset.range(5).shuffle(-3), "buffer_size"),
    (lambda: Dataset.range(5).shard(0, 0), "num_shards"),
    (lambda: Dataset.range(5).shard(2, 2), "index"),
    (lambda: Dataset.range(5).shard(2, -1), "index"),
    (lambda: Dataset.range(5).prefetch(-5), "buffer_size"),
    (lambda: Dataset.range(5).map(lambda x: x, num_parallel_calls=0), "num_parallel_calls"),
    (lambda: Dataset.range(5).map(lambda x: x, num_parallel_calls=-3), "num_parallel_calls"),
    (lambda: Dataset.range(5).interleave(Dataset.from_tensors, cycle_length=0), "cycle_length"),
    (lambda: Dataset.range(5).interleave(Dataset.from_tensors, cycle_length=2, block_length=0), "block_length"),
    (lambda: Dataset.range(5).interleave(Dataset.from_tensors, cycle_length=2, num_parallel_calls=0),
     "num_parallel_calls"),
    (lambda: dataservice.shuffle_and_repeat(0), "buffer_size"),
])
def test_wrong_values_raise_invalid_argument_error_naming_the_argument(build, argument):
    # tf.data's InvalidArgumentError, which is a ValueError here.
    with pytest.raises(errors.InvalidArgumentError, match=argument):
        build()


@pytest.mark.parametrize("build", [
    lambda: Dataset.range(5).shuffle(4, seed=-1),
    lambda: Dataset.range(5).shuffle(-2),
    lambda: Dataset.range(5).repeat(-2),
    lambda: Dataset.range(5).take(-2),
    lambda: Dataset.range(5).skip(-3),
    lambda: Dataset.range(5).prefetch(0),
    lambda: Dataset.range(5).prefetch(-1),
    lambda: dataservice.shuffle_and_repeat(4, count=-2),
    lambda: dataservice.shuffle_and_repeat(4, seed=-2),
])
def test_values_tensorflow_accepts_are_accepted(build):
    assert build() is not None


@pytest.mark.parametrize("build, argument", [
    (lambda: Dataset.range(5).map(3), "map_func"),
    (lambda: Dataset.range(5).filter(None), "predicate"),
    (lambda: Dataset.range(5).take_while("x"), "predicate"),
    (lambda: Dataset.range(5).flat_map(None), "map_func"),
    (lambda: Dataset.range(5).interleave(None), "map_func"),
    (lambda: Dataset.range(5).reduce(0, None), "reduce_func"),
])
def test_functions_that_are_not_callable_raise_value_error(build, argument):
    # ValueError, as tf.data's "Argument `func` must be a callable".
    with pytest.raises(ValueError, match=argument):
        build()


@pytest.mark.parametrize("build, argument", [
    (lambda: Dataset.range(5).batch(2.5), "batch_size"),
    (lambda: Dataset.range(5).batch(True), "batch_size"),
    (lambda: Dataset.range(5).take("3"), "count"),
    (lambda: Dataset.range(5).shuffle(None), "buffer_size"),
    (lambda: Dataset.range(5).enumerate(start=1.5), "start"),
    (lambda: Dataset.range(5).shuffle(4, seed=1.5), "seed"),
    (lambda: Dataset.range(5).prefetch(1.5), "buffer_size"),
])
def test_wrong_types_raise_type_error_naming_the_argument(build, argument):
    with pytest.raises(TypeError, match=argument):
        build()


def test_numpy_integers_are_accepted_as_counts():
    assert [b.tolist() for b in Dataset.range(5).batch(np.int64(2))] == [[0, 1], [2, 3], [4]]
    assert list(Dataset.range(5).take(np.int32(2))) == [0, 1]
