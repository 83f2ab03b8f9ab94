"""The service benchmark workloads, and the client process that measures one of them on our service.

The workload definitions and the measurement loop (``measure_read``) are shared
with ``benchmarks.tf_service``, which runs under TensorFlow's interpreter: this
module imports only numpy and the standard library at the top, and dataservice
inside the functions that need it.

A client is started by ``benchmarks.cluster_processes`` as::

    python -m benchmarks.workloads client --service grpc://localhost:P --workload range \\
        --mode parallel_epochs --n 200000 --workers 1

It prints ``READY`` once imported, waits for ``GO`` on stdin, reads the whole
dataset through ``distribute()`` and prints ``RESULT <json>`` (or ``ERROR <json>``).
``python -m benchmarks.workloads calibrate --target-ms 0.5`` prints the busy-loop
length of the CPU-bound map for about that many milliseconds per element.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import resource
import sys
import time
import traceback
from typing import Any, Callable, Iterator, Optional

import numpy as np

__all__ = ["Workload", "WORKLOADS", "GROUPS", "MODES", "FLOAT_ARRAY_ELEMENTS", "IMAGE_SHAPE", "BATCH_SIZE",
           "busy_loop", "measure_read", "nbytes", "current_rss_mb", "peak_rss_mb", "client_main"]

MODES = ("parallel_epochs", "distributed_epoch")
#: 262144 float32 = 1 MiB per element.
FLOAT_ARRAY_ELEMENTS = 262_144
IMAGE_SHAPE = (64, 64, 3)
BATCH_SIZE = 64
MB = 1e6  # MB/s and RSS are in units of 10**6 bytes


@dataclasses.dataclass(frozen=True)
class Workload:
    key: str
    #: ``{n}`` is replaced by the number of source elements.
    title: str
    n: int
    quick_n: int
    #: "elements/s", "MB/s", "first element (ms)", "client peak RSS (MB)", or "speedup"
    metric: str
    max_outstanding_requests: Optional[int] = None
    #: Count the bytes of every element (batches may be partial), not first element x count.
    bytes_each: bool = False
    #: Worker counts to measure; the cpu_map workload compares 1 and 2.
    worker_counts: tuple = (1,)
    #: Our client's ``distribute(data_transfer_protocol=...)``.
    data_transfer_protocol: Optional[str] = None
    #: Measured on our service only; the table compares it with this workload of tf.data service's.
    tf_counterpart: Optional[str] = None

    def size(self, quick: bool) -> int:
        return self.quick_n if quick else self.n

    def describe(self, quick: bool) -> str:
        return self.title.format(n=self.size(quick))


WORKLOADS: dict[str, Workload] = {w.key: w for w in [
    Workload("range", "1. range({n}), int64 scalars", 200_000, 20_000, "elements/s"),
    Workload("float_arrays", "2. range({n}).map(-> 1 MiB float32)", 3000, 300, "MB/s"),
    Workload("image_batches", "3. range({n}).map(-> (64x64x3 uint8, int64)).batch(64)", 25_600, 2560, "MB/s",
             bytes_each=True),
    Workload("first_element", "4. time to first element, range({n})", 10, 10, "first element (ms)"),
    Workload("client_rss", "5. client peak RSS, workload 2, max_outstanding_requests=8", 3000, 300,
             "client peak RSS (MB)", max_outstanding_requests=8),
    Workload("cpu_map", "6. range({n}).map(pure-Python busy loop)", 8000, 2000, "speedup",
             worker_counts=(1, 2)),
    Workload("float_arrays_tcp", "7. workload 2 over TCP only (data_transfer_protocol='tcp')", 3000, 300, "MB/s",
             data_transfer_protocol="tcp", tf_counterpart="float_arrays"),
]}

#: Names accepted by ``--workloads`` besides the workload keys.
GROUPS = {
    "all": list(WORKLOADS),
    "small": ["range", "first_element"],
}


# --- element functions (module level: workers import them by reference) ------------------------

def float_array(x: Any) -> np.ndarray:
    return np.full(FLOAT_ARRAY_ELEMENTS, x, np.float32)


def image_and_label(x: Any) -> tuple:
    return np.full(IMAGE_SHAPE, x % 256, np.uint8), x


def busy_loop(x: Any, iters: int = 10_000) -> Any:
    """Pure-Python work that holds the GIL: about 30 ns per iteration on CPython 3.11."""
    total = 0
    for i in range(iters):
        total += i
    return x


class _Busy:
    """``busy_loop`` with a fixed length, picklable by reference (a module-level class)."""

    def __init__(self, iters: int):
        self.iters = iters

    def __call__(self, x: Any) -> Any:
        return busy_loop(x, self.iters)


# --- measurement, shared with benchmarks.tf_service ----------------------------------------------

def nbytes(element: Any) -> int:
    """Bytes of the numpy leaves of an element (tuples, lists, dicts); other leaves count as 8."""
    if isinstance(element, (tuple, list)):
        return sum(nbytes(e) for e in element)
    if isinstance(element, dict):
        return sum(nbytes(e) for e in element.values())
    if isinstance(element, (np.ndarray, np.generic)):
        return int(element.nbytes)
    if isinstance(element, (bytes, str)):
        return len(element)
    return 8


def current_rss_mb() -> float:
    """The resident set size now (psutil if installed, else /proc/self/statm)."""
    try:
        import psutil  # optional

        return psutil.Process().memory_info().rss / MB
    except ImportError:
        pass
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB
    except (OSError, ValueError, IndexError):
        return peak_rss_mb()


def peak_rss_mb() -> float:
    """The process's peak resident set size so far (``getrusage``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MB if sys.platform == "darwin" else peak * 1024 / MB


def measure_read(make_iterator: Callable[[], Iterator], bytes_each: bool = False) -> dict:
    """Times one read: ``make_iterator()`` (which applies distribute and creates the iterator) to the first
    element, then the first to the last element (throughput counts the elements after the first), then
    the last element to the end of the sequence."""
    gc.collect()
    baseline_rss = current_rss_mb()
    peak_before = peak_rss_mb()
    t0 = time.perf_counter()
    iterator = make_iterator()
    first = next(iterator)
    t1 = time.perf_counter()
    element_bytes = nbytes(first)
    del first
    n = 1
    total_bytes = element_bytes
    clock = time.perf_counter
    t_last = t1
    if bytes_each:
        for element in iterator:
            t_last = clock()
            n += 1
            total_bytes += nbytes(element)
    else:
        for _ in iterator:
            t_last = clock()
            n += 1
        total_bytes = element_bytes * n
    t2 = clock()
    # Throughput is timed from the first to the last element: the end of the sequence can come
    # much later (tf.data service learns it from the dispatcher, about a second later).
    rest_s = t_last - t1
    rest_bytes = total_bytes - element_bytes
    return {
        "elements": n,
        "bytes": total_bytes,
        "element_bytes": element_bytes,
        "first_element_ms": (t1 - t0) * 1e3,
        "read_s": rest_s,
        "end_of_sequence_ms": (t2 - t_last) * 1e3,
        "total_s": t2 - t0,
        "elements_per_s": (n - 1) / rest_s if n > 1 and rest_s > 0 else 0.0,
        "mb_per_s": rest_bytes / MB / rest_s if n > 1 and rest_s > 0 else 0.0,
        "baseline_rss_mb": baseline_rss,
        "peak_rss_before_read_mb": peak_before,
        "peak_rss_mb": peak_rss_mb(),
    }


def expected_elements(workload: Workload, n: int, mode: str, workers: int) -> int:
    per_epoch = -(-n // BATCH_SIZE) if workload.key == "image_batches" else n
    return per_epoch * workers if mode == "parallel_epochs" else per_epoch


def client_parser(description: str) -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The command line of a client process, ours or TensorFlow's, and its subcommands (to add to)."""
    parser = argparse.ArgumentParser(description=description)
    commands = parser.add_subparsers(dest="command", required=True)
    client = commands.add_parser("client", help="measure one workload against a running service")
    client.add_argument("--service", required=True, help="grpc://host:port of the dispatcher")
    client.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    client.add_argument("--mode", required=True, choices=MODES)
    client.add_argument("--n", type=int, required=True, help="number of source elements")
    client.add_argument("--workers", type=int, default=1, help="workers in the cluster (to check the count)")
    client.add_argument("--max-outstanding-requests", type=int, default=None)
    client.add_argument("--busy-iters", type=int, default=10_000, help="busy-loop length of cpu_map")
    client.add_argument("--no-wait", action="store_true", help="do not wait for GO on stdin")
    calibrate = commands.add_parser("calibrate", help="busy-loop length for --target-ms per element")
    calibrate.add_argument("--target-ms", type=float, default=0.5)
    return parser, commands


def max_outstanding_requests(args: argparse.Namespace) -> Optional[int]:
    """The client's ``max_outstanding_requests``: ``--max-outstanding-requests``, else the workload's."""
    return args.max_outstanding_requests or WORKLOADS[args.workload].max_outstanding_requests


def run_client_protocol(args: argparse.Namespace, prepare: Callable[[], Callable[[], Iterator]],
                        before_read: Optional[Callable[[], None]] = None) -> int:
    """``READY``, wait for ``GO``, measure, ``RESULT <json>``; ``ERROR <json>`` and exit code 1 on failure."""
    try:
        workload = WORKLOADS[args.workload]
        make_iterator = prepare()
        print("READY", flush=True)
        if not args.no_wait:
            line = sys.stdin.readline()
            if line.strip() != "GO":
                raise RuntimeError(f"expected GO on stdin, got {line!r}")
        if before_read is not None:
            before_read()
        result = measure_read(make_iterator, bytes_each=workload.bytes_each)
        result["expected_elements"] = expected_elements(workload, args.n, args.mode, args.workers)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    except BaseException as exc:  # report anything, then exit
        print("ERROR " + json.dumps({"error": f"{type(exc).__name__}: {exc}",
                                     "traceback": traceback.format_exc()}), flush=True)
        return 1


# --- our client -------------------------------------------------------------------------------------

def our_dataset(workload: Workload, n: int, busy_iters: int):
    from dataservice import Dataset

    if workload.key in ("range", "first_element"):
        return Dataset.range(n)
    if workload.key in ("float_arrays", "client_rss", "float_arrays_tcp"):
        return Dataset.range(n).map(float_array)
    if workload.key == "image_batches":
        return Dataset.range(n).map(image_and_label).batch(BATCH_SIZE)
    if workload.key == "cpu_map":
        return Dataset.range(n).map(_Busy(busy_iters))
    raise ValueError(f"unknown workload {workload.key!r}")


def _wait_for_workers(service: str, workers: int, timeout_s: float = 60.0) -> None:
    """Until the dispatcher knows ``workers`` workers (they register before announcing; this checks)."""
    from dataservice.service.dispatcher_client import DispatcherClient

    client = DispatcherClient.from_environment(service, timeout_ms=int(timeout_s * 1000))
    try:
        deadline = time.monotonic() + timeout_s
        while len(client.get_status(timeout_s=timeout_s).workers) < workers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the dispatcher at {service} did not see {workers} workers in {timeout_s} s")
            time.sleep(0.05)
    finally:
        client.close()


def _our_client(args: argparse.Namespace) -> int:
    def prepare() -> Callable[[], Iterator]:
        from dataservice import distribute

        dataset = our_dataset(WORKLOADS[args.workload], args.n, args.busy_iters)
        outstanding = max_outstanding_requests(args)

        def make_iterator() -> Iterator:
            return iter(dataset.apply(distribute(args.mode, args.service, max_outstanding_requests=outstanding,
                                                 data_transfer_protocol=WORKLOADS[args.workload].data_transfer_protocol)))

        return make_iterator

    return run_client_protocol(args, prepare, lambda: _wait_for_workers(args.service, args.workers))


def _calibrate(target_ms: float) -> dict:
    iters = 10_000
    busy_loop(0, iters)
    start = time.perf_counter()
    for i in range(50):
        busy_loop(i, iters)
    ms = (time.perf_counter() - start) / 50 * 1e3
    iters = max(1, round(iters * target_ms / ms))
    start = time.perf_counter()
    for i in range(50):
        busy_loop(i, iters)
    return {"iters": iters, "ms_per_element": (time.perf_counter() - start) / 50 * 1e3}


def client_main(argv: Optional[list] = None) -> int:
    parser, _ = client_parser("A benchmark client of our service (see benchmarks.run).")
    args = parser.parse_args(argv)
    if args.command == "calibrate":
        print("RESULT " + json.dumps(_calibrate(args.target_ms)), flush=True)
        return 0
    return _our_client(args)


if __name__ == "__main__":
    # Re-import under the package name, so the map functions pickle as benchmarks.workloads.* (by
    # reference), not as __main__.* (by value).
    from benchmarks.workloads import client_main as _main

    sys.exit(_main())
