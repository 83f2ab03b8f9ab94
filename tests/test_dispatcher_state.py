"""DispatcherState and DispatcherCore without a network: requests in, responses and
state out, time from a fake clock."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from dataservice import errors
from dataservice.dispatcher import saves
from dataservice.dispatcher.core import INFINITE, NOT_SPLITTABLE, DispatcherCore
from dataservice.dispatcher.state import DispatcherState, IterationState
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import state_pb2
from dataservice.service.config import DispatcherConfig
from tests.journals import FakeClock, Recorder, named_job

PE, DE = state_pb2.PARALLEL_EPOCHS, state_pb2.DISTRIBUTED_EPOCH


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def core(clock):
    return DispatcherCore(DispatcherConfig(job_gc_timeout_ms=10_000, client_timeout_ms=5_000), clock=clock)


def register(core, blob=b"pipeline", num_splits=4) -> int:
    return core.register_dataset(pb.RegisterDatasetRequest(dataset_def=blob, num_splits=num_splits)).dataset_id


def job(core, dataset_id, mode=PE, name="") -> int:
    return core.get_or_create_job(pb.GetOrCreateJobRequest(dataset_id=dataset_id, processing_mode=mode,
                                                           job_name=name)).job_id


def iteration(core, job_id, repetition=0) -> pb.GetOrCreateIterationResponse:
    return core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id, repetition=repetition))


def heartbeat(core, address, uid="uid", current=(), finished=(), wait_ms=0) -> pb.WorkerHeartbeatResponse:
    return core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=address, worker_uid=uid,
                                                           current_tasks=list(current),
                                                           finished_tasks=list(finished), wait_ms=wait_ms))


def split(core, iteration_id, task_id) -> pb.GetSplitResponse:
    return core.get_split(pb.GetSplitRequest(iteration_id=iteration_id, task_id=task_id))


# --- datasets ------------------------------------------------------------------------------

def test_same_dataset_registered_twice_gets_the_same_id(core):
    first = register(core, b"a")
    assert register(core, b"a") == first
    second = register(core, b"b")
    assert second != first
    assert len(core.state.datasets) == 2
    assert core.get_dataset_def(pb.GetDatasetDefRequest(dataset_id=second)).dataset_def == b"b"


def test_empty_dataset_def_is_refused(core):
    with pytest.raises(errors.InvalidRequestError):
        register(core, b"")


def test_unknown_dataset_is_not_found(core):
    with pytest.raises(errors.NotFoundError):
        core.get_dataset_def(pb.GetDatasetDefRequest(dataset_id=12345))
    with pytest.raises(errors.NotFoundError):
        job(core, 12345)


def test_ids_are_never_reused_across_dispatcher_incarnations(clock):
    config = DispatcherConfig()
    first = DispatcherCore(config, clock=clock)
    ids = [register(first, bytes([i])) for i in range(50)]
    restarted = DispatcherCore(config, clock=clock)
    # The restarted dispatcher's first id is past every id the previous one handed out.
    assert register(restarted, b"x") > max(ids)


# --- jobs -------------------------------------------------------------------------------------

def test_named_job_is_shared_and_anonymous_jobs_are_not(core):
    dataset_id = register(core)
    assert job(core, dataset_id, name="j") == job(core, dataset_id, name="j")
    assert job(core, dataset_id) != job(core, dataset_id)


def test_job_name_reused_with_another_mode_conflicts_and_with_another_dataset_is_another_job(core):
    a, b = register(core, b"a"), register(core, b"b")
    first = job(core, a, PE, "j")
    with pytest.raises(errors.AlreadyExistsError, match="'j'.*distributed_epoch"):
        job(core, a, DE, "j")
    # As in tf.data service, a job name is scoped by the dataset id read.
    assert job(core, b, PE, "j") != first and job(core, a, PE, "j") == first
    assert len(core.state.jobs) == 2


def test_bad_processing_mode_and_unsplittable_datasets(core):
    with pytest.raises(errors.InvalidRequestError):
        job(core, register(core), mode=state_pb2.PROCESSING_MODE_UNSPECIFIED)
    unsplittable = register(core, b"generator", num_splits=NOT_SPLITTABLE)
    with pytest.raises(errors.NotSplittableError):
        job(core, unsplittable, DE)
    job(core, unsplittable, PE)  # parallel epochs needs no splits


# --- tasks ----------------------------------------------------------------------------------

def test_tasks_are_created_for_every_worker_and_for_a_worker_joining_later(core):
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    job_id = job(core, register(core))
    it = iteration(core, job_id)
    tasks = core.state.iterations[it.iteration_id].tasks
    assert sorted(core.state.tasks[t].worker_address for t in tasks) == ["w1:1", "w2:1"]

    # Each worker learns of its own task.
    (task_def,) = heartbeat(core, "w1:1").new_tasks
    assert task_def.worker_address == "w1:1" and task_def.iteration_id == it.iteration_id
    assert task_def.job_id == job_id and task_def.processing_mode == PE and task_def.num_splits == 4
    # A task the worker already runs is not sent again.
    assert list(heartbeat(core, "w1:1", current=[task_def.task_id]).new_tasks) == []

    # A worker joining later gets a task for the running iteration, and the client sees it.
    (late,) = heartbeat(core, "w3:1").new_tasks
    assert late.iteration_id == it.iteration_id
    seen = core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=it.client_id, read_key=it.read_key))
    assert {t.worker_address for t in seen.tasks} == {"w1:1", "w2:1", "w3:1"}
    assert not seen.iteration_finished and seen.dispatcher_incarnation == core.incarnation


def test_restarted_worker_resumes_its_parallel_epochs_stream_after_the_clients_stop_reading(core):
    heartbeat(core, "w1:1", uid="first")
    it = iteration(core, job(core, register(core)))
    (task_def,) = heartbeat(core, "w1:1", uid="first").new_tasks
    # The worker restarts (new uid): its task is revoked, and nothing replaces it while a
    # client may still be reading from the old one.
    assert not heartbeat(core, "w1:1", uid="second").new_tasks
    assert core.state.tasks[task_def.task_id].revoked
    response = core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=it.client_id, read_key=it.read_key, progress=[
        state_pb2.SplitProgress(stream_id=task_def.stream_id, split_index=0, ranges=[0, 7], total=-1)]))
    assert list(response.revoked_tasks) == [task_def.task_id]
    core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=it.client_id, read_key=it.read_key, stopped_tasks=[task_def.task_id]))
    # Now a new task takes over the same stream and skips what the client holds.
    (again,) = heartbeat(core, "w1:1", uid="second").new_tasks
    assert again.task_id != task_def.task_id
    assert again.stream_id == task_def.stream_id
    assert list(again.skip_ranges) == [0, 7]
    assert not heartbeat(core, "w1:1", uid="second", current=[again.task_id]).new_tasks


def test_worker_silent_past_the_timeout_gets_no_task_in_a_new_iteration(core, clock):
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    clock.advance(6)
    heartbeat(core, "w1:1")
    clock.advance(6)  # w2 silent for 12 s, past worker_timeout_ms (10 s); w1 for 6 s
    job_id = job(core, register(core), name="j")
    it = iteration(core, job_id)
    assert [core.state.tasks[t].worker_address for t in core.state.iterations[it.iteration_id].tasks] == ["w1:1"]
    # Back again: the next iteration has a task on it.
    heartbeat(core, "w2:1")
    later = iteration(core, job_id, 1)
    assert sorted(core.state.tasks[t].worker_address
                  for t in core.state.iterations[later.iteration_id].tasks) == ["w1:1", "w2:1"]


def test_heartbeat_long_poll_ends_before_the_worker_could_look_lost():
    core = DispatcherCore(DispatcherConfig(worker_timeout_ms=200))
    heartbeat(core, "w1:1")
    start = time.monotonic()
    heartbeat(core, "w1:1", current=[], wait_ms=60_000)
    assert time.monotonic() - start < 5


def test_worker_is_told_to_delete_tasks_it_should_not_hold(core):
    heartbeat(core, "w1:1")
    response = heartbeat(core, "w1:1", current=[424242])
    assert list(response.tasks_to_delete) == [424242]


def test_heartbeat_long_poll_answers_as_soon_as_a_task_is_created(core):
    heartbeat(core, "w1:1")
    job_id = job(core, register(core))
    answered = threading.Event()
    result = {}

    def poll():
        result["response"] = heartbeat(core, "w1:1", wait_ms=30_000)
        answered.set()

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    assert not answered.wait(0.05)  # nothing to say yet: the poll waits
    it = iteration(core, job_id)
    assert answered.wait(5), "the long poll did not wake up for the new task"
    (task_def,) = result["response"].new_tasks
    assert task_def.iteration_id == it.iteration_id
    thread.join(5)


def test_empty_worker_address_is_refused(core):
    with pytest.raises(errors.InvalidRequestError):
        heartbeat(core, "")


@pytest.mark.parametrize("address", ["no-port", "h:0", "h:99999", "x" * 300 + ":1", "grpc://h:1:2"])
def test_malformed_or_oversized_worker_addresses_are_refused(core, address):
    with pytest.raises(errors.InvalidRequestError, match="WorkerHeartbeat"):
        heartbeat(core, address)
    with pytest.raises(errors.InvalidRequestError, match="data_address"):
        core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address="w1:1", worker_uid="u", data_address=address))
    assert core.state.workers == {}


def test_a_stream_whose_worker_returns_after_its_iteration_ended_is_not_awaited(core, clock):
    """parallel_epochs: a worker lost while the others finish ends the iteration without its copy;
    when it comes back, the reader must not be told to wait for a task that will never come."""
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    it = iteration(core, job(core, register(core)))
    tasks = {t.worker_address: t for t in (*heartbeat(core, "w1:1").new_tasks, *heartbeat(core, "w2:1").new_tasks)}
    for _ in range(3):  # w2 silent for 12 s, past worker_timeout_ms: lost, its task revoked
        clock.advance(4)
        core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=it.client_id, read_key=it.read_key))
        heartbeat(core, "w1:1", current=[tasks["w1:1"].task_id])
    core.collect_garbage()
    assert core.state.tasks[tasks["w2:1"].task_id].revoked
    heartbeat(core, "w1:1", current=[tasks["w1:1"].task_id], finished=[tasks["w1:1"].task_id])
    beat = core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=it.client_id, read_key=it.read_key,
                                                           stopped_tasks=[tasks["w2:1"].task_id]))
    assert beat.iteration_finished
    heartbeat(core, "w2:1")  # back: its stream is still pending, but the iteration is over
    beat = core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=it.client_id, read_key=it.read_key))
    assert beat.iteration_finished and not beat.more_tasks_expected


def test_iteration_finishes_when_every_task_has_finished(core):
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    it = iteration(core, job(core, register(core)))
    t1, t2 = core.state.iterations[it.iteration_id].tasks
    heartbeat(core, "w1:1", current=[t1], finished=[t1])
    assert core.state.iterations[it.iteration_id].state is IterationState.ACTIVE
    heartbeat(core, "w2:1", current=[t2], finished=[t2])
    assert core.state.iterations[it.iteration_id].state is IterationState.FINISHED
    assert core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=it.client_id, read_key=it.read_key)).iteration_finished
    # While a client reads, the finished tasks stay; once it is released they are deleted.
    assert list(heartbeat(core, "w1:1", current=[t1]).tasks_to_delete) == []
    core.release_iteration_client(pb.ReleaseIterationClientRequest(client_id=it.client_id, read_key=it.read_key))
    assert list(heartbeat(core, "w1:1", current=[t1]).tasks_to_delete) == [t1]
    # A worker joining now gets no task for the finished iteration.
    assert list(heartbeat(core, "w3:1").new_tasks) == []


# --- splits ---------------------------------------------------------------------------------

def test_splits_are_handed_out_in_order_until_end_of_splits(core):
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    it = iteration(core, job(core, register(core, num_splits=5), DE))
    t1, t2 = core.state.iterations[it.iteration_id].tasks
    handed = [split(core, it.iteration_id, t).split_index for t in (t1, t2, t1, t2, t2)]
    assert handed == [0, 1, 2, 3, 4]
    assert core.state.iterations[it.iteration_id].next_split == 5
    # Every split is leased but none is with a client yet: a lease may still come back.
    assert split(core, it.iteration_id, t1).wait
    # The client holds every element of every split: the pass is over.
    core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=it.client_id, read_key=it.read_key, progress=[
        state_pb2.SplitProgress(stream_id=0, split_index=i, ranges=[0, 3], total=3) for i in range(5)]))
    for t in (t1, t2):
        assert split(core, it.iteration_id, t).end_of_splits
    assert core.state.iterations[it.iteration_id].finished


def test_infinite_datasets_never_run_out_of_splits(core):
    heartbeat(core, "w1:1")
    it = iteration(core, job(core, register(core, num_splits=INFINITE), DE))
    (task_id,) = core.state.iterations[it.iteration_id].tasks
    assert [split(core, it.iteration_id, task_id).split_index for _ in range(100)] == list(range(100))


def test_an_endless_reads_done_splits_stay_a_few_ranges_and_replay_from_a_checkpoint(core):
    # A repeat()ed read completes splits for as long as it runs: its done splits are kept, and checkpointed,
    # as ranges, not a key per split (a set of them grew for months, and every checkpoint listed them all).
    heartbeat(core, "w1:1")
    it = iteration(core, job(core, register(core, num_splits=INFINITE), DE))
    (task_id,) = core.state.iterations[it.iteration_id].tasks
    leased = [split(core, it.iteration_id, task_id).split_index for _ in range(3000)]
    ended = [s for s in leased if s != 1500]  # one split still in flight
    core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=it.client_id, read_key=it.read_key, progress=[
        state_pb2.SplitProgress(stream_id=0, split_index=s, ranges=[0, 8], total=8) for s in ended]))
    done = core.state.iterations[it.iteration_id].done
    assert len(done) == 2999 and (0, 1499) in done and (0, 1500) not in done and (0, 1501) in done
    assert done.covers(0, 1500) and not done.covers(0, 1501) and not done.covers(1, 1) and done.covers(1, 0)
    (snapshot,) = [u.iteration_snapshot for u in core.state.to_updates() if u.HasField("iteration_snapshot")]
    assert list(snapshot.done_ranges) == [0, 0, 1500, 0, 1501, 3000] and not snapshot.done
    replayed = DispatcherState()
    for update in core.state.to_updates():
        replayed.apply(update)
    assert replayed.iterations[it.iteration_id].done == done
    # The leases, packed too (a fleet's are tens of thousands): the one in flight, and the task's last answer.
    assert list(snapshot.lease_triples) == [0, 1500, task_id] and not snapshot.leases
    assert list(snapshot.last_assignment_quads) == [0, 2999, task_id, 0] and not snapshot.last_assignments
    # A checkpoint written before these fields listed (stream, split) pairs and a message per lease: it still loads.
    Lease = state_pb2.IterationSnapshotUpdate.Lease
    old = state_pb2.IterationSnapshotUpdate()
    old.CopyFrom(snapshot)
    for field in ("done_ranges", "lease_triples", "last_assignment_quads"):
        old.ClearField(field)
    old.done.extend([0, 0, 0, 1, 0, 7])
    old.leases.append(Lease(stream_id=0, split_index=1500, task_id=task_id))
    old.pending.append(Lease(stream_id=0, split_index=1498, task_id=task_id))
    old.last_assignments.append(Lease(stream_id=0, split_index=2999, task_id=task_id, request_id=0))
    older = DispatcherState()
    for update in core.state.to_updates():
        if update.HasField("iteration_snapshot"):
            update = state_pb2.Update(iteration_snapshot=old)
        older.apply(update)
    restored = older.iterations[it.iteration_id]
    assert set(restored.done) == {(0, 0), (0, 1), (0, 7)}
    assert dict(restored.leases) == {(0, 1500): task_id} and restored.pending == {(0, 1498): task_id}
    assert older.tasks[task_id].last_splits == (2999,)


def test_split_for_an_unknown_iteration_or_task_is_not_found(core):
    heartbeat(core, "w1:1")
    it = iteration(core, job(core, register(core), DE))
    with pytest.raises(errors.NotFoundError):
        split(core, 999, 1)
    with pytest.raises(errors.NotFoundError):
        split(core, it.iteration_id, 999)


def test_each_iteration_of_a_job_has_its_own_splits(core):
    heartbeat(core, "w1:1")
    job_id = job(core, register(core, num_splits=2), DE, "j")
    first, second = iteration(core, job_id, 0), iteration(core, job_id, 1)
    assert first.iteration_id != second.iteration_id
    # The same repetition is the same iteration, with a new client.
    again = iteration(core, job_id, 0)
    assert again.iteration_id == first.iteration_id and again.client_id != first.client_id
    for it in (first, second):
        (task_id,) = core.state.iterations[it.iteration_id].tasks
        assert [split(core, it.iteration_id, task_id).split_index for _ in range(2)] == [0, 1]


# --- clients and garbage collection -----------------------------------------------------------------

def test_release_of_clients(core):
    it = iteration(core, job(core, register(core), name="j"))
    other = iteration(core, named_job(core.state, "j"))
    assert core.state.iterations[it.iteration_id].clients == {it.client_id, other.client_id}
    core.release_iteration_client(pb.ReleaseIterationClientRequest(client_id=it.client_id, read_key=it.read_key))
    core.release_iteration_client(pb.ReleaseIterationClientRequest(client_id=it.client_id, read_key=it.read_key))  # idempotent
    assert core.state.iterations[it.iteration_id].clients == {other.client_id}
    assert it.client_id not in core.state.clients
    with pytest.raises(errors.NotFoundError, match="unknown"):
        core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=it.client_id, read_key=it.read_key))
    core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=other.client_id, read_key=other.read_key))


def test_idle_iteration_is_garbage_collected_after_the_timeout(core, clock):
    heartbeat(core, "w1:1")
    job_id = job(core, register(core), name="j")
    it = iteration(core, job_id)
    (task_id,) = core.state.iterations[it.iteration_id].tasks
    for _ in range(15):  # a minute in which the client reads and heartbeats: nothing is collected
        clock.advance(4)
        core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=it.client_id, read_key=it.read_key))
        assert core.collect_garbage() == []
    core.release_iteration_client(pb.ReleaseIterationClientRequest(client_id=it.client_id, read_key=it.read_key))
    clock.advance(9.9)
    assert core.collect_garbage() == []
    clock.advance(0.2)
    assert core.collect_garbage() == [it.iteration_id]
    # Collected, the job leaves the state with its iteration and task: nothing of it can be read.
    assert (job_id, it.iteration_id, task_id) not in (core.state.jobs, core.state.iterations, core.state.tasks)
    assert job_id not in core.state.jobs and task_id not in core.state.tasks
    assert core.state.jobs_pruned == 1 and "j" not in {key.job_name for key in core.state.jobs_by_key}
    assert core.collect_garbage() == []  # collected once
    assert list(heartbeat(core, "w1:1", current=[task_id]).tasks_to_delete) == [task_id]
    with pytest.raises(errors.NotFoundError, match="left the dispatcher.s state; a new read under the job name .j. starts a new job"):
        iteration(core, job_id)
    # Its name starts a new job.
    assert job(core, core.state.datasets and next(iter(core.state.datasets)), name="j") != job_id


def test_a_new_client_keeps_an_idle_iteration_alive(core, clock):
    job_id = job(core, register(core), name="j")
    it = iteration(core, job_id)
    core.release_iteration_client(pb.ReleaseIterationClientRequest(client_id=it.client_id, read_key=it.read_key))
    clock.advance(9)
    joined = iteration(core, job_id)
    clock.advance(9)
    assert core.collect_garbage() == []
    core.release_iteration_client(pb.ReleaseIterationClientRequest(client_id=joined.client_id, read_key=joined.read_key))
    clock.advance(10.1)
    assert core.collect_garbage() == [it.iteration_id]


def test_silent_client_is_released_and_then_its_iteration_collected(core, clock):
    heartbeat(core, "w1:1")
    it = iteration(core, job(core, register(core), name="shared"))
    (task_id,) = core.state.iterations[it.iteration_id].tasks
    clock.advance(4)
    core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=it.client_id, read_key=it.read_key))
    heartbeat(core, "w1:1", current=[task_id])
    clock.advance(4)
    core.check_liveness()
    assert it.client_id in core.state.clients
    clock.advance(1.1)  # 5.1 s since the last heartbeat: past client_timeout_ms
    heartbeat(core, "w1:1", current=[task_id])
    core.check_liveness()  # on its own clock, without waiting for the garbage collector
    assert it.client_id not in core.state.clients
    assert not core.state.tasks[task_id].revoked  # another reader may still join the shared job
    clock.advance(2.6)  # nobody read it for client_timeout_ms / 2: its task stops, the worker frees it
    heartbeat(core, "w1:1", current=[task_id])
    core.check_liveness()
    assert core.state.tasks[task_id].revoked
    assert list(heartbeat(core, "w1:1", current=[task_id]).tasks_to_delete) == [task_id]
    clock.advance(7.5)
    assert core.collect_garbage() == [it.iteration_id]


def test_an_anonymous_job_ends_and_leaves_the_state_when_its_reader_goes(core, clock):
    heartbeat(core, "w1:1")
    job_id = job(core, register(core))
    it = iteration(core, job_id)
    (task_id,) = core.state.iterations[it.iteration_id].tasks
    clock.advance(5.1)
    heartbeat(core, "w1:1", current=[task_id])
    core.check_liveness()  # silent past client_timeout_ms: nobody else may read an anonymous job
    assert job_id not in core.state.jobs and it.iteration_id not in core.state.iterations
    assert list(heartbeat(core, "w1:1", current=[task_id]).tasks_to_delete) == [task_id]


def test_finished_named_jobs_beyond_the_kept_number_leave_the_state(clock):
    core = DispatcherCore(DispatcherConfig(job_gc_timeout_ms=10_000, worker_timeout_ms=10_000,
                                           client_timeout_ms=5_000, finished_jobs_kept=3), clock=clock)
    heartbeat(core, "w1:1")
    dataset = register(core)
    jobs = []
    for n in range(6):
        job_id = job(core, dataset, name=f"job-{n}")
        it = iteration(core, job_id)
        (task_id,) = core.state.iterations[it.iteration_id].tasks
        heartbeat(core, "w1:1", current=[task_id], finished=[task_id])  # produced everything: finished
        assert core.state.iterations[it.iteration_id].finished
        core.release_iteration_client(pb.ReleaseIterationClientRequest(client_id=it.client_id,
                                                                       read_key=it.read_key))
        assert core.state.iterations[it.iteration_id].pruned and task_id not in core.state.tasks
        jobs.append(job_id)
    assert sorted(core.state.jobs) == jobs[-3:] and core.state.jobs_pruned == 3
    # A late reader of a kept job's finished repetition is told at once that it finished.
    late = iteration(core, jobs[-1])
    reply = core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=late.client_id, read_key=late.read_key))
    assert reply.iteration_finished and not reply.tasks and not reply.more_tasks_expected
    status = core.get_status(pb.GetStatusRequest())
    assert (status.counts.jobs, status.counts.jobs_pruned, status.counts.jobs_finished) == (3, 3, 6)


def test_a_worker_gone_for_good_leaves_the_state_once_no_task_refers_to_it(core, clock):
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    it = iteration(core, job(core, register(core), DE, name="shared"))
    (t1, t2) = core.state.iterations[it.iteration_id].tasks
    clock.advance(11)  # past worker_timeout_ms and job_gc_timeout_ms for w2; w1 keeps heartbeating
    heartbeat(core, "w1:1", current=[core.state.tasks[t].task_id for t in (t1, t2)
                                     if core.state.tasks[t].worker_address == "w1:1"])
    core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=it.client_id, read_key=it.read_key))
    core.collect_garbage()
    assert "w2:1" in core.state.workers  # its revoked task still belongs to a running iteration
    core.release_iteration_client(pb.ReleaseIterationClientRequest(client_id=it.client_id, read_key=it.read_key))
    clock.advance(11)
    heartbeat(core, "w1:1")
    core.collect_garbage()  # the idle iteration is collected, its job and tasks pruned ...
    core.collect_garbage()  # ... and then the worker nobody refers to
    assert "w2:1" not in core.state.workers and "w1:1" in core.state.workers
    assert [e["worker"] for kind, e in core.events if kind == "prune_worker"] == ["w2:1"]


def test_a_task_of_an_iteration_that_finished_before_its_worker_heard_of_it_still_goes_out(core):
    # Its readers know the task from their heartbeat and ask its worker for it: the worker must get
    # it and answer end of input, or the readers ask "not running" forever.
    heartbeat(core, "w1:1")
    heartbeat(core, "w2:1")
    it = iteration(core, job(core, register(core, num_splits=1), DE, name="short"))
    t1, t2 = sorted(core.state.iterations[it.iteration_id].tasks,
                    key=lambda t: core.state.tasks[t].worker_address)
    assert [t.task_id for t in heartbeat(core, "w1:1").new_tasks] == [t1]
    assert split(core, it.iteration_id, t1).split_index == 0
    core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=it.client_id, read_key=it.read_key, progress=[
        state_pb2.SplitProgress(stream_id=0, split_index=0, ranges=[0, 5], total=5)]))
    assert core.state.iterations[it.iteration_id].finished  # before w2 ever heard of its task
    assert [t.task_id for t in heartbeat(core, "w2:1").new_tasks] == [t2]
    assert split(core, it.iteration_id, t2).end_of_splits
    core.release_iteration_client(pb.ReleaseIterationClientRequest(client_id=it.client_id, read_key=it.read_key))
    assert list(heartbeat(core, "w2:1", current=[t2]).tasks_to_delete) == [t2]  # nobody reads it any more


# --- replay ----------------------------------------------------------------------------------

def test_replaying_the_updates_rebuilds_the_same_state(core, clock, tmp_path):
    recorder = Recorder(core)
    # Static sharding's fixed worker list: each worker below is bound to its entry (bind_static_worker).
    core.config = dataclasses.replace(core.config, worker_addresses=["w1", "w2", "w3", "w9"])
    heartbeat(core, "w1:1", uid="a")
    heartbeat(core, "w2:1", uid="b")
    a = register(core, b"a", num_splits=3)
    b = register(core, b"b")
    register(core, b"a")
    # User-chosen dataset ids: a new pipeline under a name, and a second name for a registered one.
    core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"c", num_splits=1, dataset_name="c-v1"))
    core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"a", num_splits=3, dataset_name="a-v1"))
    named = job(core, a, DE, "named")
    it = iteration(core, named)
    second = iteration(core, named)  # a second client
    t1, t2 = core.state.iterations[it.iteration_id].tasks
    split(core, it.iteration_id, t1)
    split(core, it.iteration_id, t2)
    split(core, it.iteration_id, t1)  # split 2, which no client holds when t1 is revoked below
    heartbeat(core, "w3:1", uid="c")  # joins the running iteration
    heartbeat(core, "w1:1", uid="a2")  # restarts
    heartbeat(core, "w1:1", uid="a2", current=[t1], finished=[t1])
    # A client reports what it holds (split 0 complete) and stops reading the revoked task.
    core.client_heartbeat(pb.ClientHeartbeatRequest(
        client_id=it.client_id, read_key=it.read_key, stopped_tasks=[t1],
        progress=[state_pb2.SplitProgress(stream_id=0, split_index=0, ranges=[0, 5], total=5),
                  state_pb2.SplitProgress(stream_id=0, split_index=1, ranges=[0, 2], total=-1)]))
    core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=second.client_id, read_key=second.read_key,
                                                    stopped_tasks=[t1]))
    assert split(core, it.iteration_id, t2).split_index == 2  # the revoked task's split (assign_split, reassigned)
    for name in ("other", ""):  # a finished named iteration leaves a stub; an anonymous job leaves
        other = iteration(core, job(core, b, name=name))
        for t in core.state.iterations[other.iteration_id].tasks:
            worker = core.state.tasks[t].worker_address
            heartbeat(core, worker, uid=core.state.workers[worker].uid, current=[t], finished=[t])
        core.release_iteration_client(pb.ReleaseIterationClientRequest(client_id=other.client_id,
                                                                       read_key=other.read_key))
    # distributed_save: groups leased, one committed, the rest released when the workers go silent
    # (below); a second save fails.
    path = str(tmp_path / "save")
    save_id = core.distributed_save(pb.DistributedSaveRequest(dataset_id=a, path=path, compression="LZ4")).save_id
    first = core.lease_save_group(pb.LeaseSaveGroupRequest(save_id=save_id, worker_address="w1:1"))
    core.lease_save_group(pb.LeaseSaveGroupRequest(save_id=save_id, worker_address="w2:1"))
    open(saves.uncommitted_path(path, first.group, first.attempt), "wb").close()
    assert core.report_save_chunk(pb.ReportSaveChunkRequest(save_id=save_id, worker_address="w1:1", group=first.group,
                                                            attempt=first.attempt, num_elements=0)).committed
    failing = core.distributed_save(pb.DistributedSaveRequest(dataset_id=b, path=str(tmp_path / "failing"))).save_id
    lease = core.lease_save_group(pb.LeaseSaveGroupRequest(save_id=failing, worker_address="w1:1"))
    core.report_save_chunk(pb.ReportSaveChunkRequest(save_id=failing, worker_address="w1:1", group=lease.group,
                                                     attempt=lease.attempt, error="ValueError: no"))
    assert core.state.saves[failing].error.endswith("ValueError: no")
    clock.advance(100)
    core.collect_garbage()
    assert not core.state.saves[save_id].leases, "the silent workers' leases went back to the pool"
    heartbeat(core, "w9:1", uid="gone")  # a worker that came and went, given no task
    clock.advance(100)
    core.collect_garbage()
    assert "w9:1" not in core.state.workers
    heartbeat(core, "w1:1", uid="a2")
    later = iteration(core, job(core, a, DE, "later"))  # the checkpoint below summarises its iteration
    assert core.state.iterations[later.iteration_id].tasks
    # Coordinated reads: a job with num_consumers, a client reading as consumer 0 (0 is set, not None), and
    # a worker that joins the rotation at a later round once the reader acknowledged the block.
    from dataservice import Dataset
    from dataservice.data.serialization import serialize_dataset
    infinite = register(core, serialize_dataset(Dataset.range(3).repeat()))
    coordinated = core.get_or_create_job(pb.GetOrCreateJobRequest(dataset_id=infinite, processing_mode=PE,
                                                                  job_name="coordinated", num_consumers=2)).job_id
    reader = core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=coordinated, consumer_index=0))
    assert core.state.clients[reader.client_id].consumer_index == 0
    reader_heartbeat = dict(client_id=reader.client_id, read_key=reader.read_key, current_round=3)
    core.client_heartbeat(pb.ClientHeartbeatRequest(**reader_heartbeat))  # the reader knows the tasks now
    heartbeat(core, "w9:1", uid="back")  # joins: pending until the reader acknowledges the block
    block = core.client_heartbeat(pb.ClientHeartbeatRequest(**reader_heartbeat)).block_round
    core.client_heartbeat(pb.ClientHeartbeatRequest(**reader_heartbeat, acknowledged_block_round=block))
    starts = [core.state.tasks[t].starting_round for t in core.state.iterations[reader.iteration_id].tasks]
    assert 0 in starts and block > 3 and block in starts, (starts, block)

    every_kind = {f.name for f in state_pb2.Update.DESCRIPTOR.oneofs_by_name["kind"].fields}
    assert recorder.kinds() == every_kind - {"iteration_snapshot", "id_floor", "counters"}  # for checkpoints
    replayed = DispatcherState()
    for update in recorder.updates:
        replayed.apply(update)
    assert vars(replayed) == vars(core.state)
    assert replayed.next_id() == core.state.next_id()
    # A checkpoint's summary rebuilds the same state in far fewer updates.
    snapshot = core.state.to_updates()
    assert "iteration_snapshot" in {u.WhichOneof("kind") for u in snapshot}
    from_checkpoint = DispatcherState(first_id=1)
    for update in snapshot:
        from_checkpoint.apply(update)
    assert vars(from_checkpoint) == vars(core.state)


def test_unknown_update_is_refused():
    with pytest.raises(ValueError, match="a kind this dataservice does not know"):
        DispatcherState().apply(state_pb2.Update())


def test_an_update_of_a_newer_kind_says_to_upgrade():
    """A kind added later (field 99 here) parses as an update of no kind: replaying it would drop what it
    says, so it is refused, and the message says why."""
    newer = state_pb2.Update.FromString(b"\x98\x06\x01")  # field 99, varint 1
    assert newer.WhichOneof("kind") is None
    with pytest.raises(ValueError, match="written by a newer dataservice; upgrade"):
        DispatcherState().apply(newer)


def test_state_apply_example_from_the_docstring():
    state = DispatcherState()
    state.apply(state_pb2.Update(register_worker=state_pb2.RegisterWorkerUpdate(worker_address="w:1",
                                                                                 worker_uid="a")))
    assert list(state.workers) == ["w:1"]
    state.apply(state_pb2.Update(register_worker=state_pb2.RegisterWorkerUpdate(worker_address="w:1",
                                                                                 worker_uid="b")))
    assert state.workers["w:1"].uid == "b"
