"""The tf.data service API end to end on a real in-process cluster: the documented
examples, register_dataset/from_dataset_id (also across processes), and job names."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from dataservice import Dataset, ShardingPolicy, distribute, errors, from_dataset_id, register_dataset
from dataservice.proto import dispatcher_pb2 as pb
from tests.cluster import TestCluster, wait_until
from tests.elements import ints

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A background thread (fetcher, heartbeat, task) dying of an exception fails the test.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


def read_in_threads(datasets, timeout_s: float = 20.0) -> list[list[int]]:
    """Iterates each dataset on its own thread, all at once; the elements each thread read."""
    results: list = [None] * len(datasets)
    errors_seen: list = []
    start = threading.Barrier(len(datasets))

    def read(i):
        try:
            start.wait()
            results[i] = ints(datasets[i])
        except BaseException as exc:  # reported below, in the test's thread
            errors_seen.append(exc)

    threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(datasets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
        assert not t.is_alive(), "a reader hung"
    if errors_seen:
        raise errors_seen[0]
    return results


# --- the documented examples ---------------------------------------------------------------

def test_parallel_epochs_with_two_workers_gives_every_element_twice(cluster):
    dataset = Dataset.range(10).apply(distribute(processing_mode="parallel_epochs", service=cluster.target))
    assert sorted(ints(dataset)) == sorted(list(range(10)) * 2)


def test_distributed_epoch_with_two_workers_gives_every_element_once(cluster):
    dataset = Dataset.range(10).apply(distribute(processing_mode="distributed_epoch", service=cluster.target))
    assert sorted(ints(dataset)) == list(range(10))


def test_distributed_epoch_over_many_splits_uses_both_workers(cluster):
    dataset = Dataset.range(20_000).apply(distribute(ShardingPolicy.DYNAMIC, cluster.target))
    assert sorted(ints(dataset)) == list(range(20_000))


def test_sharding_policy_off_is_parallel_epochs(cluster):
    dataset = Dataset.range(5).apply(distribute(ShardingPolicy.OFF, cluster.target))
    assert sorted(ints(dataset)) == sorted(list(range(5)) * 2)


def test_map_before_distribute_runs_on_workers_and_after_runs_locally(cluster):
    dataset = Dataset.range(5)
    dataset = dataset.map(lambda x: x * x)
    dataset = dataset.apply(distribute("parallel_epochs", cluster.target))
    dataset = dataset.map(lambda x: x + 1)
    assert sorted(ints(dataset)) == [1, 1, 2, 2, 5, 5, 10, 10, 17, 17]


def test_functions_after_distribute_are_never_shipped(cluster):
    # A lock cannot be pickled: if the map after distribute were sent to the
    # workers, registering the pipeline would fail.
    lock = threading.Lock()

    def add_one(x):
        with lock:
            return x + 1

    dataset = Dataset.range(3).apply(distribute("parallel_epochs", cluster.target)).map(add_one)
    assert sorted(ints(dataset)) == [1, 1, 2, 2, 3, 3]


def test_dispatcher_target_without_scheme_works_as_a_worker_address(cluster):
    address = cluster.dispatcher.target.split("://")[1]
    dataset = Dataset.range(4).apply(distribute("parallel_epochs", address))
    assert sorted(ints(dataset)) == [0, 0, 1, 1, 2, 2, 3, 3]


# --- register_dataset and from_dataset_id ---------------------------------------------------

def test_register_dataset_then_from_dataset_id(cluster):
    dataset = Dataset.range(10)
    dataset_id = register_dataset(cluster.target, dataset)
    assert isinstance(dataset_id, int) and dataset_id > 0
    read = from_dataset_id(processing_mode="parallel_epochs", service=cluster.target, dataset_id=dataset_id,
                           element_spec=None)
    assert sorted(ints(read)) == sorted(list(range(10)) * 2)
    read = from_dataset_id("distributed_epoch", cluster.target, dataset_id)
    assert sorted(ints(read)) == list(range(10))


def test_same_pipeline_registered_twice_gets_the_same_id(cluster):
    def square(x):
        return x * x

    dataset = Dataset.range(10).map(square)
    first = register_dataset(cluster.target, dataset)
    assert register_dataset(cluster.target, dataset) == first
    # An equal pipeline built again serializes to the same bytes: the same id.
    assert register_dataset(cluster.target, Dataset.range(10).map(square)) == first
    others = {register_dataset(cluster.target, Dataset.range(11).map(square)),
              register_dataset(cluster.target, Dataset.range(10)),
              register_dataset(cluster.target, Dataset.range(10).map(lambda x: x + 1))}
    assert first not in others and len(others) == 3


_SUBPROCESS_READER = r"""
import json, sys
from dataservice import from_dataset_id
target, dataset_id = sys.argv[1], int(sys.argv[2])
dataset = from_dataset_id("distributed_epoch", target, dataset_id, timeout_ms=20000)
print(json.dumps(sorted(int(x) for x in dataset)))
"""


@pytest.mark.slow
def test_from_dataset_id_in_another_process(cluster):
    # The pipeline holds a closure: the other process runs nothing of it, the workers do.
    offset = 100
    dataset_id = register_dataset(cluster.target, Dataset.range(50).map(lambda x: x + offset))
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _SUBPROCESS_READER, cluster.target, str(dataset_id)],
                          capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == list(range(100, 150))


# --- job names --------------------------------------------------------------------------

def test_readers_sharing_a_job_name_split_a_distributed_epoch(cluster):
    base = Dataset.range(2_000)
    readers = [base.apply(distribute("distributed_epoch", cluster.target, job_name="shared",
                                     max_outstanding_requests=8)) for _ in range(2)]
    parts = read_in_threads(readers)
    assert sorted(parts[0] + parts[1]) == list(range(2_000))


def test_readers_sharing_a_job_name_split_parallel_epochs(cluster):
    dataset_id = register_dataset(cluster.target, Dataset.range(500))
    readers = [from_dataset_id("parallel_epochs", cluster.target, dataset_id, job_name="shared-pe",
                               max_outstanding_requests=8) for _ in range(2)]
    parts = read_in_threads(readers)
    # One job: the two workers' output, each element once per worker, split between the readers.
    assert sorted(parts[0] + parts[1]) == sorted(list(range(500)) * 2)


def test_each_iteration_of_a_named_job_is_a_new_iteration(cluster):
    dataset = Dataset.range(5).apply(distribute("parallel_epochs", cluster.target, job_name="epochs"))
    for _ in range(3):
        assert sorted(ints(dataset)) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    # repeat() iterates its input again: three more iterations of the same job.
    assert collections.Counter(ints(dataset.repeat(3))) == {i: 6 for i in range(5)}
    status = cluster.dispatcher.core.get_status(pb.GetStatusRequest())
    (job,) = [j for j in status.jobs if j.job_name == "epochs"]
    assert len(job.iterations) == 6


def test_two_readers_of_a_named_job_share_each_repetition(cluster):
    # The doc's example: two training processes each iterate the named job three times;
    # their k-th iterations are the same iteration, split first come first served.
    base = Dataset.range(300)
    first, second = (base.apply(distribute("distributed_epoch", cluster.target, job_name="two-trainers"))
                     for _ in range(2))
    for _ in range(3):
        a, b = read_in_threads([first, second])
        assert sorted(a + b) == list(range(300))


def test_reader_joining_a_named_job_read_to_its_end_gets_end_of_input_at_once(cluster):
    # The doc: another reader of job "job" after it was read to its end "will immediately
    # receive end of input, without getting any data".
    base = Dataset.range(10)
    first = base.apply(distribute("parallel_epochs", cluster.target, job_name="job"))
    late = base.apply(distribute("parallel_epochs", cluster.target, job_name="job"))
    assert sorted(ints(first)) == sorted(list(range(10)) * 2)
    wait_until(lambda: not any(w.task_ids for w in cluster.workers), 10, "the workers to drop the finished tasks")
    start = time.monotonic()
    assert ints(late) == []
    assert time.monotonic() - start < 2


def test_anonymous_jobs_are_never_shared(cluster):
    dataset = Dataset.range(100).apply(distribute("distributed_epoch", cluster.target))
    a, b = read_in_threads([dataset, dataset])
    assert sorted(a) == sorted(b) == list(range(100))


def test_job_name_reused_with_another_dataset_is_another_job(cluster):
    # As in tf.data service, a job name is scoped by the dataset id read: each pipeline reads in full.
    assert sorted(int(x) for x in Dataset.range(5).apply(distribute("parallel_epochs", cluster.target,
                                                                    job_name="taken"))) == sorted(list(range(5)) * 2)
    other = Dataset.range(6).apply(distribute("parallel_epochs", cluster.target, job_name="taken"))
    assert sorted(int(x) for x in other) == sorted(list(range(6)) * 2)


def test_job_name_reused_with_another_mode_is_rejected(cluster):
    dataset_id = register_dataset(cluster.target, Dataset.range(5))
    list(from_dataset_id("parallel_epochs", cluster.target, dataset_id, job_name="mode"))
    with pytest.raises(errors.AlreadyExistsError, match="distributed_epoch"):
        list(from_dataset_id("distributed_epoch", cluster.target, dataset_id, job_name="mode"))


def test_single_worker_cluster_reads_everything_once():
    with TestCluster(num_workers=1) as one:
        dataset = Dataset.range(10).apply(distribute("parallel_epochs", one.target))
        assert ints(dataset) == list(range(10))
