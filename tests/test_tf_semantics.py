"""tf.data service semantics that training loops rely on (issue 13): repeat over a drained shared
iteration, a garbage-collected job name recreated, nondeterministic interleave in completion order,
the cardinality of a distributed dataset, and zip/concatenate in distributed_epoch.

Each scenario is one of tf.data service's own, rewritten for our API. Shared-job balance is in
tests/test_shared_jobs.py, element_spec in tests/test_element_spec.py, string dataset ids in
tests/test_dataset_ids.py, pipelines spanning splits in tests/test_split_groups.py.
"""

from __future__ import annotations

import collections
import time

import pytest

from dataservice import Dataset, distribute, from_dataset_id, register_dataset
from dataservice.data.dataset import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY
from tests.cluster import TestCluster, run_with_deadline, wait_until
from tests.elements import ints

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


def shared(target: str, name: str, n: int = 20) -> Dataset:
    return Dataset.range(n).apply(distribute("distributed_epoch", target, job_name=name, timeout_ms=20_000))


# --- repeat over a drained iteration --------------------------------------------------------------

def test_repeat_count_goes_on_past_an_iteration_another_reader_drained(cluster):
    # Reader A takes the whole of the job's first iteration; reader B's repeat(2) then finds its first
    # iteration empty. As in tf, repeat(count) never stops early: B goes on to the next iteration.
    assert sorted(run_with_deadline(lambda: ints(shared(cluster.target, "drained")), 30)) == list(range(20))
    got = run_with_deadline(lambda: ints(shared(cluster.target, "drained").repeat(2)), 30)
    assert sorted(got) == list(range(20))


def test_repeat_forever_over_the_service_goes_on_past_an_empty_iteration(cluster):
    assert sorted(run_with_deadline(lambda: ints(shared(cluster.target, "forever")), 30)) == list(range(20))
    got = run_with_deadline(lambda: ints(shared(cluster.target, "forever").repeat().take(20)), 30)
    assert sorted(got) == list(range(20))


def _alternately_empty():
    """A generator factory whose odd calls yield nothing: epochs 1, 3, ... of a repeat are empty."""
    calls = collections.Counter()

    def gen():
        calls["n"] += 1
        if calls["n"] % 2 == 0:
            yield from range(3)
    return gen


def test_local_repeat_count_does_not_stop_at_an_empty_epoch_and_repeat_forever_does():
    assert ints(Dataset.from_generator(_alternately_empty()).repeat(4)) == [0, 1, 2, 0, 1, 2]
    # repeat() of something that reads no service ends at its first empty epoch (or it would spin).
    assert ints(Dataset.from_generator(_alternately_empty()).repeat()) == []
    assert ints(Dataset.range(0).repeat(3)) == []


# --- a garbage-collected job name ------------------------------------------------------------------

def test_a_garbage_collected_named_job_is_created_again_under_its_name():
    # tf's testGcAndRecreate: the same job name read, abandoned and garbage collected, three times over.
    with TestCluster(num_workers=1, job_gc_timeout_ms=300, job_gc_check_interval_ms=100,
                     client_timeout_ms=2_000) as gc_cluster:
        core = gc_cluster.dispatcher.core
        dataset = Dataset.range(50).apply(distribute("distributed_epoch", gc_cluster.target, job_name="collected",
                                                     max_outstanding_requests=1, timeout_ms=20_000))
        for round_ in range(1, 4):
            iterator = iter(dataset)
            assert 0 <= int(next(iterator)) < 50
            iterator.close()  # the reader leaves after one element: nobody reads the job now
            wait_until(lambda: sum(kind == "prune_job" for kind, _ in core.events) >= round_, 15,
                       f"the job to be collected (round {round_})")
            wait_until(lambda: not gc_cluster.workers[0].task_ids, 15, "the worker to drop the job's task")
        # A new reader under the name gets a fresh job: the whole dataset, no NotFoundError ...
        again = Dataset.range(50).apply(distribute("distributed_epoch", gc_cluster.target, job_name="collected",
                                                   timeout_ms=20_000))
        assert sorted(run_with_deadline(lambda: ints(again), 30)) == list(range(50))
        # ... and so does the first dataset object, iterated again (its next repetition).
        assert sorted(run_with_deadline(lambda: ints(dataset), 30)) == list(range(50))


# --- nondeterministic interleave ---------------------------------------------------------------------

def _inputs_with_a_slow_first(i):
    if i == 0:
        return Dataset.range(3).map(lambda x: (time.sleep(0.3), x + 100)[1])
    return Dataset.range(i * 10, i * 10 + 5)


def test_nondeterministic_interleave_takes_elements_in_completion_order():
    fast = sorted(i * 10 + k for i in range(1, 4) for k in range(5))
    ds = Dataset.range(4).interleave(_inputs_with_a_slow_first, cycle_length=4, num_parallel_calls=4,
                                     deterministic=False)
    got = run_with_deadline(lambda: ints(ds), 30)
    assert sorted(got) == sorted(fast + [100, 101, 102])
    # The slow input's first element takes 0.3 s: every fast input's elements come before it.
    assert sorted(got[:15]) == fast, got


def test_deterministic_interleave_keeps_the_cycle_order_with_the_whole_cycle_open():
    ds = Dataset.range(4).interleave(_inputs_with_a_slow_first, cycle_length=4, block_length=2,
                                     num_parallel_calls=4, deterministic=True)
    sequential = Dataset.range(4).interleave(_inputs_with_a_slow_first, cycle_length=4, block_length=2)
    assert run_with_deadline(lambda: ints(ds), 30) == ints(sequential)


def _fails_on_two(i):
    if i == 2:
        raise KeyError("input 2")
    return Dataset.range(i * 10, i * 10 + 3)


@pytest.mark.parametrize("deterministic", [True, False])
def test_an_interleave_function_error_reaches_the_consumer(deterministic):
    ds = Dataset.range(4).interleave(_fails_on_two, cycle_length=4, num_parallel_calls=2,
                                     deterministic=deterministic)
    with pytest.raises(KeyError, match="input 2"):
        run_with_deadline(lambda: ints(ds), 30)


# --- cardinality -------------------------------------------------------------------------------------------

def test_cardinality_of_a_distributed_dataset_follows_tf(cluster):
    def card(ds: Dataset, mode: str = "distributed_epoch") -> int:
        return ds.apply(distribute(mode, cluster.target)).cardinality()

    assert card(Dataset.range(10).repeat()) == INFINITE_CARDINALITY
    assert card(Dataset.range(10).repeat(), "parallel_epochs") == INFINITE_CARDINALITY
    assert card(Dataset.range(0)) == 0
    # Known locally, but not through the service: how many a reader gets depends on workers and readers.
    assert card(Dataset.range(10)) == UNKNOWN_CARDINALITY
    assert card(Dataset.range(10), "parallel_epochs") == UNKNOWN_CARDINALITY
    # from_dataset_id learns it from what the dispatcher recorded at registration (another process, typically).
    for registered, expected in ((Dataset.range(10).repeat(), INFINITE_CARDINALITY), (Dataset.range(0), 0),
                                 (Dataset.range(10), UNKNOWN_CARDINALITY)):
        dataset_id = register_dataset(cluster.target, registered)
        assert from_dataset_id("distributed_epoch", cluster.target, dataset_id).cardinality() == expected
        # and what follows it computes with it, as tf.data does
        assert from_dataset_id("parallel_epochs", cluster.target, dataset_id).batch(4).cardinality() == expected


# --- zip and concatenate in distributed_epoch ------------------------------------------------------

def test_zip_of_splittable_datasets_is_splittable_and_pairs_exactly(cluster):
    n = 3_000
    features = Dataset.range(n)
    labels = Dataset.range(n).map(lambda x: x * 2)
    zipped = Dataset.zip((features, labels))
    assert zipped.num_splits() == features.num_splits()
    got = run_with_deadline(lambda: [(int(a), int(b)) for a, b in zipped.apply(
        distribute("distributed_epoch", cluster.target, timeout_ms=20_000))], 60)
    assert sorted(got) == [(i, 2 * i) for i in range(n)]


def test_concatenate_of_splittable_datasets_reads_each_element_once(cluster):
    first, second = Dataset.range(1_000), Dataset.range(10_000, 12_000)
    both = first.concatenate(second)
    assert both.num_splits() == first.num_splits() + second.num_splits()
    got = run_with_deadline(lambda: ints(both.apply(distribute("distributed_epoch", cluster.target,
                                                                 timeout_ms=20_000))), 60)
    assert sorted(got) == list(range(1_000)) + list(range(10_000, 12_000))
    # Locally, a pass over every split is the concatenation, in order, and so is one over two epochs.
    assert ints(both.iterate_splits(range(both.num_splits()))) == ints(both)
    twice = both.repeat(2)
    assert ints(twice.iterate_splits(range(2 * both.num_splits()))) == ints(both) * 2


def test_zip_or_concatenate_with_an_unsplittable_input_names_it(cluster):
    from dataservice import errors

    def gen():
        yield 1

    for ds in (Dataset.zip((Dataset.range(3), Dataset.from_generator(gen))),
               Dataset.range(3).concatenate(Dataset.from_generator(gen))):
        with pytest.raises(errors.NotSplittableError, match="from_generator"):
            ds.apply(distribute("distributed_epoch", cluster.target))
