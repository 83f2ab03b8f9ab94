"""Several splits per GetSplit answer for a large fleet (issue 28): one answer leases up to what the task asks
(``GetSplitRequest.max_splits``), one more per ``fleet_intervals.SPLIT_LEASE_WORKERS`` workers, and never more
than every task of the iteration could still take; a retry gets the same splits; the journal, a checkpoint and a
lost worker keep them all. Tests lower ``SPLIT_LEASE_WORKERS`` so that two workers make a "large" fleet.

Example::

    >>> splits_per_lease(asked=8, workers=2_000, splits_left=None, tasks=2_000)
    8
"""

from __future__ import annotations

import numpy as np
import pytest

from dataservice import Dataset, distribute
from dataservice.dispatcher import fleet_intervals
from dataservice.dispatcher.core import INFINITE, DispatcherCore
from dataservice.dispatcher.fleet_intervals import splits_per_lease
from dataservice.dispatcher.state import DispatcherState, StateUpdateError
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import state_pb2
from dataservice.service.config import DispatcherConfig
from tests.cluster import TestCluster, run_with_deadline
from tests.journals import FakeClock, Recorder

DE = state_pb2.DISTRIBUTED_EPOCH


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def core(clock):
    return DispatcherCore(DispatcherConfig(job_gc_timeout_ms=60_000, client_timeout_ms=60_000,
                                           worker_timeout_ms=5_000), clock=clock)


@pytest.fixture
def large_fleet(monkeypatch):
    """Two workers count as a fleet of 500: two splits per answer."""
    monkeypatch.setattr(fleet_intervals, "SPLIT_LEASE_WORKERS", 1)


def start(core, num_splits, deterministic=False, workers=("w1:1", "w2:1")):
    for address in workers:
        core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=address, worker_uid=address))
    dataset_id = core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"p", num_splits=num_splits)).dataset_id
    job_id = core.get_or_create_job(pb.GetOrCreateJobRequest(dataset_id=dataset_id, processing_mode=DE,
                                                             deterministic=deterministic)).job_id
    it = core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id))
    return it, core.state.iterations[it.iteration_id].tasks


def ask(core, it, task_id, request_id, max_splits=8) -> list[int]:
    response = core.get_split(pb.GetSplitRequest(iteration_id=it.iteration_id, task_id=task_id,
                                                 request_id=request_id, max_splits=max_splits), may_wait=False)
    if response.end_of_splits or response.wait:
        return []
    return [response.split_index] + [s.split_index for s in response.more_splits]


# --- the rule ---------------------------------------------------------------------------------------------

def test_the_lease_grows_with_the_fleet_up_to_what_was_asked_and_the_cap():
    assert splits_per_lease(asked=8, workers=250, splits_left=None, tasks=250) == 1
    assert splits_per_lease(asked=8, workers=251, splits_left=None, tasks=251) == 2
    assert splits_per_lease(asked=3, workers=2_000, splits_left=None, tasks=2_000) == 3
    assert splits_per_lease(asked=0, workers=2_000, splits_left=None, tasks=2_000) == 1  # an older worker
    assert splits_per_lease(asked=100, workers=100_000, splits_left=None, tasks=10) == fleet_intervals.MAX_SPLITS_PER_LEASE


def test_a_task_through_its_splits_quickly_is_leased_half_a_second_of_them():
    # 2 workers: no fleet rule. 100 ms per split: 5 at once; 1 s per split: one; no pace known yet: one.
    assert splits_per_lease(asked=8, workers=2, splits_left=60, tasks=2, split_s=0.1) == 5
    assert splits_per_lease(asked=8, workers=2, splits_left=60, tasks=2, split_s=0.073) == 6  # a 32-image batch
    assert splits_per_lease(asked=8, workers=2, splits_left=60, tasks=2, split_s=0.001) == \
        fleet_intervals.MAX_SPLITS_PER_LEASE
    assert splits_per_lease(asked=8, workers=2, splits_left=60, tasks=2, split_s=1.0) == 1
    assert splits_per_lease(asked=8, workers=2, splits_left=60, tasks=2, split_s=None) == 1
    assert splits_per_lease(asked=3, workers=2, splits_left=60, tasks=2, split_s=0.01) == 3  # what was asked
    assert splits_per_lease(asked=8, workers=2, splits_left=5, tasks=2, split_s=0.01) == 2   # the epoch's end


def test_the_epochs_end_is_shared_out_one_split_at_a_time():
    assert splits_per_lease(asked=8, workers=2_000, splits_left=16_000, tasks=2_000) == 8
    assert splits_per_lease(asked=8, workers=2_000, splits_left=3_999, tasks=2_000) == 1
    assert splits_per_lease(asked=8, workers=2_000, splits_left=1, tasks=2_000) == 1


# --- the dispatcher ----------------------------------------------------------------------------------------

def test_a_small_fleet_leases_one_split_per_answer(core):
    it, (t1, t2) = start(core, num_splits=INFINITE)
    assert ask(core, it, t1, 1) == [0]
    assert ask(core, it, t2, 1) == [1]


def test_a_large_fleet_leases_several_and_the_last_ones_singly(core, large_fleet):
    it, (t1, t2) = start(core, num_splits=7)
    assert ask(core, it, t1, 1) == [0, 1]   # 7 left for 2 tasks: 2 each
    assert ask(core, it, t2, 1) == [2, 3]   # 5 left: 2
    assert ask(core, it, t1, 2) == [4]      # 3 left: 1
    assert ask(core, it, t2, 2) == [5]
    assert ask(core, it, t1, 3) == [6]
    assert ask(core, it, t2, 3) == []       # all leased: wait
    iteration = core.state.iterations[it.iteration_id]
    assert iteration.next_split == 7
    assert {split for _, split in iteration.leases} == set(range(7))


def test_a_quick_task_is_leased_by_its_pace_measured_between_its_getsplits(core, clock):
    it, (t1, t2) = start(core, num_splits=40)
    assert ask(core, it, t1, 1) == [0]          # no pace yet
    assert ask(core, it, t2, 1) == [1]
    clock.advance(0.1)                          # t1 took 100 ms for its split: half a second is 5
    assert ask(core, it, t1, 2) == [2, 3, 4, 5, 6]
    clock.advance(1.0)                          # 200 ms per split for t1's five, 1.1 s for t2's one
    assert ask(core, it, t1, 3) == [7, 8]
    assert ask(core, it, t2, 2) == [9]
    assert ask(core, it, t1, 3) == [7, 8]       # a retry: the same splits
    clock.advance(0.01)                         # 5 ms per split: 8 (the cap), while 2 tasks could each get 8
    assert ask(core, it, t1, 4) == list(range(10, 18))
    clock.advance(0.001)
    assert ask(core, it, t1, 5) == list(range(18, 26))
    clock.advance(0.001)
    assert ask(core, it, t1, 6) == list(range(26, 33))  # 14 left for 2 tasks: 7
    clock.advance(0.001)
    assert ask(core, it, t1, 7) == [33, 34, 35]         # 7 left: 3


def test_a_task_that_asks_for_one_gets_one(core, large_fleet):
    it, (t1, _) = start(core, num_splits=INFINITE)
    assert ask(core, it, t1, 1, max_splits=1) == [0]
    assert ask(core, it, t1, 2, max_splits=0) == [1]


def test_a_deterministic_read_leases_one_split_at_a_time(core, large_fleet):
    it, (t1, _) = start(core, num_splits=INFINITE, deterministic=True)
    assert ask(core, it, t1, 1) == [0]


def test_a_retry_gets_the_same_splits_and_leases_nothing_more(core, large_fleet):
    recorder = Recorder(core)
    it, (t1, t2) = start(core, num_splits=INFINITE)
    first = ask(core, it, t1, 1)
    committed = len(recorder.updates)
    assert ask(core, it, t1, 1) == first == [0, 1]
    assert len(recorder.updates) == committed
    assert ask(core, it, t2, 1) == [2, 3]
    assert ask(core, it, t1, 2) == [4, 5]


def test_the_journal_and_a_checkpoint_rebuild_a_multi_split_answer(core, large_fleet):
    recorder = Recorder(core)
    it, (t1, t2) = start(core, num_splits=INFINITE)
    ask(core, it, t1, 1)
    ask(core, it, t2, 1)
    assert core.state.tasks[t1].last_splits == (0, 1)
    replayed = DispatcherState()
    for update in recorder.updates:
        replayed.apply(update)
    assert vars(replayed) == vars(core.state)
    from_checkpoint = DispatcherState(first_id=1)
    for update in core.state.to_updates():
        from_checkpoint.apply(update)
    assert vars(from_checkpoint) == vars(core.state)
    assert from_checkpoint.tasks[t2].last_splits == (2, 3)


def test_a_lease_of_several_splits_is_one_journal_record(core, large_fleet):
    recorder = Recorder(core)
    it, (t1, _) = start(core, num_splits=INFINITE)
    before = len(recorder.updates)
    assert ask(core, it, t1, 1) == [0, 1]
    (update,) = recorder.updates[before:]
    assert update.WhichOneof("kind") == "lease_splits"
    assert list(update.lease_splits.split_indices) == [0, 1]


def test_a_journal_of_one_assign_split_per_split_rebuilds_the_same_lease(core, large_fleet):
    """Journals written before ``lease_splits`` hold one ``assign_split`` record per split of an answer:
    they replay to the state one ``lease_splits`` record gives."""
    recorder = Recorder(core)
    it, (t1, t2) = start(core, num_splits=INFINITE)
    ask(core, it, t1, 1)
    ask(core, it, t2, 1)
    older = DispatcherState()
    for update in recorder.updates:
        if update.WhichOneof("kind") != "lease_splits":
            older.apply(update)
            continue
        lease = update.lease_splits
        for split in lease.split_indices:
            older.apply(state_pb2.Update(assign_split=state_pb2.AssignSplitUpdate(
                iteration_id=lease.iteration_id, task_id=lease.task_id, split_index=split,
                request_id=lease.request_id)))
    assert vars(older) == vars(core.state)
    assert older.tasks[t1].last_splits == (0, 1) and older.tasks[t2].last_splits == (2, 3)


def test_a_lease_of_no_split_is_refused(core):
    it, (t1, _) = start(core, num_splits=INFINITE)
    with pytest.raises(StateUpdateError, match="leases no split"):
        core.state.apply(state_pb2.Update(lease_splits=state_pb2.LeaseSplitsUpdate(
            iteration_id=it.iteration_id, task_id=t1, request_id=1)))


def test_a_lost_workers_leased_splits_all_go_to_the_others(core, clock, large_fleet):
    it, (t1, t2) = start(core, num_splits=INFINITE)
    assert ask(core, it, t1, 1) == [0, 1]
    worker_of = {core.state.tasks[t].worker_address: t for t in (t1, t2)}
    alive = next(a for a, t in worker_of.items() if t == t2)
    clock.advance(6)  # past worker_timeout_ms; only t2's worker heartbeats
    core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=alive, worker_uid=alive, current_tasks=[t2]))
    core.collect_garbage()
    assert core.state.tasks[t1].revoked
    iteration = core.state.iterations[it.iteration_id]
    assert sorted(split for _, split in iteration.pending) == [0, 1]
    # The clients stopped reading the revoked task: each split is handed out again, one per answer.
    core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=it.client_id, read_key=it.read_key, stopped_tasks=[t1]))
    assert ask(core, it, t2, 1) == [0]
    assert ask(core, it, t2, 2) == [1]
    assert ask(core, it, t2, 3) == [2, 3]


def test_split_leases_know_each_tasks_keys_through_every_change():
    # The index a revocation reads (SplitLeases.of_task) always equals a scan of the table.
    import random

    from dataservice.dispatcher.state import SplitLeases

    rng = random.Random(5)
    leases, plain = SplitLeases({(0, 0): 1}), {(0, 0): 1}
    for _ in range(3_000):
        key, task = (rng.randrange(3), rng.randrange(40)), rng.randrange(1, 9)
        op = rng.random()
        if op < 0.6:
            leases[key] = plain[key] = task
        elif op < 0.8 and key in plain:
            del leases[key], plain[key]
        else:
            assert leases.pop(key, None) == plain.pop(key, None)
        assert leases == plain
    for task in range(1, 9):
        assert sorted(leases.of_task(task)) == sorted(k for k, t in plain.items() if t == task)
    with pytest.raises(TypeError, match="one key at a time"):
        leases.update({(9, 9): 1})
    with pytest.raises(KeyError):
        leases.pop((99, 99))


def test_a_mass_loss_revokes_each_lost_task_by_its_own_leases(core, clock, large_fleet):
    # 300 workers, 200 of them lost at once (a rack): each lost task's leases, and only those, go back to be
    # redone; the journal and a checkpoint rebuild the same tables and the same index.
    recorder = Recorder(core)
    workers = [f"w{i}:1" for i in range(300)]
    it, tasks = start(core, num_splits=INFINITE, workers=workers)
    leased = {t: ask(core, it, t, 1) for t in tasks}
    assert all(len(splits) >= 2 for splits in leased.values())  # several splits per answer
    lost = {t for t in tasks if int(core.state.tasks[t].worker_address[1:].split(":")[0]) < 200}
    clock.advance(6)  # past worker_timeout_ms; only the last 100 workers heartbeat
    for t in set(tasks) - lost:
        address = core.state.tasks[t].worker_address
        core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=address, worker_uid=address,
                                                        current_tasks=[t]))
    core.collect_garbage()
    iteration = core.state.iterations[it.iteration_id]
    stream = {t: core.state.tasks[t].stream_id for t in tasks}
    assert {t for t in tasks if core.state.tasks[t].revoked} == lost
    assert iteration.pending == {(stream[t], s): t for t in lost for s in leased[t]}
    assert dict(iteration.leases) == {(stream[t], s): t for t in set(tasks) - lost for s in leased[t]}
    assert all(iteration.leases.of_task(t) == [] for t in lost)
    replayed = DispatcherState()
    for update in recorder.updates:
        replayed.apply(update)
    from_checkpoint = DispatcherState(first_id=1)
    for update in core.state.to_updates():
        from_checkpoint.apply(update)
    for state in (replayed, from_checkpoint):
        assert vars(state) == vars(core.state)
        rebuilt = state.iterations[it.iteration_id].leases
        assert all(sorted(rebuilt.of_task(t)) == sorted(iteration.leases.of_task(t)) for t in tasks)


# --- through real servers --------------------------------------------------------------------------------

def test_a_read_with_several_splits_per_answer_delivers_every_element_once(large_fleet):
    with TestCluster(num_workers=2) as cluster:
        recorder = Recorder(cluster.dispatcher.core)
        ds = Dataset.range(3_000).apply(distribute("distributed_epoch", cluster.target))
        got = run_with_deadline(lambda: sorted(int(x) for x in ds), 60.0)
        assert got == list(range(3_000))
        answers: dict = {}
        for update in recorder.updates:
            if update.WhichOneof("kind") == "lease_splits":
                key = (update.lease_splits.task_id, update.lease_splits.request_id)
                answers[key] = answers.get(key, 0) + len(update.lease_splits.split_indices)
        assert max(answers.values()) >= 2, answers  # several splits in one answer (the fleet rule, and the pace)


def test_a_worker_stopped_mid_read_loses_none_of_its_leased_splits(large_fleet):
    with TestCluster(num_workers=2) as cluster:
        ds = Dataset.from_tensor_slices(np.arange(4_000)).apply(distribute("distributed_epoch", cluster.target))

        def read() -> list:
            out = []
            for i, x in enumerate(ds):
                out.append(int(x))
                if i == 500:
                    cluster.stop_worker(0)
            return out

        got = run_with_deadline(read, 90.0)
        assert sorted(got) == list(range(4_000))
