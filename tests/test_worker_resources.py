"""What a worker spends on iterations: nothing on those nobody reads, a bounded budget on the rest.

Real in-process dispatcher and workers (``tests/cluster.py``), real readers
(``IterationReader``, what ``distribute`` iterates with) and the dispatcher's own client
for iterations created and never read:

- tasks start at their first read: hundreds of unread iterations add no thread and
  buffer nothing, and arrive at the worker with one pipeline download in all;
- the worker-wide memory budget holds while a stalled reader's task sits at it, and
  the other task's reader still gets every element (a task with nothing buffered may
  always buffer one);
- a task the dispatcher deletes ends its thread at once and returns its bytes, whether
  its producer waited for budget or for buffer room;
- the worker's data-port limits (``data_max_connections``, ``data_idle_timeout_ms``)
  reach its data-transfer server.
"""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from dataservice import Dataset, register_dataset
from dataservice.client.reader import IterationReader
from dataservice.proto import state_pb2
from dataservice.service.dispatcher_client import DispatcherClient
from dataservice.worker.memory_budget import MemoryBudget
from dataservice.worker.task_runner import BUFFER_ELEMENTS, approximate_size
from tests.cluster import TestCluster, run_with_deadline, wait_until

MIB = 1 << 20
#: What one element of ``_mib_elements`` counts against a budget.
ELEMENT_BYTES = approximate_size(np.zeros(MIB, np.uint8))


def _mib_elements(n: int) -> Dataset:
    return Dataset.range(n).map(lambda i: np.full(MIB, i % 251, np.uint8))


def _check_mib_elements(elements: list, n: int) -> None:
    assert len(elements) == n, f"{len(elements)} elements, expected {n}"
    for i, element in enumerate(elements):
        assert element.shape == (MIB,) and element[0] == i % 251 and element[-1] == i % 251, f"element {i}"


def _runner_of(worker, iteration_id: int):
    """The worker's task of an iteration (one worker: one task per iteration)."""
    for task_id in worker.task_ids:
        runner = worker.find_task(task_id, 0)
        if runner is not None and runner.task_def.iteration_id == iteration_id:
            return runner
    return None


def _task_threads() -> list:
    """Producer threads of tasks (see ``TaskRunner``) alive in this process."""
    return [t for t in threading.enumerate() if t.name.startswith("dataservice-task-")]


def _dataset_def_calls(client: DispatcherClient) -> int:
    return sum(r.calls for r in client.get_status().rpc_latency if r.method == "GetDatasetDef")


@pytest.fixture
def dispatcher_client():
    clients = []

    def connect(cluster: TestCluster) -> DispatcherClient:
        clients.append(DispatcherClient(cluster.dispatcher_address, timeout_ms=10_000))
        return clients[-1]

    yield connect
    for client in clients:
        client.close()


def test_unread_iterations_cost_no_thread_and_no_buffer(dispatcher_client):
    # Clients that never heartbeat stay registered for the whole test.
    with TestCluster(num_workers=1, client_timeout_ms=120_000) as cluster:
        worker = cluster.workers[0]
        client = dispatcher_client(cluster)
        n = 2_000
        dataset_id = register_dataset(cluster.target, Dataset.range(n))
        job_ids = []

        def create(count: int) -> None:
            for _ in range(count):
                name = f"unread-{len(job_ids)}"
                job_ids.append(client.get_or_create_job(dataset_id, state_pb2.PARALLEL_EPOCHS, name))
                client.get_or_create_iteration(job_ids[-1], 0)

        create(2)  # the worker's first tasks load the pipeline and warm the servers' thread pools
        wait_until(lambda: len(worker.task_ids) == 2, 10, "the first tasks on the worker")
        threads_before = threading.active_count()
        started = time.monotonic()
        create(320)
        wait_until(lambda: len(worker.task_ids) == 322, 20, "322 tasks on the worker")
        elapsed = time.monotonic() - started
        assert elapsed < 10, f"creating 320 iterations and announcing their tasks took {elapsed:.1f} s"
        # A heartbeat answer of hundreds of tasks of one dataset costs one pipeline download in all.
        assert _dataset_def_calls(client) == 1
        assert threading.active_count() <= threads_before + 3, \
            f"threads grew from {threads_before} to {threading.active_count()} for unread iterations"
        assert not _task_threads()
        assert worker.memory_budget.used_bytes == 0
        assert worker.memory_budget.open_accounts == 322
        assert not any(worker.find_task(t, 0).started for t in worker.task_ids)
        assert not any(worker.find_task(t, 0).finished for t in worker.task_ids)

        # One of them read, as a second reader of its named job: every element exactly once.
        chosen = job_ids[150]
        reader = IterationReader(DispatcherClient(cluster.dispatcher_address), chosen, 0,
                                 max_outstanding_requests=16, timeout_ms=20_000)
        try:
            items = run_with_deadline(lambda: [int(x) for x in reader], 30)
            started_tasks = [worker.find_task(t, 0) for t in worker.task_ids if worker.find_task(t, 0).started]
        finally:
            reader.close()
        assert sorted(items) == list(range(n))
        assert [r.task_def.iteration_id for r in started_tasks] == [reader.iteration_id]
        assert worker.memory_budget.used_bytes == 0
        # The read task's producer ended with its data. (The servers' thread pools and data
        # connections keep threads of their own after a read; they do not depend on tasks.)
        wait_until(lambda: not _task_threads(), 10, "the read task's producer thread to end")


def test_budget_holds_and_a_stalled_reader_does_not_starve_another(dispatcher_client):
    budget = 4 * MIB
    n = 12
    with TestCluster(num_workers=0) as cluster:
        worker = cluster.add_worker(memory_budget_bytes=budget)
        cluster.wait_for_workers(1)
        client = dispatcher_client(cluster)
        dataset_id = register_dataset(cluster.target, _mib_elements(n))

        def reader(job_name: str) -> IterationReader:
            job_id = client.get_or_create_job(dataset_id, state_pb2.PARALLEL_EPOCHS, job_name)
            return IterationReader(DispatcherClient(cluster.dispatcher_address), job_id, 0,
                                   max_outstanding_requests=1, timeout_ms=20_000)

        greedy = reader("greedy")
        starved = None
        try:
            greedy_items = [run_with_deadline(lambda: next(greedy), 20)]
            # The greedy task fills the worker's budget (three elements; a fourth would exceed it)
            # while its reader stalls.
            wait_until(lambda: worker.memory_budget.used_bytes == 3 * ELEMENT_BYTES, 10,
                       "the greedy task to fill the budget")
            starved = reader("starved")
            samples = []

            def read_starved() -> list:
                out = []
                for element in starved:
                    out.append(element)
                    samples.append(worker.memory_budget.used_bytes)
                return out

            starved_items = run_with_deadline(read_starved, 30)
            _check_mib_elements(starved_items, n)
            greedy_items += run_with_deadline(lambda: list(greedy), 30)
            _check_mib_elements(greedy_items, n)
        finally:
            greedy.close()
            if starved is not None:
                starved.close()
        assert max(samples) <= budget + ELEMENT_BYTES, samples
        assert worker.memory_budget.peak_bytes <= budget + ELEMENT_BYTES, worker.memory_budget
        # Both tasks ended with every element taken: exactly nothing is left counted.
        assert worker.memory_budget.used_bytes == 0


@pytest.mark.parametrize("blocked_on", ["budget", "buffer"])
def test_a_deleted_task_ends_its_thread_and_returns_its_bytes_at_once(dispatcher_client, blocked_on):
    with TestCluster(num_workers=0, job_gc_timeout_ms=200, job_gc_check_interval_ms=100) as cluster:
        if blocked_on == "budget":
            worker = cluster.add_worker(memory_budget_bytes=3 * MIB)
            dataset, full = _mib_elements(100), 2 * ELEMENT_BYTES  # a third would exceed the budget
        else:
            worker = cluster.add_worker()
            dataset, full = Dataset.range(10 ** 7), BUFFER_ELEMENTS * approximate_size(np.int64(0))
        cluster.wait_for_workers(1)
        client = dispatcher_client(cluster)
        job_id = client.get_or_create_job(register_dataset(cluster.target, dataset), state_pb2.PARALLEL_EPOCHS, "")
        reader = IterationReader(DispatcherClient(cluster.dispatcher_address), job_id, 0,
                                 max_outstanding_requests=1, timeout_ms=20_000)
        try:
            run_with_deadline(lambda: next(reader), 20)
            runner = wait_until(lambda: _runner_of(worker, reader.iteration_id), 10, "the task")
            thread = runner.thread
            wait_until(lambda: runner.buffered_bytes == full, 10, f"the task's producer to block on its {blocked_on}")
            assert thread.is_alive()
        finally:
            reader.close()  # its job is collected and the task deleted
        wait_until(lambda: runner.task_id not in worker.task_ids, 10, "the dispatcher to delete the task")
        deleted_at = time.monotonic()
        thread.join(2)
        assert not thread.is_alive(), f"the producer blocked on its {blocked_on} outlived its task's deletion"
        assert time.monotonic() - deleted_at < 1
        assert runner.buffered_bytes == 0
        assert worker.memory_budget.used_bytes == 0 and worker.memory_budget.open_accounts == 0


def test_budget_accounts_wait_and_wake():
    budget = MemoryBudget(100)
    a, b = budget.account(), budget.account()
    assert a.reserve(60) and a.reserve(40)
    assert b.reserve(70), "an empty account may always buffer one element"
    assert budget.used_bytes == 170 and budget.peak_bytes == 170
    outcome = []
    waiter = threading.Thread(target=lambda: outcome.append(b.reserve(10)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive(), "a reserve beyond the budget by a non-empty account must wait"
    a.release(60)  # 110: still over
    waiter.join(0.2)
    assert waiter.is_alive()
    a.release(40)  # 70 + 10 fits
    waiter.join(5)
    assert outcome == [10] and budget.used_bytes == 80
    assert a.charge(500) and budget.used_bytes == 580  # elements coming back do not wait
    blocked = threading.Thread(target=lambda: outcome.append(b.reserve(10)))
    blocked.start()
    blocked.join(0.2)
    assert blocked.is_alive()
    b.close()
    blocked.join(5)
    assert outcome == [10, 0] and budget.used_bytes == 500 and b.used_bytes == 0
    a.close()
    a.release(5)  # after close: ignored, everything went back on close
    assert budget.used_bytes == 0 and budget.open_accounts == 0
    # A producer's credit: extra bytes only as far as they fit within the budget.
    c = budget.account()
    assert c.reserve(30, extra=50) == 80 and c.reserve(10, extra=50) == 20 and budget.used_bytes == 100
    c.close()
    with pytest.raises(ValueError, match="positive"):
        MemoryBudget(0)


def _read_until(sock: socket.socket, done, timeout_s: float) -> bytes:
    """What ``sock`` receives until ``done(data)`` or the peer closes; socket.timeout past ``timeout_s``."""
    sock.settimeout(timeout_s)
    data = b""
    while not done(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_worker_config_limits_reach_the_data_port():
    expected = b"serves at most 1 connections"
    with TestCluster(num_workers=0) as cluster:
        worker = cluster.add_worker(data_max_connections=1, data_idle_timeout_ms=400)
        host, port = worker.data_address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as first:
            opened = time.monotonic()
            with socket.create_connection((host, int(port)), timeout=5) as second:
                refusal = _read_until(second, lambda data: expected in data, 5)
            assert expected in refusal, refusal
            # The first one sent no request: closed once data_idle_timeout_ms has passed.
            assert _read_until(first, lambda data: False, 5) == b""
            assert time.monotonic() - opened < 3
