"""A reader's heartbeat with a huge set of delivered offsets does not stop the dispatcher (issue 28).

Readers report all they hold of each split they received more of: with many gaps (a cross-trainer cache's
skips, an elastic reader's share) that is hundreds of thousands of ranges. The dispatcher works out what is
new without its lock and records it a slice at a time (``core._progress_pieces``), so other RPCs are
answered meanwhile; what it records is exactly what was reported.
"""

from __future__ import annotations

import threading

import pytest

from dataservice.dispatcher.core import PROGRESS_PIECE_RANGES, DispatcherCore
from dataservice.dispatcher.state import DispatcherState
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import state_pb2
from dataservice.service.config import DispatcherConfig
from dataservice.service.intervals import OffsetSet
from tests.journals import FakeClock, Recorder

pytestmark = pytest.mark.no_grpc

#: Ranges of the big heartbeat: every other offset of 1.6 million.
RANGES = 800_000


def _reader(core: DispatcherCore) -> pb.GetOrCreateIterationResponse:
    core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address="w1:1", worker_uid="u"))
    dataset_id = core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"p", num_splits=4)).dataset_id
    job_id = core.get_or_create_job(pb.GetOrCreateJobRequest(dataset_id=dataset_id,
                                                             processing_mode=state_pb2.DISTRIBUTED_EPOCH)).job_id
    return core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id))


def _heartbeat(reader, flat: list, total: int = -1) -> pb.ClientHeartbeatRequest:
    return pb.ClientHeartbeatRequest(client_id=reader.client_id, read_key=reader.read_key, progress=[
        state_pb2.SplitProgress(split_index=0, ranges=flat, total=total)])


def test_other_rpcs_are_answered_while_a_huge_heartbeat_is_recorded():
    core = DispatcherCore(DispatcherConfig(), clock=FakeClock())
    reader = _reader(core)
    flat = [v for k in range(RANGES) for v in (2 * k, 2 * k + 1)]
    done = threading.Event()

    def heartbeat():
        core.client_heartbeat(_heartbeat(reader, flat))
        done.set()

    thread = threading.Thread(target=heartbeat, daemon=True)
    thread.start()
    answered_meanwhile = 0
    while not done.is_set():
        core.get_status(pb.GetStatusRequest())
        if not done.is_set():
            answered_meanwhile += 1
    thread.join(60)
    # Recorded a slice at a time with the lock free in between: status calls went through all along. (Under
    # the lock throughout, the calls made while it was recorded would all have waited for its end.)
    assert answered_meanwhile >= 3, answered_meanwhile
    held = core.state.iterations[reader.iteration_id].progress[(0, 0)]
    assert held == OffsetSet.from_flat(flat) and len(held.ranges) == RANGES


def test_a_huge_heartbeat_is_journaled_as_slices_that_replay_to_the_same_state():
    core = DispatcherCore(DispatcherConfig(), clock=FakeClock())
    recorder = Recorder(core)
    reader = _reader(core)
    n = 3 * PROGRESS_PIECE_RANGES + 5
    flat = [v for k in range(n) for v in (3 * k, 3 * k + 1)]
    core.client_heartbeat(_heartbeat(reader, flat, total=3 * n))
    records = [u.record_progress for u in recorder.updates if u.HasField("record_progress")]
    assert len(records) == 4 and all(len(r.progress[0].ranges) <= 2 * PROGRESS_PIECE_RANGES for r in records)
    assert [r.progress[0].total for r in records] == [-1, -1, -1, 3 * n]  # the total with the last slice
    # Reported again, with one more range: only that one is new.
    core.client_heartbeat(_heartbeat(reader, flat + [3 * n + 5, 3 * n + 6]))
    assert list(recorder.updates[-1].record_progress.progress[0].ranges) == [3 * n + 5, 3 * n + 6]
    replayed = DispatcherState()
    for update in recorder.updates:
        replayed.apply(update)
    assert replayed.iterations[reader.iteration_id].progress == core.state.iterations[reader.iteration_id].progress
