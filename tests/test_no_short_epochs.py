"""A distributed_epoch read never ends short without an error when a task fails or goes away.

Issue 12's investigation, one test per path. Ended short before, now redone or raised:

- the last worker lost holding no split (before its first, or between two): the reader was told
  to expect no more tasks, and ended with what it had;
- the last worker lost just after a split: the iteration finished on "every task finished"
  (a revoked task counts as finished) with splits never produced;
- no worker can load the pipeline: the failed task finished the iteration, so a second reader
  of the job got end of input;
- a pipeline whose loading raises ``SystemExit``: the worker's heartbeat thread died, and the
  read waited for ``timeout_ms``.

Checked and found sound (kept as regression tests): the only worker restarted during the
first split. Elsewhere: "task not running" answered for good (tests/test_unreachable_workers.py)
and an answer freed under a reader's copy by a stopping worker
(tests/test_service_delivery.py::test_large_elements_survive_a_worker_restart). The
real-process tests with default timeouts are in tests/test_failure_detection.py.
"""

from __future__ import annotations

import collections
import threading

import pytest

from dataservice import Dataset, distribute, errors
from dataservice.dispatcher.core import DispatcherCore
from dataservice.proto import dispatcher_pb2, state_pb2
from dataservice.service.config import DispatcherConfig
from tests.cluster import TestCluster, run_with_deadline, wait_until
from tests.journals import FakeClock

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


def slow_identity(x):
    total = 0
    for i in range(2000):
        total += i
    return x


def assert_once_each(items, n: int) -> None:
    counts = collections.Counter(int(x) for x in items)
    missing = [i for i in range(n) if counts[i] == 0]
    repeated = [k for k, v in counts.items() if v > 1]
    assert not missing and not repeated, f"{len(missing)} missing (first {missing[:5]}), repeated {repeated[:5]}"


# --- a task revoked while it holds no split ------------------------------------------------------

def test_the_only_worker_lost_before_its_first_split_fails_the_read_instead_of_ending_it():
    # Before: the task was revoked holding no lease, so nothing was "pending", the dispatcher told the
    # reader to expect no more tasks, and the read ended at once with 0 elements and no error.
    with TestCluster(num_workers=1, worker_timeout_ms=500) as cluster:
        lost = cluster.workers[0].address
        dataset = Dataset.range(100).apply(distribute("distributed_epoch", cluster.target, timeout_ms=3_000))
        cluster.stop_worker(0)  # its task is created (the worker is not lost yet) but never starts
        got = []

        def read():
            for x in dataset:
                got.append(x)
        with pytest.raises(errors.ServiceUnavailableError) as info:
            run_with_deadline(read, 30)
        assert got == []
        message = str(info.value)
        assert lost in message and "lost" in message and "no other worker has taken the job over" in message, message


def test_a_worker_registering_after_the_only_one_was_lost_produces_the_whole_epoch():
    with TestCluster(num_workers=1, worker_timeout_ms=500) as cluster:
        dataset = Dataset.range(100).apply(distribute("distributed_epoch", cluster.target, timeout_ms=20_000))
        cluster.stop_worker(0)
        core = cluster.dispatcher.core
        got: list = []
        reading = threading.Thread(target=lambda: got.extend(dataset), daemon=True)
        reading.start()
        # The dispatcher declares it lost and revokes its task, which held no split ...
        wait_until(lambda: any(kind == "revoke_task" for kind, _ in core.events), 10, "the task to be revoked")
        cluster.add_worker()  # ... and a new worker takes the whole epoch over.
        reading.join(30)
        assert not reading.is_alive(), "the read did not end"
        assert_once_each(got, 100)


def test_the_last_worker_lost_just_after_a_split_does_not_finish_the_epoch_short():
    # The core alone, with a fake clock. The only worker's task produced split 0 of 4, and the reader
    # holds all of it; then the worker falls silent and its task is revoked; then the reader reports
    # split 0 complete. Before: a revoked task counts as finished, so "every task finished, nothing
    # pending" finished the iteration with splits 1-3 never produced, and the reader ended there.
    clock = FakeClock()
    core = DispatcherCore(DispatcherConfig(worker_timeout_ms=10_000, client_timeout_ms=60_000), clock=clock)
    dataset_id = core.register_dataset(dispatcher_pb2.RegisterDatasetRequest(dataset_def=b"p", num_splits=4)).dataset_id
    job_id = core.get_or_create_job(dispatcher_pb2.GetOrCreateJobRequest(
        dataset_id=dataset_id, processing_mode=state_pb2.DISTRIBUTED_EPOCH)).job_id
    core.worker_heartbeat(dispatcher_pb2.WorkerHeartbeatRequest(worker_address="w:1", worker_uid="u1"))
    reader = core.get_or_create_iteration(dispatcher_pb2.GetOrCreateIterationRequest(job_id=job_id, repetition=0))
    (task,) = core.worker_heartbeat(dispatcher_pb2.WorkerHeartbeatRequest(worker_address="w:1",
                                                                          worker_uid="u1")).new_tasks
    split = core.get_split(dispatcher_pb2.GetSplitRequest(iteration_id=reader.iteration_id, task_id=task.task_id,
                                                          request_id=1))
    assert split.split_index == 0
    clock.advance(11)  # the worker is silent past worker_timeout_ms
    core.check_liveness()
    assert core.state.tasks[task.task_id].revoked
    answer = core.client_heartbeat(dispatcher_pb2.ClientHeartbeatRequest(
        client_id=reader.client_id, read_key=reader.read_key, stopped_tasks=[task.task_id],
        progress=[state_pb2.SplitProgress(stream_id=0, split_index=0, ranges=[0, 10], total=10)]))
    assert not core.state.iterations[reader.iteration_id].finished, "finished with 3 of 4 splits never produced"
    assert answer.more_tasks_expected and not answer.iteration_finished and not answer.tasks
    # The worker comes back (restarted: a new process): a new task produces the rest.
    news = core.worker_heartbeat(dispatcher_pb2.WorkerHeartbeatRequest(worker_address="w:1", worker_uid="u2"))
    (new_task,) = news.new_tasks
    splits = [core.get_split(dispatcher_pb2.GetSplitRequest(iteration_id=reader.iteration_id,
                                                            task_id=new_task.task_id, request_id=i + 1)).split_index
              for i in range(3)]
    assert splits == [1, 2, 3]


# --- a worker that cannot load the pipeline ------------------------------------------------------

def _fail_on_load():
    raise ModuleNotFoundError("No module named 'only_on_the_client'", name="only_on_the_client")


class _OnlyOnTheClient:
    """Pickles fine, but fails to unpickle: like a pipeline that needs a module workers lack."""

    def __reduce__(self):
        return (_fail_on_load, ())


def test_every_reader_of_a_pipeline_no_worker_can_load_gets_the_error():
    # Before: the failed task reported itself finished, which finished the iteration (split 0 still
    # leased to it), so a second reader of the job got end of input: 0 elements, no error.
    with TestCluster(num_workers=1) as cluster:
        needed = _OnlyOnTheClient()
        for reader in range(2):
            dataset = Dataset.range(10).map(lambda x: (needed, x)[1]).apply(
                distribute("distributed_epoch", cluster.target, job_name="unloadable", timeout_ms=10_000))
            with pytest.raises(errors.MissingModuleError, match="only_on_the_client"):
                run_with_deadline(lambda: list(dataset), 30)
            if reader == 0:  # the worker heard the task end before the second reader joins
                core = cluster.dispatcher.core
                wait_until(lambda: all(t.finished for t in core.state.tasks.values()), 10,
                           "the worker to report its failed task")


class _ExitOnLoad:
    def __reduce__(self):
        return (_exit, ())


def _exit():
    raise SystemExit(3)


def test_a_pipeline_whose_loading_raises_systemexit_fails_the_read_and_the_worker_carries_on(caplog):
    # Before: SystemExit passed every `except Exception` on the worker and ended its heartbeat thread:
    # the worker fell silent for good, and the read waited for timeout_ms.
    with TestCluster(num_workers=1, worker_timeout_ms=1_000) as cluster:
        poison = _ExitOnLoad()
        dataset = Dataset.range(10).map(lambda x: (poison, x)[1]).apply(
            distribute("distributed_epoch", cluster.target, timeout_ms=20_000))
        with pytest.raises(errors.WorkerEnvironmentError, match="SystemExit"):
            run_with_deadline(lambda: list(dataset), 15)
        # The worker still heartbeats and serves the next read.
        good = Dataset.range(10).apply(distribute("distributed_epoch", cluster.target, timeout_ms=20_000))
        assert_once_each(run_with_deadline(lambda: list(good), 30), 10)
        assert not any(kind == "revoke_task" for kind, _ in cluster.dispatcher.core.events)


# --- a worker restarted during the first split ----------------------------------------------------

def test_the_only_worker_restarted_during_the_first_split_loses_and_repeats_nothing():
    with TestCluster(num_workers=1, worker_timeout_ms=60_000) as cluster:
        n = 2_000
        dataset = Dataset.range(n).map(slow_identity).apply(
            distribute("distributed_epoch", cluster.target, max_outstanding_requests=4, timeout_ms=30_000))
        iterator = iter(dataset)
        first = [next(iterator) for _ in range(5)]  # split 0 of 64 is 32 elements: mid-way through it
        cluster.restart_worker(0)
        rest = run_with_deadline(lambda: list(iterator), 60)
        assert_once_each(first + rest, n)
        events = [(kind, fields) for kind, fields in cluster.dispatcher.core.events]
        assert any(kind == "revoke_task" and fields["why"] == "the worker restarted" for kind, fields in events)
        assert any(kind == "reassign_split" and fields["split"] == 0 for kind, fields in events)
