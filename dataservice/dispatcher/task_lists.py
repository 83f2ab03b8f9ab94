"""What each iteration's readers last learnt of its tasks: ClientHeartbeat sends only what changed.

A reader's heartbeat used to carry every TaskDef of its iteration, a worker's worth each: with two
thousand workers and ten thousand readers that is tens of millions of TaskDefs a second, and it grew as
workers times readers. Now each iteration has a version that moves on whenever its readers' task list
changes (a task created or revoked; a worker re-registered, which changes its TaskDefs' addresses), and
a short log of which tasks changed at which version. A reader sends the version it has
(``ClientHeartbeatRequest.known_tasks_version``) and gets nothing (``tasks_unchanged``) if it is current,
the changed tasks only (``tasks_changed_only``) if the log still reaches back to it, else the whole list.
``service.dispatcher_client.KnownTasks`` puts the reader's list back together, so every answer reads as
complete.

Soft state, never journaled: versions are offset by a random base per dispatcher incarnation, so a
version from before a restart never matches and the reader gets the whole list again.

Example::

    >>> lists = ReaderTaskLists()
    >>> lists.note(state, update)                  # before the core applies a create_task update
    >>> lists.changed_since(iteration_id, known)   # [task ids], or None: send the whole list
    >>> response.MergeFromString(lists.whole_list(iteration_id, make))   # made once per version
"""

from __future__ import annotations

import secrets
from typing import Callable, Optional

from dataservice.proto import state_pb2

__all__ = ["ReaderTaskLists", "MAX_LOGGED_CHANGES"]

#: Changes remembered per iteration; a reader further behind gets the whole list.
MAX_LOGGED_CHANGES = 4096


class ReaderTaskLists:
    def __init__(self) -> None:
        self._base = secrets.randbits(40) << 20
        #: iteration -> changes so far (its version is base + this).
        self._counts: dict[int, int] = {}
        #: iteration -> [(change number, task id)], the last MAX_LOGGED_CHANGES changes in order.
        self._logs: dict[int, list] = {}
        #: task id -> the TaskDef readers get for it, made once (every reader of an iteration gets the same,
        #: and a reader joining a read over thousands of workers needs them all); dropped when it changes.
        self._defs: dict[int, object] = {}
        #: iteration -> (version, the whole list serialized): a reader that joins a read over thousands of
        #: workers gets it merged into its answer in one parse, not a TaskDef at a time (O(workers) of
        #: Python per reader: ten thousand readers joining saturated the dispatcher).
        self._wholes: dict[int, tuple[int, bytes]] = {}

    def task_def(self, task_id: int, make) -> object:
        """The readers' TaskDef of ``task_id``: ``make(task_id)``'s, made once until the task changes."""
        task_def = self._defs.get(task_id)
        if task_def is None:
            task_def = self._defs[task_id] = make(task_id)
        return task_def

    def whole_list(self, iteration_id: int, make: Callable[[], bytes]) -> bytes:
        """The iteration's whole task list, serialized (``make()``'s), made once per version."""
        version = self.version(iteration_id)
        cached = self._wholes.get(iteration_id)
        if cached is None or cached[0] != version:
            cached = self._wholes[iteration_id] = (version, make())
        return cached[1]

    def version(self, iteration_id: int) -> int:
        return self._base + self._counts.get(iteration_id, 0)

    def changed_since(self, iteration_id: int, known: int) -> Optional[list[int]]:
        """The tasks whose TaskDef or revocation changed since version ``known`` (oldest first, each once),
        or None if ``known`` is not a version the log reaches back to: send the whole list."""
        count = known - self._base
        if not 0 <= count <= self._counts.get(iteration_id, 0):
            return None
        log = self._logs.get(iteration_id, [])
        if log and log[0][0] > count + 1:
            return None  # forgotten: the reader is further behind than the log
        changed = {}
        for number, task_id in reversed(log):
            if number <= count:
                break
            changed.setdefault(task_id, number)
        return sorted(changed, key=changed.get)

    def note(self, state, update: state_pb2.Update) -> None:
        """Records what ``update``, about to be applied to ``state``, changes in readers' task lists."""
        kind = update.WhichOneof("kind")
        if kind == "create_task":
            self._changed(update.create_task.iteration_id, [update.create_task.task_id])
        elif kind == "revoke_task":
            task = state.tasks.get(update.revoke_task.task_id)
            if task is not None:
                self._changed(task.iteration_id, [task.task_id])
        elif kind in ("register_worker", "prune_worker", "bind_static_worker"):
            # A TaskDef names its worker's addresses, tags and shard.
            worker = state.workers.get(getattr(update, kind).worker_address)
            by_iteration: dict[int, list] = {}
            for task_id in (worker.tasks if worker is not None else ()):
                task = state.tasks.get(task_id)
                if task is not None:
                    by_iteration.setdefault(task.iteration_id, []).append(task_id)
            for iteration_id, task_ids in by_iteration.items():
                self._changed(iteration_id, task_ids)
        elif kind == "prune_iteration":
            self._counts.pop(update.prune_iteration.iteration_id, None)
            self._logs.pop(update.prune_iteration.iteration_id, None)
            self._wholes.pop(update.prune_iteration.iteration_id, None)
            iteration = state.iterations.get(update.prune_iteration.iteration_id)
            for task_id in (iteration.tasks if iteration is not None else ()):
                self._defs.pop(task_id, None)

    def _changed(self, iteration_id: int, task_ids: list) -> None:
        count = self._counts.get(iteration_id, 0) + 1
        self._counts[iteration_id] = count
        log = self._logs.setdefault(iteration_id, [])
        log.extend((count, task_id) for task_id in task_ids)
        for task_id in task_ids:
            self._defs.pop(task_id, None)
        if len(log) > MAX_LOGGED_CHANGES:
            del log[:len(log) - MAX_LOGGED_CHANGES]
