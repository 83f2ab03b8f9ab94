"""Real processes killed mid-read: workers, dispatchers and clients die (SIGKILL) or stall (SIGSTOP).

The dispatcher and the workers run as ``python -m dataservice ...`` subprocesses
(tests/processes.py); the reader runs in this process on a thread, or in a
subprocess where the client itself is killed. Every wait has a deadline and
every subprocess is killed at the end of its test. The in-process versions of
the delivery tests are in tests/test_service_delivery.py.

Example::

    $ PYTHONPATH=. python -m pytest tests/test_kill9.py -q
"""

from __future__ import annotations

import collections
import re
import signal
import time

import grpc
import pytest

from dataservice import Dataset, distribute, errors
from tests.processes import (ENDLESS_READER_SCRIPT, BackgroundReader, Processes, Server, free_port, slow_identity,
                             tag_with_pid, wait_for_workers, wait_until)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")]

#: Elements of the slow pipelines: a read takes a few seconds, so a kill lands mid-way.
N = 30_000
#: How long a client keeps trying an unreachable dispatcher: longer than any outage here.
CLIENT_TIMEOUT_MS = 30_000
#: The longest a read (or its remainder after a kill) may take.
READ_TIMEOUT_S = 30.0


def cluster(procs: Processes, num_workers: int, *dispatcher_flags: str, **kwargs) -> tuple[Server, list[Server]]:
    """A dispatcher and ``num_workers`` workers, started together; returns once every worker is registered."""
    dispatcher = procs.dispatcher(*dispatcher_flags, **kwargs)  # first: the workers need its port
    workers = procs.workers(dispatcher.port, num_workers)  # started together
    wait_for_workers(dispatcher.port, [w.address for w in workers])
    return dispatcher, workers


def slow_range(n: int = N) -> Dataset:
    return Dataset.range(n).map(slow_identity)


def assert_each_element(items: list[int], n: int, times: int = 1) -> None:
    """``items`` holds every element of range(n) exactly ``times`` times (a precise message otherwise)."""
    counts = collections.Counter(items)
    if counts == {i: times for i in range(n)}:
        return
    missing = [i for i in range(n) if counts[i] < times]
    extra = sorted((k, v) for k, v in counts.items() if v > times or not 0 <= k < n)
    pytest.fail(f"expected each of range({n}) {times}x; got {len(items)} elements: {len(missing)} short "
                f"(first {missing[:10]}), {len(extra)} over (first {extra[:10]})")


def revocations(dispatcher: Server, worker: Server) -> list[str]:
    return re.findall(rf"revoked task \d+ on worker {re.escape(worker.address)} \(([^)]*)\)", dispatcher.proc.stderr)


# --- 1, 2: a worker killed in distributed_epoch --------------------------------------------------

#: A worker timeout no test outlasts: a restarted worker is noticed by its re-registration (a new
#: process id), never by its silence, so the restart path is what is tested.
LONG_WORKER_TIMEOUT = ("--worker-timeout-ms", "60000")


@pytest.mark.parametrize("restart", [False, True], ids=["killed", "killed-and-restarted"])
def test_worker_killed_mid_read_in_distributed_epoch_loses_and_repeats_nothing(procs, restart):
    dispatcher, workers = cluster(procs, 2, *(LONG_WORKER_TIMEOUT if restart else ()))
    reader = BackgroundReader(slow_range().apply(
        distribute("distributed_epoch", dispatcher.target, max_outstanding_requests=16, timeout_ms=CLIENT_TIMEOUT_MS)))
    reader.wait_for(N // 4, READ_TIMEOUT_S)
    workers[0].proc.kill9()
    at_kill = reader.count
    assert at_kill < N, "the read ended before the kill: make the pipeline slower"
    if restart:
        assert procs.worker(dispatcher.port, port=workers[0].port).address == workers[0].address
    items = reader.join(READ_TIMEOUT_S)  # the iterator ends: the job finished without the dead process
    assert_each_element(items, N)
    why = revocations(dispatcher, workers[0])
    assert why == (["the worker restarted"] if restart else ["no heartbeat for 1000 ms"]), \
        f"the dead process's task was not revoked as expected: {why}"


def test_two_consumers_of_a_job_see_every_element_once_when_a_worker_is_killed(procs):
    dispatcher, workers = cluster(procs, 2)
    # One dataset object per consumer: the k-th iteration of each is the same iteration of the job.
    readers = [BackgroundReader(slow_range().apply(
        distribute("distributed_epoch", dispatcher.target, job_name="shared", max_outstanding_requests=8,
                   timeout_ms=CLIENT_TIMEOUT_MS)), name=f"consumer-{i}") for i in range(2)]
    for reader in readers:
        reader.wait_for(N // 8, READ_TIMEOUT_S)
    workers[1].proc.kill9()
    assert sum(r.count for r in readers) < N, "the read ended before the kill: make the pipeline slower"
    parts = [reader.join(READ_TIMEOUT_S) for reader in readers]
    assert_each_element(parts[0] + parts[1], N)
    assert all(parts), "a consumer got nothing"
    assert revocations(dispatcher, workers[1]), "the dispatcher never revoked the dead worker's task"


# --- 3: a worker killed and restarted in parallel_epochs -----------------------------------------

@pytest.mark.parametrize("worker_timeout", [(), LONG_WORKER_TIMEOUT], ids=["short-worker-timeout", "restart-path"])
def test_worker_killed_and_restarted_in_parallel_epochs_resumes_after_what_the_client_holds(procs, worker_timeout):
    dispatcher, workers = cluster(procs, 2, *worker_timeout)
    reader = BackgroundReader(slow_range().apply(
        distribute("parallel_epochs", dispatcher.target, max_outstanding_requests=16, timeout_ms=CLIENT_TIMEOUT_MS)))
    reader.wait_for(N // 3, READ_TIMEOUT_S)
    workers[0].proc.kill9()
    at_kill = reader.count
    assert at_kill < 2 * N, "the read ended before the kill: make the pipeline slower"
    restarted = procs.worker(dispatcher.port, port=workers[0].port)  # same port, same advertised address
    assert restarted.address == workers[0].address
    items = reader.join(READ_TIMEOUT_S)
    # Both workers' epochs, each element exactly once per worker: the restarted worker took over its
    # old stream and skipped what the client already held.
    assert_each_element(items, N, times=2)
    assert "re-registered after a restart" in dispatcher.proc.stderr
    # The old process's task was revoked (lost, or restarted: whichever the dispatcher noticed first)
    # and a new task took over its stream.
    why = revocations(dispatcher, workers[0])
    assert len(why) == 1, f"the dead process's task was not revoked: {why}"
    if worker_timeout:
        assert why == ["the worker restarted"]
    old_tasks = re.findall(r"started task (\d+)", workers[0].proc.stderr)
    new_tasks = re.findall(r"started task (\d+)", restarted.proc.stderr)
    assert len(old_tasks) == len(new_tasks) == 1 and old_tasks != new_tasks, \
        f"the restarted process must run a new task on the old stream, not the old task: {old_tasks} {new_tasks}"


# --- 4: a fault-tolerant dispatcher killed and restarted ----------------------------------------

def test_fault_tolerant_dispatcher_killed_mid_read_in_parallel_epochs(procs, tmp_path):
    work_dir = tmp_path / "journal"
    dispatcher, workers = cluster(procs, 1, work_dir=work_dir)
    reader = BackgroundReader(slow_range().apply(
        distribute("parallel_epochs", dispatcher.target, max_outstanding_requests=16, timeout_ms=CLIENT_TIMEOUT_MS)))
    reader.wait_for(N // 4, READ_TIMEOUT_S)
    dispatcher.proc.kill9()
    at_kill = reader.count
    assert at_kill < N - 500, "the read ended before the kill: make the pipeline slower"
    # Elements flow straight from the worker: the read goes on while the dispatcher is down.
    reader.wait_for(at_kill + 200, READ_TIMEOUT_S, "while the dispatcher is down")
    restarted = procs.dispatcher(port=dispatcher.port, work_dir=work_dir)
    items = reader.join(READ_TIMEOUT_S)
    assert items == list(range(N)), (f"{len(items)} elements; first out of place at "
                                     f"{next((i for i, x in enumerate(items) if x != i), None)}")
    assert re.search(r"replayed [1-9]\d* updates", restarted.proc.stderr), "the restart did not replay the journal"


def test_fault_tolerant_dispatcher_killed_mid_read_in_distributed_epoch(procs, tmp_path):
    work_dir = tmp_path / "journal"
    dispatcher, workers = cluster(procs, 2, work_dir=work_dir)
    reader = BackgroundReader(slow_range().apply(
        distribute("distributed_epoch", dispatcher.target, max_outstanding_requests=16, timeout_ms=CLIENT_TIMEOUT_MS)))
    reader.wait_for(N // 4, READ_TIMEOUT_S)
    dispatcher.proc.kill9()
    assert reader.count < N, "the read ended before the kill: make the pipeline slower"
    restarted = procs.dispatcher(port=dispatcher.port, work_dir=work_dir)
    items = reader.join(READ_TIMEOUT_S)
    assert_each_element(items, N)
    assert re.search(r"replayed [1-9]\d* updates", restarted.proc.stderr), "the restart did not replay the journal"


# --- 5: a dispatcher without fault tolerance killed and restarted ------------------------------

@pytest.mark.parametrize("mode", ["parallel_epochs", "distributed_epoch"])
def test_dispatcher_without_fault_tolerance_restarted_fails_the_read_clearly(procs, mode):
    dispatcher, workers = cluster(procs, 2)
    reader = BackgroundReader(Dataset.range(10_000_000).map(slow_identity).apply(
        distribute(mode, dispatcher.target, max_outstanding_requests=16, timeout_ms=CLIENT_TIMEOUT_MS)))
    reader.wait_for(2_000, READ_TIMEOUT_S)
    dispatcher.proc.kill9()
    restarted = procs.dispatcher(port=dispatcher.port)
    restarted_at = time.monotonic()
    offsets = [w.proc.stderr_size() for w in workers]

    # The reader fails with one of our errors: the restarted dispatcher does not know its client.
    if not reader.done.wait(READ_TIMEOUT_S):
        pytest.fail(f"the reader hung after the dispatcher restarted without its state (read {reader.count})")
    assert reader.error is not None, f"the read ended normally after {reader.count} of 10,000,000 elements"
    assert not isinstance(reader.error, grpc.RpcError), repr(reader.error)
    assert isinstance(reader.error, (errors.NotFoundError, errors.ServiceError)), repr(reader.error)
    # It says what went wrong: the dispatcher does not know the client (its heartbeat), or the
    # iteration (a worker's GetSplit, reported through the task).
    assert re.search(r"unknown to the dispatcher|does not exist", str(reader.error)), str(reader.error)

    # The workers drop the old tasks without a stream of warnings (a 2 s window is what is measured).
    time.sleep(max(0.0, restarted_at + 2.0 - time.monotonic()))
    for worker, offset in zip(workers, offsets):
        warnings = [line for line in worker.proc.stderr_since(offset).splitlines() if " WARNING " in line]
        assert len(warnings) < 10, f"worker {worker.address}: {len(warnings)} warnings in 2 s:\n" + \
            "\n".join(warnings[:20])
        assert "Traceback" not in worker.proc.stderr

    # A new read works.
    again = Dataset.range(1_000).apply(distribute(mode, restarted.target, timeout_ms=CLIENT_TIMEOUT_MS))
    got = [int(x) for x in again]
    assert_each_element(got, 1_000, times=2 if mode == "parallel_epochs" else 1)


# --- 6: a stalled worker ----------------------------------------------------------------------

@pytest.mark.parametrize("worker_timeout", [(), LONG_WORKER_TIMEOUT], ids=["declared-lost", "not-declared-lost"])
def test_stalled_worker_does_not_stop_the_others_in_parallel_epochs(procs, worker_timeout):
    """SIGSTOP: the worker holds its connections open and answers nothing. With the long worker
    timeout the dispatcher never notices within the test, so the flow owes nothing to revocation."""
    dispatcher, workers = cluster(procs, 2, *worker_timeout)
    stalled, live = workers
    reader = BackgroundReader(Dataset.range(N).map(tag_with_pid).apply(
        distribute("parallel_epochs", dispatcher.target, max_outstanding_requests=16, timeout_ms=CLIENT_TIMEOUT_MS)),
        convert=lambda e: (int(e[0]), int(e[1])))
    reader.wait_for(N // 4, READ_TIMEOUT_S)
    stalled.proc.send(signal.SIGSTOP)
    resumed = False
    try:
        def from_worker(pid: int) -> list[int]:
            return [x for x, p in list(reader.items) if p == pid]

        assert len(from_worker(live.proc.pid)) < N, "the live worker was done before the stall: make it slower"
        wait_until(lambda: len(from_worker(live.proc.pid)) >= N or reader.done.is_set(), READ_TIMEOUT_S,
                   "the live worker's whole epoch while the other worker is stopped")
        assert reader.error is None, repr(reader.error)
        assert_each_element(from_worker(live.proc.pid), N)
        assert {p for _, p in reader.items} <= {stalled.proc.pid, live.proc.pid}

        stalled.proc.send(signal.SIGCONT)
        resumed = True
        # Ends either way. Declared lost, the woken worker takes its stream over by running the
        # pipeline again and skipping what the client holds: that re-run takes a while.
        items = reader.join(READ_TIMEOUT_S * 4)
        if worker_timeout:
            # Never declared lost: once resumed, the stalled worker simply finishes its epoch.
            assert not revocations(dispatcher, stalled)
            assert_each_element([x for x, _ in items], N, times=2)
    finally:
        if not resumed:
            stalled.proc.send(signal.SIGCONT)
        stalled.proc.kill9()


# --- 7: a client killed ----------------------------------------------------------------------

def test_killed_client_has_its_job_collected_and_tasks_deleted(procs):
    dispatcher, workers = cluster(procs, 2, "--client-timeout-ms", "1000", "--job-gc-timeout-ms", "1000")
    client = procs.python(ENDLESS_READER_SCRIPT, dispatcher.target, "vanish")
    client.wait_for_line(r"^read 1000$")

    def vanish(status: dict) -> dict:
        return next((j for j in status["jobs"] if j["job_name"] == "vanish"), {})

    status = procs.status(dispatcher.port)
    assert vanish(status) and not vanish(status)["garbage_collected"], status
    tasks = {w["address"]: list(w["tasks"]) for w in status["workers"]}
    assert all(tasks.values()), f"a worker has no task of the job: {status}"

    client.kill9()
    killed_at = time.monotonic()

    def collected() -> dict:
        s = procs.status(dispatcher.port)
        # Collected, the job leaves the dispatcher's state: only its count remains.
        return s if not vanish(s) and not any(w["tasks"] for w in s["workers"]) else {}

    status = wait_until(collected, 20, "the job to be collected and the workers' task lists to empty")
    assert status["counts"]["jobs_pruned"] == 1 and status["counts"]["clients"] == 0, status
    # ... and the workers really dropped them (not just the dispatcher's view).
    by_address = {w.address: w for w in workers}
    for address, task_ids in tasks.items():
        worker = by_address[address]
        for task_id in task_ids:
            wait_until(lambda: f"deleted task {task_id}" in worker.proc.stderr, 10,
                       f"worker {address} to delete task {task_id}")
    assert time.monotonic() - killed_at < 20
    assert re.search(r"client \d+ silent for 1000 ms", dispatcher.proc.stderr), "the client was not timed out"


# --- 8: a client started before the cluster ----------------------------------------------------

def test_client_started_before_the_cluster_waits_and_reads_everything(procs):
    port = free_port()
    reader = BackgroundReader(Dataset.range(5_000).apply(
        distribute("parallel_epochs", f"grpc://localhost:{port}", timeout_ms=30_000)))
    assert reader.started.wait(10), "the reader thread did not start"
    dispatcher = procs.dispatcher(port=port, wait=False)
    worker = procs.worker(port, wait=False)
    procs.await_dispatcher(dispatcher)
    procs.await_worker(worker)
    items = reader.join(READ_TIMEOUT_S)
    assert items == list(range(5_000))  # one worker: the whole epoch once, in order
