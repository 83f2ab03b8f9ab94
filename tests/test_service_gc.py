"""Lost workers, silent clients and job garbage collection, with in-process servers."""

from __future__ import annotations

import time

import pytest

from dataservice import Dataset, distribute, register_dataset
from dataservice.proto import state_pb2
from dataservice.service.dispatcher_client import DispatcherClient
from tests.cluster import TestCluster, wait_until

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


def events(cluster, kind: str) -> list[dict]:
    return [fields for k, fields in list(cluster.dispatcher.core.events) if k == kind]


def test_a_lost_worker_is_detected_after_worker_timeout_and_gets_no_new_task():
    with TestCluster(num_workers=2, worker_timeout_ms=500) as cluster:
        lost = cluster.workers[0].address
        list(Dataset.range(10).apply(distribute("parallel_epochs", cluster.target)))
        cluster.stop_worker(0)
        started = time.monotonic()
        dataset = Dataset.range(1_000).apply(distribute("parallel_epochs", cluster.target))
        # Until the timeout the new job also has a task on the lost worker: it is revoked when the
        # worker is declared lost, and the read completes with the live worker's epoch.
        assert sorted(int(x) for x in dataset) == list(range(1_000))
        wait_until(lambda: any(e["worker"] == lost for e in events(cluster, "revoke_task")), 10, "the revocation")
        assert time.monotonic() - started >= 0.4
        core = cluster.dispatcher.core
        assert core._worker_lost(lost)


def test_a_silent_client_is_released_and_its_job_collected_with_its_tasks_deleted():
    with TestCluster(num_workers=2, client_timeout_ms=300, job_gc_timeout_ms=300,
                     job_gc_check_interval_ms=50) as cluster:
        dataset_id = register_dataset(cluster.target, Dataset.range(10_000_000))
        client = DispatcherClient(cluster.dispatcher_address, timeout_ms=5_000)
        try:
            job_id = client.get_or_create_job(dataset_id, state_pb2.PARALLEL_EPOCHS, "silent")
            client.get_or_create_iteration(job_id, 0)  # ... and never heard from again
            wait_until(lambda: all(w.task_ids for w in cluster.workers), 10, "tasks on every worker")
            wait_until(lambda: events(cluster, "client_timeout"), 10, "the client to time out")
            wait_until(lambda: events(cluster, "garbage_collect"), 10, "the job to be collected")
            wait_until(lambda: not any(w.task_ids for w in cluster.workers), 10, "the tasks to be deleted")
            # Collected, the job left the dispatcher's state; only its count remains.
            status = client.get_status()
            assert not status.jobs and status.counts.jobs_pruned == 1 and status.counts.tasks == 0
        finally:
            client.close()


def test_a_job_with_a_live_client_is_never_collected():
    with TestCluster(num_workers=1, client_timeout_ms=300, job_gc_timeout_ms=300,
                     job_gc_check_interval_ms=50) as cluster:
        iterator = iter(Dataset.range(10_000_000).apply(
            distribute("parallel_epochs", cluster.target, max_outstanding_requests=4)))
        next(iterator)
        # Many client and GC timeouts go by while the client heartbeats without reading.
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert not events(cluster, "garbage_collect")
            assert not events(cluster, "client_timeout")
            time.sleep(0.05)
        assert int(next(iterator)) == 1
        status = DispatcherClient(cluster.dispatcher_address).get_status()
        (job,) = status.jobs
        assert not job.garbage_collected and job.num_clients == 1
        iterator.close()
