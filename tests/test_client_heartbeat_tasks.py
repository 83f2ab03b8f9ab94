"""A steady reader's ClientHeartbeat leaves out the task list (``tasks_unchanged``): with thousands of
workers it would carry thousands of TaskDefs a second per reader. A change to the read's tasks (a new
worker's task, a revoked one) sends what changed only (``tasks_changed_only``); ``KnownTasks`` puts the
whole list back together."""

from __future__ import annotations

from dataservice import Dataset, register_dataset
from dataservice.proto import state_pb2
from dataservice.service.dispatcher_client import DispatcherClient, KnownTasks
from tests.cluster import TestCluster, wait_until


def _start_read(cluster: TestCluster, client: DispatcherClient):
    """A distributed_epoch read of an endless dataset, as a reader starts one: its GetOrCreateIteration answer."""
    dataset_id = register_dataset(cluster.target, Dataset.range(10**9))
    job_id = client.get_or_create_job(dataset_id, state_pb2.DISTRIBUTED_EPOCH, "")
    return client.get_or_create_iteration(job_id, 0)


def test_unchanged_task_lists_are_left_out_and_filled_back():
    with TestCluster(num_workers=2, worker_timeout_ms=2_000) as cluster:
        client = DispatcherClient(cluster.dispatcher_address, timeout_ms=10_000)
        try:
            iteration = _start_read(cluster, client)
            known = KnownTasks()

            def heartbeat():
                return client.client_heartbeat(iteration.client_id, read_key=iteration.read_key, tasks=known)

            def heartbeat_where(predicate):
                response = heartbeat()
                return response if predicate(response) else None

            wait_until(lambda: len(heartbeat().tasks) == 2, 10, "a task on each worker")
            steady = heartbeat()
            assert steady.tasks_unchanged and len(steady.tasks) == 2  # left out on the wire, filled back
            bare = client.client_heartbeat(iteration.client_id, read_key=iteration.read_key)
            assert not bare.tasks_unchanged and len(bare.tasks) == 2  # a reader that knows no version gets them

            # A third worker's task changes the list: the next heartbeat carries it whole.
            cluster.add_worker()
            changed = wait_until(lambda: heartbeat_where(lambda r: len(r.tasks) == 3), 10, "the new task")
            assert not changed.tasks_unchanged and changed.tasks_changed_only  # one TaskDef on the wire
            # A lost worker's task is revoked: the list changes again.
            cluster.stop_worker(0)
            revoked = wait_until(lambda: heartbeat_where(lambda r: r.revoked_tasks), 15, "the revoked task")
            assert not revoked.tasks_unchanged and revoked.tasks_changed_only
            assert len(revoked.tasks) == 2 and revoked.revoked_tasks[0] not in {t.task_id for t in revoked.tasks}
            again = heartbeat()
            assert again.tasks_unchanged and list(again.revoked_tasks) == list(revoked.revoked_tasks)
        finally:
            client.close()


def test_readers_joining_get_the_whole_list_made_once_per_version(monkeypatch):
    # Ten thousand readers joining a read over two thousand workers each need every TaskDef: the list is
    # serialized once per version of the iteration's tasks and merged into each answer, never stale.
    from dataservice.dispatcher.core import DispatcherCore

    made = []
    whole_task_list = DispatcherCore._whole_task_list
    monkeypatch.setattr(DispatcherCore, "_whole_task_list", lambda core, it: made.append(it.iteration_id)
                        or whole_task_list(core, it))
    with TestCluster(num_workers=2, worker_timeout_ms=2_000) as cluster:
        client = DispatcherClient(cluster.dispatcher_address, timeout_ms=10_000)
        try:
            iteration = _start_read(cluster, client)

            def joining():  # a reader that knows no version: the whole list
                return client.client_heartbeat(iteration.client_id, read_key=iteration.read_key)

            first = wait_until(lambda: (lambda r: r if len(r.tasks) == 2 else None)(joining()), 10, "two tasks")
            made.clear()
            answers = [joining() for _ in range(20)]
            assert all(list(a.tasks) == list(first.tasks) for a in answers)
            assert not any(a.tasks_unchanged or a.tasks_changed_only for a in answers)
            # Made at most once per version answered (none: the answer above made it at this version).
            assert len(made) <= len({a.tasks_version for a in answers}) - (answers[0].tasks_version ==
                                                                             first.tasks_version)

            cluster.add_worker()
            grown = wait_until(lambda: (lambda r: r if len(r.tasks) == 3 else None)(joining()), 10, "the new task")
            cluster.stop_worker(0)
            shrunk = wait_until(lambda: (lambda r: r if r.revoked_tasks else None)(joining()), 15, "the revoked task")
            assert len(shrunk.tasks) == 2 and shrunk.revoked_tasks[0] in {t.task_id for t in grown.tasks}
            assert shrunk.revoked_tasks[0] not in {t.task_id for t in shrunk.tasks}
            made.clear()
            answers = [joining() for _ in range(20)]
            assert all(list(a.tasks) == list(shrunk.tasks) and list(a.revoked_tasks) == list(shrunk.revoked_tasks)
                       for a in answers)  # the cached list is the current one
            assert len(made) <= len({a.tasks_version for a in answers} - {shrunk.tasks_version})
        finally:
            client.close()


def test_a_restarted_dispatcher_sends_the_list_again(tmp_path):
    with TestCluster(num_workers=1, fault_tolerant_mode=True, work_dir=str(tmp_path)) as cluster:
        client = DispatcherClient(cluster.dispatcher_address, timeout_ms=10_000)
        try:
            iteration = _start_read(cluster, client)
            known = KnownTasks()
            wait_until(lambda: client.client_heartbeat(iteration.client_id, read_key=iteration.read_key,
                                                       tasks=known).tasks, 10, "the task")
            version = known.version
            cluster.restart_dispatcher()
            response = client.client_heartbeat(iteration.client_id, read_key=iteration.read_key, tasks=known)
            # Versions are offset by a random base per incarnation: the old one never matches.
            assert not response.tasks_unchanged and len(response.tasks) == 1 and known.version != version
        finally:
            client.close()


def test_the_change_log_reaches_back_so_far_then_the_whole_list_is_sent():
    from dataservice.dispatcher import task_lists
    from dataservice.dispatcher.state import DispatcherState

    lists, state = task_lists.ReaderTaskLists(), DispatcherState()
    start = lists.version(7)
    for task_id in range(3):
        lists.note(state, state_pb2.Update(create_task=state_pb2.CreateTaskUpdate(task_id=task_id, iteration_id=7)))
    assert lists.changed_since(7, start) == [0, 1, 2]
    assert lists.changed_since(7, start + 2) == [2]
    assert lists.changed_since(7, lists.version(7)) == []
    assert lists.changed_since(7, start - 1) is None and lists.changed_since(7, 12345) is None  # not a version
    for task_id in range(task_lists.MAX_LOGGED_CHANGES):
        lists.note(state, state_pb2.Update(create_task=state_pb2.CreateTaskUpdate(task_id=10 + task_id,
                                                                                  iteration_id=7)))
    assert lists.changed_since(7, start + 2) is None  # forgotten: the whole list
    assert lists.changed_since(7, lists.version(7) - 1) == [10 + task_lists.MAX_LOGGED_CHANGES - 1]
