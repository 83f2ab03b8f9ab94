"""What iterations nobody reads cost a worker: ``python -m benchmarks.unread_iterations``.

Starts our dispatcher and one worker as processes (``benchmarks.cluster_processes``), then
creates ``--iterations`` iterations of ``range(--elements)`` (int64 scalars, or with
``--element-bytes`` above 8 a uint8 array of that size per element), each an anonymous
``parallel_epochs`` job. ``--stalled-readers N`` of them are read through ``from_dataset_id``
(``max_outstanding_requests=1``): one element each, then never again; the rest are created with
``GetOrCreateIteration`` and never read. Once the dispatcher lists every task on the worker
(``GetStatusResponse.workers[0].num_tasks``), it samples the worker's RSS, threads and CPU for
``--sample-s`` seconds. ``--memory-budget-bytes`` goes to the worker. MB is 10**6 bytes.

Example (2 cores)::

    $ python -m benchmarks.unread_iterations --iterations 2000
    dataservice unread iterations: 2,000 iterations of range(100) int64 scalars, 0 read once then stalled; ...
    |     t |  RSS MB | threads |  CPU% |
    |  idle |    61.8 |      12 |     - |
    |  1.0s |    71.0 |      12 |   1.0 |
    ...
    | 10.0s |    71.0 |      12 |   1.0 |
    worker: 2,000 tasks (iterations created and first elements read in 6.3 s); RSS 61.8 MB idle, 71.0 MB at
    the peak row; threads 12 idle, 12 at the peak; CPU 0.7% over 10 s

Each row: the worker's VmRSS and thread count, and its CPU use (user + system, % of one core) since
the row before. The run is bounded as a whole and stops every process it started when it ends,
fails or gets SIGTERM (exit code 1 with the reason on stderr).
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sys
import threading
import time
from typing import Optional

import numpy as np

import dataservice as ds
from benchmarks.cluster_processes import (START_TIMEOUT_S, BenchmarkError, ProcessGroup, process_cpu_s,
                                          process_stats, start_dispatcher_and_worker)
from dataservice.errors import DataServiceError
from dataservice.proto import state_pb2
from dataservice.service.dispatcher_client import DispatcherClient

#: Long enough that the dispatcher neither drops the silent clients of unread iterations nor collects their jobs.
SERVER_TIMEOUT_MS = 3_600_000
#: Creating the iterations, and the worker getting their tasks, must finish within this.
SETUP_TIMEOUT_S = 300.0
#: A reader's first element must arrive within this (distribute's ``timeout_ms``).
READ_TIMEOUT_MS = 60_000


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.unread_iterations",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=_positive, default=2000, help="iterations created (default: 2000)")
    parser.add_argument("--element-bytes", type=_positive, default=8,
                        help="8 (default): int64 scalars; more: uint8 arrays of this many bytes")
    parser.add_argument("--elements", type=_positive, default=100, help="elements per iteration (default: 100)")
    parser.add_argument("--stalled-readers", type=int, default=0, metavar="N",
                        help="of the iterations, N are read one element each, then stalled (default: 0)")
    parser.add_argument("--memory-budget-bytes", type=_positive, default=None, help="the worker's flag of that name")
    parser.add_argument("--sample-s", type=float, default=10.0, help="seconds of sampling (default: 10)")
    return parser


def _dataset(element_bytes: int, elements: int) -> ds.Dataset:
    if element_bytes <= 8:
        return ds.Dataset.range(elements)
    return ds.Dataset.range(elements).map(lambda i: np.full(element_bytes, i % 251, np.uint8))


def _wait_for_tasks(client: DispatcherClient, n: int, deadline: float) -> int:
    while True:
        workers = client.get_status(timeout_s=30).workers
        if workers and workers[0].num_tasks >= n:
            return workers[0].num_tasks
        if time.monotonic() > deadline:
            raise BenchmarkError(f"the worker has {workers[0].num_tasks if workers else 'no'} tasks of {n} after "
                                 f"{SETUP_TIMEOUT_S:.0f} s")
        time.sleep(0.2)


def run(args: argparse.Namespace, group: ProcessGroup) -> None:
    """The measurement: prints the header, the rows and the summary; the caller closes ``group``."""
    worker_flags = ["--memory-budget-bytes", str(args.memory_budget_bytes)] if args.memory_budget_bytes else []
    readers: list = []
    client: Optional[DispatcherClient] = None
    try:
        service, _dispatcher, worker = start_dispatcher_and_worker(
            group, sys.executable, dispatcher_args=["--client-timeout-ms", str(SERVER_TIMEOUT_MS),
                                                    "--job-gc-timeout-ms", str(SERVER_TIMEOUT_MS)],
            worker_args=worker_flags)
        client = DispatcherClient.from_environment(service, timeout_ms=int(START_TIMEOUT_S * 1000))
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while not client.get_status(timeout_s=30).workers:  # it registers before it prints its line; this checks
            if time.monotonic() > deadline:
                raise BenchmarkError("the dispatcher listed no worker")
            time.sleep(0.05)
        what = (f"range({args.elements:,}) int64 scalars" if args.element_bytes <= 8
                else f"range({args.elements:,}).map(-> {args.element_bytes:,}-byte uint8 array)")
        print(f"dataservice unread iterations: {args.iterations:,} iterations of {what}, {args.stalled_readers:,} "
              f"read once then stalled; worker pid {worker.pid}"
              f"{f', --memory-budget-bytes {args.memory_budget_bytes:,}' if args.memory_budget_bytes else ''}; "
              f"machine: {os.cpu_count()} cores, Python {platform.python_version()}", flush=True)
        idle_rss, idle_threads = process_stats(worker.pid)
        print("|     t |  RSS MB | threads |  CPU% |")
        print(f"|  idle | {idle_rss:7.1f} | {idle_threads:7d} |     - |", flush=True)

        started = time.monotonic()
        dataset_id = ds.register_dataset(service, _dataset(args.element_bytes, args.elements))
        for _ in range(args.iterations - args.stalled_readers):
            job_id = client.get_or_create_job(dataset_id, state_pb2.PARALLEL_EPOCHS, "")
            client.get_or_create_iteration(job_id, 0)
        reading = ds.from_dataset_id("parallel_epochs", service, dataset_id, max_outstanding_requests=1,
                                     timeout_ms=READ_TIMEOUT_MS)
        for _ in range(args.stalled_readers):
            readers.append(iter(reading))
            next(readers[-1])
        created_s = time.monotonic() - started
        num_tasks = _wait_for_tasks(client, args.iterations, deadline)

        step = max(0.5, args.sample_s / 10)
        peak_rss, peak_threads = idle_rss, idle_threads
        t0, cpu0 = time.monotonic(), process_cpu_s(worker.pid)
        last_t, last_cpu = t0, cpu0
        while last_t - t0 < args.sample_s - 1e-6:
            time.sleep(max(0.0, last_t + step - time.monotonic()))
            now, cpu = time.monotonic(), process_cpu_s(worker.pid)
            rss, threads = process_stats(worker.pid)
            if rss is None or cpu is None:
                raise BenchmarkError(f"the worker (pid {worker.pid}) exited:\n{worker.stderr_tail()}")
            peak_rss, peak_threads = max(peak_rss, rss), max(peak_threads, threads)
            print(f"| {now - t0:4.1f}s | {rss:7.1f} | {threads:7d} | {100 * (cpu - last_cpu) / (now - last_t):5.1f} |",
                  flush=True)
            last_t, last_cpu = now, cpu
        print(f"worker: {num_tasks:,} tasks (iterations created and first elements read in {created_s:.1f} s); "
              f"RSS {idle_rss:.1f} MB idle, {peak_rss:.1f} MB at the peak row; threads {idle_threads} idle, "
              f"{peak_threads} at the peak; "
              f"CPU {100 * (last_cpu - cpu0) / (last_t - t0):.1f}% over {last_t - t0:.0f} s")
    finally:
        for reader in readers:
            reader.close()
        if client is not None:
            client.close()


def main(argv: Optional[list] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 <= args.stalled_readers <= args.iterations:
        parser.error(f"--stalled-readers must be between 0 and --iterations ({args.iterations}), "
                     f"got {args.stalled_readers}")
    if args.sample_s <= 0:
        parser.error(f"--sample-s must be positive, got {args.sample_s}")
    group = ProcessGroup()

    def fail(message: str) -> None:
        print(f"python -m benchmarks.unread_iterations: error: {message}", file=sys.stderr, flush=True)
        group.close()
        sys.stdout.flush()
        os._exit(1)  # a read stuck in the client library must not hold the exit

    # One bound on the whole run, whatever waits: start-up, setup, sampling, and slack for the rest.
    limit_s = 2 * START_TIMEOUT_S + SETUP_TIMEOUT_S + args.sample_s
    watchdog = threading.Timer(limit_s, fail, [f"the run did not finish within {limit_s:.0f} s"])
    watchdog.daemon = True
    watchdog.start()
    signal.signal(signal.SIGTERM, lambda signum, frame: fail(f"signal {signum}"))
    try:
        run(args, group)
    except (BenchmarkError, DataServiceError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail("interrupted")
    finally:
        watchdog.cancel()
        group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
