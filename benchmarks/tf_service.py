"""TensorFlow's tf.data service, one role per process, for the comparison in ``benchmarks.run``.

Runs under an interpreter that has TensorFlow (TensorFlow is not a dependency of
dataservice; ``benchmarks.run --tf-python PATH`` names that interpreter). The
dispatcher and worker are TensorFlow's C++ servers
(``tf.data.experimental.service.DispatchServer`` / ``WorkerServer``)::

    $ /work/tfvenv/bin/python -m benchmarks.tf_service dispatcher --port 0
    tf dispatcher listening on grpc://localhost:40123
    $ /work/tfvenv/bin/python -m benchmarks.tf_service worker --dispatcher localhost:40123 --port 0
    tf worker listening on localhost:40125 (dispatcher localhost:40123)
    $ /work/tfvenv/bin/python -m benchmarks.tf_service client --service grpc://localhost:40123 \\
          --workload range --mode parallel_epochs --n 200000 --no-wait
    READY
    RESULT {"elements": 200000, ...}

The client speaks the protocol of ``benchmarks.workloads`` (``READY``, ``GO`` on
stdin, ``RESULT <json>``) and builds the same workloads with TensorFlow ops. The
CPU-bound map cannot be pure Python here: a ``tf.py_function`` lives in the
client's interpreter and cannot run on a tf.data service worker, so its busy loop
is a ``tf.while_loop`` calibrated to the same time per element.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

from benchmarks.workloads import (BATCH_SIZE, FLOAT_ARRAY_ELEMENTS, IMAGE_SHAPE, client_parser,
                                  max_outstanding_requests, run_client_protocol)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _tf():
    import tensorflow as tf

    return tf


def _serve_until_signal() -> int:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    return 0


def _dispatcher(args: argparse.Namespace) -> int:
    tf = _tf()
    server = tf.data.experimental.service.DispatchServer(
        tf.data.experimental.service.DispatcherConfig(port=args.port))
    print(f"tf dispatcher listening on {server.target}", flush=True)
    code = _serve_until_signal()
    server._stop()
    return code


def _worker(args: argparse.Namespace) -> int:
    tf = _tf()
    server = tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(dispatcher_address=args.dispatcher, port=args.port))
    # start() returns once the worker has registered with the dispatcher.
    print(f"tf worker listening on {server._address} (dispatcher {args.dispatcher})", flush=True)
    code = _serve_until_signal()
    server._stop()
    return code


def _busy_map(tf, iters: int):
    def busy(x):
        _, total = tf.while_loop(lambda i, t: i < iters, lambda i, t: (i + 1, t + i),
                                 (tf.constant(0, tf.int64), tf.constant(0, tf.int64)))
        return x + 0 * total  # depends on the loop, so it is not pruned

    return busy


def tf_dataset(tf, key: str, n: int, busy_iters: int):
    ds = tf.data.Dataset.range(n)
    if key in ("range", "first_element"):
        return ds
    if key in ("float_arrays", "client_rss"):
        return ds.map(lambda x: tf.fill([FLOAT_ARRAY_ELEMENTS], tf.cast(x, tf.float32)))
    if key == "image_batches":
        return ds.map(lambda x: (tf.fill(list(IMAGE_SHAPE), tf.cast(x % 256, tf.uint8)), x)).batch(BATCH_SIZE)
    if key == "cpu_map":
        return ds.map(_busy_map(tf, busy_iters))
    raise ValueError(f"unknown workload {key!r}")


def _client(args: argparse.Namespace) -> int:
    def prepare():
        tf = _tf()
        dataset = tf_dataset(tf, args.workload, args.n, args.busy_iters)
        outstanding = max_outstanding_requests(args)

        def make_iterator():
            distributed = dataset.apply(tf.data.experimental.service.distribute(
                processing_mode=args.mode, service=args.service, max_outstanding_requests=outstanding))
            return iter(distributed.as_numpy_iterator())

        return make_iterator

    return run_client_protocol(args, prepare)


def _calibrate(target_ms: float) -> dict:
    tf = _tf()

    def ms_per_element(iters: int, n: int = 50) -> float:
        ds = tf.data.Dataset.range(n).map(_busy_map(tf, iters))
        for _ in ds.take(1):
            pass
        start = time.perf_counter()
        for _ in ds.as_numpy_iterator():
            pass
        return (time.perf_counter() - start) / n * 1e3

    iters = 20
    ms = ms_per_element(iters)
    iters = max(1, round(iters * target_ms / ms))
    return {"iters": iters, "ms_per_element": ms_per_element(iters)}


def main(argv=None) -> int:
    parser, commands = client_parser("TensorFlow's tf.data service: dispatcher, worker or benchmark client.")
    dispatcher = commands.add_parser("dispatcher", help="run tf.data service's DispatchServer")
    dispatcher.add_argument("--port", type=int, default=0)
    worker = commands.add_parser("worker", help="run tf.data service's WorkerServer")
    worker.add_argument("--dispatcher", required=True, help="host:port of the dispatcher")
    worker.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "dispatcher":
        return _dispatcher(args)
    if args.command == "worker":
        return _worker(args)
    if args.command == "calibrate":
        print("RESULT " + json.dumps(_calibrate(args.target_ms)), flush=True)
        return 0
    return _client(args)


if __name__ == "__main__":
    sys.exit(main())
