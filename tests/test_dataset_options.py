"""dataservice.Options: setting, merging, and their effect on the executor."""

import threading

import pytest

from dataservice import AUTOTUNE, Dataset, Options, ThreadingOptions
from dataservice.data import dataset as dataset_module

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc

WAIT = 10  # seconds; a bound for waits that a correct executor satisfies at once


def options(deterministic=None, pool=None, intra=None):
    o = Options()
    o.deterministic = deterministic
    o.threading.private_threadpool_size = pool
    o.threading.max_intra_op_parallelism = intra
    return o


def test_defaults():
    o = Dataset.range(3).options()
    assert o == Options()
    assert o.deterministic is None
    assert o.threading.private_threadpool_size is None
    assert o.threading.max_intra_op_parallelism is None


def test_with_options_sets_and_later_settings_win():
    ds = Dataset.range(3).with_options(options(deterministic=False, pool=4))
    assert ds.options().deterministic is False
    assert ds.options().threading.private_threadpool_size == 4
    ds = ds.with_options(options(deterministic=True, intra=2))
    merged = ds.options()
    assert merged.deterministic is True  # the later value wins
    assert merged.threading.private_threadpool_size == 4  # unset later: the earlier value stays
    assert merged.threading.max_intra_op_parallelism == 2


def test_options_propagate_downstream():
    ds = Dataset.range(3).with_options(options(deterministic=False)).map(lambda x: x).batch(2).prefetch(1)
    assert ds.options().deterministic is False
    assert [b.tolist() for b in ds] == [[0, 1], [2]]


def test_options_of_several_inputs_merge():
    a = Dataset.range(3).with_options(options(pool=3))
    b = Dataset.range(3).with_options(options(deterministic=False, pool=5))
    zipped = Dataset.zip(a, b).options()
    assert zipped.deterministic is False
    assert zipped.threading.private_threadpool_size == 5  # the later input wins
    assert a.concatenate(Dataset.range(2)).options().threading.private_threadpool_size == 3


def test_merge_returns_a_new_object():
    a, b = options(deterministic=True, pool=2), options(intra=1)
    merged = a.merge(b)
    assert merged is not a and merged is not b
    assert (merged.deterministic, merged.threading.private_threadpool_size,
            merged.threading.max_intra_op_parallelism) == (True, 2, 1)
    assert a.threading.max_intra_op_parallelism is None and b.deterministic is None


def test_options_validation():
    o = Options()
    with pytest.raises(AttributeError, match="no option"):
        o.experimental_foo = 1
    with pytest.raises(TypeError, match="deterministic"):  # tf.data's kinds: TypeError for a type
        o.deterministic = "yes"
    with pytest.raises(TypeError, match="private_threadpool_size"):
        o.threading.private_threadpool_size = 1.5
    with pytest.raises(ValueError, match="private_threadpool_size"):
        o.threading.private_threadpool_size = 0
    with pytest.raises(ValueError, match="max_intra_op_parallelism"):
        o.threading.max_intra_op_parallelism = -1
    with pytest.raises(AttributeError):
        o.threading.foo = 1
    with pytest.raises(TypeError, match="threading"):
        o.threading = {"private_threadpool_size": 2}
    o.threading = ThreadingOptions(private_threadpool_size=2)
    assert o.threading.private_threadpool_size == 2
    with pytest.raises(TypeError, match="Options"):
        Dataset.range(3).with_options({"deterministic": False})


# --- the executor honours them ------------------------------------------------------

class Concurrency:
    """Records how many calls run at once and on which threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.active = 0
        self.peak = 0
        self.threads = set()

    def __enter__(self):
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.threads.add(threading.get_ident())

    def __exit__(self, *exc):
        with self.lock:
            self.active -= 1


def test_parallel_map_runs_calls_concurrently():
    barrier = threading.Barrier(4, timeout=WAIT)

    def f(x):
        if x < 4:
            barrier.wait()  # passes only when 4 calls run at the same time
        return x * 2

    ds = Dataset.range(10).map(f, num_parallel_calls=4).with_options(options(pool=4))
    assert list(ds) == [2 * i for i in range(10)]


def test_private_threadpool_size_bounds_the_threads(monkeypatch):
    # Without the option the pool would have 8 threads, whatever this machine has.
    monkeypatch.setattr(dataset_module, "default_parallelism", lambda: 8)
    seen = Concurrency()

    def f(x):
        with seen:
            return x

    ds = Dataset.range(200).map(f, num_parallel_calls=8).with_options(options(pool=2))
    assert list(ds) == list(range(200))
    assert 1 <= len(seen.threads) <= 2
    assert seen.peak <= 2


def read_ahead(ds, pulled):
    """The most elements the pipeline had pulled from its source beyond those it yielded."""
    most = 0
    for k, _ in enumerate(ds):
        most = max(most, len(pulled) - (k + 1))
    return most


def counted_source(pulled, n=100):
    def gen():
        for i in range(n):
            pulled.append(i)
            yield i
    return Dataset.from_generator(gen)


def test_max_intra_op_parallelism_bounds_calls_in_flight():
    pulled = []
    uncapped = counted_source(pulled).map(lambda x: x, num_parallel_calls=8).with_options(options(pool=8))
    assert read_ahead(uncapped, pulled) == 7  # 8 calls in flight: 7 beyond the one yielded

    pulled = []
    capped = counted_source(pulled).map(lambda x: x, num_parallel_calls=8).with_options(options(pool=8, intra=2))
    assert read_ahead(capped, pulled) == 1

    pulled = []
    sequential = counted_source(pulled).map(lambda x: x, num_parallel_calls=8).with_options(options(intra=1))
    assert read_ahead(sequential, pulled) == 0


def test_deterministic_option_false_lets_parallel_map_reorder():
    release = threading.Event()

    def f(x):
        if x == 0:
            release.wait(WAIT)  # element 0 is slow until the consumer has seen another one
        return x

    ds = Dataset.range(8).map(f, num_parallel_calls=4).with_options(options(deterministic=False, pool=4))
    it = iter(ds)
    first = next(it)
    release.set()
    rest = list(it)
    assert first != 0
    assert sorted([first] + rest) == list(range(8))


def test_explicit_deterministic_argument_overrides_the_option():
    third_done = threading.Event()

    def f(x):
        if x == 0:
            assert third_done.wait(WAIT)  # element 0 finishes after element 3
        if x == 3:
            third_done.set()
        return x

    order_kept = Dataset.range(50).map(f, num_parallel_calls=4, deterministic=True).with_options(
        options(deterministic=False, pool=4))
    assert list(order_kept) == list(range(50))


def test_autotune_parallelism_with_options():
    ds = Dataset.range(100).map(lambda x: x + 1, num_parallel_calls=AUTOTUNE).with_options(options(pool=3))
    assert list(ds) == list(range(1, 101))


# --- issue 16: tf.data's spellings, equality, read-only options() ------------------------------

def test_experimental_spellings_name_the_same_options():
    o = Options()
    o.experimental_deterministic = False
    o.experimental_threading.private_threadpool_size = 3
    assert o.deterministic is False and o.threading.private_threadpool_size == 3
    assert o.experimental_threading is o.threading
    o.experimental_threading = ThreadingOptions(max_intra_op_parallelism=2)
    assert o.threading.max_intra_op_parallelism == 2 and o.threading.private_threadpool_size is None


def test_equality_compares_values_and_options_are_unhashable():
    a, b = options(deterministic=False, pool=4), Options()
    b.experimental_deterministic = False
    b.experimental_threading.private_threadpool_size = 4
    assert a == b and not a != b
    assert a != Options() and Options() == Options() and (a == 5) is False
    with pytest.raises(TypeError):
        hash(a)


def test_options_returned_by_a_dataset_refuse_changes():
    ds = Dataset.range(3).with_options(options(deterministic=False))
    with pytest.raises(ValueError, match="with_options"):
        ds.options().deterministic = True
    with pytest.raises(ValueError, match="with_options"):
        ds.options().experimental_threading.private_threadpool_size = 2
    assert ds.options().deterministic is False
    copy = ds.options().merge(Options())  # a merge is a new, changeable Options
    copy.deterministic = True
    assert copy.deterministic is True and ds.options().deterministic is False


def test_merge_refuses_what_is_not_options():
    with pytest.raises(TypeError, match="Options"):
        Options().merge({"deterministic": False})


def test_options_absent_from_tf_data_are_refused_not_ignored():
    o = Options()
    for name in ("experimental_optimization", "experimental_slack", "autotune", "experimental_external_state_policy"):
        with pytest.raises(AttributeError, match="no option"):
            setattr(o, name, None)
    with pytest.raises(AttributeError, match="no option"):
        o.experimental_distribute.auto_shard_policy = 1


def test_deterministic_false_lets_a_slow_element_be_overtaken():
    # The option acts: with it, a parallel map yields finished elements while the first is still running.
    release = threading.Event()

    def f(x):
        if x == 0:
            assert release.wait(WAIT)
        return x

    o = Options()
    o.experimental_deterministic = False
    it = iter(Dataset.range(4).map(f, num_parallel_calls=4).with_options(o))
    first = [next(it) for _ in range(3)]
    release.set()
    assert sorted(first) == [1, 2, 3] and list(it) == [0]
