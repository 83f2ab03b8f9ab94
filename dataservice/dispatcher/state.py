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
import hashlib
from typing import Iterable, NamedTuple, Optional

from dataservice.proto import state_pb2
from dataservice.service.intervals import OffsetSet

__all__ = ["DispatcherState", "DatasetInfo", "WorkerInfo", "JobInfo", "JobKey", "IterationInfo", "TaskInfo",
           "ClientInfo", "SaveInfo", "IterationState", "SplitLeases", "DoneSplits", "StateUpdateError"]


class StateUpdateError(ValueError):
    """An update that does not fit the state: it names an object that does not exist (or one
    that already does). ``apply`` checks before it changes anything, so the state is unchanged.
    The core never commits such an update; met while replaying a journal, it means the journal
    lost records the update depends on, and the start is refused (see journal.py)."""


@dataclasses.dataclass
class DatasetInfo:
    dataset_id: int
    fingerprint: str
    dataset_def: bytes
    num_splits: int
    #: The ids users chose for it (register_dataset(..., dataset_id=...)), in the order given.
    names: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class WorkerInfo:
    address: str
    uid: str
    data_address: str = ""
    tasks: set = dataclasses.field(default_factory=set)
    #: target_workers: its WorkerConfig.worker_tags, and the host it runs on (host_identity).
    tags: tuple = ()
    host_id: str = ""


class JobKey(NamedTuple):
    """What a named job answers to: its name scoped by the dataset id its readers named, as in tf.data
    service. ``dataset_name`` is the chosen id they named ("" for the numeric id ``dataset_id``), so two
    names of one pipeline under one job_name are two jobs.

    Example::

        >>> JobKey("train", 1733400000000000, "imagenet-v3") == JobKey("train", 1733400000000000)
        False
    """

    job_name: str
    dataset_id: int
    dataset_name: str = ""
    #: A restored read's ``resume_digest`` ("" for a fresh read): the readers restoring one saved position
    #: under one job_name share a job, and none of them joins the job the saved readers read.
    resume: str = ""


def resume_digest(resume: Optional[state_pb2.ResumePoint]) -> str:
    """A short digest of a restored read's start (``ResumePoint``), its seeks left out; "" for None.

    Example::

        >>> resume_digest(None), len(resume_digest(state_pb2.ResumePoint(done_groups=[0, 4])))
        ('', 16)
        >>> seek = state_pb2.GroupSeek(group=0, offset=64, state=b"{}")
        >>> with_seek = state_pb2.ResumePoint(position=100, seeks=[seek])
        >>> resume_digest(with_seek) == resume_digest(state_pb2.ResumePoint(position=100))
        True
    """
    if resume is None:
        return ""
    # Without the seeks: readers saving at one step may hold different marks of a group taken in part (each
    # keeps the marks its own fetchers received), and any of them is a valid place for the group's worker to
    # start; they restore one position, so they share one job (its seeks are its first reader's).
    point = state_pb2.ResumePoint()
    point.CopyFrom(resume)
    del point.seeks[:]
    return hashlib.sha256(point.SerializeToString(deterministic=True)).hexdigest()[:16]


@dataclasses.dataclass
class JobInfo:
    job_id: int
    name: str
    dataset_id: int
    processing_mode: int
    iterations: dict = dataclasses.field(default_factory=dict)  # repetition -> iteration id
    # How the job is read (CreateJobUpdate): coordinated reads, cross-trainer cache, target workers.
    num_consumers: int = 0
    cross_trainer_cache: bool = False
    target_workers: str = "AUTO"
    #: The chosen dataset id its readers named ("": the numeric id); part of its key.
    dataset_name: str = ""
    #: Readers get the elements in split group order (CreateJobUpdate.deterministic).
    deterministic: bool = False
    #: A restored read: where its first iteration starts (a ResumePoint; None for a fresh read).
    resume: Optional[state_pb2.ResumePoint] = None
    #: Elastic readers sharing the deterministic sequence (CreateJobUpdate.num_readers); 0 otherwise.
    num_readers: int = 0

    @property
    def key(self) -> JobKey:
        return JobKey(self.name, self.dataset_id, self.dataset_name, resume_digest(self.resume))


class DoneSplits:
    """The splits of an iteration whose every element a client holds, ``(stream id, split index)`` keys kept
    as ranges of split indices per stream. An endless read (``repeat()``) completes splits for as long as it
    runs, mostly in order: a set of every key grew by a tuple per split for months, and a journal checkpoint
    listed them all under the dispatcher's lock; the ranges stay about as many as the splits in flight.

    Example::

        >>> done = DoneSplits([(0, 0), (0, 1), (0, 3)])
        >>> (0, 1) in done, (0, 2) in done, len(done), done.flat_ranges()
        (True, False, 3, [0, 0, 2, 0, 3, 4])
    """

    __slots__ = ("_streams",)

    def __init__(self, keys=()):
        self._streams: dict[int, OffsetSet] = {}
        for key in keys:
            self.add(key)

    @classmethod
    def from_flat_ranges(cls, flat) -> "DoneSplits":
        """From ``[stream, first split, end split, ...]`` (``flat_ranges``, a checkpoint's form)."""
        done = cls()
        values = list(flat)
        for stream, start, end in zip(values[0::3], values[1::3], values[2::3]):
            done.add_range(stream, start, end)
        return done

    def add(self, key: tuple) -> None:
        stream, split = key
        self.add_range(stream, split, split + 1)

    def add_range(self, stream: int, start: int, end: int) -> None:
        """Adds the splits ``start .. end - 1`` of ``stream``."""
        ranges = self._streams.get(stream)
        if ranges is None:
            ranges = self._streams[stream] = OffsetSet()
        ranges.add(start, end)

    def flat_ranges(self) -> list[int]:
        """``[stream, first split, end split, ...]``, streams in order."""
        out: list[int] = []
        for stream in sorted(self._streams):
            for start, end in self._streams[stream].ranges:
                out += (stream, start, end)
        return out

    def __contains__(self, key) -> bool:
        ranges = self._streams.get(key[0])
        return ranges is not None and key[1] in ranges

    def covers(self, stream: int, total: int) -> bool:
        """Whether splits ``0 .. total - 1`` of ``stream`` are all done: O(1), where ``len`` walks every range
        (a distributed_epoch read's done splits are as ragged as its thousands of readers made them)."""
        ranges = self._streams.get(stream)
        return total == 0 or (ranges is not None and ranges.covers(total))

    def __len__(self) -> int:
        # A sum over the ranges, about as many as the splits in flight: no count to keep in step.
        return sum(len(ranges) for ranges in self._streams.values())

    def __iter__(self):
        for stream in sorted(self._streams):
            for start, end in self._streams[stream].ranges:
                for split in range(start, end):
                    yield stream, split

    def __eq__(self, other) -> bool:
        if not isinstance(other, DoneSplits):
            return NotImplemented
        return self.flat_ranges() == other.flat_ranges()

    def __repr__(self) -> str:
        return f"DoneSplits({self.flat_ranges()})"


class SplitLeases(dict):
    """An iteration's leases, ``(stream id, split index) -> task producing it``, that also know each task's
    keys: revoking a task (a lost worker's) touches its own leases, not every lease of the iteration.
    A fleet that loses a rack revokes thousands of tasks at once, each a scan of tens of thousands of
    leases before; seconds under the dispatcher's lock.

    Example::

        >>> leases = SplitLeases({(0, 3): 7})
        >>> leases[(0, 4)] = 7
        >>> leases.of_task(7)
        [(0, 3), (0, 4)]
    """

    def __init__(self, items=()):
        super().__init__()
        self._by_task: dict[int, dict] = {}  # task -> its keys, in the order it leased them
        for key, task_id in dict(items).items():
            self[key] = task_id

    def of_task(self, task_id: int) -> list:
        """The keys ``task_id`` holds, in the order it leased them."""
        return list(self._by_task.get(task_id, ()))

    def __setitem__(self, key, task_id: int) -> None:
        old = self.get(key)
        if old is not None and old != task_id:
            self._forget(key, old)
        super().__setitem__(key, task_id)
        self._by_task.setdefault(task_id, {})[key] = None

    def __delitem__(self, key) -> None:
        task_id = self[key]
        super().__delitem__(key)
        self._forget(key, task_id)

    def pop(self, key, *default):
        if key not in self:
            if default:
                return default[0]
            raise KeyError(key)
        task_id = super().pop(key)
        self._forget(key, task_id)
        return task_id

    def _forget(self, key, task_id: int) -> None:
        keys = self._by_task[task_id]
        del keys[key]
        if not keys:
            del self._by_task[task_id]

    def _unsupported(self, *args, **kwargs):
        raise TypeError("SplitLeases changes one key at a time ([key] = task, del, pop): its index follows them")

    clear = popitem = setdefault = update = __ior__ = _unsupported


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
    # Finished, without clients, and its tasks and bookkeeping dropped (PruneIterationUpdate).
    pruned: bool = False
    # Delivery bookkeeping, keyed by (stream id, split index): see record_progress.
    leases: SplitLeases = dataclasses.field(default_factory=SplitLeases)  # key -> task producing it
    pending: dict = dataclasses.field(default_factory=dict)   # key -> revoked task that held it
    progress: dict = dataclasses.field(default_factory=dict)  # key -> OffsetSet clients hold
    totals: dict = dataclasses.field(default_factory=dict)    # key -> elements the split produced
    done: DoneSplits = dataclasses.field(default_factory=DoneSplits)  # keys whose every element a client holds
    # Elastic readers: key -> reader index -> OffsetSet it holds (``progress`` is their intersection); and the
    # reader indices clients have read as (a reader index is read by one reader, once).
    reader_progress: dict = dataclasses.field(default_factory=dict)
    claimed_readers: set = dataclasses.field(default_factory=set)

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
    last_request_id: int = 0   # its last GetSplit request, and the splits that answered it (in order)
    last_splits: tuple = ()
    starting_round: int = 0    # coordinated reads: the first round it serves (CreateTaskUpdate)
    worker_index: int = 0      # static sharding: the shard it produces (CreateTaskUpdate)


@dataclasses.dataclass
class SaveInfo:
    """A distributed_save: its groups leased to workers, its chunks committed, and how it ended."""
    save_id: int
    dataset_id: int
    path: str
    num_groups: int
    compression: str
    element_spec: bytes = b""
    leases: dict = dataclasses.field(default_factory=dict)     # group -> (worker address, attempt)
    committed: dict = dataclasses.field(default_factory=dict)  # group -> (attempt, num_elements, bytes)
    finished: bool = False
    error: str = ""
    #: The starting call's DistributedSaveRequest.request_token: only its retries get this save back.
    request_token: bytes = dataclasses.field(default=b"", repr=False)


@dataclasses.dataclass
class ClientInfo:
    client_id: int
    iteration_id: int
    consumer_index: Optional[int] = None   # coordinated reads: the consumer it reads as
    reader_index: Optional[int] = None     # elastic readers: the reader it reads as


class DispatcherState:
    """Datasets, workers, jobs, iterations, tasks and clients; see the module docstring."""

    def __init__(self, first_id: int = 1) -> None:
        self.datasets: dict[int, DatasetInfo] = {}
        self.datasets_by_fingerprint: dict[str, int] = {}
        #: A user-chosen dataset id to the numeric one. Datasets never leave the state, so a name,
        #: once given, names its dataset for good (across restarts too, in fault-tolerant mode).
        self.datasets_by_name: dict[str, int] = {}
        self.workers: dict[str, WorkerInfo] = {}
        self.jobs: dict[int, JobInfo] = {}
        #: Named jobs by (job_name, dataset id, chosen dataset id read): see JobKey.
        self.jobs_by_key: dict[JobKey, int] = {}
        self.iterations: dict[int, IterationInfo] = {}
        self.tasks: dict[int, TaskInfo] = {}
        self.clients: dict[int, ClientInfo] = {}
        #: Iterations not finished yet: what a worker may get tasks for (kept apart so that
        #: thousands of finished ones cost a heartbeat nothing).
        self.active_iterations: dict[int, IterationInfo] = {}
        #: distributed_save runs, by save id; the unfinished ones also by path (saves_by_path).
        self.saves: dict[int, SaveInfo] = {}
        self.saves_by_path: dict[str, int] = {}
        #: Finished jobs that left the state (PruneJobUpdate), since the state began.
        self.jobs_pruned = 0
        #: Static sharding: worker index (its DispatcherConfig.worker_addresses entry) -> the worker
        #: address bound to it (BindStaticWorkerUpdate); kept across restarts. A new worker re-binds an
        #: entry only once its worker is lost (the takeover rule of service/worker_list.resolve_index).
        self.static_workers: dict[int, str] = {}
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
        """Applies ``update``; StateUpdateError (and no change) if it does not fit the state."""
        kind = update.WhichOneof("kind")
        handler = getattr(self, f"_apply_{kind}", None)
        if handler is None:
            if kind is None:
                raise StateUpdateError("a state update of a kind this dataservice does not know: the journal "
                                       "was written by a newer dataservice; upgrade to start on this work_dir")
            raise StateUpdateError(f"unknown state update {kind!r}")
        handler(getattr(update, kind))

    # Each handler checks everything it will look up before it changes anything.
    def _need(self, table: dict, key, what: str, update: str):
        value = table.get(key)
        if value is None:
            raise StateUpdateError(f"{update} names {what} {key}, which does not exist")
        return value

    def _new(self, table: dict, key, what: str, update: str) -> None:
        if key in table:
            raise StateUpdateError(f"{update} creates {what} {key}, which already exists")
        if key <= 0 if isinstance(key, int) else not key:
            raise StateUpdateError(f"{update} creates {what} {key!r}: not a valid id")

    def _apply_register_dataset(self, u: state_pb2.RegisterDatasetUpdate) -> None:
        self._new(self.datasets, u.dataset_id, "dataset", "register_dataset")
        if u.dataset_name:
            self._free_name(u.dataset_name, f"register_dataset {u.dataset_id}")
        self.datasets[u.dataset_id] = DatasetInfo(u.dataset_id, u.fingerprint, u.dataset_def, u.num_splits)
        self.datasets_by_fingerprint[u.fingerprint] = u.dataset_id
        if u.dataset_name:
            self._bind_name(u.dataset_id, u.dataset_name)
        self._saw_id(u.dataset_id)

    def _apply_name_dataset(self, u: state_pb2.NameDatasetUpdate) -> None:
        what = f"name_dataset {u.dataset_name!r}"
        self._need(self.datasets, u.dataset_id, "dataset", what)
        if not u.dataset_name:
            raise StateUpdateError(f"name_dataset for dataset {u.dataset_id} has no name")
        self._free_name(u.dataset_name, what)
        self._bind_name(u.dataset_id, u.dataset_name)

    def _free_name(self, name: str, update: str) -> None:
        # A name is never re-bound: readers resolving it must always get the same pipeline.
        if name in self.datasets_by_name:
            raise StateUpdateError(f"{update}: the dataset name {name!r} already names dataset "
                                   f"{self.datasets_by_name[name]}")

    def _bind_name(self, dataset_id: int, name: str) -> None:
        self.datasets_by_name[name] = dataset_id
        self.datasets[dataset_id].names.append(name)

    def _apply_register_worker(self, u: state_pb2.RegisterWorkerUpdate) -> None:
        if not u.worker_address:
            raise StateUpdateError("register_worker has no worker address")
        existing = self.workers.get(u.worker_address)
        if existing is None:
            self.workers[u.worker_address] = WorkerInfo(u.worker_address, u.worker_uid, u.data_address,
                                                        tags=tuple(u.worker_tags), host_id=u.host_id)
        else:
            existing.uid = u.worker_uid  # a restart on the same address keeps its task assignments
            existing.data_address = u.data_address
            existing.tags, existing.host_id = tuple(u.worker_tags), u.host_id

    def _apply_create_job(self, u: state_pb2.CreateJobUpdate) -> None:
        self._new(self.jobs, u.job_id, "job", "create_job")
        self._need(self.datasets, u.dataset_id, "dataset", f"create_job {u.job_id}")
        if u.dataset_name and not u.job_name:
            raise StateUpdateError(f"create_job {u.job_id}: an anonymous job has no dataset name to be keyed by")
        job = self.jobs[u.job_id] = JobInfo(u.job_id, u.job_name, u.dataset_id, u.processing_mode,
                                            num_consumers=u.num_consumers, cross_trainer_cache=u.cross_trainer_cache,
                                            target_workers=u.target_workers or "AUTO", dataset_name=u.dataset_name,
                                            deterministic=u.deterministic,
                                            resume=u.resume if u.HasField("resume") else None,
                                            num_readers=u.num_readers)
        if u.job_name:
            # A known key is re-bound: the core creates a job under a taken key only once the
            # job bearing it was garbage collected.
            self.jobs_by_key[job.key] = u.job_id
        self._saw_id(u.job_id)

    def _apply_create_iteration(self, u: state_pb2.CreateIterationUpdate) -> None:
        what = f"create_iteration {u.iteration_id}"
        self._new(self.iterations, u.iteration_id, "iteration", "create_iteration")
        job = self._need(self.jobs, u.job_id, "job", what)
        if u.repetition in job.iterations:
            raise StateUpdateError(f"{what}: repetition {u.repetition} of job {u.job_id} already has iteration "
                                   f"{job.iterations[u.repetition]}")
        iteration = IterationInfo(u.iteration_id, u.job_id, u.repetition, read_key=u.read_key,
                                  creator_token=u.creator_token)
        if job.resume is not None and u.repetition == 0:
            _start_at(iteration, job.resume)
        self.iterations[u.iteration_id] = iteration
        self.active_iterations[u.iteration_id] = iteration
        job.iterations[u.repetition] = u.iteration_id
        self._saw_id(u.iteration_id)

    def _apply_create_task(self, u: state_pb2.CreateTaskUpdate) -> None:
        what = f"create_task {u.task_id}"
        self._new(self.tasks, u.task_id, "task", "create_task")
        iteration = self._need(self.iterations, u.iteration_id, "iteration", what)
        worker = self._need(self.workers, u.worker_address, "worker", what)
        if iteration.pruned:
            raise StateUpdateError(f"{what}: iteration {u.iteration_id} was pruned")
        self.tasks[u.task_id] = TaskInfo(u.task_id, u.iteration_id, u.worker_address, stream_id=u.stream_id,
                                         starting_round=u.starting_round, worker_index=u.worker_index)
        iteration.tasks.append(u.task_id)
        worker.tasks.add(u.task_id)
        if self.jobs[iteration.job_id].processing_mode == state_pb2.PARALLEL_EPOCHS:
            # The task's whole output is split 0 of its stream; a task taking over a
            # revoked stream takes over its lease.
            key = (u.stream_id, 0)
            iteration.pending.pop(key, None)
            if key not in iteration.done:
                iteration.leases[key] = u.task_id
        self._saw_id(u.task_id)

    def _apply_finish_task(self, u: state_pb2.FinishTaskUpdate) -> None:
        self._need(self.tasks, u.task_id, "task", "finish_task").finished = True

    def _apply_acquire_iteration_client(self, u: state_pb2.AcquireIterationClientUpdate) -> None:
        self._new(self.clients, u.client_id, "client", "acquire_iteration_client")
        # A pruned iteration may still get clients: a reader of a named job reaching a repetition
        # that already finished is told so by its heartbeat (finished, no tasks).
        iteration = self._need(self.iterations, u.iteration_id, "iteration", f"acquire_iteration_client {u.client_id}")
        self.clients[u.client_id] = ClientInfo(
            u.client_id, u.iteration_id, u.consumer_index if u.HasField("consumer_index") else None,
            u.reader_index if u.HasField("reader_index") else None)
        iteration.clients.add(u.client_id)
        if u.HasField("reader_index"):
            iteration.claimed_readers.add(u.reader_index)
        self._saw_id(u.client_id)

    def _apply_release_iteration_client(self, u: state_pb2.ReleaseIterationClientUpdate) -> None:
        client = self._need(self.clients, u.client_id, "client", "release_iteration_client")
        del self.clients[u.client_id]
        self.iterations[client.iteration_id].clients.discard(u.client_id)

    def _lease_target(self, u, what: str) -> tuple["IterationInfo", "TaskInfo"]:
        """The iteration and task a split lease (``assign_split``, ``lease_splits``) names, checked."""
        iteration = self._need(self.iterations, u.iteration_id, "iteration", what)
        task = self._need(self.tasks, u.task_id, "task", what)
        if task.iteration_id != u.iteration_id:
            raise StateUpdateError(f"{what}: task {u.task_id} belongs to iteration {task.iteration_id}, "
                                   f"not {u.iteration_id}")
        return iteration, task

    def _apply_assign_split(self, u: state_pb2.AssignSplitUpdate) -> None:
        iteration, task = self._lease_target(u, f"assign_split of split {u.split_index}")
        if u.request_id and u.request_id == task.last_request_id and not u.reassigned:
            task.last_splits += (u.split_index,)  # another split of the same answer (GetSplitRequest.max_splits)
        else:
            task.last_request_id, task.last_splits = u.request_id, (u.split_index,)
        key = (task.stream_id, u.split_index)
        iteration.leases[key] = u.task_id
        if u.reassigned:
            iteration.pending.pop(key, None)
        else:
            iteration.next_split = max(iteration.next_split, u.split_index + 1)

    def _apply_lease_splits(self, u: state_pb2.LeaseSplitsUpdate) -> None:
        iteration, task = self._lease_target(u, f"lease_splits for task {u.task_id}")
        if not u.split_indices:
            raise StateUpdateError(f"lease_splits for task {u.task_id} leases no split")
        task.last_request_id, task.last_splits = u.request_id, tuple(u.split_indices)
        for split in u.split_indices:
            iteration.leases[(task.stream_id, split)] = u.task_id
        iteration.next_split = max(iteration.next_split, max(u.split_indices) + 1)

    def _apply_record_progress(self, u: state_pb2.RecordProgressUpdate) -> None:
        iteration = self._need(self.iterations, u.iteration_id, "iteration", "record_progress")
        for p in u.progress:
            if len(p.ranges) % 2:
                raise StateUpdateError(f"record_progress for iteration {u.iteration_id}: split "
                                       f"({p.stream_id}, {p.split_index}) has an odd number of range bounds")
        num_readers = self.jobs[iteration.job_id].num_readers if u.reader else 0
        if u.reader and not 0 < u.reader <= num_readers:
            raise StateUpdateError(f"record_progress for iteration {u.iteration_id}: reader {u.reader - 1} is not one "
                                   f"of the job's {num_readers} readers")
        for p in u.progress:
            key = (p.stream_id, p.split_index)
            if key in iteration.done:
                continue
            if p.ranges and num_readers:
                # Elastic readers each receive every element: an offset is held once all of them hold it.
                per_reader = iteration.reader_progress.setdefault(key, {})
                per_reader.setdefault(u.reader - 1, OffsetSet()).update(OffsetSet.from_flat(p.ranges))
                if len(per_reader) == num_readers:
                    held = per_reader[0]
                    for other in range(1, num_readers):
                        held = held.intersection(per_reader[other])
                    iteration.progress.setdefault(key, OffsetSet()).update(held)
            elif p.ranges:
                iteration.progress.setdefault(key, OffsetSet()).update(OffsetSet.from_flat(p.ranges))
            if p.total >= 0:
                iteration.totals[key] = p.total
            total = iteration.totals.get(key)
            if total is not None and iteration.progress.get(key, OffsetSet()).covers(total):
                # Every element of the split is with a client: nothing to redo, ever.
                iteration.done.add(key)
                for table in (iteration.progress, iteration.totals, iteration.leases, iteration.pending,
                              iteration.reader_progress):
                    table.pop(key, None)

    def _apply_revoke_task(self, u: state_pb2.RevokeTaskUpdate) -> None:
        task = self._need(self.tasks, u.task_id, "task", "revoke_task")
        task.revoked = True
        task.finished = True
        iteration = self.iterations[task.iteration_id]
        for key in iteration.leases.of_task(u.task_id):
            del iteration.leases[key]
            iteration.pending[key] = u.task_id

    def _apply_finish_iteration(self, u: state_pb2.FinishIterationUpdate) -> None:
        iteration = self._need(self.iterations, u.iteration_id, "iteration", "finish_iteration")
        iteration.state = IterationState.GARBAGE_COLLECTED if u.garbage_collected else IterationState.FINISHED
        self.active_iterations.pop(u.iteration_id, None)
        if u.garbage_collected:
            for task_id in iteration.tasks:
                self.tasks[task_id].finished = True

    def _apply_prune_iteration(self, u: state_pb2.PruneIterationUpdate) -> None:
        iteration = self._need(self.iterations, u.iteration_id, "iteration", "prune_iteration")
        if not iteration.finished or iteration.clients:
            raise StateUpdateError(f"prune_iteration: iteration {u.iteration_id} is "
                                   f"{'not finished' if not iteration.finished else 'still read by clients'}")
        self._drop_tasks(iteration)
        iteration.pruned = True
        iteration.leases, iteration.pending, iteration.progress, iteration.totals = SplitLeases(), {}, {}, {}
        iteration.reader_progress = {}
        iteration.done = DoneSplits()

    def _drop_tasks(self, iteration: IterationInfo) -> None:
        for task_id in iteration.tasks:
            task = self.tasks.pop(task_id)
            worker = self.workers.get(task.worker_address)
            if worker is not None:
                worker.tasks.discard(task_id)
        iteration.tasks = []

    def _apply_prune_job(self, u: state_pb2.PruneJobUpdate) -> None:
        job = self._need(self.jobs, u.job_id, "job", "prune_job")
        iterations = [self.iterations[i] for i in job.iterations.values()]
        if any(not it.finished or it.clients for it in iterations):
            raise StateUpdateError(f"prune_job: job {u.job_id} still has an unfinished or read iteration")
        for iteration in iterations:
            self._drop_tasks(iteration)
            del self.iterations[iteration.iteration_id]
        del self.jobs[u.job_id]
        if job.name and self.jobs_by_key.get(job.key) == u.job_id:
            del self.jobs_by_key[job.key]
        self.jobs_pruned += 1

    def _apply_prune_worker(self, u: state_pb2.PruneWorkerUpdate) -> None:
        worker = self._need(self.workers, u.worker_address, "worker", "prune_worker")
        if worker.tasks:
            raise StateUpdateError(f"prune_worker: worker {u.worker_address} still has {len(worker.tasks)} tasks")
        del self.workers[u.worker_address]

    # --- distributed_save -----------------------------------------------------------
    def _apply_create_save(self, u: state_pb2.CreateSaveUpdate) -> None:
        what = f"create_save {u.save_id}"
        self._new(self.saves, u.save_id, "save", "create_save")
        self._need(self.datasets, u.dataset_id, "dataset", what)
        if not u.path or u.num_groups <= 0:
            raise StateUpdateError(f"{what}: needs a path and num_groups > 0, got {u.path!r}, {u.num_groups}")
        self.saves[u.save_id] = SaveInfo(u.save_id, u.dataset_id, u.path, u.num_groups, u.compression,
                                         u.element_spec, request_token=u.request_token)
        self.saves_by_path[u.path] = u.save_id
        self._saw_id(u.save_id)

    def _save_group(self, save_id: int, group: int, update: str) -> SaveInfo:
        save = self._need(self.saves, save_id, "save", update)
        if not 0 <= group < save.num_groups:
            raise StateUpdateError(f"{update}: save {save_id} has no group {group} (it has {save.num_groups})")
        return save

    def _apply_lease_save_group(self, u: state_pb2.LeaseSaveGroupUpdate) -> None:
        save = self._save_group(u.save_id, u.group, "lease_save_group")
        for group, (address, _) in list(save.leases.items()):
            if address == u.worker_address:
                del save.leases[group]
        save.leases[u.group] = (u.worker_address, u.attempt)
        self._saw_id(u.attempt)  # attempts come from the one id space: never reused, across restarts too

    def _apply_commit_save_chunk(self, u: state_pb2.CommitSaveChunkUpdate) -> None:
        save = self._save_group(u.save_id, u.group, "commit_save_chunk")
        if u.group in save.committed:
            raise StateUpdateError(f"commit_save_chunk: group {u.group} of save {u.save_id} is committed already")
        save.committed[u.group] = (u.attempt, u.num_elements, u.bytes)
        save.leases.pop(u.group, None)
        if not save.element_spec and u.element_spec:
            save.element_spec = u.element_spec

    def _apply_release_save_leases(self, u: state_pb2.ReleaseSaveLeasesUpdate) -> None:
        save = self._need(self.saves, u.save_id, "save", "release_save_leases")
        for group, (address, _) in list(save.leases.items()):
            if address == u.worker_address:
                del save.leases[group]

    def _apply_finish_save(self, u: state_pb2.FinishSaveUpdate) -> None:
        save = self._need(self.saves, u.save_id, "save", "finish_save")
        save.finished = True
        save.error = u.error
        save.leases = {}
        if self.saves_by_path.get(save.path) == u.save_id:
            del self.saves_by_path[save.path]

    def _apply_bind_static_worker(self, u: state_pb2.BindStaticWorkerUpdate) -> None:
        if not u.worker_address or u.worker_index < 0:
            raise StateUpdateError(f"bind_static_worker needs a worker address and an index >= 0, got "
                                   f"{u.worker_address!r}, {u.worker_index}")
        # The core binds a free index (or re-binds one whose entry the list no longer matches).
        for index, address in list(self.static_workers.items()):
            if address == u.worker_address:
                del self.static_workers[index]
        self.static_workers[u.worker_index] = u.worker_address

    def _apply_counters(self, u: state_pb2.CountersUpdate) -> None:
        self.jobs_pruned = u.jobs_pruned

    def _apply_id_floor(self, u: state_pb2.IdFloorUpdate) -> None:
        self._next_id = max(self._next_id, u.next_id)

    def _apply_iteration_snapshot(self, u: state_pb2.IterationSnapshotUpdate) -> None:
        what = f"iteration_snapshot of iteration {u.iteration_id}"
        iteration = self._need(self.iterations, u.iteration_id, "iteration", what)
        if u.state not in _STATE_CODES:
            raise StateUpdateError(f"{what}: unknown iteration state {u.state}")
        q = u.last_assignment_quads
        # (task id, split index, request id) of each task's last answer, in order, from either form.
        last_assignments = [(last.task_id, last.split_index, last.request_id) for last in u.last_assignments] + \
            list(zip(q[2::4], q[1::4], q[3::4]))
        for task_id, _, _ in last_assignments:
            self._need(self.tasks, task_id, "task", what)
        iteration.next_split = u.next_split
        iteration.state = _STATE_CODES[u.state]
        if iteration.finished:
            self.active_iterations.pop(u.iteration_id, None)
        leases = {(lease.stream_id, lease.split_index): lease.task_id for lease in u.leases}
        leases.update(_keyed_triples(u.lease_triples))
        iteration.leases = SplitLeases(leases)
        iteration.pending = {(lease.stream_id, lease.split_index): lease.task_id for lease in u.pending}
        iteration.pending.update(_keyed_triples(u.pending_triples))
        iteration.progress = {(p.stream_id, p.split_index): OffsetSet.from_flat(p.ranges)
                              for p in u.progress if p.ranges}
        iteration.totals = {(p.stream_id, p.split_index): p.total for p in u.progress if p.total >= 0}
        iteration.done = DoneSplits.from_flat_ranges(u.done_ranges)
        for key in zip(u.done[0::2], u.done[1::2]):  # a checkpoint written before done_ranges
            iteration.done.add(key)
        iteration.claimed_readers = set(u.claimed_readers)
        answered: set = set()  # the tasks whose last answer this snapshot has begun to list
        for task_id, split_index, request_id in last_assignments:
            task = self.tasks[task_id]
            if task_id in answered:
                task.last_splits += (split_index,)
            else:
                answered.add(task_id)
                task.last_request_id, task.last_splits = request_id, (split_index,)

    # --- checkpoints --------------------------------------------------------------
    def to_updates(self) -> list[state_pb2.Update]:
        """Updates that rebuild this state from empty: what a checkpoint stores.

        Their number depends on what exists now (datasets, workers, jobs, tasks,
        clients), not on how many updates led here.
        """
        U = state_pb2.Update
        out: list[state_pb2.Update] = [U(id_floor=state_pb2.IdFloorUpdate(next_id=self._next_id)),
                                       U(counters=state_pb2.CountersUpdate(jobs_pruned=self.jobs_pruned))]
        for d in self.datasets.values():
            out.append(U(register_dataset=state_pb2.RegisterDatasetUpdate(
                dataset_id=d.dataset_id, fingerprint=d.fingerprint, dataset_def=d.dataset_def,
                num_splits=d.num_splits, dataset_name=d.names[0] if d.names else "")))
            out.extend(U(name_dataset=state_pb2.NameDatasetUpdate(dataset_id=d.dataset_id, dataset_name=name))
                       for name in d.names[1:])
        out.extend(U(bind_static_worker=state_pb2.BindStaticWorkerUpdate(worker_address=a, worker_index=i))
                   for i, a in sorted(self.static_workers.items()))
        for w in self.workers.values():
            out.append(U(register_worker=state_pb2.RegisterWorkerUpdate(worker_address=w.address, worker_uid=w.uid,
                                                                        data_address=w.data_address,
                                                                        worker_tags=w.tags, host_id=w.host_id)))
        # A key re-bound to a new job (its old job was garbage collected) keys two jobs, and
        # the last create_job applied wins jobs_by_key: the bound job goes after the others.
        for j in sorted(self.jobs.values(), key=lambda j: (self.jobs_by_key.get(j.key) == j.job_id, j.job_id)):
            out.append(U(create_job=state_pb2.CreateJobUpdate(job_id=j.job_id, job_name=j.name,
                                                              dataset_id=j.dataset_id,
                                                              processing_mode=j.processing_mode,
                                                              num_consumers=j.num_consumers,
                                                              cross_trainer_cache=j.cross_trainer_cache,
                                                              target_workers=j.target_workers,
                                                              dataset_name=j.dataset_name,
                                                              deterministic=j.deterministic, resume=j.resume,
                                                              num_readers=j.num_readers)))
        for it in self.iterations.values():
            out.append(U(create_iteration=state_pb2.CreateIterationUpdate(
                iteration_id=it.iteration_id, job_id=it.job_id, repetition=it.repetition, read_key=it.read_key,
                creator_token=it.creator_token)))
        for t in self.tasks.values():
            out.append(U(create_task=state_pb2.CreateTaskUpdate(task_id=t.task_id, iteration_id=t.iteration_id,
                                                                worker_address=t.worker_address,
                                                                stream_id=t.stream_id,
                                                                starting_round=t.starting_round,
                                                                worker_index=t.worker_index)))
            if t.revoked:
                out.append(U(revoke_task=state_pb2.RevokeTaskUpdate(task_id=t.task_id)))
            elif t.finished:
                out.append(U(finish_task=state_pb2.FinishTaskUpdate(task_id=t.task_id)))
        for c in self.clients.values():
            out.append(U(acquire_iteration_client=state_pb2.AcquireIterationClientUpdate(
                client_id=c.client_id, iteration_id=c.iteration_id, consumer_index=c.consumer_index,
                reader_index=c.reader_index)))
        for save in self.saves.values():
            out.append(U(create_save=state_pb2.CreateSaveUpdate(
                save_id=save.save_id, dataset_id=save.dataset_id, path=save.path, num_groups=save.num_groups,
                compression=save.compression, element_spec=save.element_spec, request_token=save.request_token)))
            for group, (attempt, n, nbytes) in save.committed.items():
                out.append(U(commit_save_chunk=state_pb2.CommitSaveChunkUpdate(
                    save_id=save.save_id, group=group, attempt=attempt, num_elements=n, bytes=nbytes)))
            for group, (address, attempt) in save.leases.items():
                out.append(U(lease_save_group=state_pb2.LeaseSaveGroupUpdate(
                    save_id=save.save_id, group=group, worker_address=address, attempt=attempt)))
            if save.finished:
                out.append(U(finish_save=state_pb2.FinishSaveUpdate(save_id=save.save_id, error=save.error)))
        for it in self.iterations.values():
            out.append(U(iteration_snapshot=state_pb2.IterationSnapshotUpdate(
                iteration_id=it.iteration_id, next_split=it.next_split,
                lease_triples=[v for (stream, split), task in it.leases.items() for v in (stream, split, task)],
                pending_triples=[v for (stream, split), task in it.pending.items() for v in (stream, split, task)],
                progress=[state_pb2.SplitProgress(stream_id=k[0], split_index=k[1], ranges=v.flat(),
                                                  total=it.totals.get(k, -1))
                          for k, v in sorted(it.progress.items())]
                + [state_pb2.SplitProgress(stream_id=k[0], split_index=k[1], total=n)
                   for k, n in sorted(it.totals.items()) if k not in it.progress],
                done_ranges=it.done.flat_ranges(), state=_STATE_NUMBERS[it.state],
                last_assignment_quads=[v for t in it.tasks for split in self.tasks[t].last_splits
                                       for v in (self.tasks[t].stream_id, split, t, self.tasks[t].last_request_id)],
                claimed_readers=sorted(it.claimed_readers))))
            # Elastic readers' own holdings, as they reported them (applied after the snapshot: progress only grows).
            for key, readers in sorted(it.reader_progress.items()):
                for reader, held in sorted(readers.items()):
                    out.append(U(record_progress=state_pb2.RecordProgressUpdate(
                        iteration_id=it.iteration_id, reader=reader + 1,
                        progress=[state_pb2.SplitProgress(stream_id=key[0], split_index=key[1], ranges=held.flat(),
                                                          total=-1)])))
            if it.pruned:
                out.append(U(prune_iteration=state_pb2.PruneIterationUpdate(iteration_id=it.iteration_id)))
        return out


def _keyed_triples(flat) -> Iterable[tuple[tuple[int, int], int]]:
    """``((stream, split), task)`` of each ``stream, split, task`` triple of a flattened list."""
    return zip(zip(flat[0::3], flat[1::3]), flat[2::3])


_STATE_CODES = {0: IterationState.ACTIVE, 1: IterationState.FINISHED, 2: IterationState.GARBAGE_COLLECTED}
_STATE_NUMBERS = {v: k for k, v in _STATE_CODES.items()}


def _start_at(iteration: IterationInfo, resume: state_pb2.ResumePoint) -> None:
    """Seeds a restored read's first iteration with what the saved reader's consumer took: those groups
    are done (never handed out), and of a group it took part of, those offsets are held, so that the task
    producing it leaves them out (GetSplitResponse.skip_ranges) and it is done once the rest is delivered."""
    ranges = list(resume.done_groups)
    for start, end in zip(ranges[::2], ranges[1::2]):
        iteration.done.add_range(0, start, end)
    for p in resume.partial:
        if p.ranges:
            iteration.progress[(0, p.split_index)] = OffsetSet.from_flat(p.ranges)
