"""What the dispatcher knows of each worker's tasks between heartbeats, so that a task delta costs
O(changes + news) under its lock (WorkerHeartbeatRequest.tasks_delta in dispatcher.proto), not O(the worker's tasks).

Soft state: never journaled. A restarted dispatcher (or one whose state was rolled back after a failed
journal write) has none, refuses the next delta of every worker (``resync_tasks``) and rebuilds each view
from the full list that follows.

Per worker address (``TaskView``): the task set the worker last reported, the ``heartbeat_seq`` of the last
heartbeat the dispatcher answered (and the worker's uid), and ``dirty``: the task ids whose news may have
changed since that answer. The core marks them where it changes the state (``note_update``, called by
``DispatcherCore._commit`` before each update): a task created on the worker, revoked, finished, its
iteration finished, garbage-collected, pruned, or left by its last reader. A delta's news is then found by
looking at the dirty tasks and the delta's own added and removed ones only.

``settled`` holds the workers that had a live task in every iteration that could give them one when last
walked, each with the iterations it may owe a task in since. With none owed, ``DispatcherCore._assign_tasks``
would do nothing for it, so a delta heartbeat skips that walk over the worker's tasks. An iteration nobody
read getting a reader is owed by every settled worker until a task of it is created for the worker (which
``get_or_create_iteration`` does at once on a small cluster; on a fleet, past its first workers, the pass
that answers each worker's woken poll does, in distributed_epoch); a task of the worker revoked or finished,
or a static worker bound, unsettles it.

Example::

    >>> views = TaskViews()
    >>> view = views.reset("w1:1", "uid", seq=1, reported=[7, 8])
    >>> views.applies("w1:1", "uid", base_seq=1)
    True
    >>> views.mark("w1:1", 9)   # a task created for the worker: news for its next heartbeat
    >>> sorted(view.dirty)
    [9]
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Optional

from dataservice.proto import state_pb2

__all__ = ["TaskView", "TaskViews"]


@dataclasses.dataclass
class TaskView:
    """One worker's tasks as the dispatcher last heard of them (see the module docstring)."""
    uid: str
    seq: int
    reported: set
    dirty: set = dataclasses.field(default_factory=set)


class TaskViews:
    """The per-worker ``TaskView``s and the settled workers. Not thread-safe: the core's lock guards it."""

    def __init__(self) -> None:
        self._views: dict[str, TaskView] = {}
        self.settled: dict[str, set] = {}
        # The state object the views were built against: a rollback replaces it, and then every view may lie.
        self._state = None
        self._handlers: dict[str, Callable] = {
            "create_task": self._create_task, "revoke_task": self._task_changed, "finish_task": self._task_changed,
            "finish_iteration": self._iteration_changed, "prune_iteration": self._iteration_changed,
            "iteration_snapshot": self._iteration_snapshot, "prune_job": self._job_pruned,
            "acquire_iteration_client": self._client_joins, "release_iteration_client": self._client_leaves,
            "bind_static_worker": self._unsettle_all,
            "register_worker": self._worker_registered, "prune_worker": self._worker_pruned,
        }

    def __len__(self) -> int:
        return len(self._views)

    def get(self, address: str) -> Optional[TaskView]:
        return self._views.get(address)

    def check_state(self, state) -> None:
        """Forgets everything if ``state`` is not the state the views were built against (a rollback)."""
        if state is not self._state:
            self._views.clear()
            self.settled.clear()
            self._state = state

    def applies(self, address: str, uid: str, base_seq: int) -> bool:
        """Whether a delta from ``address`` relative to ``base_seq`` can be applied: its view exists, is of
        this worker process, and its last answered heartbeat is ``base_seq`` (call ``check_state`` first)."""
        view = self._views.get(address)
        return view is not None and view.uid == uid and view.seq == base_seq

    def reset(self, address: str, uid: str, seq: int, reported: Iterable[int]) -> TaskView:
        """A full list: the worker's view starts over from it."""
        view = self._views[address] = TaskView(uid, seq, set(reported))
        return view

    def forget(self, address: str) -> None:
        """The worker is lost or removed (or sends no deltas any more): its next delta is refused."""
        self._views.pop(address, None)
        self.settled.pop(address, None)

    def mark(self, address: str, task_id: int) -> None:
        view = self._views.get(address)
        if view is not None:
            view.dirty.add(task_id)

    # --- the core's changes (before the update applies: pruned tasks must still be found) -----------
    def note_update(self, state, update: state_pb2.Update, worker_lost: Callable[[str], bool]) -> None:
        """Marks what ``update`` (about to be applied to ``state``) may change in workers' news."""
        if not self._views and not self.settled:
            return
        kind = update.WhichOneof("kind")
        handler = self._handlers.get(kind)
        if handler is not None:
            handler(state, getattr(update, kind), worker_lost)

    def is_settled(self, address: str) -> bool:
        """Whether ``_assign_tasks`` would give the worker nothing (see the module docstring)."""
        owed = self.settled.get(address)
        return owed is not None and not owed

    def settle(self, address: str) -> None:
        self.settled[address] = set()

    def _create_task(self, state, u, worker_lost) -> None:
        self.mark(u.worker_address, u.task_id)
        owed = self.settled.get(u.worker_address)
        if owed:
            owed.discard(u.iteration_id)

    def _task_changed(self, state, u, worker_lost) -> None:
        task = state.tasks.get(u.task_id)
        if task is None:
            return
        self.mark(task.worker_address, u.task_id)
        self.settled.pop(task.worker_address, None)
        if worker_lost(task.worker_address):
            self.forget(task.worker_address)  # its tasks are revoked because it is lost: bounded memory

    def _mark_iteration(self, state, iteration_id: int) -> None:
        iteration = state.iterations.get(iteration_id)
        if iteration is None:
            return
        for task_id in iteration.tasks:
            task = state.tasks.get(task_id)
            if task is not None:
                self.mark(task.worker_address, task_id)

    def _iteration_changed(self, state, u, worker_lost) -> None:
        self._mark_iteration(state, u.iteration_id)

    def _iteration_snapshot(self, state, u, worker_lost) -> None:
        self._mark_iteration(state, u.iteration_id)
        self.settled.clear()

    def _job_pruned(self, state, u, worker_lost) -> None:
        job = state.jobs.get(u.job_id)
        if job is not None:
            for iteration_id in job.iterations.values():
                self._mark_iteration(state, iteration_id)

    def _client_joins(self, state, u, worker_lost) -> None:
        iteration = state.iterations.get(u.iteration_id)
        if iteration is None:
            return
        if not iteration.clients:
            for owed in self.settled.values():  # every worker may owe a task in it now
                owed.add(u.iteration_id)
        if iteration.finished:
            self._mark_iteration(state, u.iteration_id)  # its tasks are no longer to be dropped

    def _client_leaves(self, state, u, worker_lost) -> None:
        client = state.clients.get(u.client_id)
        if client is None:
            return
        iteration = state.iterations.get(client.iteration_id)
        if iteration is not None and iteration.finished:
            self._mark_iteration(state, client.iteration_id)  # finished and unread: its tasks are dropped

    def _unsettle_all(self, state, u, worker_lost) -> None:
        self.settled.clear()

    def _worker_registered(self, state, u, worker_lost) -> None:
        self.settled.pop(u.worker_address, None)

    def _worker_pruned(self, state, u, worker_lost) -> None:
        self.forget(u.worker_address)
