"""CPU per WorkerHeartbeat of a worker holding many tasks, full list against deltas: ``python -m benchmarks.heartbeat_deltas``.

A ``DispatcherCore`` in this process (no network: the work under the dispatcher's lock is what is under test)
with one worker holding ``--tasks`` tasks (one per iteration, each iteration with one reader), and
``--others`` more workers sharing those iterations. It then times steady heartbeats of that worker
(``wait_ms=0``), after one untimed delta (the first delta walks the worker's tasks once, to find it owes none):

- ``full``: the worker lists all its tasks (``tasks_delta=false``, as every worker did before deltas), with
  nothing new to tell it;
- ``delta``: the worker says what changed since its last answered heartbeat: nothing (``tasks_delta=true``);
- ``delta+1``: news for every heartbeat: between two heartbeats a reader leaves (its task is to be dropped)
  and another arrives (a task to start); the delta that confirms them is sent untimed.

Each figure is the median, over ``--repeats`` runs of ``--calls`` heartbeats, of the calling thread's CPU per
heartbeat (``time.thread_time``); the core holds its lock for all of a call. A core without deltas (an older
checkout) is measured in ``full`` mode only. The delta figures creep up a little with ``--tasks`` although
their work does not (cProfile counts the same calls per heartbeat at 200 and 3,000 tasks): each lookup into a
larger state costs more (caches).

Example (2-core machine, load average about 6)::

    $ python -m benchmarks.heartbeat_deltas --tasks 1000
    tasks=1000: full 1.35 ms, delta 0.0213 ms, delta+1 0.0761 ms CPU per heartbeat (median of 5 x 200 calls)
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Optional

from dataservice.dispatcher.core import DispatcherCore
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import state_pb2
from dataservice.service.config import DispatcherConfig

WORKER = "w0:1"
HAS_DELTAS = "tasks_delta" in pb.WorkerHeartbeatRequest.DESCRIPTOR.fields_by_name


def _fleet(tasks: int, others: int) -> tuple[DispatcherCore, list, list[int]]:
    """A core whose worker WORKER holds ``tasks`` tasks: (core, readers, the worker's task ids)."""
    config = DispatcherConfig(worker_timeout_ms=3_600_000, client_timeout_ms=3_600_000, job_gc_timeout_ms=3_600_000)
    core = DispatcherCore(config)
    for i in range(others + 1):
        core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=f"w{i}:1", worker_uid=f"u{i}"))
    dataset_id = core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"p", num_splits=-1)).dataset_id
    readers = []
    for _ in range(tasks):
        job_id = core.get_or_create_job(pb.GetOrCreateJobRequest(
            dataset_id=dataset_id, processing_mode=state_pb2.DISTRIBUTED_EPOCH)).job_id
        readers.append(core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id)))
    return core, readers, sorted(core.state.workers[WORKER].tasks)


def measure(mode: str, tasks: int, others: int, calls: int) -> float:
    """One run: seconds of CPU per heartbeat of WORKER in ``mode`` (full, delta or delta+1)."""
    core, readers, held = _fleet(tasks, others)
    uid = "u0"
    seq = 1
    core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=WORKER, worker_uid=uid, current_tasks=held,
                                                    **({"heartbeat_seq": seq} if HAS_DELTAS else {})))
    current = set(held)
    if mode != "full":
        # Untimed: the first delta walks the worker's tasks once to find it owes none (TaskViews.settled).
        core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=WORKER, worker_uid=uid, tasks_delta=True,
                                                        heartbeat_seq=seq + 1, base_seq=seq))
        seq += 1
    extra = []
    if mode == "delta+1":
        # News for every heartbeat: a task of a new iteration to start, one of an old one to drop.
        dataset_id = next(iter(core.state.datasets))
        for _ in range(calls):
            job_id = core.get_or_create_job(pb.GetOrCreateJobRequest(
                dataset_id=dataset_id, processing_mode=state_pb2.DISTRIBUTED_EPOCH)).job_id
            extra.append(job_id)
    spent = 0.0
    for i in range(calls):
        added, removed = [], []
        if mode == "delta+1":
            # Outside the timing: a reader leaves (its task is to be dropped), another arrives (a task to start).
            core.release_iteration_client(pb.ReleaseIterationClientRequest(
                client_id=readers[i].client_id, read_key=readers[i].read_key))
            core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=extra[i]))
        if mode == "full":
            request = pb.WorkerHeartbeatRequest(worker_address=WORKER, worker_uid=uid, current_tasks=sorted(current))
        else:
            request = pb.WorkerHeartbeatRequest(worker_address=WORKER, worker_uid=uid, tasks_delta=True,
                                                heartbeat_seq=seq + 1, base_seq=seq)
        started = time.thread_time()
        response = core.worker_heartbeat(request)
        spent += time.thread_time() - started
        seq += 1
        if mode != "full" and response.resync_tasks:
            raise AssertionError(f"heartbeat {seq} was refused with resync_tasks")
        added = [t.task_id for t in response.new_tasks]
        removed = list(response.tasks_to_delete)
        current.update(added)
        current.difference_update(removed)
        if mode != "full" and (added or removed):
            # The worker acts on the answer: the next delta says so (outside the timing, like the worker's side).
            core.worker_heartbeat(pb.WorkerHeartbeatRequest(
                worker_address=WORKER, worker_uid=uid, tasks_delta=True, heartbeat_seq=seq + 1, base_seq=seq,
                added_tasks=added, removed_tasks=removed))
            seq += 1
        elif mode == "delta+1" and not (added and removed):
            raise AssertionError(f"heartbeat {seq}: expected a task to start and one to drop, got {response}")
    return spent / calls


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000, help="tasks the measured worker holds")
    parser.add_argument("--others", type=int, default=3, help="other workers sharing its iterations")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    modes = ["full", "delta", "delta+1"] if HAS_DELTAS else ["full"]
    figures = []
    for mode in modes:
        runs = [measure(mode, args.tasks, args.others, args.calls) for _ in range(args.repeats)]
        figures.append(f"{mode} {statistics.median(runs) * 1000:.3g} ms")
    print(f"tasks={args.tasks}: {', '.join(figures)} CPU per heartbeat "
          f"(median of {args.repeats} x {args.calls} calls)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
