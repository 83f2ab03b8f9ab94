"""How long the dispatcher takes to record a client heartbeat carrying many delivered ranges.

A client reports the offsets it holds as ranges; a reader that received every other element
of a long split in reverse order (the worst case for sorted insertion) reports as many ranges
as elements. This times ``DispatcherCore.client_heartbeat`` with N such ranges — under the
dispatcher's lock, and replayed as slowly on a fault-tolerant restart — and the replay of the
update alone.

    python -m benchmarks.offsets --ranges 800000
"""

from __future__ import annotations

import argparse
import time

from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.state import DispatcherState
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import state_pb2
from dataservice.service.config import DispatcherConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranges", type=int, default=800_000)
    args = parser.parse_args()
    n = args.ranges

    core = DispatcherCore(DispatcherConfig())
    recorded: list = []
    commit = core._commit
    core._commit = lambda update: (recorded.append(update), commit(update))
    dataset_id = core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"x", num_splits=1)).dataset_id
    job_id = core.get_or_create_job(pb.GetOrCreateJobRequest(dataset_id=dataset_id,
                                                             processing_mode=state_pb2.DISTRIBUTED_EPOCH)).job_id
    it = core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id))
    flat = []
    for i in range(n - 1, -1, -1):  # every other offset, in descending order
        flat += (2 * i, 2 * i + 1)
    progress = [state_pb2.SplitProgress(stream_id=0, split_index=0, ranges=flat, total=-1)]
    request = pb.ClientHeartbeatRequest(client_id=it.client_id, read_key=it.read_key, progress=progress)
    print(f"heartbeat of {n:,} ranges: {request.ByteSize() / 1e6:.1f} MB")
    start = time.perf_counter()
    core.client_heartbeat(request)
    print(f"DispatcherCore.client_heartbeat: {time.perf_counter() - start:.3f} s")

    replayed = DispatcherState()
    start = time.perf_counter()
    for update in recorded:
        replayed.apply(update)
    print(f"replaying its updates: {time.perf_counter() - start:.3f} s")


if __name__ == "__main__":
    main()
