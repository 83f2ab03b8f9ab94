"""The dispatcher's state, changed only through ``apply(update)``.

Every change is a typed ``Update`` protobuf (``protos/dataservice/proto/state.proto``),
so replaying a journal of updates rebuilds exactly the same state. Nothing
here does I/O, reads a clock or makes a decision: the core decides, the state
records.

Example::

    >>> state = DispatcherState()
    >>> u = state_pb2.Update(register_worker=state_pb2.RegisterWorkerUpdate(worker_address="w:1", worker_uid="a"))
    >>> state.apply(u)
    >>> list(state.workers)
    ['w:1']
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Optional

from dataservice.proto import state_pb2
from dataservice.service.intervals import OffsetSet

__all__ = ["DispatcherState", "DatasetInfo", "WorkerInfo", "JobInfo", "IterationInfo", "TaskInfo", "ClientInfo",
           "IterationState"]


@dataclasses.dataclass
class DatasetInfo:
    dataset_id: int
    fingerprint: str
    dataset_def: bytes
    num_splits: int


@dataclasses.dataclass
class WorkerInfo:
    address: str
    uid: str
    data_address: str = ""
    tasks: set = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class JobInfo:
    job_id: int
    name: str
    dataset_id: int
    processing_mode: int
    iterations: dict = dataclasses.field(default_factory=dict)  # repetition -> iteration id


class IterationState(enum.Enum):
    ACTIVE = "active"
    FINISHED = "finished"
    GARBAGE_COLLECTED = "garbage_collected"


@dataclasses.dataclass
class IterationInfo:
    iteration_id: int
    job_id: int
    repetition: int
    state: IterationState = IterationState.ACTIVE
    # Secrets: kept out of repr (and so of logs and assertion messages); see CreateIterationUpdate.
    read_key: bytes = dataclasses.field(default=b"", repr=False)
    creator_token: bytes = dataclasses.field(default=b"", repr=False)
    next_split: int = 0
    tasks: list = dataclasses.field(default_factory=list)
    clients: set = dataclasses.field(default_factory=set)
    # Delivery bookkeeping, keyed by (stream id, split index): see record_progress.
    leases: dict = dataclasses.field(default_factory=dict)    # key -> task producing it
    pending: dict = dataclasses.field(default_factory=dict)   # key -> revoked task that held it
    progress: dict = dataclasses.field(default_factory=dict)  # key -> OffsetSet clients hold
    totals: dict = dataclasses.field(default_factory=dict)    # key -> elements the split produced
    done: set = dataclasses.field(default_factory=set)        # keys whose every element a client holds

    @property
    def finished(self) -> bool:
        return self.state is not IterationState.ACTIVE


@dataclasses.dataclass
class TaskInfo:
    task_id: int
    iteration_id: int
    worker_address: str
    stream_id: int = 0
    finished: bool = False
    revoked: bool = False
    last_request_id: int = 0   # its last GetSplit request, and the split that answered it
    last_split: int = -1


@dataclasses.dataclass
class ClientInfo:
    client_id: int
    iteration_id: int


class DispatcherState:
    """Datasets, workers, jobs, iterations, tasks and clients; see the module docstring."""

    def __init__(self, first_id: int = 1) -> None:
        self.datasets: dict[int, DatasetInfo] = {}
        self.datasets_by_fingerprint: dict[str, int] = {}
        self.workers: dict[str, WorkerInfo] = {}
        self.jobs: dict[int, JobInfo] = {}
        self.jobs_by_name: dict[str, int] = {}
        self.iterations: dict[int, IterationInfo] = {}
        self.tasks: dict[int, TaskInfo] = {}
        self.clients: dict[int, ClientInfo] = {}
        self._next_id = first_id  # one id space for everything: ids are never reused

    def next_id(self) -> int:
        """The id the next created object gets (the core reads it, the update carries it)."""
        return self._next_id

    def _saw_id(self, value: int) -> None:
        self._next_id = max(self._next_id, value + 1)

    # --- lookups that the core and the status page share ------------------------
    def job_of_iteration(self, iteration_id: int) -> JobInfo:
        return self.jobs[self.iterations[iteration_id].job_id]

    def dataset_of_iteration(self, iteration_id: int) -> DatasetInfo:
        return self.datasets[self.job_of_iteration(iteration_id).dataset_id]

    def find_iteration(self, job_id: int, repetition: int) -> Optional[IterationInfo]:
        iteration_id = self.jobs[job_id].iterations.get(repetition)
        return None if iteration_id is None else self.iterations[iteration_id]

    # --- the only way to change the state -------------------------------------
    def apply(self, update: state_pb2.Update) -> None:
        kind = update.WhichOneof("kind")
        handler = getattr(self, f"_apply_{kind}", None)
        if handler is None:
            raise ValueError(f"unknown state update {kind!r}")
        handler(getattr(update, kind))

    def _apply_register_dataset(self, u: state_pb2.RegisterDatasetUpdate) -> None:
        self.datasets[u.dataset_id] = DatasetInfo(u.dataset_id, u.fingerprint, u.dataset_def, u.num_splits)
        self.datasets_by_fingerprint[u.fingerprint] = u.dataset_id
        self._saw_id(u.dataset_id)

    def _apply_register_worker(self, u: state_pb2.RegisterWorkerUpdate) -> None:
        existing = self.workers.get(u.worker_address)
        if existing is None:
            self.workers[u.worker_address] = WorkerInfo(u.worker_address, u.worker_uid, u.data_address)
        else:
            existing.uid = u.worker_uid  # a restart on the same address keeps its task assignments
            existing.data_address = u.data_address

    def _apply_create_job(self, u: state_pb2.CreateJobUpdate) -> None:
        self.jobs[u.job_id] = JobInfo(u.job_id, u.job_name, u.dataset_id, u.processing_mode)
        if u.job_name:
            # A known name is re-bound: the core creates a job under a taken name only once the
            # job bearing it was garbage collected.
            self.jobs_by_name[u.job_name] = u.job_id
        self._saw_id(u.job_id)

    def _apply_create_iteration(self, u: state_pb2.CreateIterationUpdate) -> None:
        self.iterations[u.iteration_id] = IterationInfo(u.iteration_id, u.job_id, u.repetition,
                                                        read_key=u.read_key, creator_token=u.creator_token)
        self.jobs[u.job_id].iterations[u.repetition] = u.iteration_id
        self._saw_id(u.iteration_id)

    def _apply_create_task(self, u: state_pb2.CreateTaskUpdate) -> None:
        self.tasks[u.task_id] = TaskInfo(u.task_id, u.iteration_id, u.worker_address, stream_id=u.stream_id)
        iteration = self.iterations[u.iteration_id]
        iteration.tasks.append(u.task_id)
        self.workers[u.worker_address].tasks.add(u.task_id)
        if self.jobs[iteration.job_id].processing_mode == state_pb2.PARALLEL_EPOCHS:
            # The task's whole output is split 0 of its stream; a task taking over a
            # revoked stream takes over its lease.
            key = (u.stream_id, 0)
            iteration.pending.pop(key, None)
            if key not in iteration.done:
                iteration.leases[key] = u.task_id
        self._saw_id(u.task_id)

    def _apply_finish_task(self, u: state_pb2.FinishTaskUpdate) -> None:
        self.tasks[u.task_id].finished = True

    def _apply_acquire_iteration_client(self, u: state_pb2.AcquireIterationClientUpdate) -> None:
        self.clients[u.client_id] = ClientInfo(u.client_id, u.iteration_id)
        self.iterations[u.iteration_id].clients.add(u.client_id)
        self._saw_id(u.client_id)

    def _apply_release_iteration_client(self, u: state_pb2.ReleaseIterationClientUpdate) -> None:
        client = self.clients.pop(u.client_id)
        self.iterations[client.iteration_id].clients.discard(u.client_id)

    def _apply_assign_split(self, u: state_pb2.AssignSplitUpdate) -> None:
        iteration = self.iterations[u.iteration_id]
        task = self.tasks[u.task_id]
        task.last_request_id, task.last_split = u.request_id, u.split_index
        key = (task.stream_id, u.split_index)
        iteration.leases[key] = u.task_id
        if u.reassigned:
            iteration.pending.pop(key, None)
        else:
            iteration.next_split = max(iteration.next_split, u.split_index + 1)

    def _apply_record_progress(self, u: state_pb2.RecordProgressUpdate) -> None:
        iteration = self.iterations[u.iteration_id]
        for p in u.progress:
            key = (p.stream_id, p.split_index)
            if key in iteration.done:
                continue
            if p.ranges:
                iteration.progress.setdefault(key, OffsetSet()).update(OffsetSet.from_flat(p.ranges))
            if p.total >= 0:
                iteration.totals[key] = p.total
            total = iteration.totals.get(key)
            if total is not None and iteration.progress.get(key, OffsetSet()).covers(total):
                # Every element of the split is with a client: nothing to redo, ever.
                iteration.done.add(key)
                for table in (iteration.progress, iteration.totals, iteration.leases, iteration.pending):
                    table.pop(key, None)

    def _apply_revoke_task(self, u: state_pb2.RevokeTaskUpdate) -> None:
        task = self.tasks[u.task_id]
        task.revoked = True
        task.finished = True
        iteration = self.iterations[task.iteration_id]
        for key, holder in list(iteration.leases.items()):
            if holder == u.task_id:
                del iteration.leases[key]
                iteration.pending[key] = u.task_id

    def _apply_finish_iteration(self, u: state_pb2.FinishIterationUpdate) -> None:
        iteration = self.iterations[u.iteration_id]
        iteration.state = IterationState.GARBAGE_COLLECTED if u.garbage_collected else IterationState.FINISHED
        for task_id in iteration.tasks:
            task = self.tasks[task_id]
            if u.garbage_collected:
                task.finished = True

    def _apply_id_floor(self, u: state_pb2.IdFloorUpdate) -> None:
        self._next_id = max(self._next_id, u.next_id)

    def _apply_iteration_snapshot(self, u: state_pb2.IterationSnapshotUpdate) -> None:
        iteration = self.iterations[u.iteration_id]
        iteration.next_split = u.next_split
        iteration.state = _STATE_CODES[u.state]
        iteration.leases = {(lease.stream_id, lease.split_index): lease.task_id for lease in u.leases}
        iteration.pending = {(lease.stream_id, lease.split_index): lease.task_id for lease in u.pending}
        iteration.progress = {(p.stream_id, p.split_index): OffsetSet.from_flat(p.ranges)
                              for p in u.progress if p.ranges}
        iteration.totals = {(p.stream_id, p.split_index): p.total for p in u.progress if p.total >= 0}
        iteration.done = set(zip(u.done[0::2], u.done[1::2]))
        for last in u.last_assignments:
            task = self.tasks[last.task_id]
            task.last_request_id, task.last_split = last.request_id, last.split_index

    # --- checkpoints --------------------------------------------------------------
    def to_updates(self) -> list[state_pb2.Update]:
        """Updates that rebuild this state from empty: what a checkpoint stores.

        Their number depends on what exists now (datasets, workers, jobs, tasks,
        clients), not on how many updates led here.
        """
        U = state_pb2.Update
        out: list[state_pb2.Update] = [U(id_floor=state_pb2.IdFloorUpdate(next_id=self._next_id))]
        for d in self.datasets.values():
            out.append(U(register_dataset=state_pb2.RegisterDatasetUpdate(
                dataset_id=d.dataset_id, fingerprint=d.fingerprint, dataset_def=d.dataset_def,
                num_splits=d.num_splits)))
        for w in self.workers.values():
            out.append(U(register_worker=state_pb2.RegisterWorkerUpdate(worker_address=w.address, worker_uid=w.uid,
                                                                        data_address=w.data_address)))
        # A name re-bound to a new job (its old job was garbage collected) names two jobs, and
        # the last create_job applied wins jobs_by_name: the bound job goes after the others.
        for j in sorted(self.jobs.values(), key=lambda j: (self.jobs_by_name.get(j.name) == j.job_id, j.job_id)):
            out.append(U(create_job=state_pb2.CreateJobUpdate(job_id=j.job_id, job_name=j.name,
                                                              dataset_id=j.dataset_id,
                                                              processing_mode=j.processing_mode)))
        for it in self.iterations.values():
            out.append(U(create_iteration=state_pb2.CreateIterationUpdate(
                iteration_id=it.iteration_id, job_id=it.job_id, repetition=it.repetition, read_key=it.read_key,
                creator_token=it.creator_token)))
        for t in self.tasks.values():
            out.append(U(create_task=state_pb2.CreateTaskUpdate(task_id=t.task_id, iteration_id=t.iteration_id,
                                                                worker_address=t.worker_address,
                                                                stream_id=t.stream_id)))
            if t.revoked:
                out.append(U(revoke_task=state_pb2.RevokeTaskUpdate(task_id=t.task_id)))
            elif t.finished:
                out.append(U(finish_task=state_pb2.FinishTaskUpdate(task_id=t.task_id)))
        for c in self.clients.values():
            out.append(U(acquire_iteration_client=state_pb2.AcquireIterationClientUpdate(
                client_id=c.client_id, iteration_id=c.iteration_id)))
        Lease = state_pb2.IterationSnapshotUpdate.Lease
        for it in self.iterations.values():
            done: list[int] = []
            for stream, split in sorted(it.done):
                done += (stream, split)
            out.append(U(iteration_snapshot=state_pb2.IterationSnapshotUpdate(
                iteration_id=it.iteration_id, next_split=it.next_split,
                leases=[Lease(stream_id=k[0], split_index=k[1], task_id=v) for k, v in sorted(it.leases.items())],
                pending=[Lease(stream_id=k[0], split_index=k[1], task_id=v) for k, v in sorted(it.pending.items())],
                progress=[state_pb2.SplitProgress(stream_id=k[0], split_index=k[1], ranges=v.flat(),
                                                  total=it.totals.get(k, -1))
                          for k, v in sorted(it.progress.items())]
                + [state_pb2.SplitProgress(stream_id=k[0], split_index=k[1], total=n)
                   for k, n in sorted(it.totals.items()) if k not in it.progress],
                done=done, state=_STATE_NUMBERS[it.state],
                last_assignments=[Lease(stream_id=self.tasks[t].stream_id, split_index=self.tasks[t].last_split,
                                        task_id=t, request_id=self.tasks[t].last_request_id)
                                  for t in it.tasks if self.tasks[t].last_split >= 0])))
        return out


_STATE_CODES = {0: IterationState.ACTIVE, 1: IterationState.FINISHED, 2: IterationState.GARBAGE_COLLECTED}
_STATE_NUMBERS = {v: k for k, v in _STATE_CODES.items()}
