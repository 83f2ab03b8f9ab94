"""The bookkeeping of resumable reads, without a network: the consumer's position (``client/read_position``),
the deterministic order and an elastic reader's share (``client/group_order``), and the dispatcher's side of a
restored read and of elastic readers (``dispatcher/state`` through ``DispatcherCore``).

The same behaviour through real servers and processes: tests/test_resumable_reads*.py.
"""

from __future__ import annotations

import json

import pytest

from dataservice import errors
from dataservice.client.group_order import GroupOrder, ReaderShare
from dataservice.client.read_position import ReadPosition
from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.state import DispatcherState
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import state_pb2
from dataservice.service.config import DispatcherConfig
from dataservice.service.intervals import OffsetSet
from tests.journals import FakeClock

pytestmark = pytest.mark.no_grpc

DE = state_pb2.DISTRIBUTED_EPOCH


# --- the consumer's position ---------------------------------------------------------------------------------

def test_a_position_settles_groups_taken_whole_and_keeps_the_offsets_of_the_others():
    position = ReadPosition()
    position.took([(0, 0, 3, -1), (2, 0, 2, -1)])
    position.took([(0, 3, 0, 3), (1, 0, 0, 0)])  # group 0 ended at 3 elements; group 1 was empty
    assert position.to_state() == {"done": [0, 2], "partial": [[2, [0, 2]]], "seeks": []}
    assert ReadPosition.from_state(json.loads(json.dumps(position.to_state()))).to_state() == position.to_state()
    resume = position.to_resume()
    assert list(resume.done_groups) == [0, 2]
    assert [(p.split_index, list(p.ranges)) for p in resume.partial] == [(2, [0, 2])]


def test_a_seek_travels_with_its_group_and_must_lie_within_what_was_taken():
    position = ReadPosition(OffsetSet([(0, 4)]), {4: OffsetSet([(0, 100)])}, {4: (64, '{"x": 1}')})
    state = position.to_state()
    assert state["seeks"] == [[4, 64, '{"x": 1}']]
    assert [(s.group, s.offset, s.state) for s in ReadPosition.from_state(state).to_resume().seeks] == \
        [(4, 64, b'{"x": 1}')]
    with pytest.raises(ValueError, match="past what was taken"):
        ReadPosition.from_state({**state, "seeks": [[4, 101, "{}"]]})


@pytest.mark.parametrize("bad, match", [
    ({"done": [0], "partial": []}, "'done'"),
    ({"done": [3, 1], "partial": []}, "empty or reversed"),
    ({"done": [0, 2], "partial": [[1, [0, 5]]]}, "both done and in part"),
    ({"done": [], "partial": [[1, [0, 5]], [1, [6, 7]]]}, "in part twice"),
    ({"done": [], "partial": [["x", [0, 1]]]}, "\\[group, ranges\\] pairs"),
    ({"done": [], "partial": {"1": [0, 1]}}, "'partial' must be list"),
    ({"done": [], "partial": [], "seeks": [[1, 1, "{}"]]}, "'seeks'"),
    ({"partial": []}, "'done' is missing"),
])
def test_a_malformed_position_is_a_value_error_naming_what_is_wrong(bad, match):
    with pytest.raises(ValueError, match=match):
        ReadPosition.from_state(bad)


# --- the deterministic order ---------------------------------------------------------------------------------

def _elements(chunks):
    return [x for chunk in chunks for x in chunk[0]]


def test_groups_are_released_in_index_order_whatever_order_they_arrive_in():
    order = GroupOrder()
    out = []
    out += order.add(["c0", "c1"], 20, [(2, 0, 2, 2)])
    out += order.add(["b0"], 10, [(1, 0, 1, -1)])
    assert out == [] and order.held == 3
    out += order.add(["a0", "a1"], 20, [(0, 0, 2, 2)])
    assert _elements(out) == ["a0", "a1", "b0"] and order.head == 1
    out += order.add(["b1"], 10, [(1, 1, 1, 2)])
    assert _elements(out) == ["a0", "a1", "b0", "b1", "c0", "c1"] and order.head == 3 and order.held == 0
    assert sum(chunk[1] for chunk in out) == 60  # every byte lent to the budget comes back
    assert [seg for chunk in out for seg in chunk[2]][-1] == (2, 0, 2, 2)


def test_an_empty_group_and_a_group_ended_twice_do_not_stall_the_order():
    order = GroupOrder()
    assert order.add([], 0, [(1, 0, 0, 0)]) == []  # group 1 filtered to nothing, ahead of its turn
    out = order.add(["a"], 8, [(0, 0, 1, 1)])
    assert _elements(out) == ["a"] and order.head == 2
    assert order.add([], 0, [(0, 1, 0, 1)]) == []  # group 0 redone elsewhere ends again: nothing pending
    assert order.pending_groups() == []


def test_a_restored_order_starts_after_the_taken_prefix_of_its_group():
    order = GroupOrder(ReadPosition(OffsetSet([(0, 5)]), {5: OffsetSet([(0, 30)])}))
    assert (order.head, order.offset) == (5, 30)
    out = order.add(["x30", "x31"], 16, [(5, 30, 2, 32)]) + order.add(["y0"], 8, [(6, 0, 1, -1)])
    assert _elements(out) == ["x30", "x31", "y0"]


# --- an elastic reader's share ----------------------------------------------------------------------------------

def test_each_reader_keeps_every_nth_element_of_whole_rounds_only():
    sequence = [f"s{k}" for k in range(11)]
    shares = []
    for i in range(3):
        share = ReaderShare(num_readers=3, reader_index=i)
        out = share.feed([(sequence[:4], 4, [(0, 0, 4, 4)]), (sequence[4:], 7, [(1, 0, 7, 7)])])
        share.end()
        shares.append(_elements(out))
        assert share.dropped == 11 - len(shares[-1])
    # 11 elements: 3 whole rounds; s9 and s10 are of an incomplete round, dropped for every reader.
    assert shares == [["s0", "s3", "s6"], ["s1", "s4", "s7"], ["s2", "s5", "s8"]]


def test_a_share_names_a_position_in_groups_and_offsets():
    share = ReaderShare(num_readers=2, reader_index=0)
    share.feed([(list(range(5)), 0, [(0, 0, 5, 5)]), (list(range(4)), 0, [(3, 10, 4, -1)])])
    assert share.group_at(3) == (0, 3)
    assert share.group_at(5) == (3, 10)   # group 3 was restored at offset 10
    assert share.group_at(8) == (3, 13)


# --- the dispatcher's side ----------------------------------------------------------------------------------

@pytest.fixture
def core():
    return DispatcherCore(DispatcherConfig(job_gc_timeout_ms=10_000, client_timeout_ms=5_000), clock=FakeClock())


def _setup(core, resume=None, name="", num_readers=0, num_splits=8):
    core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address="w1:1", worker_uid="u"))
    dataset_id = core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"p", num_splits=num_splits)).dataset_id
    return core.get_or_create_job(pb.GetOrCreateJobRequest(
        dataset_id=dataset_id, processing_mode=DE, job_name=name, deterministic=True, resume=resume,
        num_readers=num_readers)).job_id


def test_a_restored_job_never_hands_out_done_groups_and_seeks_into_a_partial_one(core):
    resume = state_pb2.ResumePoint(done_groups=[0, 3, 5, 6], partial=[
        state_pb2.SplitProgress(split_index=3, ranges=[0, 40])], seeks=[state_pb2.GroupSeek(group=3, offset=32,
                                                                                            state=b"{}")])
    job_id = _setup(core, resume)
    it = core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id))
    (task,) = core.state.iterations[it.iteration_id].tasks
    answers = [core.get_split(pb.GetSplitRequest(iteration_id=it.iteration_id, task_id=task, request_id=r))
               for r in range(1, 5)]
    assert [a.split_index for a in answers] == [3, 4, 6, 7]
    assert list(answers[0].skip_ranges) == [0, 40] and (answers[0].seek_offset, answers[0].seek_state) == (32, b"{}")
    assert not answers[1].seek_state and not answers[1].skip_ranges
    # The start is part of the job's journal record: a replay rebuilds the same iteration.
    replayed = DispatcherState()
    for update in core.state.to_updates():
        replayed.apply(update)
    assert set(replayed.iterations[it.iteration_id].done) >= {(0, 0), (0, 1), (0, 2), (0, 5)}


def test_readers_restoring_one_position_share_a_job_and_never_join_the_saved_one(core):
    saved = _setup(core, name="train")
    resume = state_pb2.ResumePoint(done_groups=[0, 2], position=500)
    restored = core.get_or_create_job(pb.GetOrCreateJobRequest(
        dataset_id=core.state.jobs[saved].dataset_id, processing_mode=DE, job_name="train", deterministic=True,
        resume=resume)).job_id
    again = core.get_or_create_job(pb.GetOrCreateJobRequest(
        dataset_id=core.state.jobs[saved].dataset_id, processing_mode=DE, job_name="train", deterministic=True,
        resume=resume)).job_id
    assert restored != saved and again == restored


def test_elastic_readers_hold_a_split_only_once_every_reader_holds_it(core):
    job_id = _setup(core, name="ranks", num_readers=2)
    readers = [core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id, reader_index=i))
               for i in range(2)]
    iteration = core.state.iterations[readers[0].iteration_id]

    def report(reader, ranges):
        core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=reader.client_id, read_key=reader.read_key,
                                                        progress=[state_pb2.SplitProgress(split_index=0, ranges=ranges,
                                                                                          total=-1)]))

    report(readers[0], [0, 50])
    assert (0, 0) not in iteration.progress  # reader 1 holds nothing yet: a lost worker redoes it all
    report(readers[1], [0, 30])
    assert iteration.progress[(0, 0)].ranges == [(0, 30)]
    with pytest.raises(errors.InvalidRequestError, match="reader_index in \\[0, 2\\)"):
        core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id, reader_index=2))
    replayed = DispatcherState()
    for update in core.state.to_updates():
        replayed.apply(update)
    assert replayed.iterations[iteration.iteration_id].reader_progress[(0, 0)][0].ranges == [(0, 50)]


def test_a_deterministic_or_restored_job_must_be_a_plain_distributed_epoch_read(core):
    dataset_id = core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"p", num_splits=4)).dataset_id
    for request, match in [
        (pb.GetOrCreateJobRequest(dataset_id=dataset_id, processing_mode=state_pb2.PARALLEL_EPOCHS,
                                  deterministic=True), "needs distributed_epoch"),
        (pb.GetOrCreateJobRequest(dataset_id=dataset_id, processing_mode=DE, job_name="j", num_consumers=2,
                                  resume=state_pb2.ResumePoint()), "does not go with coordinated"),
        (pb.GetOrCreateJobRequest(dataset_id=dataset_id, processing_mode=DE, num_readers=2, deterministic=True),
         "needs deterministic=True and a job_name"),
    ]:
        with pytest.raises(errors.InvalidRequestError, match=match):
            core.get_or_create_job(request)


def test_a_retried_claim_of_a_reader_index_gets_it_and_another_reader_does_not(core):
    job_id = _setup(core, name="ranks", num_readers=2)
    first = core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id, reader_index=0,
                                                                         request_token=b"t" * 16))
    retried = core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id, reader_index=0,
                                                                           request_token=b"t" * 16))
    assert retried.client_id != first.client_id and first.client_id not in core.state.clients
    with pytest.raises(errors.InvalidRequestError, match="was read by another reader already"):
        core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id, reader_index=0,
                                                                     request_token=b"u" * 16))
    replayed = DispatcherState()
    for update in core.state.to_updates():
        replayed.apply(update)
    assert replayed.iterations[retried.iteration_id].claimed_readers == {0}


def test_a_state_restored_again_after_its_readers_died_starts_a_new_job():
    clock = FakeClock()
    core = DispatcherCore(DispatcherConfig(job_gc_timeout_ms=10_000, client_timeout_ms=60_000), clock=clock)
    resume = state_pb2.ResumePoint(done_groups=[0, 2], position=500)
    first = _setup(core, resume, name="train")
    core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=first))
    request = pb.GetOrCreateJobRequest(dataset_id=core.state.jobs[first].dataset_id, processing_mode=DE,
                                       job_name="train", deterministic=True, resume=resume)
    assert core.get_or_create_job(request).job_id == first  # its reader is alive: a reader restoring alongside
    clock.advance(10)  # the restored trainer was killed: silent for a few heartbeats, not yet timed out
    again = core.get_or_create_job(request).job_id
    assert again != first and core.get_or_create_job(request).job_id == again
