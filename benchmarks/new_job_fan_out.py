"""A new job on a fleet: how long its first reader's GetOrCreateIteration holds the dispatcher.

N workers, each speaking task deltas and settled (as in a running fleet), and with ``--fault-tolerant``
a journal in a temporary directory. A ``distributed_epoch`` job gets its first reader:
``get_or_create_iteration`` is timed (wall time of the call, which holds the dispatcher's lock, and so
the asyncio server's event loop, throughout), then the pass that answers each worker's woken poll
(``worker_heartbeat_again``, as the server runs it once ``long_polls.Wakeups`` wakes the poll), timed per
``FAN_OUT_BATCH`` of them: the work that one turn of a paced fan-out does. The core runs in this process (no
gRPC, its log lines silenced: what is measured is the state's work and the journal's writes).

Usage::

    .venv/bin/python -m benchmarks.new_job_fan_out                        # 2,000 workers, fault-tolerant
    .venv/bin/python -m benchmarks.new_job_fan_out --workers 500 --no-fault-tolerant

Run it from an older checkout (``cd /tmp/before && python -m benchmarks.new_job_fan_out``) to compare.

Example output::

    2,000 workers, fault-tolerant: GetOrCreateIteration 2.1 ms (32 tasks made); the woken polls' passes
    0.21 ms per batch of 8 at p50, 0.70 ms the slowest; 2,000 tasks in all (best of 3)
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from typing import Optional

from dataservice.dispatcher import long_polls
from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.journaled_store import JournaledStore
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import state_pb2
from dataservice.service.config import DispatcherConfig

__all__ = ["measure"]

#: Polls one turn of a paced fan-out wakes (an older tree, run for comparison, has no such constant: the
#: same batch is timed there).
FAN_OUT_BATCH = getattr(long_polls, "FAN_OUT_BATCH", 8)


def measure(workers: int, fault_tolerant: bool) -> dict:
    """One run: the new reader's call (ms), the tasks it made, the passes' ms per FAN_OUT_BATCH, tasks in all."""
    with tempfile.TemporaryDirectory() as work_dir:
        config = DispatcherConfig(worker_timeout_ms=600_000, client_timeout_ms=600_000, job_gc_timeout_ms=600_000,
                                  work_dir=work_dir if fault_tolerant else None, fault_tolerant_mode=fault_tolerant)
        store: Optional[JournaledStore] = None
        if fault_tolerant:
            store = JournaledStore(work_dir)
            store.open()
        try:
            core = DispatcherCore(config, store=store)
            addresses = [f"w{i}:1" for i in range(workers)]
            for address in addresses:
                # A full list, then an empty delta: the worker is settled, as every worker of a running fleet.
                core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=address, worker_uid=address,
                                                                heartbeat_seq=1), may_wait=False)
                core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=address, worker_uid=address,
                                                                heartbeat_seq=2, tasks_delta=True, base_seq=1),
                                      may_wait=False)
            dataset_id = core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"p", num_splits=-1)).dataset_id
            job_id = core.get_or_create_job(pb.GetOrCreateJobRequest(
                dataset_id=dataset_id, processing_mode=state_pb2.DISTRIBUTED_EPOCH)).job_id
            if store is not None:
                store.wait_durable()
            started = time.perf_counter()
            core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id))
            call_s = time.perf_counter() - started
            made = len(core.state.tasks)
            batches = []
            for first in range(0, workers, FAN_OUT_BATCH):
                started = time.perf_counter()
                for address in addresses[first:first + FAN_OUT_BATCH]:
                    core.worker_heartbeat_again(pb.WorkerHeartbeatRequest(
                        worker_address=address, worker_uid=address, heartbeat_seq=3, tasks_delta=True, base_seq=2))
                batches.append(time.perf_counter() - started)
            if store is not None:
                store.wait_durable()
            return {"call_ms": call_s * 1000, "tasks_made": made, "batch_p50_ms": statistics.median(batches) * 1000,
                    "batch_max_ms": max(batches) * 1000, "tasks": len(core.state.tasks)}
        finally:
            if store is not None:
                store.close()


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--no-fault-tolerant", dest="fault_tolerant", action="store_false",
                        help="no journal (the state in memory only)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    logging.disable(logging.INFO)
    runs = [measure(args.workers, args.fault_tolerant) for _ in range(args.repeats)]
    best = min(runs, key=lambda r: r["call_ms"])
    mode = "fault-tolerant" if args.fault_tolerant else "in memory"
    print(f"{args.workers:,} workers, {mode}: GetOrCreateIteration {best['call_ms']:.1f} ms "
          f"({best['tasks_made']:,} tasks made); the woken polls' passes {best['batch_p50_ms']:.2f} ms per batch of "
          f"{FAN_OUT_BATCH} at p50, {best['batch_max_ms']:.2f} ms the slowest; {best['tasks']:,} tasks in all "
          f"(best of {args.repeats})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
