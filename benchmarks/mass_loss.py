"""A rack lost at once: how long the dispatcher's lock is held to revoke every lost worker's tasks.

A fleet of N workers reads two ``distributed_epoch`` jobs of an endless dataset; each task has leased one
GetSplit answer's splits (8 at 2,000 workers: ``fleet_intervals.splits_per_lease``). Then a share of
the workers falls silent past ``worker_timeout_ms`` and one ``collect_garbage`` pass revokes their tasks,
their leased splits going back to be redone. The pass runs under the dispatcher's lock, so every other call
waits for it. The core runs in this process (no gRPC, and its log lines silenced: what is measured is the
state's work).

Usage::

    .venv/bin/python -m benchmarks.mass_loss                       # 2,000 workers, all lost
    .venv/bin/python -m benchmarks.mass_loss --workers 500 --lost 0.25

Run it from an older checkout (``cd /tmp/before && python -m benchmarks.mass_loss``) to compare.
"""

from __future__ import annotations

import argparse
import logging
import time

from dataservice.dispatcher.core import INFINITE, DispatcherCore
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import state_pb2
from dataservice.service.config import DispatcherConfig


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def measure(workers: int, lost_share: float, jobs: int = 2) -> dict:
    """Builds the fleet, leases a split answer per task, loses ``lost_share`` of the workers; times the pass."""
    clock = _Clock()
    core = DispatcherCore(DispatcherConfig(worker_timeout_ms=5_000, client_timeout_ms=600_000,
                                           job_gc_timeout_ms=600_000), clock=clock)
    addresses = [f"w{i}:1" for i in range(workers)]
    for address in addresses:
        core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=address, worker_uid=address))
    tasks = []
    for job in range(jobs):
        dataset_id = core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"p%d" % job,
                                                                     num_splits=INFINITE)).dataset_id
        job_id = core.get_or_create_job(pb.GetOrCreateJobRequest(
            dataset_id=dataset_id, processing_mode=state_pb2.DISTRIBUTED_EPOCH)).job_id
        it = core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id))
        for address in addresses:  # past the first few, a worker's task is made by its next poll
            core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=address, worker_uid=address),
                                  may_wait=False)
        for task_id in core.state.iterations[it.iteration_id].tasks:
            core.get_split(pb.GetSplitRequest(iteration_id=it.iteration_id, task_id=task_id, request_id=1,
                                              max_splits=8), may_wait=False)
            tasks.append(task_id)
    leases = sum(len(i.leases) for i in core.state.iterations.values())
    lost = set(addresses[:int(workers * lost_share)])
    clock.now += 6.0  # past worker_timeout_ms; the others heartbeat
    for address in addresses:
        if address not in lost:
            core.worker_heartbeat(pb.WorkerHeartbeatRequest(
                worker_address=address, worker_uid=address, current_tasks=sorted(core.state.workers[address].tasks)))
    started = time.perf_counter()
    core.collect_garbage()
    seconds = time.perf_counter() - started
    revoked = sum(1 for t in tasks if core.state.tasks[t].revoked)
    return {"workers": workers, "lost": len(lost), "tasks": len(tasks), "leases": leases, "revoked": revoked,
            "seconds": seconds}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2_000)
    parser.add_argument("--lost", type=float, default=1.0, help="share of the workers lost at once (default all)")
    parser.add_argument("--runs", type=int, default=3, help="the best is reported")
    args = parser.parse_args(argv)
    logging.getLogger("dataservice").setLevel(logging.ERROR)  # a "revoked task" line per task is not measured
    results = [measure(args.workers, args.lost) for _ in range(args.runs)]
    best = min(results, key=lambda r: r["seconds"])
    print(f"{best['workers']:,} workers, {best['lost']:,} lost at once: {best['revoked']:,} of {best['tasks']:,} "
          f"tasks revoked, {best['leases']:,} splits leased; the pass held the lock {best['seconds'] * 1000:,.0f} ms "
          f"(best of {args.runs})")


if __name__ == "__main__":
    main()
