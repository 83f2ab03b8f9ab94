"""Failures are detected on their own clocks, with the dispatcher's default settings (issue 12).

A worker killed with SIGKILL is declared lost ``worker_timeout_ms`` (10 s) after it fell
silent, checked every second, and its distributed_epoch splits are redone on the other
worker: not when the garbage collector next runs (``job_gc_check_interval_ms``, 60 s). A
client killed mid-read is released after ``client_timeout_ms``, also on its own clock. Real
processes (tests/processes.py); the figures of the same experiment are measured by
``benchmarks/recovery.py``. The in-process paths by which a read could end short are in
tests/test_no_short_epochs.py.
"""

from __future__ import annotations

import collections
import re
import time

import pytest

from dataservice import Dataset, distribute
from dataservice.data.sources import split_size_for
from tests.processes import (ENDLESS_READER_SCRIPT, BackgroundReader, Processes, tag_with_pid, wait_for_workers,
                             wait_until)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")]

#: The dispatcher's defaults, which these tests rely on (asserted against DispatcherConfig below).
WORKER_TIMEOUT_S = 10.0
GC_INTERVAL_S = 60.0
#: Generous: detection takes worker_timeout_ms plus at most a second's tick; then the reader confirms
#: it stopped reading the lost task (its heartbeat, a second), and the surviving task asks for a split.
SLACK_S = 8.0
N = 30_000


def test_the_defaults_are_what_these_tests_assume():
    from dataservice.service.config import DispatcherConfig
    config = DispatcherConfig()
    assert (config.worker_timeout_ms, config.job_gc_check_interval_ms) == (WORKER_TIMEOUT_S * 1000,
                                                                         GC_INTERVAL_S * 1000)


def test_a_killed_workers_splits_are_redone_within_worker_timeout_with_default_settings(procs: Processes):
    dispatcher = procs.dispatcher(defaults=True)
    workers = procs.workers(dispatcher.port, 2, defaults=True)
    wait_for_workers(dispatcher.port, [w.address for w in workers])
    # Each element is (value, pid of the worker process that produced it), stamped when it arrives.
    reader = BackgroundReader(
        Dataset.range(N).map(tag_with_pid).apply(distribute("distributed_epoch", dispatcher.target,
                                                            max_outstanding_requests=16, timeout_ms=60_000)),
        convert=lambda e: (int(e[0]), int(e[1]), time.monotonic()))
    reader.wait_for(N // 4, 60)
    victim = workers[0].proc.popen.pid
    size = split_size_for(N)

    def victim_mid_split() -> bool:
        # The victim's latest element delivered is mid-way through its split: the rest of that split
        # (more than max_outstanding_requests elements) cannot have arrived, so it is surely redone.
        latest = next((value for value, pid, _ in reversed(reader.items[-200:]) if pid == victim), None)
        return latest is not None and size // 4 <= latest % size < 3 * size // 4
    wait_until(victim_mid_split, 60, "the killed worker to be mid-way through a split")
    workers[0].proc.kill9()
    killed_at = time.monotonic()
    assert reader.count < N, "the read ended before the kill"
    items = reader.join(WORKER_TIMEOUT_S + 60)
    ended_s = time.monotonic() - killed_at

    counts = collections.Counter(value for value, _, _ in items)
    assert counts == {i: 1 for i in range(N)}, "an element was lost or repeated"
    # The splits the victim had delivered part of, and the other worker finished: redone ones.
    by_split: dict[int, set] = collections.defaultdict(set)
    for value, pid, _ in items:
        by_split[value // size].add(pid)
    redone = {split for split, pids in by_split.items() if victim in pids and len(pids) > 1}
    assert redone, f"no split of the killed worker was redone: {dict(by_split)}"
    first_redo_s = min(t for value, pid, t in items if pid != victim and value // size in redone) - killed_at
    # Not before the worker could be declared lost (its last heartbeat came at most a second before
    # the kill), and well before the garbage collector's 60 s.
    assert WORKER_TIMEOUT_S - 2 < first_redo_s < WORKER_TIMEOUT_S + SLACK_S, \
        f"the first element of a redone split came {first_redo_s:.1f} s after the kill"
    assert ended_s < WORKER_TIMEOUT_S + SLACK_S + 10, f"the epoch ended {ended_s:.1f} s after the kill"
    assert re.search(rf"revoked task \d+ on worker {re.escape(workers[0].address)} \(no heartbeat for 10000 ms\)",
                     dispatcher.proc.stderr), "the dead worker's task was not revoked for its silence"


#: Shorter than the garbage collector's default interval (60 s), which the dispatcher keeps.
CLIENT_TIMEOUT_S = 3.0


def test_a_killed_client_is_released_on_its_own_timeout_not_the_gc_clock(procs: Processes):
    dispatcher = procs.dispatcher("--client-timeout-ms", str(int(CLIENT_TIMEOUT_S * 1000)), defaults=True)
    workers = procs.workers(dispatcher.port, 2, defaults=True)
    wait_for_workers(dispatcher.port, [w.address for w in workers])
    client = procs.python(ENDLESS_READER_SCRIPT, dispatcher.target, "vanish")
    client.wait_for_line(r"^read 1000$")
    status = procs.status(dispatcher.port)
    assert status["counts"]["clients"] == 1, status
    tasks = {w["address"]: list(w["tasks"]) for w in status["workers"]}
    assert all(tasks.values()), f"a worker has no task of the job: {status}"

    client.kill9()
    killed_at = time.monotonic()
    wait_until(lambda: procs.status(dispatcher.port)["counts"]["clients"] == 0, CLIENT_TIMEOUT_S + SLACK_S,
               "the killed client to be released")
    released_s = time.monotonic() - killed_at
    assert released_s < CLIENT_TIMEOUT_S + SLACK_S < GC_INTERVAL_S
    assert re.search(r"client \d+ silent for 3000 ms", dispatcher.proc.stderr), "the client was not timed out"
    # Nobody reads the job now: after half the client timeout more, its workers drop what they buffered.
    by_address = {w.address: w for w in workers}
    for address, task_ids in tasks.items():
        for task_id in task_ids:
            wait_until(lambda: f"deleted task {task_id}" in by_address[address].proc.stderr, SLACK_S,
                       f"worker {address} to delete task {task_id}")
    assert time.monotonic() - killed_at < 1.5 * CLIENT_TIMEOUT_S + SLACK_S
