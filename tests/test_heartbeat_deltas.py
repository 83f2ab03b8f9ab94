"""WorkerHeartbeat task deltas (WorkerHeartbeatRequest.tasks_delta in dispatcher.proto): workers send what
changed since their last answered heartbeat, the dispatcher answers from what changed since, and a delta it cannot apply (a restart, a lost
answer, a restarted worker) is refused with resync_tasks, after which the worker sends its full list.

The core is driven directly where the sequence of heartbeats matters (a lost answer); real dispatcher and
worker servers on 127.0.0.1 show the worker's side (deltas in steady state, a resync after a restart)."""

from __future__ import annotations

import random
import re
import threading

import pytest

from dataservice import Dataset, errors, from_dataset_id, register_dataset
from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.request_checks import check_request
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import state_pb2
from dataservice.service.config import DispatcherConfig
from dataservice.service.dispatcher_client import DispatcherClient
from tests.cluster import TestCluster, wait_until
from tests.journals import FakeClock

PE, DE = state_pb2.PARALLEL_EPOCHS, state_pb2.DISTRIBUTED_EPOCH
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


class SimWorker:
    """A worker's heartbeats against a core, as worker/server.py sends them: a full list first, then deltas
    relative to the last answered heartbeat; it starts and drops the tasks each answer names."""

    def __init__(self, core: DispatcherCore, address: str, uid: str = "uid"):
        self.core, self.address, self.uid = core, address, uid
        self.tasks: set[int] = set()
        self.finished: set[int] = set()
        self.seq = 0
        self.base: tuple | None = None   # (seq, tasks, finished) of the last answered heartbeat

    def request(self) -> pb.WorkerHeartbeatRequest:
        self.seq += 1
        if self.base is None:
            return pb.WorkerHeartbeatRequest(worker_address=self.address, worker_uid=self.uid,
                                             heartbeat_seq=self.seq, current_tasks=sorted(self.tasks),
                                             finished_tasks=sorted(self.finished))
        seq, tasks, finished = self.base
        return pb.WorkerHeartbeatRequest(worker_address=self.address, worker_uid=self.uid, heartbeat_seq=self.seq,
                                         tasks_delta=True, base_seq=seq, added_tasks=sorted(self.tasks - tasks),
                                         removed_tasks=sorted(tasks - self.tasks),
                                         finished_tasks=sorted(self.finished - finished))

    def beat(self, lose_answer: bool = False) -> pb.WorkerHeartbeatResponse:
        request = self.request()
        response = self.core.worker_heartbeat(request)
        if lose_answer:
            return response  # the worker never saw it: its base stays the previous answered heartbeat
        if response.resync_tasks:
            self.base = None
            return response
        self.base = (request.heartbeat_seq, frozenset(self.tasks), frozenset(self.finished))
        self.tasks.update(t.task_id for t in response.new_tasks)
        self.tasks.difference_update(response.tasks_to_delete)
        self.finished.difference_update(response.tasks_to_delete)
        return response


def _news(response: pb.WorkerHeartbeatResponse) -> tuple[list, list]:
    return [t.task_id for t in response.new_tasks], list(response.tasks_to_delete)


def _full_walk(core: DispatcherCore, address: str, current) -> tuple[list, list]:
    """What a full-list heartbeat would be told now (the walk over every task, without side effects)."""
    with core._cond:
        return _news(core._worker_news(address, current))


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def core(clock):
    return DispatcherCore(DispatcherConfig(job_gc_timeout_ms=10_000, client_timeout_ms=5_000,
                                           worker_timeout_ms=2_000), clock=clock)


def _dataset(core, num_splits=4) -> int:
    return core.register_dataset(pb.RegisterDatasetRequest(dataset_def=b"p", num_splits=num_splits)).dataset_id


def _reader(core, dataset_id, mode=DE, name="") -> pb.GetOrCreateIterationResponse:
    job_id = core.get_or_create_job(pb.GetOrCreateJobRequest(dataset_id=dataset_id, processing_mode=mode,
                                                             job_name=name)).job_id
    return core.get_or_create_iteration(pb.GetOrCreateIterationRequest(job_id=job_id))


def _release(core, reader) -> None:
    core.release_iteration_client(pb.ReleaseIterationClientRequest(client_id=reader.client_id,
                                                                   read_key=reader.read_key))


# --- the core, driven directly -------------------------------------------------------------------

def test_deltas_carry_the_same_news_as_full_lists(core, clock):
    # Readers come and go, workers get lost and come back, tasks finish: after every step the delta's answer
    # is what a walk over the worker's full list finds.
    rng = random.Random(28)
    dataset_id = _dataset(core, num_splits=-1)
    worker, other = SimWorker(core, "w1:1"), SimWorker(core, "w2:1")
    worker.beat(), other.beat()
    readers, resyncs = [], 0
    for step in range(300):
        op = rng.random()
        if op < 0.35 or not readers:
            mode = rng.choice([DE, PE])
            readers.append(_reader(core, dataset_id, mode=mode, name=rng.choice(["", "", f"named{step % 7}-{mode}"])))
        elif op < 0.6:
            _release(core, readers.pop(rng.randrange(len(readers))))
        elif op < 0.7 and worker.tasks:
            worker.finished.add(rng.choice(sorted(worker.tasks)))
        elif op < 0.75:
            clock.advance(3)  # both workers silent past worker_timeout_ms: their tasks are revoked
            core.check_liveness()
        elif op < 0.8:
            clock.advance(1)
            core.collect_garbage()
        if rng.random() < 0.7:
            other.beat()
        before = set(worker.tasks)
        response = worker.beat()
        if response.resync_tasks:  # lost since its last heartbeat: its view was forgotten
            resyncs += 1
            response = worker.beat()
        assert _news(response) == _full_walk(core, worker.address, before), step
        with core._cond:  # a heartbeat that skipped the assignment walk (a settled worker) missed no task
            held = set(core.state.workers[worker.address].tasks)
            core._assign_tasks(worker.address)
            assert core.state.workers[worker.address].tasks == held, step
    assert resyncs and core.heartbeat_counts["delta"] > 400, (resyncs, core.heartbeat_counts)
    # Steady state: with nothing new, the answer is empty and the worker's view holds no dirty task.
    worker.beat()
    assert _news(worker.beat()) == ([], [])
    assert not core._task_views.get(worker.address).dirty


def test_a_delta_after_a_lost_answer_is_refused_and_the_full_list_fixes_it(core):
    dataset_id = _dataset(core)
    worker = SimWorker(core, "w1:1")
    worker.beat()                                    # seq 1: the full list
    first = _reader(core, dataset_id)
    assert len(worker.beat().new_tasks) == 1         # seq 2: a delta, answered with the task
    for _ in range(2):
        worker.beat()                                # seq 3, 4
    assert worker.base[0] == 4
    second = _reader(core, dataset_id)
    lost = worker.beat(lose_answer=True)             # seq 5: applied, but its answer is lost
    assert [t.iteration_id for t in lost.new_tasks] == [second.iteration_id]
    assert core.heartbeat_counts["delta"] == 4

    refused = worker.beat()                          # seq 6, relative to 4: the dispatcher answered 5
    assert refused.resync_tasks and not refused.new_tasks and not refused.tasks_to_delete
    assert core.heartbeat_counts["resync"] == 1 and core.heartbeat_counts["delta"] == 4
    assert ("resync_tasks", {"worker": "w1:1", "base_seq": 4, "heartbeat_seq": 6}) in core.events

    fixed = worker.beat()                            # seq 7: the full list; the lost task comes again
    assert [t.iteration_id for t in fixed.new_tasks] == [second.iteration_id]
    assert core.heartbeat_counts["full"] == 2
    assert {core.state.tasks[t].iteration_id for t in worker.tasks} == {first.iteration_id, second.iteration_id}
    assert not worker.beat().resync_tasks            # deltas again
    assert core.heartbeat_counts["delta"] == 5


def test_a_delta_from_a_restarted_worker_is_refused(core):
    dataset_id = _dataset(core)
    worker = SimWorker(core, "w1:1", uid="first")
    worker.beat()
    reader = _reader(core, dataset_id)
    worker.beat()
    (task_id,) = worker.tasks
    # The same address, another process: whatever it claims as its base, the view is of the old process.
    worker.uid = "second"
    assert worker.beat().resync_tasks
    assert not core.state.tasks[task_id].revoked  # nothing was done for the refused delta
    worker.tasks.clear()                          # the new process runs nothing
    answer = worker.beat()                        # its full list: the old process's task is revoked
    assert core.state.tasks[task_id].revoked
    assert core.state.workers["w1:1"].uid == "second"
    assert [t.iteration_id for t in answer.new_tasks] == [reader.iteration_id]  # a new task of the iteration
    assert task_id not in {t.task_id for t in answer.new_tasks}
    assert not worker.beat().resync_tasks


def test_a_delta_to_a_restarted_dispatcher_is_refused():
    config = DispatcherConfig()
    first = DispatcherCore(config)
    worker = SimWorker(first, "w1:1")
    worker.beat(), worker.beat()
    worker.core = DispatcherCore(config)  # a new incarnation knows nothing of the worker's deltas
    answer = worker.beat()
    assert answer.resync_tasks and answer.dispatcher_incarnation == worker.core.incarnation
    assert "w1:1" not in worker.core.state.workers  # a refused delta registers nobody
    worker.beat()
    assert "w1:1" in worker.core.state.workers


def test_a_worker_without_deltas_is_answered_as_before(core):
    # An old worker: never sets tasks_delta nor heartbeat_seq. Every heartbeat is a full list, no view is kept.
    dataset_id = _dataset(core)
    reader = _reader(core, dataset_id)
    request = pb.WorkerHeartbeatRequest(worker_address="w1:1", worker_uid="old")
    answer = core.worker_heartbeat(request)
    assert [t.iteration_id for t in answer.new_tasks] == [reader.iteration_id]
    (task_id,) = [t.task_id for t in answer.new_tasks]
    assert core._task_views.get("w1:1") is None
    _release(core, reader)
    answer = core.worker_heartbeat(pb.WorkerHeartbeatRequest(worker_address="w1:1", worker_uid="old",
                                                             current_tasks=[task_id]))
    assert list(answer.tasks_to_delete) == [task_id] and not answer.resync_tasks
    assert core.heartbeat_counts["full"] == 2 and not core.heartbeat_counts["delta"]


def test_a_lost_worker_is_forgotten_and_resynced(core, clock):
    dataset_id = _dataset(core)
    worker = SimWorker(core, "w1:1")
    worker.beat()
    _reader(core, dataset_id)
    worker.beat()
    clock.advance(3)
    core.check_liveness()                      # lost: its task is revoked, its view forgotten
    assert core._task_views.get("w1:1") is None and "w1:1" not in core._task_views.settled
    assert worker.beat().resync_tasks
    answer = worker.beat()
    assert answer.tasks_to_delete and answer.new_tasks  # the revoked task goes, a new one comes


def test_a_settled_worker_still_gets_a_task_it_waits_for(core, clock):
    # parallel_epochs: a worker back from being lost takes over its stream only once the reader confirmed it
    # stopped reading the revoked task. Until then it is owed a task, and the delta heartbeats keep trying.
    dataset_id = _dataset(core)
    worker = SimWorker(core, "w1:1")
    worker.beat()
    reader = _reader(core, dataset_id, mode=PE, name="stream")
    worker.beat()
    (old_task,) = worker.tasks
    clock.advance(3)
    core.check_liveness()
    assert worker.beat().resync_tasks
    assert list(worker.beat().tasks_to_delete) == [old_task]   # full list: no new task yet (the reader reads it)
    assert worker.beat().new_tasks == []
    core.client_heartbeat(pb.ClientHeartbeatRequest(client_id=reader.client_id, read_key=reader.read_key,
                                                    stopped_tasks=[old_task]))
    answer = worker.beat()
    assert not answer.resync_tasks and len(answer.new_tasks) == 1
    assert answer.new_tasks[0].stream_id == core.state.tasks[old_task].stream_id


def test_a_long_poll_outlived_by_a_newer_heartbeat_leaves_its_view_alone(core):
    # The worker gave up on a delta still waiting at the dispatcher and sent its full list: the old poll, woken
    # by news, must not answer from (nor consume) the newer heartbeat's view.
    dataset_id = _dataset(core)
    worker = SimWorker(core, "w1:1")
    worker.beat()
    stale = worker.request()
    stale.wait_ms = 300
    outcome = {}
    poll = threading.Thread(target=lambda: outcome.update(answer=core.worker_heartbeat(stale)), daemon=True)
    poll.start()
    wait_until(lambda: core.heartbeat_counts["delta"] == 1, 5, "the delta to reach the dispatcher")
    worker.base = None
    assert not worker.beat().resync_tasks           # the full list, while the old delta still waits
    reader = _reader(core, dataset_id)              # news: wakes the old poll
    poll.join(5)
    assert not poll.is_alive() and outcome["answer"].resync_tasks and not outcome["answer"].new_tasks
    answer = worker.beat()                          # the newer heartbeat's delta gets the news
    assert [t.iteration_id for t in answer.new_tasks] == [reader.iteration_id]


def test_a_worker_silent_when_an_iteration_began_gets_its_task_through_a_delta(core, clock):
    # The iteration is created while the worker looks lost (and it has no task to revoke, so its view stays):
    # it gets no task then. Its next delta, settled as it was, must still walk and give it one.
    dataset_id = _dataset(core)
    worker = SimWorker(core, "w1:1")
    worker.beat(), worker.beat()
    assert core._task_views.is_settled("w1:1")
    clock.advance(3)
    reader = _reader(core, dataset_id)
    assert not core.state.workers["w1:1"].tasks
    answer = worker.beat()
    assert not answer.resync_tasks
    assert [t.iteration_id for t in answer.new_tasks] == [reader.iteration_id]


@pytest.mark.parametrize("fields, says", [
    (dict(tasks_delta=True, heartbeat_seq=3, base_seq=2, current_tasks=[1]), "a delta (tasks_delta) carries no current"),
    (dict(tasks_delta=True, heartbeat_seq=3, base_seq=3), "a delta needs 1 <= base_seq < heartbeat_seq"),
    (dict(tasks_delta=True, heartbeat_seq=3, base_seq=0), "a delta needs 1 <= base_seq < heartbeat_seq"),
    (dict(tasks_delta=True, heartbeat_seq=3, base_seq=2, added_tasks=[5], removed_tasks=[5]),
     "task 5 is both in added_tasks and removed_tasks"),
    (dict(heartbeat_seq=3, added_tasks=[5]), "added_tasks and removed_tasks come only with tasks_delta"),
    (dict(tasks_delta=True, heartbeat_seq=3, base_seq=2, removed_tasks=[0]), "removed_tasks holds the task id 0"),
    (dict(heartbeat_seq=-1), "heartbeat_seq is -1"),
])
def test_malformed_deltas_are_refused(fields, says):
    request = pb.WorkerHeartbeatRequest(worker_address="w1:1", **fields)
    with pytest.raises(errors.InvalidRequestError, match=re.escape(says)):
        check_request("WorkerHeartbeat", request, DispatcherConfig())


# --- real servers --------------------------------------------------------------------------------

def _counts(cluster) -> dict:
    core = cluster.dispatcher.core
    with core._cond:
        return dict(core.heartbeat_counts)


def test_steady_heartbeats_are_deltas_and_tasks_start_and_end_through_them():
    with TestCluster(num_workers=2) as cluster:
        dataset_id = register_dataset(cluster.target, Dataset.range(40))
        for _ in range(2):
            assert sorted(int(x) for x in from_dataset_id("distributed_epoch", cluster.target, dataset_id)) == \
                list(range(40))
        # The readers left: their tasks end, through deltas, on both workers.
        wait_until(lambda: all(not w.task_ids for w in cluster.workers), 10, "the workers to drop their tasks")
        wait_until(lambda: _counts(cluster).get("delta", 0) >= 20, 10, "delta heartbeats")
        counts = _counts(cluster)
        assert counts["full"] == 2 and counts.get("resync", 0) == 0, counts  # one full list per worker: the first


def test_a_restarted_dispatcher_resyncs_the_worker_and_reads_complete_exactly_once(tmp_path):
    with TestCluster(num_workers=0, fault_tolerant_mode=True, work_dir=str(tmp_path)) as cluster:
        # A long retry window: the heartbeat in flight when the dispatcher stops reaches the new one.
        cluster.add_worker(dispatcher_timeout_ms=20_000)
        cluster.wait_for_workers(1)
        dataset_id = register_dataset(cluster.target, Dataset.range(30))
        reader = iter(from_dataset_id("distributed_epoch", cluster.target, dataset_id, job_name="resync"))
        seen = [int(next(reader)) for _ in range(5)]
        wait_until(lambda: _counts(cluster).get("delta", 0) >= 3, 10, "delta heartbeats")
        restarted = cluster.restart_dispatcher()
        # The worker's next delta is refused (the new dispatcher has no view of it), then its full list comes.
        wait_until(lambda: _counts(cluster).get("resync", 0) >= 1 and _counts(cluster).get("full", 0) >= 1, 15,
                   "a resync and the full list after it")
        wait_until(lambda: _counts(cluster).get("delta", 0) >= 3, 10, "deltas again")
        kinds = [fields for kind, fields in list(restarted.core.events) if kind == "resync_tasks"]
        assert kinds and kinds[0]["worker"] == f"localhost:{cluster.workers[0].port}"
        seen.extend(int(x) for x in reader)
        assert sorted(seen) == list(range(30))  # every element once


def test_a_restarted_worker_starts_over_with_a_full_list():
    with TestCluster(num_workers=1) as cluster:
        dataset_id = register_dataset(cluster.target, Dataset.range(20))
        reader = iter(from_dataset_id("distributed_epoch", cluster.target, dataset_id, job_name="restart"))
        seen = [int(next(reader))]
        wait_until(lambda: _counts(cluster).get("delta", 0) >= 2, 10, "delta heartbeats")
        full_before = _counts(cluster)["full"]
        cluster.restart_worker(0)
        wait_until(lambda: _counts(cluster)["full"] > full_before, 10, "the restarted worker's full list")
        wait_until(lambda: _counts(cluster).get("delta", 0) >= 4, 10, "deltas again")
        seen.extend(int(x) for x in reader)
        # distributed_epoch: what the old worker had leased but not delivered is produced again, nothing twice.
        assert sorted(seen) == list(range(20))


def test_after_a_failed_heartbeat_the_worker_sends_its_full_list(tmp_path):
    with TestCluster(num_workers=0, fault_tolerant_mode=True, work_dir=str(tmp_path)) as cluster:
        # A short retry window: with the dispatcher down, the heartbeat fails rather than waits for it.
        worker = cluster.add_worker(dispatcher_timeout_ms=300)
        cluster.wait_for_workers(1)
        dataset_id = register_dataset(cluster.target, Dataset.range(30))
        client = DispatcherClient(cluster.dispatcher_address, timeout_ms=5_000)
        try:
            job_id = client.get_or_create_job(dataset_id, DE, "failed")
            client.get_or_create_iteration(job_id, 0)  # a task for the worker (idle: nobody reads it)
        finally:
            client.close()
        wait_until(lambda: worker.task_ids, 10, "the worker to get its task")
        wait_until(lambda: _counts(cluster).get("delta", 0) >= 2, 10, "delta heartbeats")
        cluster.stop_dispatcher()
        wait_until(lambda: worker._answered is None, 10, "a heartbeat to fail")
        restarted = cluster.start_dispatcher()
        wait_until(lambda: _counts(cluster).get("delta", 0) >= 2, 15, "deltas to the new dispatcher")
        counts = _counts(cluster)
        assert counts["full"] >= 1 and counts.get("resync", 0) == 0, counts  # no delta went to it first
        with restarted.core._cond:
            view = restarted.core._task_views.get(f"localhost:{worker.port}")
            assert sorted(view.reported) == worker.task_ids
