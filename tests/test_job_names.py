"""Named jobs across garbage collection (issue #9): a finished shared job still gives end of
input, as in tf.data, but once every iteration of a named job has been collected the name
starts a new job — in the core, through journal replay and checkpoints, and end to end."""

from __future__ import annotations

import os

import pytest

from dataservice import Dataset, distribute, errors
from dataservice.dispatcher.core import DispatcherCore, MemoryStore
from dataservice.dispatcher.journal import CHECKPOINT_FILE
from dataservice.dispatcher.journaled_store import JournaledStore
from dataservice.dispatcher.state import DispatcherState, IterationState
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import state_pb2
from dataservice.service.config import DispatcherConfig
from tests.cluster import TestCluster, wait_until
from tests.journals import FakeClock, Recorder, comparable, named_job, replay

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

PE, DE = state_pb2.PARALLEL_EPOCHS, state_pb2.DISTRIBUTED_EPOCH
GC_TIMEOUT_S = 10.0
CONFIG = DispatcherConfig(job_gc_timeout_ms=int(GC_TIMEOUT_S * 1000), client_timeout_ms=5_000)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def core(clock):
    return DispatcherCore(CONFIG, clock=clock)


def register(core, blob=b"pipeline", num_splits=4) -> int:
    return core.register_dataset(pb.RegisterDatasetRequest(dataset_def=blob, num_splits=num_splits)).dataset_id


def job(core, dataset_id, mode=PE, name="train") -> int:
    return core.get_or_create_job(pb.GetOrCreateJobRequest(dataset_id=dataset_id, processing_mode=mode,
                                                           job_name=name)).job_id


def iteration(core, job_id, repetition=0) -> pb.GetOrCreateIterationResponse:
    return core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id, repetition=repetition))


def release(core, it: pb.GetOrCreateIterationResponse) -> None:
    core.release_iteration_client(pb.ReleaseIterationClientRequest(client_id=it.client_id, read_key=it.read_key))


def worker_heartbeat(core, address="w1:1", current=(), finished=()) -> pb.WorkerHeartbeatResponse:
    return core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address=address, worker_uid="uid",
                                                           current_tasks=list(current),
                                                           finished_tasks=list(finished)))


def read_to_the_end(core, job_id: int, repetition: int = 0) -> int:
    """One client reads the iteration to its end (its one task finishes) and leaves; the iteration id."""
    it = iteration(core, job_id, repetition)
    (task_id,) = core.state.iterations[it.iteration_id].tasks
    worker_heartbeat(core, current=[task_id], finished=[task_id])
    assert core.state.iterations[it.iteration_id].state is IterationState.FINISHED
    release(core, it)
    return it.iteration_id


def collect(core, clock) -> list[int]:
    clock.advance(GC_TIMEOUT_S + 0.1)
    return core.collect_garbage()


def events(core, kind: str) -> list[dict]:
    return [fields for k, fields in list(core.events) if k == kind]


# --- the rule, in the core ------------------------------------------------------------------------

def test_a_finished_named_job_gives_end_of_input_until_it_is_collected(core, clock):
    worker_heartbeat(core)
    dataset_id = register(core)
    first = job(core, dataset_id)
    iteration_id = read_to_the_end(core, first)
    # A second run before the collection joins the finished iteration: end of input, as in tf.data.
    clock.advance(GC_TIMEOUT_S - 1)
    assert job(core, dataset_id) == first
    late = iteration(core, first)
    assert late.iteration_id == iteration_id
    assert core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=late.client_id, read_key=late.read_key)).iteration_finished
    release(core, late)
    assert core.collect_garbage() == []  # the late client restarted the idle clock
    assert collect(core, clock) == [iteration_id]
    assert events(core, "recreate_job") == []  # a collection alone re-binds nothing


def test_a_collected_named_job_is_created_again_under_its_name(core, clock, caplog):
    worker_heartbeat(core)
    dataset_id = register(core)
    first = job(core, dataset_id)
    old_iteration = read_to_the_end(core, first)
    assert collect(core, clock) == [old_iteration]
    # A client still holding the old job id learns that the name is free again.
    with pytest.raises(errors.NotFoundError, match="a new read under the job name .train. starts a new job"):
        iteration(core, first)

    second = job(core, dataset_id)
    assert second != first and second > first
    assert named_job(core.state, "train") == second
    # The collected job left the state: its name simply starts a new job.
    assert first not in core.state.jobs and old_iteration not in core.state.iterations
    # The new job reads the whole dataset again, from a fresh iteration with its own task.
    worker_heartbeat(core)  # still alive after the fake clock's jump past worker_timeout_ms
    it = iteration(core, second)
    assert it.iteration_id != old_iteration
    assert core.state.iterations[it.iteration_id].state is IterationState.ACTIVE
    (task_id,) = core.state.iterations[it.iteration_id].tasks
    assert [t.task_id for t in worker_heartbeat(core).new_tasks] == [task_id]
    assert job(core, dataset_id) == second
    with pytest.raises(errors.NotFoundError) as raised:
        iteration(core, first)
    assert "a new read" not in str(raised.value)  # the name belongs to the new job now


def test_a_collected_name_may_be_reused_with_another_mode(core, clock):
    a, b = register(core, b"a"), register(core, b"b")
    first = job(core, a, PE)
    release(core, iteration(core, first))
    with pytest.raises(errors.AlreadyExistsError):
        job(core, a, DE)  # not collected yet: the name is taken, for dataset a
    # A name is scoped by the dataset id read (as in tf.data service): under it, dataset b is another job.
    assert job(core, b, DE) not in (first, None)
    assert collect(core, clock)
    second = job(core, a, DE)
    assert (core.state.jobs[second].dataset_id, core.state.jobs[second].processing_mode) == (a, DE)
    # ... and the new job's parameters bind the name from now on.
    with pytest.raises(errors.AlreadyExistsError, match="dataset %d in distributed_epoch" % a):
        job(core, a, PE)


def test_a_named_job_with_any_live_iteration_keeps_its_name(core, clock):
    dataset_id = register(core)
    first = job(core, dataset_id)
    assert job(core, dataset_id) == first  # no iteration yet: nothing was collected
    zero = iteration(core, first, 0)
    one = iteration(core, first, 1)
    release(core, zero)
    assert collect(core, clock) == [zero.iteration_id]  # repetition 1 still has its client
    assert job(core, dataset_id) == first
    with pytest.raises(errors.NotFoundError) as raised:
        iteration(core, first, 0)
    assert "a new read" not in str(raised.value)  # the name is not free: repetition 1 lives
    with pytest.raises(errors.AlreadyExistsError):
        job(core, dataset_id, DE)
    release(core, one)
    assert collect(core, clock) == [one.iteration_id]
    assert job(core, dataset_id) != first


def test_anonymous_jobs_are_untouched(core, clock):
    dataset_id = register(core)
    anonymous = job(core, dataset_id, name="")
    release(core, iteration(core, anonymous))
    assert anonymous not in core.state.jobs  # its one reader left: nobody can read it again
    assert job(core, dataset_id, name="") != anonymous
    assert core.state.jobs_by_key == {} and events(core, "recreate_job") == []


def test_an_iteration_idle_when_the_dispatcher_restarted_is_still_collected(core, clock):
    """Idle clocks are volatile: a restarted dispatcher must start them for iterations that
    were already idle, or a named job finished before the restart would hold its name forever."""
    recorder = Recorder(core)
    worker_heartbeat(core)
    dataset_id = register(core)
    first = job(core, dataset_id)
    iteration_id = read_to_the_end(core, first)

    state = DispatcherState()
    for update in recorder.updates:
        state.apply(update)
    restarted = DispatcherCore(CONFIG, clock=clock, store=MemoryStore(state))
    assert restarted.collect_garbage() == []  # the timeout counts from the restart
    clock.advance(GC_TIMEOUT_S - 1)
    assert restarted.collect_garbage() == []
    clock.advance(1.1)
    assert restarted.collect_garbage() == [iteration_id]
    assert job(restarted, dataset_id) != first


# --- replay: journal and checkpoint -----------------------------------------------------------------

def recreate(core, clock, dataset_id: int) -> tuple[int, int]:
    """Reads job "train" to its end, lets it be collected and reads the name again: (old, new) job ids."""
    first = job(core, dataset_id)
    read_to_the_end(core, first)
    assert collect(core, clock)
    second = job(core, dataset_id)
    iteration(core, second)
    # The collected job left the state; the name is bound to the new one.
    assert first not in core.state.jobs and named_job(core.state, "train") == second
    return first, second


def test_replaying_the_updates_binds_the_name_to_the_new_job(core, clock):
    recorder = Recorder(core)
    worker_heartbeat(core)
    job(core, register(core, b"other"), name="unrelated")
    first, second = recreate(core, clock, register(core))
    assert [u.create_job.job_id for u in recorder.updates if u.HasField("create_job")][-2:] == [first, second]

    replayed = DispatcherState()
    for update in recorder.updates:
        replayed.apply(update)
    assert vars(replayed) == vars(core.state)
    assert named_job(replayed, "train") == second

    from_checkpoint = DispatcherState()
    for update in core.state.to_updates():
        from_checkpoint.apply(update)
    assert vars(from_checkpoint) == vars(core.state)
    assert from_checkpoint.jobs_by_key == core.state.jobs_by_key and named_job(from_checkpoint, "train") == second


def test_a_checkpoint_binds_the_name_to_the_new_job_whatever_the_order_of_the_jobs():
    # Two jobs under one name: a collected job not pruned yet (say, replayed from a journal written
    # before jobs were pruned) and the job the name was re-bound to.
    U = state_pb2.Update
    state = DispatcherState()
    for update in (U(register_dataset=state_pb2.RegisterDatasetUpdate(dataset_id=1, fingerprint="f", dataset_def=b"d")),
                   U(create_job=state_pb2.CreateJobUpdate(job_id=2, job_name="train", dataset_id=1)),
                   U(create_iteration=state_pb2.CreateIterationUpdate(iteration_id=3, job_id=2)),
                   U(finish_iteration=state_pb2.FinishIterationUpdate(iteration_id=3, garbage_collected=True)),
                   U(create_job=state_pb2.CreateJobUpdate(job_id=4, job_name="train", dataset_id=1))):
        state.apply(update)
    # The checkpoint must not rely on the table's order: put the bound job first.
    state.jobs = {4: state.jobs[4], 2: state.jobs[2]}
    rebuilt = DispatcherState()
    for update in state.to_updates():
        rebuilt.apply(update)
    assert named_job(rebuilt, "train") == 4
    assert set(rebuilt.jobs) == {2, 4}


@pytest.mark.parametrize("checkpoint_records", [10_000, 1], ids=["journal", "checkpoint"])
def test_after_recreation_and_a_restart_the_name_maps_to_the_new_job(tmp_path, clock, checkpoint_records):
    store = JournaledStore(str(tmp_path), checkpoint_records=checkpoint_records)
    store.open()
    core = DispatcherCore(CONFIG, clock=clock, store=store)
    try:
        worker_heartbeat(core)
        dataset_id = register(core)
        first, second = recreate(core, clock, dataset_id)
        store.wait_durable()
        expected = comparable(core.state)
    finally:
        store.close()
    from_checkpoint = replay(tmp_path)[0].WhichOneof("kind") == "id_floor"  # a checkpoint starts with one
    assert from_checkpoint == (checkpoint_records == 1)
    assert os.path.exists(tmp_path / CHECKPOINT_FILE) == from_checkpoint

    restarted = JournaledStore(str(tmp_path), checkpoint_records=checkpoint_records)
    restarted.open()
    try:
        assert comparable(restarted.state) == expected
        assert named_job(restarted.state, "train") == second
        assert first not in restarted.state.jobs and second in restarted.state.jobs
        core = DispatcherCore(CONFIG, clock=clock, store=restarted)
        assert job(core, dataset_id) == second
        # The restarted dispatcher frees the name again once the new job is collected too.
        (live,) = restarted.state.clients  # the new job's reader, replayed
        key = restarted.state.iterations[restarted.state.clients[live].iteration_id].read_key
        release(core, pb.GetOrCreateIterationResponse(client_id=live, read_key=key))
        assert core.collect_garbage() == []
        assert collect(core, clock)
        third = job(core, dataset_id)
        assert third not in (first, second)
        assert second not in core.state.jobs and named_job(core.state, "train") == third
        restarted.wait_durable()
    finally:
        restarted.close()
    assert named_job(replayed_state(tmp_path), "train") == third


def replayed_state(work_dir) -> DispatcherState:
    """The state a dispatcher starting on ``work_dir`` would replay."""
    store = JournaledStore(str(work_dir))
    store.open()
    store.close()
    return store.state


# --- end to end -------------------------------------------------------------------------------------

N = 50


def read(target: str) -> list[int]:
    """A fresh run of a script reading job "train": its first iteration is repetition 0."""
    return sorted(int(x) for x in Dataset.range(N).apply(distribute("parallel_epochs", target, job_name="train")))


def cluster_events(cluster, kind: str) -> list[dict]:
    return events(cluster.dispatcher.core, kind)


def finished_job_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "dataservice.client" and r.levelname == "WARNING" and "read to its end" in r.getMessage()]


def test_a_named_job_read_to_its_end_and_collected_is_read_again_in_full(caplog):
    # The GC timeout leaves the second read, right after the first, well inside the window.
    with TestCluster(num_workers=2, job_gc_timeout_ms=1_500, job_gc_check_interval_ms=50) as cluster:
        everything = sorted(list(range(N)) * 2)  # parallel_epochs: one copy per worker
        assert read(cluster.target) == everything
        assert finished_job_warnings(caplog) == []
        (created,) = cluster_events(cluster, "create_job")
        assert read(cluster.target) == []  # within the GC window: the finished job's end of input
        # ... and the reader says why, and what to do.
        (warning,) = finished_job_warnings(caplog)
        assert "job 'train'" in warning and "new job_name" in warning and "job_gc_timeout_ms" in warning
        assert len(cluster_events(cluster, "create_job")) == 1
        with cluster.dispatcher.core._cond:
            (iteration_id,) = cluster.dispatcher.core.state.jobs[created["job_id"]].iterations.values()
        wait_until(lambda: any(e["iteration_id"] == iteration_id for e in cluster_events(cluster, "garbage_collect")),
                   10, "the finished iteration to be collected")
        assert read(cluster.target) == everything
        assert len(finished_job_warnings(caplog)) == 1  # a re-created job reads in full, without a warning
        (_, recreated) = cluster_events(cluster, "create_job")
        assert recreated["job_name"] == "train" and recreated["job_id"] != created["job_id"]
        with cluster.dispatcher.core._cond:
            assert named_job(cluster.dispatcher.core.state, "train") == recreated["job_id"]
            assert created["job_id"] not in cluster.dispatcher.core.state.jobs


def test_a_recreated_name_survives_a_fault_tolerant_restart(tmp_path):
    with TestCluster(num_workers=1, fault_tolerant_mode=True, work_dir=str(tmp_path), job_gc_timeout_ms=300,
                     job_gc_check_interval_ms=50) as cluster:
        assert read(cluster.target) == list(range(N))
        wait_until(lambda: cluster_events(cluster, "garbage_collect"), 10, "the first job to be collected")
        assert read(cluster.target) == list(range(N))
        (_, recreated) = cluster_events(cluster, "create_job")

        restarted = cluster.restart_dispatcher()
        with restarted.core._cond:
            assert named_job(restarted.core.state, "train") == recreated["job_id"]
        # The new job was idle at the restart: the restarted dispatcher collects it all the same.
        wait_until(lambda: cluster_events(cluster, "garbage_collect"), 10, "the second job to be collected")
        assert read(cluster.target) == list(range(N))
        (again,) = cluster_events(cluster, "create_job")  # the restarted dispatcher's events
        assert again["job_name"] == "train" and again["job_id"] != recreated["job_id"]
