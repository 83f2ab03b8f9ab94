"""Parallel map and interleave: order kept by default, same multiset when nondeterministic.

Timing is forced with events, never sleeps: each wait is bounded by WAIT and only
ever reaches it when the behaviour under test is broken.
"""

import threading

import pytest

from dataservice import AUTOTUNE, Dataset, Options
from tests.elements import ints

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc

WAIT = 10


def pool(size):
    o = Options()
    o.threading.private_threadpool_size = size
    return o


@pytest.mark.parametrize("parallelism", [1, 2, 4, AUTOTUNE])
def test_parallel_map_keeps_order(parallelism):
    ds = Dataset.range(500).map(lambda x: x * 3, num_parallel_calls=parallelism)
    assert ints(ds) == [3 * i for i in range(500)]


def test_parallel_map_keeps_order_when_calls_finish_in_reverse():
    done = [threading.Event() for _ in range(5)]
    waited_ok = []

    def f(x):
        if x < 3:  # the first four run together (num_parallel_calls=4): 3, 2, 1, 0 finish in turn
            waited_ok.append(done[x + 1].wait(WAIT))
        done[x].set()
        return x

    ds = Dataset.range(5).map(f, num_parallel_calls=4).with_options(pool(4))
    assert ints(ds) == [0, 1, 2, 3, 4]
    assert waited_ok == [True, True, True]


def test_parallel_map_tuple_elements_are_unpacked():
    ds = Dataset.zip((Dataset.range(50), Dataset.range(50))).map(lambda a, b: a * b, num_parallel_calls=3)
    assert ints(ds) == [i * i for i in range(50)]


def test_nondeterministic_map_yields_the_same_multiset():
    ds = Dataset.range(300).map(lambda x: x % 17, num_parallel_calls=4, deterministic=False)
    assert sorted(ints(ds)) == sorted(i % 17 for i in range(300))


def test_nondeterministic_map_does_not_wait_for_a_slow_element():
    release = threading.Event()

    def f(x):
        if x == 0:
            release.wait(WAIT)
        return x

    it = iter(Dataset.range(6).map(f, num_parallel_calls=3, deterministic=False).with_options(pool(3)))
    first = int(next(it))
    release.set()
    assert first != 0
    assert sorted([first] + ints(it)) == list(range(6))


def test_abandoned_parallel_map_does_not_hang():
    ds = Dataset.range(10 ** 9).map(lambda x: x + 1, num_parallel_calls=4)
    assert ints(ds.take(3)) == [1, 2, 3]
    it = iter(ds)
    assert int(next(it)) == 1
    it.close()


INTERLEAVE_DOC_EXPECTED = [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 3, 3, 4, 4,
                           5, 5, 5, 5, 5, 5]


@pytest.mark.parametrize("parallelism", [1, 2, AUTOTUNE])
def test_parallel_interleave_keeps_the_documented_order(parallelism):
    ds = Dataset.range(1, 6).interleave(lambda x: Dataset.from_tensors(x).repeat(6), cycle_length=2,
                                       block_length=4, num_parallel_calls=parallelism)
    assert ints(ds) == INTERLEAVE_DOC_EXPECTED


def test_parallel_interleave_matches_sequential_with_uneven_inputs():
    def fn(x):
        return Dataset.range(x * 10, x * 10 + x % 4).map(lambda v: v + 1)

    sequential = Dataset.range(20).interleave(fn, cycle_length=3, block_length=2)
    parallel = Dataset.range(20).interleave(fn, cycle_length=3, block_length=2, num_parallel_calls=3)
    assert ints(parallel) == ints(sequential)


def test_nondeterministic_interleave_yields_the_same_multiset():
    fn = lambda x: Dataset.range(x)  # noqa: E731
    ds = Dataset.range(30).interleave(fn, cycle_length=4, num_parallel_calls=4, deterministic=False)
    assert sorted(ints(ds)) == sorted(v for x in range(30) for v in range(x))


def test_nondeterministic_interleave_skips_a_slot_that_is_not_ready():
    release = threading.Event()
    second_buffered = threading.Event()

    def source(x):
        def slow():
            yield 0
            release.wait(WAIT)  # the second element of input 0 is late
            yield 1

        def fast():
            yield 10
            yield 11
            second_buffered.set()  # runs when 11 has been handed to the reader
            yield 12

        return Dataset.from_generator(slow if x == 0 else fast)

    ds = Dataset.range(2).interleave(source, cycle_length=2, block_length=1, num_parallel_calls=2,
                                     deterministic=False)
    it = iter(ds)
    assert [int(next(it)), int(next(it))] == [0, 10]
    assert second_buffered.wait(WAIT)
    third = int(next(it))
    release.set()
    assert third == 11  # not blocked behind input 0's late element
    assert sorted([0, 10, third] + ints(it)) == [0, 1, 10, 11, 12]


def test_deterministic_option_false_applies_to_interleave():
    fn = lambda x: Dataset.from_tensors(x).repeat(3)  # noqa: E731
    o = Options()
    o.deterministic = False
    ds = Dataset.range(10).interleave(fn, cycle_length=3, num_parallel_calls=3).with_options(o)
    assert sorted(ints(ds)) == sorted(list(range(10)) * 3)


def test_abandoned_parallel_interleave_does_not_hang():
    ds = Dataset.range(10 ** 9).interleave(lambda x: Dataset.range(10 ** 9), cycle_length=3,
                                           num_parallel_calls=3)
    assert ints(ds.take(4)) == [0, 0, 0, 1]
