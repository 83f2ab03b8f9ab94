"""How long other RPCs wait while the dispatcher records a reader's huge heartbeat: ``python -m benchmarks.heartbeat_lock``.

A reader reports all it holds of each split it received more of. With many gaps (a cross-trainer cache's
skips, an elastic reader's share) that is hundreds of thousands of ranges. This measures, on a
``DispatcherCore`` in this process (no network: the lock is what is under test), a heartbeat of
``--ranges`` ranges sent twice (the first records them all, the second finds nothing new), while another
thread calls GetStatus in a loop: the heartbeats' durations and the longest GetStatus. Median of ``--repeats``.

Example::

    $ python -m benchmarks.heartbeat_lock --ranges 800000
    first heartbeat 0.55 s, second 0.33 s; GetStatus during them: longest 0.07 s (median of 5)
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Optional

from dataservice.dispatcher.core import DispatcherCore
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import state_pb2
from dataservice.service.config import DispatcherConfig


def measure(ranges: int) -> tuple[float, float, float]:
    """One run: (first heartbeat s, second heartbeat s, longest GetStatus s meanwhile)."""
    core = DispatcherCore(DispatcherConfig())
    core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address="w1:1", worker_uid="u"))
    dataset_id = core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"p", num_splits=4)).dataset_id
    job_id = core.get_or_create_job(pb.GetOrCreateJobRequest(dataset_id=dataset_id,
                                                             processing_mode=state_pb2.DISTRIBUTED_EPOCH)).job_id
    reader = core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id))
    flat = [v for k in range(ranges) for v in (2 * k, 2 * k + 1)]
    request = pb.ClientHeartbeatRequest(client_id=reader.client_id, read_key=reader.read_key, progress=[
        state_pb2.SplitProgress(split_index=0, ranges=flat, total=-1)])
    longest = 0.0
    stop = threading.Event()

    def status() -> None:
        nonlocal longest
        while not stop.is_set():
            started = time.perf_counter()
            core.get_status(pb.GetStatusRequest())
            longest = max(longest, time.perf_counter() - started)
            stop.wait(0.005)

    thread = threading.Thread(target=status, daemon=True)
    thread.start()
    durations = []
    for _ in range(2):
        started = time.perf_counter()
        core.client_heartbeat(request)
        durations.append(time.perf_counter() - started)
    stop.set()
    thread.join()
    return durations[0], durations[1], longest


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranges", type=int, default=800_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    runs = [measure(args.ranges) for _ in range(args.repeats)]
    first, second, longest = (statistics.median(r[i] for r in runs) for i in range(3))
    print(f"first heartbeat {first:.2f} s, second {second:.2f} s; GetStatus during them: longest {longest:.2f} s "
          f"(median of {args.repeats})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
