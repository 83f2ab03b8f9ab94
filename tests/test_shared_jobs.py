"""Readers of a shared job (``job_name``) share its elements first come first served, in proportion to
how fast their consumers take them, and reach its end at about the same time (issue 13): each reader
reads only a few round trips' worth ahead of its consumer (dataservice/client/read_ahead.py).

Each reader reads its own Dataset object on its own thread, as separate processes would. Its consumer's
speed is a sleep per element. Every test checks that each element arrives exactly once across readers."""

from __future__ import annotations

import threading
import time
import pytest

from dataservice import Dataset, distribute
from dataservice.client.reader import IterationReader
from dataservice.data.serialization import serialize_dataset
from dataservice.proto import state_pb2
from dataservice.service.dispatcher_client import DispatcherClient
from tests.cluster import TestCluster, run_with_deadline

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

#: The longest a test's readers may take together.
READ_DEADLINE_S = 30.0
_NOTHING = object()


def shared(cluster: TestCluster, n: int, job_name: str, mode: str = "distributed_epoch") -> Dataset:
    """A new Dataset object reading ``range(n)`` as one reader of the job ``job_name``."""
    return Dataset.range(n).apply(distribute(mode, cluster.target, job_name=job_name))


def read_concurrently(datasets: list, seconds_per_element: list, deadline_s: float = READ_DEADLINE_S,
                      ) -> list[list[int]]:
    """What each dataset's reader got, each read on its own thread, its consumer sleeping
    ``seconds_per_element[i]`` after each element. Every reader takes its first element, then waits
    for the others to have theirs, so that no reader starts reading much earlier than the others.

    Example::

        >>> a, b = read_concurrently([shared(cluster, 100, "j"), shared(cluster, 100, "j")], [0.001, 0.001])
    """
    got: list[list[int]] = [[] for _ in datasets]
    failures: list[BaseException] = []
    started = threading.Barrier(len(datasets), timeout=deadline_s)

    def read(i: int) -> None:
        try:
            iterator = iter(datasets[i])
            first = next(iterator, _NOTHING)
            if first is not _NOTHING:
                got[i].append(int(first))
            started.wait()
            for element in iterator:
                got[i].append(int(element))
                time.sleep(seconds_per_element[i])
        except BaseException as exc:  # handed to the test's thread
            failures.append(exc)
            started.abort()

    threads = [threading.Thread(target=read, args=(i,), name=f"reader-{i}", daemon=True)
               for i in range(len(datasets))]
    deadline = time.monotonic() + deadline_s
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = [thread.name for thread in threads if thread.is_alive()]
    assert not hung, f"readers {hung} still reading after {deadline_s} s (got {[len(g) for g in got]} elements)"
    if failures:
        raise failures[0]
    return got


def assert_exactly_once(got: list[list[int]], n: int, copies: int = 1) -> None:
    everything = sorted(x for elements in got for x in elements)
    assert everything == sorted(list(range(n)) * copies), \
        f"{len(everything)} elements, {len(set(everything))} distinct, expected range({n}) x {copies}"


def shares(got: list[list[int]]) -> list[float]:
    total = sum(len(elements) for elements in got)
    return [len(elements) / total for elements in got]


@pytest.fixture(scope="module")
def two_workers():
    with TestCluster(num_workers=2) as cluster:
        yield cluster


def test_two_equally_fast_readers_each_get_about_half(two_workers):
    n = 10_000
    got = read_concurrently([shared(two_workers, n, "equal"), shared(two_workers, n, "equal")], [0.0003, 0.0003])
    assert_exactly_once(got, n)
    assert all(0.4 <= share <= 0.6 for share in shares(got)), [len(g) for g in got]


def test_a_reader_twice_as_fast_gets_about_twice_as_much(two_workers):
    n = 3_000
    fast, slow = read_concurrently([shared(two_workers, n, "unequal"), shared(two_workers, n, "unequal")],
                                   [0.001, 0.002])
    assert_exactly_once([fast, slow], n)
    assert 1.4 <= len(fast) / max(1, len(slow)) <= 3.0, (len(fast), len(slow))


def test_eight_consumers_of_a_small_job_on_four_workers_all_get_some():
    # With a fixed read-ahead of 1,024 elements the first consumer took all 300.
    n = 300
    with TestCluster(num_workers=4) as cluster:
        got = read_concurrently([shared(cluster, n, "eight") for _ in range(8)], [0.005] * 8)
    assert_exactly_once(got, n)
    assert all(got), [len(g) for g in got]
    assert max(shares(got)) <= 0.35, [len(g) for g in got]


def test_two_readers_of_a_thousand_elements_alternating_on_one_thread(two_workers):
    # tf.data service's testSharedJobName: both readers deliver elements in turn; then each reads
    # on to the end. It used to be that the first request of reader 1 took all 1,000 elements.
    n = 1000

    def alternate() -> tuple[list[int], list[int]]:
        one, two = iter(shared(two_workers, n, "alternating")), iter(shared(two_workers, n, "alternating"))
        got_one: list[int] = []
        got_two: list[int] = []
        for _ in range(n // 5):
            got_one.append(int(next(one)))
            got_two.append(int(next(two)))
        got_one.extend(int(x) for x in one)
        got_two.extend(int(x) for x in two)
        return got_one, got_two

    got_one, got_two = run_with_deadline(alternate, READ_DEADLINE_S)
    assert len(got_one) >= n // 5 and len(got_two) >= n // 5
    assert_exactly_once([got_one, got_two], n)


def test_parallel_epochs_readers_of_a_shared_job_share_each_workers_epoch(two_workers):
    # Every worker produces the whole dataset once; the readers share all of it.
    n = 2_000
    got = read_concurrently([shared(two_workers, n, "parallel", "parallel_epochs"),
                             shared(two_workers, n, "parallel", "parallel_epochs")], [0.0003, 0.0003])
    assert_exactly_once(got, n, copies=2)
    assert all(0.3 <= share <= 0.7 for share in shares(got)), [len(g) for g in got]


def test_a_single_reader_still_reads_far_ahead_when_its_consumer_keeps_up(two_workers):
    # The read-ahead grows to max_outstanding_requests for a consumer faster than the service.
    limit, n = 512, 100_000
    dataset = Dataset.range(n)
    client = DispatcherClient(two_workers.dispatcher_address, timeout_ms=5_000)
    reader = None
    try:
        dataset_id = client.register_dataset(serialize_dataset(dataset), dataset.num_splits())
        job_id = client.get_or_create_job(dataset_id, state_pb2.DISTRIBUTED_EPOCH, "")
        reader = IterationReader(client, job_id, 0, max_outstanding_requests=limit)

        def consume() -> tuple[int, int]:
            count, most = 0, 0
            for _ in reader:
                count += 1
                most = max(most, reader._credits.read_ahead.limit)
            return count, most

        count, most = run_with_deadline(consume, READ_DEADLINE_S)
    finally:
        if reader is not None:
            reader.close()
        client.close()
    assert count == n
    assert most == limit
