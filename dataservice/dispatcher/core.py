"""The dispatcher's logic: one method per RPC, proto request in, proto response out.

The core decides what changes and records each change through ``_commit``,
which applies a typed update to the state (and, in fault-tolerant mode, will
journal it first). Volatile facts that need no replay — when a worker or a
client was last heard from — live here, not in the state. No gRPC in this
module: tests drive it directly.

Example::

    >>> core = DispatcherCore(DispatcherConfig())
    >>> resp = core.register_dataset(dispatcher_pb2.RegisterDatasetRequest(dataset_def=b"...", num_splits=4))
    >>> resp.dataset_id   # ids start at the current time in microseconds: unique across restarts
    1733400000000000
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import heapq
import hmac
import itertools
import logging
import math
import secrets
import threading
import time
import uuid
from typing import Callable, Iterable, Optional, Protocol

from dataservice import errors
from dataservice.data.dataset import INFINITE_CARDINALITY
from dataservice.data.serialization import registered_cardinality
from dataservice.dispatcher import fleet_intervals, request_checks, saves, scaling, static_workers
from dataservice.dispatcher.client_stats import ClientStats, LoadReports, WorkerRecommendation
from dataservice.dispatcher.coordinated_rounds import RoundCoordinator, rotation_of
from dataservice.dispatcher.long_polls import ALL, WAKE_BATCH, Wakeups
from dataservice.dispatcher.rpc_stats import RpcStats
from dataservice.dispatcher.state import DispatcherState, IterationInfo, IterationState, JobKey, resume_digest
from dataservice.dispatcher.task_lists import ReaderTaskLists
from dataservice.dispatcher.task_views import TaskViews
from dataservice.service.auth import task_read_key
from dataservice.proto import dispatcher_pb2, state_pb2
from dataservice.service.addresses import parse_address
from dataservice.service.intervals import OffsetSet
from dataservice.service.config import WORKER_TAG_RULE, DispatcherConfig, worker_tags_problem
from dataservice.service.host_identity import check_host_id
from dataservice.service.processing_modes import MODE_NAMES, is_static

__all__ = ["DispatcherCore"]

log = logging.getLogger("dataservice.dispatcher")

class StateStore(Protocol):
    """Where the state lives: in memory, or journaled (dataservice/dispatcher/journal.py)."""

    state: DispatcherState

    def commit(self, update: state_pb2.Update) -> None: ...

    def wait_durable(self) -> None: ...

    def durability(self) -> Optional[Callable[[], None]]:
        """``wait_durable`` cut in two: None if this thread's commits are durable, else the wait
        (the journaled store's is a ``journal.DurableWait``, which an event loop can wait for)."""

    def bind_lock(self, lock: threading.Condition) -> None:
        """The core's lock, which commits arrive holding; a store that replaces ``state``
        outside a commit (a journal rollback) takes it and notifies its waiters."""


class MemoryStore:
    """The state in memory only: a restart forgets it."""

    def __init__(self, state: DispatcherState):
        self.state = state

    def commit(self, update: state_pb2.Update) -> None:
        self.state.apply(update)

    def wait_durable(self) -> None:
        return None

    def durability(self) -> None:
        return None

    def bind_lock(self, lock: threading.Condition) -> None:
        return None  # the state only changes through commits, under the core's lock


def first_id_now() -> int:
    """The first id a fresh state hands out: microseconds since the epoch (see DispatcherCore.__init__)."""
    return time.time_ns() // 1000


#: Bytes of an iteration's read key (see CreateIterationUpdate.read_key).
READ_KEY_BYTES = 32

#: How long GetSplit waits for a split to come free before telling the task to ask again.
SPLIT_WAIT_S = 1.0
#: The longest a worker or client silent past its timeout goes unnoticed (see liveness_interval_s).
LIVENESS_TICK_S = 1.0
#: While leasing an iteration's remaining splits takes longer than this (``_many_splits_left``), its readers
#: report split ends at their slow pace; a reader at that pace hears of the end nearing within 0.2 s
#: (``SLOW_HEARTBEATS_PER_S``).
REPORT_SLOWLY_LEFT_S = 0.5
#: Long polls (WorkerHeartbeat, GetSplit) that may wait at once *inside the core*, for a caller that
#: drives the core from its own threads: beyond this many, a long poll is answered at once, so waiting
#: calls never hold every thread. The gRPC server does not wait here: it asks the core to answer at
#: once and waits on ``wakeups`` (grpc_service.py), holding no thread, however many workers wait.
LONG_POLL_SLOTS = 12
#: New tasks one WorkerHeartbeat answer carries at most; the answer says there are more, and the
#: worker asks again at once. Keeps the reply small however many iterations are created at once.
MAX_NEW_TASKS_PER_HEARTBEAT = 256
#: A distributed_epoch iteration's first reader has tasks made at once on this many live workers (as many as
#: one notification wakes at once, ``long_polls.WAKE_BATCH``: a cluster that small starts its read as before);
#: the rest of the fleet's as their polls are answered (``DispatcherCore._fan_out_tasks``).
EAGER_TASK_WORKERS = WAKE_BATCH
#: Pruned jobs whose names the dispatcher remembers, to tell a late client what became of its job.
PRUNED_JOBS_REMEMBERED = 10_000
#: Items each list of GetStatus holds unless the request asks for another number.
STATUS_ITEMS = 100

NOT_SPLITTABLE = -2
INFINITE = -1


def _read_options(job) -> tuple:
    """A job's (or a GetOrCreateJobRequest's) read options, which every reader of a named job shares."""
    return job.num_consumers, bool(job.cross_trainer_cache), (job.target_workers or "AUTO").upper(), \
        bool(job.deterministic), job.num_readers


def _shown_dataset(job) -> str:
    """The dataset a job's readers named: ``dataset 'tens-v1' (1733400000000000)`` or ``dataset 1733400000000000``."""
    return f"dataset {job.dataset_name!r} ({job.dataset_id})" if job.dataset_name else f"dataset {job.dataset_id}"


def _shown_read_options(job) -> str:
    num_consumers, cache, target, deterministic, num_readers = _read_options(job)
    return f"num_consumers={num_consumers or None}, cross_trainer_cache={'on' if cache else 'off'}, " \
           f"target_workers={target!r}, deterministic={deterministic}, num_readers={num_readers or None}"


def heartbeat_wait_s(req: dispatcher_pb2.WorkerHeartbeatRequest, config: DispatcherConfig, workers: int = 0,
                     spread: float = 0.0, after_news: bool = False) -> float:
    """How long a worker's heartbeat may wait for news: what it asked (0: not at all), stretched for a
    large fleet of ``workers`` and spread at random by ``spread`` (more widely for the poll that follows
    an answer with news: ``fleet_intervals``), and answered well before the worker could look lost (half
    of ``worker_timeout_ms``) however long it asked to wait."""
    if req.wait_ms <= 0:
        return 0.0
    return fleet_intervals.worker_poll_s(req.wait_ms / 1000, workers, config.worker_timeout_ms, spread, after_news)


def heartbeat_has_news(req: dispatcher_pb2.WorkerHeartbeatRequest,
                       response: dispatcher_pb2.WorkerHeartbeatResponse) -> bool:
    """Whether a heartbeat's answer tells the worker something: its long poll ends."""
    if response.new_tasks or response.tasks_to_delete or response.resync_tasks:
        return True
    return bool({d.save_id for d in response.saves} - set(req.current_saves))


class DispatcherCore:
    """See the module docstring. Thread-safe: every method holds the core's lock."""

    def __init__(self, config: DispatcherConfig, clock: Callable[[], float] = time.monotonic,
                 store: Optional["StateStore"] = None):
        self.config = config
        # Ids must not repeat across restarts either: workers and clients of a previous
        # incarnation still hold its task, client and dataset ids, and a reused id would
        # silently attach them to this incarnation's objects (a worker would even run its
        # cached pipeline for another dataset). Microseconds since the epoch only grow, and
        # replaying a journal only ever raises the next id.
        self.store: StateStore = store or MemoryStore(DispatcherState(first_id=first_id_now()))
        self.incarnation = uuid.uuid4().hex
        self._clock = clock
        self._cond = threading.Condition()
        self.store.bind_lock(self._cond)
        self._worker_seen: dict[str, float] = {}
        self._worker_seen_unix: dict[str, float] = {}
        self._client_seen: dict[int, float] = {}
        #: Jobs whose readers must stop, and why (elastic readers restored at different positions); not journaled.
        self._read_errors: dict[int, str] = {}
        #: (iteration, reader index) -> (request token, client id) of the reader that claimed it: a retry of that
        #: request (its answer lost) may claim it again; nobody else may. In memory: soft state.
        self._reader_claims: dict[tuple, tuple] = {}
        # Revoked task -> clients that have not yet confirmed they stopped reading it (volatile:
        # after a restart every current client is asked again).
        self._awaiting_stop: dict[int, set] = {}
        self._iteration_idle_since: dict[int, float] = {}
        self._long_polls = 0
        # Task -> (when it was last leased new splits, how many): its pace (soft state, ``_splits_per_lease``);
        # and per iteration, its tasks' seconds per split, a moving average (``_many_splits_left``).
        self._lease_pace: dict[int, tuple[float, int]] = {}
        self._split_s: dict[int, float] = {}
        #: Which long polls a committed change concerns (``long_polls``): the asyncio server waits on them.
        self.wakeups = Wakeups()
        # Inside _one_fan_out: the keys commits concern, notified together when it ends (else None).
        self._deferred_wakes: Optional[list] = None
        #: What readers' heartbeats need of their iterations' task lists: only what changed (soft state).
        self._task_lists = ReaderTaskLists()
        # Recently pruned jobs' keys, for the error a late client gets (volatile, bounded).
        self._pruned_jobs: dict[int, JobKey] = {}
        # Finished named jobs still in the state, oldest first (volatile: rebuilt from the state).
        self._finished_jobs: dict[int, None] = {
            job.job_id: None for job in sorted(self.state.jobs.values(), key=lambda j: j.job_id)
            if job.name and self._job_done(job)}
        #: Per-RPC latency, recorded by the gRPC adapter and reported by GetStatus.
        self.rpc_stats = RpcStats()
        #: Recent decisions, for tests and the status page to assert on.
        self.events: collections.deque = collections.deque(maxlen=1000)
        #: What clients (iterator.stats()) and workers (their producers' load) last reported: metrics,
        #: soft state, never journaled (a restarted dispatcher learns them again from the next heartbeats).
        self.load_reports = LoadReports()
        #: The thresholds of recommended_workers() (see scaling.py); replace it to change the policy.
        self.scaling_policy = scaling.ScalingPolicy()
        self._scaling_state = scaling.ScalingState()
        #: Coordinated reads: readers' rounds and workers joining a rotation (soft state).
        self._rounds = RoundCoordinator(clock)
        #: WorkerHeartbeat task deltas: each worker's tasks as last reported, and what changed since (soft state).
        self._task_views = TaskViews()
        #: WorkerHeartbeats by kind: "full" (current_tasks), "delta" (applied), "resync" (a delta refused).
        self.heartbeat_counts: collections.Counter = collections.Counter()

    # --- recording changes ------------------------------------------------------
    @property
    def state(self) -> DispatcherState:
        return self.store.state

    def _commit(self, update: state_pb2.Update) -> None:
        # The store applies the update (journaling it first in fault-tolerant mode);
        # if it raises, the state is unchanged and the RPC fails.
        self._task_views.note_update(self.state, update, self._worker_lost)
        keys = self._wake_keys(update)  # before: a released client or pruned iteration is gone after
        self._task_lists.note(self.state, update)
        try:
            self.store.commit(update)
        except BaseException:
            self.wakeups.notify((ALL,))  # a failed write may have rolled the state back: every poll re-reads it
            raise
        self._cond.notify_all()
        if self._deferred_wakes is not None:
            self._deferred_wakes.extend(keys)
        else:
            self.wakeups.notify(keys)
        kind = update.WhichOneof("kind")
        if kind == "prune_iteration":
            self.wakeups.forget(("iteration", update.prune_iteration.iteration_id))
        elif kind == "prune_worker":
            self.wakeups.forget(("worker", update.prune_worker.worker_address))

    @contextlib.contextmanager
    def _one_fan_out(self):
        """Under the lock: the long polls that the commits inside concern are woken as one notification when
        it ends, so that news for thousands of workers at once (a new job: ``_fan_out_tasks``) is paced by
        ``Wakeups`` as one fan-out, not woken a commit at a time. Keys may be added to ``_deferred_wakes`` inside
        it without a commit: polls to wake so that the pass answering them makes their news."""
        if self._deferred_wakes is not None:  # nested: the outer one notifies
            yield
            return
        self._deferred_wakes = []
        try:
            yield
        finally:
            keys, self._deferred_wakes = self._deferred_wakes, None
            if keys:
                self.wakeups.notify(list(dict.fromkeys(keys)))

    def _wake_keys(self, update: state_pb2.Update) -> list:
        """The long polls ``update`` may have news for: the workers whose tasks it changes (a
        heartbeat waits for those), the iteration whose splits it may free (GetSplit waits for those)."""
        kind = update.WhichOneof("kind")
        change = getattr(update, kind)
        state = self.state
        if kind in ("create_save", "finish_save", "release_save_leases"):
            return [ALL]  # a save is news to every worker (rare)
        if kind in ("register_worker", "prune_worker", "bind_static_worker"):
            return [("worker", change.worker_address)]
        if kind in ("assign_split", "lease_splits"):
            return []  # a split leased frees nothing
        if kind == "record_progress" and not any(p.total >= 0 for p in change.progress):
            return []  # offsets without a split's end free nothing (and come with every reader's heartbeat)
        iteration_id = getattr(change, "iteration_id", None) if kind != "create_task" else None
        keys = []
        if kind in ("create_task", "finish_task", "revoke_task"):
            task = state.tasks.get(change.task_id)
            address = change.worker_address if kind == "create_task" else getattr(task, "worker_address", None)
            if address:
                keys.append(("worker", address))
            iteration_id = change.iteration_id if kind == "create_task" else getattr(task, "iteration_id", None)
        elif kind == "release_iteration_client":
            client = state.clients.get(change.client_id)
            iteration_id = getattr(client, "iteration_id", None)
        if iteration_id is None:
            return keys
        keys.append(("iteration", iteration_id))
        if kind in ("finish_iteration", "release_iteration_client", "prune_iteration", "acquire_iteration_client"):
            # Whether a finished iteration's tasks are dropped depends on its readers; an unfinished one's
            # readers coming and going is no news to its workers (a reader per worker per join would be
            # O(workers x readers)).
            iteration = state.iterations.get(iteration_id)
            if iteration is not None and (iteration.finished or kind in ("finish_iteration", "prune_iteration")):
                keys.extend({("worker", state.tasks[t].worker_address) for t in iteration.tasks
                             if t in state.tasks})
        return keys

    def wait_durable(self) -> None:
        """Returns once everything this core has committed is durable (fault-tolerant mode).

        The gRPC adapter calls it after every RPC, outside the lock, so concurrent
        RPCs share one fsync and no answer reveals a state that a crash could lose.
        """
        self.store.wait_durable()

    def durability(self) -> Optional[Callable[[], None]]:
        """``wait_durable`` cut in two, for the asyncio server: None if what this thread committed (or could
        have read) is durable already, else the blocking wait, which may then run on another thread."""
        return self.store.durability()

    def _event(self, kind: str, **fields) -> None:
        self.events.append((kind, fields))

    def _wait(self, state: DispatcherState, timeout: float) -> None:
        """A long poll's wait: ServiceUnavailableError if the state the poll started from is
        gone when it wakes (a failed journal write rolled it back: the poll's tasks, workers
        and iterations may no longer exist). Whatever it held of the old state is stale."""
        self._cond.wait(timeout)
        if self.state is not state:
            raise errors.ServiceUnavailableError(
                "the dispatcher's state was rolled back after a failed journal write while this request "
                "waited; retry it")

    # --- datasets -----------------------------------------------------------------
    def register_dataset(self, req: dispatcher_pb2.RegisterDatasetRequest) -> dispatcher_pb2.RegisterDatasetResponse:
        """The pipeline's numeric id: a new one, or that of the same pipeline (same fingerprint) registered
        before. With ``dataset_name`` (an id the user chose) the name is bound to the pipeline for good:
        registering the same pipeline under it again is idempotent, another pipeline AlreadyExistsError."""
        if not req.dataset_def:
            raise errors.InvalidRequestError("RegisterDataset: dataset_def is empty")
        fingerprint = hashlib.sha256(req.dataset_def).hexdigest()
        name = req.dataset_name
        with self._cond:
            existing = self.state.datasets_by_fingerprint.get(fingerprint)
            named = self.state.datasets_by_name.get(name) if name else None
            if named is not None and named != existing:
                bound = self.state.datasets[named]
                raise errors.AlreadyExistsError(
                    f"dataset id {name!r} is already registered, with another pipeline (dataset {named}, fingerprint "
                    f"{bound.fingerprint[:16]}, {len(bound.dataset_def):,} bytes; this one: fingerprint "
                    f"{fingerprint[:16]}, {len(req.dataset_def):,} bytes). A dataset id names one pipeline for the "
                    f"dispatcher's lifetime: register a changed pipeline under a new dataset_id (say, a new version "
                    f"suffix), or read the registered one with from_dataset_id(..., dataset_id={name!r})")
            if named is not None:
                return dispatcher_pb2.RegisterDatasetResponse(dataset_id=named)
            if existing is not None:
                if name:
                    # The same pipeline, registered before without this name: one dataset, one more name.
                    self._commit(state_pb2.Update(name_dataset=state_pb2.NameDatasetUpdate(
                        dataset_id=existing, dataset_name=name)))
                    self._event("name_dataset", dataset_id=existing, dataset_name=name)
                    log.info("dataset %d is also dataset %r", existing, name)
                return dispatcher_pb2.RegisterDatasetResponse(dataset_id=existing)
            dataset_id = self.state.next_id()
            self._commit(state_pb2.Update(register_dataset=state_pb2.RegisterDatasetUpdate(
                dataset_id=dataset_id, fingerprint=fingerprint, dataset_def=req.dataset_def,
                num_splits=req.num_splits, dataset_name=name)))
            self._event("register_dataset", dataset_id=dataset_id, dataset_name=name)
            log.info("registered dataset %d%s (%d bytes)", dataset_id, f" as {name!r}" if name else "",
                     len(req.dataset_def))
            return dispatcher_pb2.RegisterDatasetResponse(dataset_id=dataset_id)

    def get_dataset_id(self, req: dispatcher_pb2.GetDatasetIdRequest) -> dispatcher_pb2.GetDatasetIdResponse:
        """The numeric id of the dataset registered under the user-chosen id ``dataset_name``."""
        with self._cond:
            dataset_id = self.state.datasets_by_name.get(req.dataset_name)
            if dataset_id is None:
                forgets = "" if self.config.fault_tolerant_mode else (
                    "; this dispatcher runs without fault_tolerant_mode, so a restart forgets every registration")
                raise errors.NotFoundError(
                    f"dataset id {req.dataset_name!r} is not registered with this dispatcher: register it first, with "
                    f"register_dataset(service, dataset, dataset_id={req.dataset_name!r}){forgets}")
            return dispatcher_pb2.GetDatasetIdResponse(dataset_id=dataset_id)

    def get_dataset_def(self, req: dispatcher_pb2.GetDatasetDefRequest) -> dispatcher_pb2.GetDatasetDefResponse:
        with self._cond:
            dataset = self._dataset(req.dataset_id)
            return dispatcher_pb2.GetDatasetDefResponse(dataset_def=dataset.dataset_def)

    def _dataset(self, dataset_id: int):
        dataset = self.state.datasets.get(dataset_id)
        if dataset is None:
            raise errors.NotFoundError(f"dataset id {dataset_id} is not registered with this dispatcher")
        return dataset

    # --- jobs and iterations -------------------------------------------------------
    def get_or_create_job(self, req: dispatcher_pb2.GetOrCreateJobRequest) -> dispatcher_pb2.GetOrCreateJobResponse:
        if req.processing_mode not in MODE_NAMES:
            raise errors.InvalidRequestError(f"unknown processing mode {req.processing_mode}")
        if req.num_consumers and is_static(req.processing_mode):
            raise errors.InvalidRequestError(
                f"coordinated reads (num_consumers) do not go with static sharding "
                f"({MODE_NAMES[req.processing_mode]}): a worker's shard is fixed, so a worker joining or coming "
                f"back could not enter the consumers' rotation at a common round. Use parallel_epochs "
                f"(ShardingPolicy.OFF) with coordinated reads")
        static_workers.check_static_job(self.config, req.processing_mode)
        resume = req.resume if req.HasField("resume") else None
        request_checks.check_resumable_job(req, resume)
        with self._cond:
            dataset = self._dataset(req.dataset_id)
            if req.processing_mode == state_pb2.DISTRIBUTED_EPOCH and dataset.num_splits == NOT_SPLITTABLE:
                raise errors.NotSplittableError(
                    f"dataset {req.dataset_id} is not splittable, so it cannot be read in distributed_epoch mode; "
                    "use parallel_epochs")
            if resume is not None and resume.num_groups > 0 and dataset.num_splits >= 0 \
                    and resume.num_groups != dataset.num_splits:
                # A position names groups by index: over another count they are other elements.
                raise errors.InvalidRequestError(
                    f"GetOrCreateJob: the restored read's position counts {resume.num_groups} split groups, and "
                    f"dataset {req.dataset_id} is registered with {dataset.num_splits}: the state was saved from a "
                    f"read of another pipeline (or registration), and over other groups it would skip or repeat "
                    f"elements")
            cardinality = registered_cardinality(dataset.dataset_def) \
                if req.num_consumers or req.cross_trainer_cache else INFINITE_CARDINALITY
            if cardinality >= 0:
                # Only a known end is refused, as in tf.data service: a pipeline whose cardinality is unknown
                # (flat_map, group_by_window, filter over an infinite input) may well never end.
                what = "coordinated reads (num_consumers)" if req.num_consumers else "cross_trainer_cache"
                raise errors.InvalidRequestError(
                    f"{what} need an infinite dataset (or one whose cardinality is unknown), and dataset "
                    f"{req.dataset_id} has {cardinality} elements: end the pipeline with .repeat(), so that no reader "
                    f"runs out of data while others still read")
            if req.dataset_name and self.state.datasets_by_name.get(req.dataset_name) != req.dataset_id:
                raise errors.InvalidRequestError(
                    f"GetOrCreateJob: dataset id {req.dataset_name!r} does not name dataset {req.dataset_id} "
                    f"(it names {self.state.datasets_by_name.get(req.dataset_name) or 'nothing'})")
            collected = None
            if req.job_name:
                # As in tf.data service, a job name is scoped by the dataset id the reader names: readers
                # naming other ids (even other names of this pipeline) under this name read other jobs.
                key = JobKey(req.job_name, req.dataset_id, req.dataset_name, resume_digest(resume))
                if resume is not None and req.num_readers:
                    self._check_restored_position(req, key)
                job_id = self.state.jobs_by_key.get(key)
                if job_id is not None:
                    job = self.state.jobs[job_id]
                    if self._job_collected(job):
                        # Nothing of the old job can be read any more: without a new job the name
                        # would be dead until a restart. Its parameters bind no one now either.
                        collected = job
                    elif job.resume is not None and self._abandoned(job):
                        # The same state restored again (the restored trainer was killed before its next
                        # checkpoint): the first attempt's readers took part of the job and are gone. Joining
                        # it would lose what they took; the restore starts afresh in a new job.
                        collected = job
                    elif job.processing_mode != req.processing_mode:
                        raise errors.AlreadyExistsError(
                            f"job name {req.job_name!r} is already used by a job reading {_shown_dataset(job)} in "
                            f"{MODE_NAMES[job.processing_mode]}; this request reads it in "
                            f"{MODE_NAMES[req.processing_mode]}. Every reader of a job must pass the same "
                            f"processing_mode: use another job_name for the other mode.")
                    elif _read_options(job) != _read_options(req):
                        raise errors.InvalidRequestError(
                            f"job {req.job_name!r} is read with {_shown_read_options(job)}, but this reader asks "
                            f"for {_shown_read_options(req)}: every reader of a job must pass the same "
                            f"num_consumers, cross_trainer_cache and target_workers to distribute (or use another "
                            f"job_name)")
                    else:
                        return dispatcher_pb2.GetOrCreateJobResponse(job_id=job_id)
            job_id = self.state.next_id()
            # Applying it re-binds jobs_by_key to the new job; a collected job stays in the state
            # (clients may still hold its id) but no longer answers to its key.
            self._commit(state_pb2.Update(create_job=state_pb2.CreateJobUpdate(
                job_id=job_id, job_name=req.job_name, dataset_id=req.dataset_id,
                processing_mode=req.processing_mode, num_consumers=req.num_consumers,
                cross_trainer_cache=req.cross_trainer_cache, target_workers=req.target_workers or "AUTO",
                dataset_name=req.dataset_name if req.job_name else "", deterministic=req.deterministic,
                resume=resume, num_readers=req.num_readers)))
            self._event("create_job", job_id=job_id, job_name=req.job_name)
            if collected is not None:
                self._event("recreate_job", job_name=req.job_name, job_id=job_id, old_job_id=collected.job_id)
                log.info("job name %r: job %d was garbage collected, created job %d under the name",
                         req.job_name, collected.job_id, job_id)
            return dispatcher_pb2.GetOrCreateJobResponse(job_id=job_id)

    def _live(self, client_ids) -> bool:
        """Whether any of these clients was heard from within a few heartbeat intervals (a killed trainer's
        were not, long before client_timeout_ms releases them)."""
        recent = self._clock() - 3 * self._reader_heartbeat_s()
        return any(self._client_seen.get(c, -math.inf) >= recent for c in client_ids)

    def _abandoned(self, job) -> bool:
        """A restored job left in the middle of an iteration: one not finished whose readers are all gone or
        silent. (Between two epochs every reader releases its iteration, which then is finished: not this.)"""
        return any(not it.finished and not self._live(it.clients)
                   for it in (self.state.iterations[i] for i in job.iterations.values()))

    def _check_restored_position(self, req: dispatcher_pb2.GetOrCreateJobRequest, key: JobKey) -> None:
        """Elastic readers restoring under one job name must restore one position: readers restoring states
        of another step, whose readers are alive (heard from within a few heartbeats), make this one fail,
        and them with it (``ClientHeartbeatResponse.read_error``), rather than each wait for the others."""
        for job in self.state.jobs.values():
            if (job.key[:3] != key[:3] or job.key == key or not job.num_readers or job.resume is None
                    or job.job_id in self._read_errors):
                continue
            if not self._live(c for i in job.iterations.values() for c in self.state.iterations[i].clients):
                continue  # a restore whose readers are gone (a trainer killed again): no disagreement
            message = (f"job {req.job_name!r}: readers restored states saved at different steps: one at position "
                       f"{req.resume.position} of the deterministic sequence, others at position "
                       f"{job.resume.position}. Restore every reader from states saved at the same step (the states "
                       f"of one step name the same position, whichever reader saved them)")
            self._read_errors[job.job_id] = message
            self._event("conflicting_restore", job_id=job.job_id, position=req.resume.position)
            raise errors.InvalidRequestError(message)

    @staticmethod
    def _check_reader_index(job, iteration, reader_index: Optional[int]) -> None:
        """An elastic job's reader says which of its ``num_readers`` it is."""
        if reader_index is None or not 0 <= reader_index < job.num_readers:
            raise errors.InvalidRequestError(
                f"GetOrCreateIteration: job {job.name!r} is read by {job.num_readers} elastic readers, so each reader "
                f"must give its reader_index in [0, {job.num_readers}), got {reader_index}")

    def _job_collected(self, job) -> bool:
        """Every iteration of ``job`` was garbage collected and no client is left on it."""
        iterations = [self.state.iterations[i] for i in job.iterations.values()]
        return bool(iterations) and all(
            it.state is IterationState.GARBAGE_COLLECTED and not it.clients for it in iterations)

    def get_or_create_iteration(self, req: dispatcher_pb2.GetOrCreateIterationRequest
                                ) -> dispatcher_pb2.GetOrCreateIterationResponse:
        """A new client of the iteration, with its read key. Every reader of a named job shares its
        iterations (as in tf.data service); an anonymous job's iteration is read by its creator alone."""
        with self._cond:
            job = self.state.jobs.get(req.job_id)
            if job is None:
                key = self._pruned_jobs.get(req.job_id)
                if key is None:
                    raise errors.NotFoundError(f"job {req.job_id} does not exist: it was never created here, or it "
                                               f"finished and left the dispatcher's state long ago")
                free = key.job_name and key not in self.state.jobs_by_key
                hint = f"; a new read under the job name {key.job_name!r} starts a new job" if free else ""
                raise errors.NotFoundError(f"job {req.job_id} finished (or no client read it for "
                                           f"{self.config.job_gc_timeout_ms} ms) and left the dispatcher's state{hint}")
            iteration = self.state.find_iteration(req.job_id, req.repetition)
            existing = iteration is not None
            if job.num_consumers:  # a bad consumer index is refused before an iteration is made for it
                self._rounds.check_consumer(job, None, self.state.clients, req.consumer_index
                                            if req.HasField("consumer_index") else None, req.request_token)
            if existing and not job.name and not (
                    iteration.creator_token and hmac.compare_digest(req.request_token, iteration.creator_token)):
                # Its id is no secret (GetStatus lists it): joining would hand out the read key.
                self._event("refuse_join", iteration_id=iteration.iteration_id, job_id=job.job_id)
                raise errors.PermissionDeniedError(
                    f"iteration {req.repetition} of job {req.job_id} already has a reader: an anonymous job (one "
                    f"without a job_name) is private to the reader that created it, and no other client may read "
                    f"its elements. To share a job between readers, give them all the same job_name")
            if iteration is None:
                iteration_id = self.state.next_id()
                self._commit(state_pb2.Update(create_iteration=state_pb2.CreateIterationUpdate(
                    iteration_id=iteration_id, job_id=req.job_id, repetition=req.repetition,
                    read_key=secrets.token_bytes(READ_KEY_BYTES), creator_token=req.request_token)))
                self._event("create_iteration", iteration_id=iteration_id, job_id=req.job_id)
                iteration = self.state.iterations[iteration_id]
            elif iteration.state is IterationState.GARBAGE_COLLECTED:
                free = job.name and self.state.jobs_by_key.get(job.key) == job.job_id and self._job_collected(job)
                hint = f"; a new read under the job name {job.name!r} starts a new job" if free else ""
                raise errors.NotFoundError(
                    f"iteration {req.repetition} of job {req.job_id} was garbage collected: no client read it for "
                    f"{self.config.job_gc_timeout_ms} ms{hint}")
            reader_index = req.reader_index if req.HasField("reader_index") else None
            if job.num_readers:
                self._check_reader_index(job, iteration, reader_index)
                earlier = self._reader_claims.get((iteration.iteration_id, reader_index))
                if earlier is not None and hmac.compare_digest(earlier[0], req.request_token):
                    if earlier[1] in self.state.clients:
                        self._release_client(earlier[1])  # this request's own client, whose answer was lost
                elif reader_index in iteration.claimed_readers:
                    raise errors.InvalidRequestError(
                        f"GetOrCreateIteration: reader_index {reader_index} of job {job.name!r} (iteration "
                        f"{req.repetition}) was read by another reader already, which took its share of the "
                        f"elements so far. A restarted trainer restores its iterator state (load_state_dict), "
                        f"which reads a job of its own; to read the dataset again from its start, use a new job_name")
            elif reader_index is not None:
                raise errors.InvalidRequestError(f"GetOrCreateIteration: reader_index {reader_index} for job "
                                                 f"{job.job_id}, which was not created with num_readers")
            consumer_index = None
            if job.num_consumers:
                consumer_index = req.consumer_index if req.HasField("consumer_index") else None
                retried = self._rounds.check_consumer(job, iteration, self.state.clients, consumer_index,
                                                      req.request_token)
                if retried is not None:
                    self._release_client(retried)  # this request's own client, whose answer was lost
            client_id = self.state.next_id()
            self._commit(state_pb2.Update(acquire_iteration_client=state_pb2.AcquireIterationClientUpdate(
                client_id=client_id, iteration_id=iteration.iteration_id, consumer_index=consumer_index,
                reader_index=reader_index)))
            if reader_index is not None:
                self._reader_claims[(iteration.iteration_id, reader_index)] = (req.request_token, client_id)
            self._client_seen[client_id] = self._clock()
            if job.num_consumers:
                self._rounds.joined(client_id, req.request_token)
            self._iteration_idle_since.pop(iteration.iteration_id, None)
            if not iteration.finished and len(iteration.clients) == 1:
                # Tasks exist only while an iteration has readers (see _assign_tasks): its first reader (of a new
                # iteration, or one left unread) has them made. A later reader finds them made, and worker
                # heartbeats keep them: walking every worker for every reader would cost O(workers x readers).
                self._fan_out_tasks(job, iteration)
            return dispatcher_pb2.GetOrCreateIterationResponse(iteration_id=iteration.iteration_id,
                                                               client_id=client_id, existing=existing,
                                                               read_key=iteration.read_key)

    def _fan_out_tasks(self, job, iteration) -> None:
        """Gives every live worker a task in ``iteration``, which just got its first reader, and wakes their polls.

        In distributed_epoch (neither static nor coordinated), only the first ``EAGER_TASK_WORKERS`` get their
        task here. The others' polls are woken without one, and the pass that answers each poll (woken, or its
        time up first) makes its task (``_assign_after_wakeup``: the new reader left every worker owing one,
        see task_views), as does the next heartbeat of a worker that was not polling. Any task serves that
        mode's one split stream, so when a task is made changes no element. At 2,000 workers, making them all
        here, a journaled commit each, held the event loop 58-60 ms in fault-tolerant mode, and every call
        that came meanwhile waited; made as the paced fan-out wakes their polls (``long_polls.FAN_OUT_BATCH``
        every ``WAKE_SPACING_S``), they cost about 0.2 ms a batch (``benchmarks.new_job_fan_out``). A read
        that ends before the fan-out reaches a worker leaves it no task to drop.

        Example (2,000 workers)::

            >>> core.get_or_create_iteration(request)      # 32 tasks made, 2,000 polls to wake, 8 every 50 ms
            >>> len(core.state.iterations[it].tasks)       # then, as the woken polls are answered: 32 -> 2,000
        """
        deferrable = job.processing_mode == state_pb2.DISTRIBUTED_EPOCH and not job.num_consumers
        walked = 0
        with self._one_fan_out():
            for address in list(self.state.workers):
                if self._worker_lost(address):
                    continue
                if deferrable and walked >= EAGER_TASK_WORKERS:
                    self._deferred_wakes.append(("worker", address))
                    continue
                self._assign_tasks(address, only=iteration)
                walked += 1

    def _create_task(self, iteration_id: int, worker_address: str, stream_id: Optional[int] = None,
                     starting_round: int = 0, worker_index: int = 0) -> None:
        task_id = self.state.next_id()
        mode = self.state.job_of_iteration(iteration_id).processing_mode
        if stream_id is None:
            # distributed_epoch: every task draws from the iteration's one split stream;
            # parallel_epochs: a task produces a stream of its own.
            stream_id = 0 if mode == state_pb2.DISTRIBUTED_EPOCH else task_id
        self._commit(state_pb2.Update(create_task=state_pb2.CreateTaskUpdate(
            task_id=task_id, iteration_id=iteration_id, worker_address=worker_address, stream_id=stream_id,
            starting_round=starting_round, worker_index=worker_index)))
        self._event("create_task", task_id=task_id, iteration_id=iteration_id, worker=worker_address,
                    stream_id=stream_id, starting_round=starting_round)

    def _assign_tasks(self, address: str, only=None) -> None:
        """Gives a live worker a task in every running iteration it has none in.

        A worker coming back (restarted, or heard from again after being declared
        lost) in parallel_epochs takes over its old stream — resuming after the
        elements clients already hold — once every client has stopped reading
        the revoked task; in distributed_epoch it simply draws splits again.
        """
        worker = self.state.workers[address]
        candidates = [only] if only is not None else list(self.state.active_iterations.values())
        # An iteration nobody reads gets no task (its readers left: see _release_client); one
        # gets tasks again when a reader joins.
        candidates = [it for it in candidates if it.clients and not it.finished]
        if not candidates:
            return
        by_iteration: dict[int, list] = {}
        for task_id in worker.tasks:
            task = self.state.tasks[task_id]
            by_iteration.setdefault(task.iteration_id, []).append(task)
        for iteration in candidates:
            mine = by_iteration.get(iteration.iteration_id, [])
            mode = self.state.jobs[iteration.job_id].processing_mode
            if any(not t.revoked for t in mine) and not (is_static(mode) and all(t.finished for t in mine)):
                continue  # static: a worker that finished a shard and was re-bound may owe another
            if is_static(mode):
                # One task per listed worker index, its shard; a revoked one's stream is resumed after
                # what clients hold (static_workers.resumed_stream), once they stopped reading it.
                index = static_workers.needs_task(self.state, self.config, iteration, address)
                if index is not None:
                    stream = static_workers.resumed_stream(self.state, iteration, index, self._revocation_clear)
                    if stream != static_workers.WAIT:
                        self._create_task(iteration.iteration_id, address, stream_id=stream, worker_index=index)
                continue
            if self.state.jobs[iteration.job_id].num_consumers:
                # Coordinated reads: a new stream, entering every consumer's rotation at one round.
                start = self._rounds.starting_round(iteration, address, self._client_heartbeat_s())
                if start is not None:
                    self._create_task(iteration.iteration_id, address, starting_round=start)
                continue
            if mode == state_pb2.DISTRIBUTED_EPOCH or not mine:
                self._create_task(iteration.iteration_id, address)
                continue
            stream = max(mine, key=lambda t: t.task_id).stream_id
            key = (stream, 0)
            if key in iteration.pending and self._revocation_clear(iteration.pending[key]):
                self._create_task(iteration.iteration_id, address, stream_id=stream)
                self._event("resume_stream", iteration_id=iteration.iteration_id, stream_id=stream, worker=address)

    def _task_def(self, task_id: int, for_worker: bool = True) -> dispatcher_pb2.TaskDef:
        """``for_worker=False`` for clients: no skip ranges (only the worker skips), and no read key
        (readers derive it from the iteration's, which they have: see task_read_key)."""
        task = self.state.tasks[task_id]
        iteration = self.state.iterations[task.iteration_id]
        job = self.state.jobs[iteration.job_id]
        dataset = self.state.datasets[job.dataset_id]
        skip = _held_ranges(iteration, (task.stream_id, 0)) \
            if for_worker and (job.processing_mode == state_pb2.PARALLEL_EPOCHS or is_static(job.processing_mode)) \
            else []
        return dispatcher_pb2.TaskDef(task_id=task_id, iteration_id=iteration.iteration_id, job_id=job.job_id,
                                      dataset_id=job.dataset_id, processing_mode=job.processing_mode,
                                      worker_address=task.worker_address, num_splits=dataset.num_splits,
                                      stream_id=task.stream_id, skip_ranges=skip,
                                      data_address=self.state.workers[task.worker_address].data_address,
                                      read_key=task_read_key(iteration.read_key, task_id) if for_worker else b"",
                                      num_consumers=job.num_consumers, cross_trainer_cache=job.cross_trainer_cache,
                                      num_readers=job.num_readers,
                                      **_worker_fields(self.state.workers[task.worker_address]),
                                      **static_workers.task_fields(self.config, job, task))

    def _reader_task_def(self, task_id: int) -> dispatcher_pb2.TaskDef:
        return self._task_def(task_id, for_worker=False)

    # --- revocation -------------------------------------------------------------------
    def _revoke_task(self, task_id: int, why: str) -> None:
        task = self.state.tasks[task_id]
        self._commit(state_pb2.Update(revoke_task=state_pb2.RevokeTaskUpdate(task_id=task_id)))
        self._awaiting_stop[task_id] = set(self.state.iterations[task.iteration_id].clients)
        self._event("revoke_task", task_id=task_id, worker=task.worker_address, why=why)
        log.warning("revoked task %d on worker %s (%s)", task_id, task.worker_address, why)

    def _revocation_clear(self, task_id: int) -> bool:
        """Every client has confirmed it no longer accepts elements from the revoked task,
        so what clients hold of its splits is final and the rest can be redone."""
        waiting = self._awaiting_stop.get(task_id)
        if waiting is None:
            # Revoked before this dispatcher started (replayed): ask every current client.
            iteration = self.state.iterations[self.state.tasks[task_id].iteration_id]
            waiting = self._awaiting_stop[task_id] = set(iteration.clients)
        waiting.intersection_update(self.state.clients)
        return not waiting

    # --- clients ------------------------------------------------------------------
    def _heartbeat_client(self, req: dispatcher_pb2.ClientHeartbeatRequest):
        """The client a heartbeat comes from and its iteration, its read key checked (under the lock)."""
        client = self.state.clients.get(req.client_id)
        if client is None:
            raise errors.NotFoundError(
                f"client {req.client_id} is unknown to the dispatcher (released, timed out after "
                f"{self.config.client_timeout_ms} ms, or the dispatcher restarted without fault tolerance)")
        iteration = self.state.iterations[client.iteration_id]
        self._check_read_key(iteration, req.read_key, f"ClientHeartbeat for client {req.client_id}")
        return client, iteration

    def client_heartbeat(self, req: dispatcher_pb2.ClientHeartbeatRequest) -> dispatcher_pb2.ClientHeartbeatResponse:
        # A usual heartbeat (a few ranges) is recorded in one pass under the lock; a large one is diffed outside it.
        large = sum(len(p.ranges) for p in req.progress) > 2 * SMALL_PROGRESS_RANGES
        progress = self._new_progress(req) if large else list(req.progress)
        # Many new ranges are recorded a slice at a time, the lock released in between: other RPCs go on.
        pieces = _progress_pieces(progress)
        for piece in pieces[:-1]:
            with self._cond:
                client, iteration = self._heartbeat_client(req)
                if not iteration.finished:
                    self._commit(state_pb2.Update(record_progress=state_pb2.RecordProgressUpdate(
                        iteration_id=iteration.iteration_id, progress=piece,
                        reader=client.reader_index + 1 if client.reader_index is not None else 0)))
        progress = pieces[-1] if pieces else []
        with self._cond:
            client, iteration = self._heartbeat_client(req)
            self._client_seen[req.client_id] = self._clock()
            if req.HasField("stats"):
                self.load_reports.client_reported(
                    req.client_id, iteration.job_id, iteration.iteration_id,
                    self.state.jobs[iteration.job_id].name, req.stats.elements, req.stats.bytes,
                    req.stats.stall_us / 1e6, req.stats.elapsed_us / 1e6, now=self._clock(), now_unix=time.time())
            if progress and not iteration.finished:
                reader = client.reader_index + 1 if client.reader_index is not None else 0
                self._commit(state_pb2.Update(record_progress=state_pb2.RecordProgressUpdate(
                    iteration_id=iteration.iteration_id, progress=progress, reader=reader)))
                self._maybe_finish_iteration(iteration.iteration_id)
            for task_id in req.stopped_tasks:
                waiting = self._awaiting_stop.get(task_id)
                if waiting is not None:
                    waiting.discard(req.client_id)
            if req.stopped_tasks:
                self._cond.notify_all()  # a split may be free for reassignment now
                self.wakeups.notify([("iteration", iteration.iteration_id)])
            coordinated = bool(self.state.jobs[iteration.job_id].num_consumers)
            if coordinated:
                self._coordinate(iteration, req)
            response = dispatcher_pb2.ClientHeartbeatResponse(
                tasks_version=self._task_lists.version(iteration.iteration_id),
                iteration_finished=iteration.finished, dispatcher_incarnation=self.incarnation,
                # A coordinated read's rounds are timed by the unstretched interval (coordinated_rounds).
                heartbeat_interval_ms=int((self._client_heartbeat_s() if coordinated else self._reader_heartbeat_s())
                                          * 1000),
                more_tasks_expected=self._more_tasks_expected(iteration),
                all_splits_leased=self._all_splits_leased(iteration),
                many_splits_left=self._many_splits_left(iteration),
                waiting_for_workers=static_workers.waiting_for(self.state, self.config, iteration,
                                                               self._worker_lost),
                read_error=self._read_errors.get(iteration.job_id, ""))
            # Thousands of TaskDefs a steady read need not get again: nothing if its list is current, what
            # changed if it is a little behind (task_lists.py), the whole list otherwise.
            unchanged = req.known_tasks_version == response.tasks_version
            changed = None if unchanged or not req.known_tasks_version else \
                self._task_lists.changed_since(iteration.iteration_id, req.known_tasks_version)
            # A coordinated read's rotation needs the tasks; a whole list for the answer is made once per version.
            tasks = [self.state.tasks[t] for t in iteration.tasks] if coordinated else []
            if unchanged:
                response.tasks_unchanged = True
            elif changed is not None:
                response.tasks_changed_only = True
                listed = [self.state.tasks[t] for t in changed]
                response.tasks.extend(self._task_lists.task_def(t.task_id, self._reader_task_def)
                                      for t in listed if not t.revoked)
                response.revoked_tasks.extend(t.task_id for t in listed if t.revoked)
            else:
                response.MergeFromString(self._task_lists.whole_list(
                    iteration.iteration_id, lambda: self._whole_task_list(iteration)))
            if coordinated:
                response.block_round = self._rounds.block_round(iteration.iteration_id)
                response.rotation.extend(dispatcher_pb2.RotationSlot(task_id=t, starting_round=s)
                                         for t, s in rotation_of(tasks))
                if tasks:
                    self._rounds.published(iteration.iteration_id)
            return response

    def _all_splits_leased(self, iteration: IterationInfo) -> bool:
        """Whether no new split is left to lease: from then on each split a reader reports ended may be the
        iteration's last, and the reader reports it at once rather than at its paced rate (the epoch's end
        waits for that report). False for an endless source, and for a read that takes no splits."""
        if iteration.finished or not iteration.next_split:
            return False
        num_splits = self.state.dataset_of_iteration(iteration.iteration_id).num_splits
        return num_splits != INFINITE and iteration.next_split >= num_splits

    def _many_splits_left(self, iteration: IterationInfo) -> bool:
        """Whether leasing the splits not yet leased will take more than ``REPORT_SLOWLY_LEFT_S``, at the
        iteration's tasks' measured pace (a moving average: O(1) per reader heartbeat, whatever the fleet):
        until then its readers may report split ends at their slow pace (a report per split of a 63-split
        epoch cost it 6% of its CPU), and still learn that the end nears in time to report its last split
        ends at once. False for a deterministic read and elastic readers, whose order waits on split ends,
        and while no task's pace is known; True for an endless source."""
        if iteration.finished or not iteration.next_split:
            return False
        job = self.state.jobs[iteration.job_id]
        if job.deterministic or job.num_readers:
            return False
        num_splits = self.state.dataset_of_iteration(iteration.iteration_id).num_splits
        if num_splits == INFINITE:
            return True
        pace = self._split_s.get(iteration.iteration_id)
        if pace is None:
            return False
        left = num_splits - iteration.next_split
        return left / max(1, len(iteration.tasks)) * pace > REPORT_SLOWLY_LEFT_S

    def _whole_task_list(self, iteration: IterationInfo) -> bytes:
        """An iteration's task list as a ClientHeartbeatResponse holding only ``tasks`` (TaskDefs of the live
        tasks) and ``revoked_tasks``, serialized: merged into a reader's answer (``ReaderTaskLists.whole_list``)."""
        listed = [self.state.tasks[t] for t in iteration.tasks]
        whole = dispatcher_pb2.ClientHeartbeatResponse(revoked_tasks=[t.task_id for t in listed if t.revoked])
        whole.tasks.extend(self._task_lists.task_def(t.task_id, self._reader_task_def) for t in listed if not t.revoked)
        return whole.SerializeToString()

    def _new_progress(self, req: dispatcher_pb2.ClientHeartbeatRequest) -> list:
        """What of the heartbeat's offsets the dispatcher does not hold yet, worked out without its lock.

        A reader reports all it holds of each split it received more of: with many gaps (a cross-trainer
        cache's skips, an elastic reader's share) that is hundreds of thousands of ranges, and merging them
        under the lock held every other RPC for half a second. Here the lock is taken only to copy what is held
        (two list copies per split), the difference is computed outside it, and the journaled update carries
        only that. Progress only grows, so offsets recorded meanwhile by others are harmless to add again."""
        with self._cond:
            client = self.state.clients.get(req.client_id)
            iteration = self.state.iterations.get(client.iteration_id) if client is not None else None
            if iteration is None or iteration.finished:
                return list(req.progress)  # checked, and refused or skipped, under the lock as before
            reader = client.reader_index
            held = {}
            for p in req.progress:
                key = (p.stream_id, p.split_index)
                source = iteration.reader_progress.get(key, {}).get(reader) if reader is not None \
                    else iteration.progress.get(key)
                held[key] = None if key in iteration.done else source.copy() if source is not None else OffsetSet()
        out = []
        for p in req.progress:
            key = (p.stream_id, p.split_index)
            have = held[key]
            if have is None:
                continue  # done: every element of the split is with a client
            new = OffsetSet.from_flat(p.ranges).difference(have) if len(p.ranges) > 2 or have.ranges else None
            ranges = p.ranges if new is None else new.flat()
            if ranges or p.total >= 0:
                out.append(state_pb2.SplitProgress(stream_id=p.stream_id, split_index=p.split_index,
                                                   ranges=ranges, total=p.total))
        return out

    def _reader_heartbeat_s(self) -> float:
        """How often readers heartbeat: every second, stretched for thousands of readers (``fleet_intervals``)."""
        return fleet_intervals.client_heartbeat_s(len(self.state.clients), self.config.client_timeout_ms)

    def _client_heartbeat_s(self) -> float:
        """The unstretched reader interval, well within client_timeout_ms: coordinated reads time their
        rounds' joins by it (a coordinated read's readers are a handful)."""
        return max(10, min(1_000, self.config.client_timeout_ms // 4)) / 1000

    def _coordinate(self, iteration, req: dispatcher_pb2.ClientHeartbeatRequest) -> None:
        """Coordinated reads: records the reader's round, and starts the pending workers' tasks once
        every reader has stopped short of their starting round (see coordinated_rounds)."""
        self._rounds.reported(req.client_id, req.current_round, req.acknowledged_block_round,
                              self._client_heartbeat_s())
        for address, start in self._rounds.ready(iteration, self._client_heartbeat_s()):
            worker = self.state.workers.get(address)
            if worker is None or self._worker_lost(address) or iteration.finished or any(
                    not self.state.tasks[t].revoked and self.state.tasks[t].iteration_id == iteration.iteration_id
                    for t in worker.tasks):
                continue
            self._create_task(iteration.iteration_id, address, starting_round=start)
            self._event("join_rotation", iteration_id=iteration.iteration_id, worker=address, starting_round=start)

    def release_iteration_client(self, req: dispatcher_pb2.ReleaseIterationClientRequest
                                 ) -> dispatcher_pb2.ReleaseIterationClientResponse:
        with self._cond:
            client = self.state.clients.get(req.client_id)
            if client is not None:
                self._check_read_key(self.state.iterations[client.iteration_id], req.read_key,
                                     f"ReleaseIterationClient for client {req.client_id}")
                self._release_client(req.client_id)
            return dispatcher_pb2.ReleaseIterationClientResponse()

    @staticmethod
    def _check_read_key(iteration, read_key: bytes, what: str) -> None:
        """Client ids are no secret (GetStatus lists iterations, ids are sequential): a client proves it is
        one of the iteration's readers with its read key, or someone holding only the cluster token could
        report progress for it (ending its read short) or release it."""
        if iteration.read_key and not hmac.compare_digest(read_key, iteration.read_key):
            raise errors.PermissionDeniedError(f"{what}: wrong read key: only the iteration's own readers may "
                                               f"report for its clients")

    def _release_client(self, client_id: int) -> None:
        iteration_id = self.state.clients[client_id].iteration_id
        self._commit(state_pb2.Update(release_iteration_client=state_pb2.ReleaseIterationClientUpdate(
            client_id=client_id)))
        self._client_seen.pop(client_id, None)
        self.load_reports.forget_client(client_id)
        self._rounds.forget_client(client_id)
        iteration = self.state.iterations[iteration_id]
        if not iteration.clients:
            self._iteration_idle_since[iteration_id] = self._clock()
            self._left_unread(iteration)

    # --- pruning ------------------------------------------------------------------------
    def _left_unread(self, iteration) -> None:
        """The last reader of ``iteration`` left. An anonymous job has one reader, its creator, so
        nobody can read it again: it ends and leaves the state now. A finished iteration of a named
        job leaves only a stub (a later reader of that repetition learns at once that it finished).
        An unfinished one waits for another reader for job_gc_timeout_ms; its tasks are stopped
        after client_timeout_ms / 2 (see check_liveness)."""
        job = self.state.jobs[iteration.job_id]
        if not job.name:
            if not iteration.finished:
                self._commit(state_pb2.Update(finish_iteration=state_pb2.FinishIterationUpdate(
                    iteration_id=iteration.iteration_id, garbage_collected=True)))
                self._event("garbage_collect", iteration_id=iteration.iteration_id, why="its reader left")
            self._prune_job(job)
        elif iteration.finished:
            self._prune_iteration(iteration)

    def _prune_iteration(self, iteration) -> None:
        if iteration.pruned:
            return
        self._forget_tasks(iteration)
        self._commit(state_pb2.Update(prune_iteration=state_pb2.PruneIterationUpdate(
            iteration_id=iteration.iteration_id)))
        self._event("prune_iteration", iteration_id=iteration.iteration_id)
        job = self.state.jobs[iteration.job_id]
        if self._job_done(job):
            self._finished_jobs.pop(job.job_id, None)  # finished again (a later repetition): the newest now
            self._finished_jobs[job.job_id] = None
            while len(self._finished_jobs) > self.config.finished_jobs_kept:
                oldest = next(iter(self._finished_jobs))
                old_job = self.state.jobs.get(oldest)
                if old_job is None or not self._job_done(old_job):
                    del self._finished_jobs[oldest]  # pruned already, or read again
                else:
                    self._prune_job(old_job)

    def _job_done(self, job) -> bool:
        """Every iteration of ``job`` finished and nobody reads it."""
        iterations = [self.state.iterations[i] for i in job.iterations.values()]
        return bool(iterations) and all(it.finished and not it.clients for it in iterations)

    def _forget_tasks(self, iteration) -> None:
        """Drops what the core remembers of the iteration's tasks, which are about to leave the state."""
        for task_id in iteration.tasks:
            self._awaiting_stop.pop(task_id, None)
        self._rounds.forget_iteration(iteration.iteration_id)

    def _prune_job(self, job) -> None:
        for iteration_id in job.iterations.values():
            self._forget_tasks(self.state.iterations[iteration_id])
        self._commit(state_pb2.Update(prune_job=state_pb2.PruneJobUpdate(job_id=job.job_id)))
        for iteration_id in job.iterations.values():
            self._iteration_idle_since.pop(iteration_id, None)
        self._finished_jobs.pop(job.job_id, None)
        self._pruned_jobs[job.job_id] = job.key
        while len(self._pruned_jobs) > PRUNED_JOBS_REMEMBERED:
            del self._pruned_jobs[next(iter(self._pruned_jobs))]
        self._event("prune_job", job_id=job.job_id, job_name=job.name)

    # --- workers ------------------------------------------------------------------
    def worker_heartbeat(self, req: dispatcher_pb2.WorkerHeartbeatRequest, may_wait: bool = True
                         ) -> dispatcher_pb2.WorkerHeartbeatResponse:
        """A worker's heartbeat: records it, assigns the worker its tasks and answers with its news; without
        news it waits (long poll) up to ``heartbeat_wait_s``, not with ``may_wait=False`` (the asyncio server
        waits on ``wakeups`` instead and asks again with ``worker_heartbeat_again``)."""
        _check_worker_address(req.worker_address, "worker_address")
        if req.data_address:
            _check_worker_address(req.data_address, "data_address")
        _check_worker_labels(req)
        # Answer well before the worker could look lost (worker_timeout_ms), however long it asked to wait.
        deadline = time.monotonic() + (heartbeat_wait_s(req, self.config) if may_wait else 0.0)
        with self._cond:
            state = self.state
            try:
                static_workers.admit_worker(state, self.config, req.worker_address, self._commit, self._worker_lost)
            except errors.PermissionDeniedError:
                self._event("refuse_worker", worker=req.worker_address)
                raise
            self._task_views.check_state(state)
            if req.tasks_delta and not self._task_views.applies(req.worker_address, req.worker_uid, req.base_seq):
                return self._resync_tasks(req)
            self._record_worker(req)  # assigns the worker its tasks
            with self._long_poll() as may_wait:
                while True:
                    response = self._heartbeat_news(req)
                    response.saves.extend(self._save_defs())
                    remaining = deadline - time.monotonic()
                    if heartbeat_has_news(req, response) or remaining <= 0 or not may_wait:
                        return response
                    # Long poll: a task created for this worker wakes us at once.
                    self._wait(state, remaining)
                    self._worker_seen[req.worker_address] = self._clock()
                    self._assign_after_wakeup(req)

    def _assign_after_wakeup(self, req: dispatcher_pb2.WorkerHeartbeatRequest) -> None:
        # A worker sending deltas is walked only when not settled: O(its tasks) on every wakeup otherwise.
        if req.tasks_delta:
            self._assign_unless_settled(req.worker_address)
        else:
            self._assign_tasks(req.worker_address)

    def worker_heartbeat_again(self, req: dispatcher_pb2.WorkerHeartbeatRequest
                               ) -> dispatcher_pb2.WorkerHeartbeatResponse:
        """A heartbeat that ``worker_heartbeat`` answered without news, asked again after a wakeup
        by the asyncio server, which waits between the two (``grpc_service``): what the worker
        reported is not applied twice; the worker is seen, given its tasks, and told the news."""
        with self._cond:
            if req.worker_address not in self.state.workers:  # rolled back, or pruned meanwhile
                return self.worker_heartbeat(req, may_wait=False)
            self._worker_seen[req.worker_address] = self._clock()
            self._assign_after_wakeup(req)
            response = self._heartbeat_news(req)
            response.saves.extend(self._save_defs())
            return response

    @contextlib.contextmanager
    def _long_poll(self):
        """Yields whether this call may wait (the caller holds the lock): at most LONG_POLL_SLOTS
        calls wait at once; the others answer at once and their callers wait on their side."""
        if self._long_polls >= LONG_POLL_SLOTS:
            yield False
            return
        self._long_polls += 1
        try:
            yield True
        finally:
            self._long_polls -= 1

    def _worker_lost(self, address: str) -> bool:
        """Silent for longer than ``worker_timeout_ms``: a new iteration gets no task on it,
        or its readers would wait on a dead worker until they give up. A worker not heard
        from since this dispatcher started (replayed from a journal) has worker_timeout_ms
        from the first time we ask."""
        seen = self._worker_seen.setdefault(address, self._clock())
        return self._clock() - seen > self.config.worker_timeout_ms / 1000

    def _record_worker(self, req: dispatcher_pb2.WorkerHeartbeatRequest) -> None:
        address = req.worker_address
        worker = self.state.workers.get(address)
        self._worker_seen[address] = self._clock()
        self._worker_seen_unix[address] = time.time()
        if req.HasField("load"):
            self.load_reports.worker_reported(address, req.load.interval_us / 1e6, req.load.busy_us / 1e6,
                                              req.load.running_tasks, now=self._clock())
        restarted = worker is not None and worker.uid != req.worker_uid
        if worker is None or restarted or worker.data_address != req.data_address \
                or worker.tags != tuple(req.worker_tags) or worker.host_id != req.host_id:
            self._commit(state_pb2.Update(register_worker=state_pb2.RegisterWorkerUpdate(
                worker_address=address, worker_uid=req.worker_uid, data_address=req.data_address,
                worker_tags=req.worker_tags, host_id=req.host_id)))
            self._event("register_worker", worker=address, restarted=restarted)
            log.info("worker %s %s", address, "re-registered after a restart" if restarted else "registered")
            if restarted:
                for save in list(self.state.saves.values()):
                    if not save.finished and any(a == address for a, _ in save.leases.values()):
                        self._commit(state_pb2.Update(release_save_leases=state_pb2.ReleaseSaveLeasesUpdate(
                            save_id=save.save_id, worker_address=address)))
                # The restarted process lost its tasks: what they held goes back to the pool.
                for task_id in sorted(worker.tasks):
                    task = self.state.tasks[task_id]
                    if not task.revoked and not self.state.iterations[task.iteration_id].finished:
                        self._revoke_task(task_id, "the worker restarted")
        if req.tasks_delta:
            self._apply_task_delta(req)
            self._assign_unless_settled(address)
        else:
            if req.heartbeat_seq:
                self._task_views.reset(address, req.worker_uid, req.heartbeat_seq, req.current_tasks)
            else:
                self._task_views.forget(address)  # an old worker: no deltas to expect from it
            self.heartbeat_counts["full"] += 1
            self._assign_tasks(address)
        for task_id in req.finished_tasks:
            task = self.state.tasks.get(task_id)
            if task is not None and task.worker_address == address and not task.finished:
                self._commit(state_pb2.Update(finish_task=state_pb2.FinishTaskUpdate(task_id=task_id)))
                self._maybe_finish_iteration(task.iteration_id)

    def _more_tasks_expected(self, iteration) -> bool:
        """Whether a reader whose every task has ended must wait for more instead of ending.

        A finished iteration gets no task any more, even for a stream whose worker came back after
        the iteration ended without it: telling the reader to wait would hang it. An unfinished
        distributed_epoch iteration always has more to come: its tasks end normally only once every
        split is done, which finishes it first, so a reader whose tasks all ended before that lost
        them (revoked: a worker lost or restarted, possibly between two splits, holding none) or saw
        one fail (and raises its error). Its splits are produced by the next worker to register; with
        none, the reader raises after its ``timeout_ms`` rather than end the epoch short."""
        if iteration.finished:
            return False
        mode = self.state.jobs[iteration.job_id].processing_mode
        if mode == state_pb2.DISTRIBUTED_EPOCH or is_static(mode):
            return True  # static: a listed worker's shard is still to come (static_workers.shards_complete)
        return any(self._may_resume(iteration, key) for key in iteration.pending)

    def _maybe_finish_iteration(self, iteration_id: int) -> None:
        """Finishes the iteration once it is complete: in distributed_epoch when every split is done
        (never because its tasks ended: a task revoked between splits, or failed, ends with splits
        still to produce); in parallel_epochs when every task ended and no revoked stream can resume; in a
        static sharding mode when every listed worker's shard was produced (static_workers.shards_complete)."""
        iteration = self.state.iterations[iteration_id]
        if iteration.finished:
            return
        mode = self.state.jobs[iteration.job_id].processing_mode
        distributed = mode == state_pb2.DISTRIBUTED_EPOCH
        if is_static(mode):
            complete = static_workers.shards_complete(self.state, self.config, iteration)
        else:
            complete = self._all_splits_done(iteration) or (
                not distributed and iteration.tasks and all(self.state.tasks[t].finished for t in iteration.tasks)
                and not any(self._may_resume(iteration, key) for key in iteration.pending))
        if complete:
            self._commit(state_pb2.Update(finish_iteration=state_pb2.FinishIterationUpdate(iteration_id=iteration_id)))
            self._event("finish_iteration", iteration_id=iteration_id)
            if not iteration.clients:
                self._left_unread(iteration)

    def _may_resume(self, iteration, key: tuple) -> bool:
        """A revoked split may still be produced: in distributed_epoch always (any task
        takes it); in parallel_epochs while the stream's worker is alive to take it over
        (a worker lost for good leaves its copy of the epoch short, as in tf.data)."""
        if key[0] == 0:
            return True
        task = self.state.tasks[iteration.pending[key]]
        return not self._worker_lost(task.worker_address)

    def _all_splits_done(self, iteration) -> bool:
        """distributed_epoch: every split of the pass is with a client."""
        job = self.state.jobs[iteration.job_id]
        if job.processing_mode != state_pb2.DISTRIBUTED_EPOCH:
            return False
        num_splits = self.state.datasets[job.dataset_id].num_splits
        # Checked after every heartbeat that reports progress: not a walk over every done split's range.
        return num_splits >= 0 and iteration.done.covers(0, num_splits)

    def _worker_news(self, address: str, current: Iterable[int], view=None) -> dispatcher_pb2.WorkerHeartbeatResponse:
        """What a full-list heartbeat tells the worker: a walk over all its tasks. With ``view`` (the
        worker's TaskView: it sends deltas next), what may still be news next time is left in ``view.dirty``."""
        current = set(current)
        worker = self.state.workers[address]
        new_tasks = []
        missing = worker.tasks - current
        for task_id in sorted(missing):
            if self._task_to_start(task_id):
                new_tasks.append(self._task_def(task_id))
                if len(new_tasks) >= MAX_NEW_TASKS_PER_HEARTBEAT:
                    break  # the worker asks again at once for the rest
        to_delete = [task_id for task_id in sorted(current) if self._task_to_drop(task_id, address)]
        if view is not None:
            # Sent news stays dirty until the worker's delta confirms it (it may fail to start a task).
            view.dirty = missing
            view.dirty.update(to_delete)
        return dispatcher_pb2.WorkerHeartbeatResponse(new_tasks=new_tasks, tasks_to_delete=to_delete,
                                                      dispatcher_incarnation=self.incarnation)

    def _task_to_start(self, task_id: int) -> bool:
        """A task of the worker's that it does not run is sent to it (WorkerHeartbeatResponse.new_tasks)."""
        task = self.state.tasks[task_id]
        iteration = self.state.iterations[task.iteration_id]
        # A task of an iteration that finished before its worker heard of it still goes out while
        # the iteration has readers: they know the task and ask its worker for it, and it answers
        # end of input (GetSplit says end_of_splits) instead of "not running" forever.
        return not task.finished and not (iteration.finished and not iteration.clients)

    def _task_to_drop(self, task_id: int, address: str) -> bool:
        """A task the worker at ``address`` runs is to be deleted (WorkerHeartbeatResponse.tasks_to_delete)."""
        task = self.state.tasks.get(task_id)
        if task is None or task.worker_address != address:
            return True
        iteration = self.state.iterations[task.iteration_id]
        return task.revoked or iteration.state is IterationState.GARBAGE_COLLECTED or (
            iteration.finished and not iteration.clients)

    # --- task deltas (WorkerHeartbeatRequest.tasks_delta; the bookkeeping is task_views.TaskViews) -------------
    def _heartbeat_news(self, req: dispatcher_pb2.WorkerHeartbeatRequest) -> dispatcher_pb2.WorkerHeartbeatResponse:
        """The answer to a heartbeat (the core holds its lock): from a walk over its full list, or from a
        delta's changes and the news noted since the worker's last answer.

        Example::

            response = core._heartbeat_news(request)   # new_tasks, tasks_to_delete, dispatcher_incarnation
        """
        if req.tasks_delta:
            self._task_views.check_state(self.state)  # asked again after a wait (worker_heartbeat_again)
            view = self._task_views.get(req.worker_address)
            if view is None or view.seq != req.heartbeat_seq or view.uid != req.worker_uid:
                # A long poll outlived by a newer heartbeat of this address (its caller gave up on it: the view
                # is that heartbeat's now), or the state rolled back while it waited.
                return self._resync_tasks(req)
            return self._delta_news(req.worker_address)
        view = self._task_views.get(req.worker_address) if req.heartbeat_seq else None
        if view is not None and (view.seq != req.heartbeat_seq or view.uid != req.worker_uid):
            view = None  # outlived by a newer heartbeat (see above): its view is not this list's
        return self._worker_news(req.worker_address, req.current_tasks, view)

    def _apply_task_delta(self, req: dispatcher_pb2.WorkerHeartbeatRequest) -> None:
        """Records a delta that applies (TaskViews.applies): O(its changes)."""
        view = self._task_views.get(req.worker_address)
        view.reported.difference_update(req.removed_tasks)
        view.reported.update(req.added_tasks)
        # A task the worker started may be stale already, one it dropped may be due again: both are looked at.
        view.dirty.update(req.added_tasks)
        view.dirty.update(req.removed_tasks)
        view.seq = req.heartbeat_seq
        self.heartbeat_counts["delta"] += 1

    def _delta_news(self, address: str) -> dispatcher_pb2.WorkerHeartbeatResponse:
        """What a delta heartbeat tells the worker: what ``_worker_news`` would over its full list, found by
        looking only at the tasks whose news may have changed since the last answer (its view's dirty set)."""
        view = self._task_views.get(address)
        worker = self.state.workers[address]
        new_tasks, to_delete, still_dirty = [], [], set()
        for task_id in sorted(view.dirty):
            if task_id in view.reported:
                if self._task_to_drop(task_id, address):
                    to_delete.append(task_id)
                    still_dirty.add(task_id)
            elif task_id in worker.tasks:
                if len(new_tasks) >= MAX_NEW_TASKS_PER_HEARTBEAT:
                    still_dirty.add(task_id)  # the worker asks again at once for the rest
                elif self._task_to_start(task_id):
                    new_tasks.append(self._task_def(task_id))
                    still_dirty.add(task_id)
        # Sent news stays dirty until the worker's next delta confirms it, as a full list would resend it.
        view.dirty = still_dirty
        return dispatcher_pb2.WorkerHeartbeatResponse(new_tasks=new_tasks, tasks_to_delete=to_delete,
                                                      dispatcher_incarnation=self.incarnation)

    def _assign_unless_settled(self, address: str) -> None:
        """``_assign_tasks(address)``, skipped for a settled worker (one it would give nothing: see
        task_views.TaskViews.settled); a walk that leaves the worker a live task everywhere settles it."""
        if self._task_views.is_settled(address):
            return
        self._assign_tasks(address)
        if self._worker_complete(address):
            self._task_views.settle(address)

    def _worker_complete(self, address: str) -> bool:
        """The worker has, in every iteration that could give it a task, one that ``_assign_tasks`` counts
        as its own (a live task; in static sharding, one that has not finished): it would give it nothing."""
        by_iteration: dict[int, list] = {}
        for task_id in self.state.workers[address].tasks:
            task = self.state.tasks[task_id]
            by_iteration.setdefault(task.iteration_id, []).append(task)
        for iteration in self.state.active_iterations.values():
            if not iteration.clients or iteration.finished:
                continue
            mine = by_iteration.get(iteration.iteration_id, [])
            mode = self.state.jobs[iteration.job_id].processing_mode
            if not any(not t.revoked for t in mine) or (is_static(mode) and all(t.finished for t in mine)):
                return False
        return True

    def _resync_tasks(self, req: dispatcher_pb2.WorkerHeartbeatRequest) -> dispatcher_pb2.WorkerHeartbeatResponse:
        """A delta that cannot be applied (this dispatcher restarted or rolled back, an answer was lost, the
        worker restarted): nothing is done but noting the worker alive; its next heartbeat is a full list."""
        address = req.worker_address
        if address in self.state.workers:
            self._worker_seen[address] = self._clock()
            self._worker_seen_unix[address] = time.time()
        self.heartbeat_counts["resync"] += 1
        self._event("resync_tasks", worker=address, base_seq=req.base_seq, heartbeat_seq=req.heartbeat_seq)
        return dispatcher_pb2.WorkerHeartbeatResponse(resync_tasks=True, dispatcher_incarnation=self.incarnation)

    # --- splits -------------------------------------------------------------------
    def get_split(self, req: dispatcher_pb2.GetSplitRequest, may_wait: bool = True) -> dispatcher_pb2.GetSplitResponse:
        """Leases a split to a task: a revoked one first (with the offsets clients hold), else
        the next new one, or several for a large fleet (``fleet_intervals.splits_per_lease``). When
        none is free but leased ones may still come back, the call waits a little (long poll; not with
        ``may_wait=False``: the asyncio server waits on ``wakeups`` instead) and then tells the task to
        ask again."""
        deadline = time.monotonic() + (SPLIT_WAIT_S if may_wait else 0.0)
        with self._cond:
            state = self.state
            iteration = state.iterations.get(req.iteration_id)
            if iteration is None:
                raise errors.NotFoundError(f"iteration {req.iteration_id} does not exist")
            task = state.tasks.get(req.task_id)
            if task is None or task.iteration_id != req.iteration_id:
                raise errors.NotFoundError(f"task {req.task_id} is not part of iteration {req.iteration_id}")
            num_splits = state.dataset_of_iteration(req.iteration_id).num_splits
            if req.request_id and req.request_id == task.last_request_id and task.last_splits:
                # A retry: the answer was lost (say, the dispatcher died after journaling it).
                # The same splits again, or they would stay leased to this task and never be produced.
                return self._split_answer(iteration, task.stream_id, task.last_splits)
            while True:
                if iteration.finished or task.revoked:
                    return dispatcher_pb2.GetSplitResponse(end_of_splits=True)
                for key, revoked_task in sorted(iteration.pending.items()):
                    if key[0] == task.stream_id and self._revocation_clear(revoked_task):
                        self._commit(state_pb2.Update(assign_split=state_pb2.AssignSplitUpdate(
                            iteration_id=req.iteration_id, task_id=req.task_id, split_index=key[1],
                            reassigned=True, request_id=req.request_id)))
                        self._event("reassign_split", split=key[1], task_id=req.task_id, from_task=revoked_task)
                        return self._split_answer(iteration, key[0], [key[1]])
                split = _next_new_split(iteration, iteration.next_split)
                if num_splits == INFINITE or split < num_splits:
                    count = self._splits_per_lease(req, iteration, num_splits, split)
                    leased: list[int] = []
                    while len(leased) < count and (num_splits == INFINITE or split < num_splits):
                        leased.append(split)
                        split = _next_new_split(iteration, split + 1)
                    # One record for the whole lease: at 2,000 workers, one per split was most of the journal.
                    self._commit(state_pb2.Update(lease_splits=state_pb2.LeaseSplitsUpdate(
                        iteration_id=req.iteration_id, task_id=req.task_id, split_indices=leased,
                        request_id=req.request_id)))
                    self._leased_at(req.task_id, len(leased))
                    # A restored read's group taken in part is produced without what was taken of it.
                    return self._split_answer(iteration, 0, leased)
                if not iteration.leases and not iteration.pending:
                    self._maybe_finish_iteration(iteration.iteration_id)
                    return dispatcher_pb2.GetSplitResponse(end_of_splits=True)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._long_polls >= LONG_POLL_SLOTS:
                    return dispatcher_pb2.GetSplitResponse(wait=True)
                with self._long_poll():
                    self._wait(state, remaining)

    def _splits_per_lease(self, req: dispatcher_pb2.GetSplitRequest, iteration, num_splits: int,
                          first: int) -> int:
        """How many new splits, from ``first`` on, this GetSplit leases (``fleet_intervals.splits_per_lease``):
        one for a task that asks no more, and for a deterministic read, whose readers wait for the groups in
        order (one queued behind another on a worker would hold the order up). Measures the task's pace:
        the time since its last lease, per split it got then."""
        last = self._lease_pace.get(req.task_id)
        split_s = (self._clock() - last[0]) / last[1] if last is not None else None
        if split_s is not None:
            average = self._split_s.get(iteration.iteration_id)
            self._split_s[iteration.iteration_id] = split_s if average is None else 0.75 * average + 0.25 * split_s
        if req.max_splits <= 1:
            return 1
        job = self.state.jobs[iteration.job_id]
        if job.deterministic or job.num_readers:
            return 1
        left = None if num_splits == INFINITE else num_splits - first
        return fleet_intervals.splits_per_lease(req.max_splits, len(self.state.workers), left, len(iteration.tasks),
                                                split_s)

    def _leased_at(self, task_id: int, splits: int) -> None:
        """Remembers when ``task_id`` was last leased new splits, and how many: its next GetSplit tells how
        long it took per split (``_splits_per_lease``). Soft state, not journaled: a restart starts over."""
        if len(self._lease_pace) > 2 * len(self.state.tasks) + 1_000:
            self._lease_pace.clear()  # tasks gone for good leave entries that are never read
        if len(self._split_s) > 2 * len(self.state.iterations) + 1_000:
            self._split_s.clear()
        self._lease_pace[task_id] = (self._clock(), max(1, splits))

    def _split_answer(self, iteration, stream: int, splits) -> dispatcher_pb2.GetSplitResponse:
        """A GetSplit answer leasing ``splits`` (of stream ``stream``), each with the offsets clients hold of it
        and, for a restored read's group taken in part, where its worker seeks to."""
        first, *more = splits
        return dispatcher_pb2.GetSplitResponse(
            split_index=first, skip_ranges=_held_ranges(iteration, (stream, first)), **self._seek(iteration, first),
            more_splits=[dispatcher_pb2.LeasedSplit(split_index=split,
                                                    skip_ranges=_held_ranges(iteration, (stream, split)),
                                                    **self._seek(iteration, split)) for split in more])

    def _seek(self, iteration, group: int) -> dict:
        """A restored read's first iteration: where the worker of a group taken in part seeks to."""
        resume = self.state.jobs[iteration.job_id].resume
        if resume is None or iteration.repetition:
            return {}
        for seek in resume.seeks:
            if seek.group == group:
                return {"seek_offset": seek.offset, "seek_state": seek.state}
        return {}

    # --- distributed_save ----------------------------------------------------------------
    def distributed_save(self, req: dispatcher_pb2.DistributedSaveRequest) -> dispatcher_pb2.DistributedSaveResponse:
        """Starts saving dataset ``dataset_id`` into ``path``: creates the directory and its save.json, and
        records the save; workers learn of it from their heartbeats. A retry of the call (same request_token:
        its first attempt's answer was lost) gets the same save; any other save into a path that holds a save,
        started or completed, or into a directory that is not empty, AlreadyExistsError (tf.data's rule)."""
        with self._cond:
            dataset = self._dataset(req.dataset_id)
            for save in self.state.saves.values():
                if save.path == req.path:
                    if req.request_token and save.request_token and save.dataset_id == req.dataset_id and \
                            hmac.compare_digest(req.request_token, save.request_token):
                        return dispatcher_pb2.DistributedSaveResponse(save_id=save.save_id)
                    state = ("failed: " + save.error.splitlines()[0][:200]) if save.error else \
                        "completed" if save.finished else f"{len(save.committed)} of {save.num_groups} chunks written"
                    raise errors.AlreadyExistsError(
                        f"distributed_save: {req.path} already holds a distributed save, already started or "
                        f"completed (save {save.save_id} of dataset {save.dataset_id}: {state}); save into "
                        f"another directory, or remove this one first")
            if dataset.num_splits == INFINITE:
                raise errors.InvalidRequestError(f"distributed_save: dataset {req.dataset_id} is infinite; take() "
                                                 f"a finite part to save it")
            # One chunk per split group; a pipeline that is not splittable is one group, run whole.
            num_groups = 1 if dataset.num_splits == NOT_SPLITTABLE else max(1, dataset.num_splits)
            saves.prepare_directory(req.path)
            save_id = self.state.next_id()
            saves.write_save_file(req.path, {
                "save_id": save_id, "dataset_id": req.dataset_id, "num_groups": num_groups,
                "compression": req.compression or None,
                "element_spec": req.element_spec.hex() if req.element_spec else None})
            self._commit(state_pb2.Update(create_save=state_pb2.CreateSaveUpdate(
                save_id=save_id, dataset_id=req.dataset_id, path=req.path, num_groups=num_groups,
                compression=req.compression, element_spec=req.element_spec, request_token=req.request_token)))
            self._event("create_save", save_id=save_id, path=req.path, num_groups=num_groups)
            log.info("save %d: dataset %d into %s, %d chunks", save_id, req.dataset_id, req.path, num_groups)
            return dispatcher_pb2.DistributedSaveResponse(save_id=save_id)

    def _save(self, save_id: int, rpc: str):
        save = self.state.saves.get(save_id)
        if save is None:
            raise errors.NotFoundError(f"{rpc}: save {save_id} does not exist on this dispatcher")
        return save

    def lease_save_group(self, req: dispatcher_pb2.LeaseSaveGroupRequest) -> dispatcher_pb2.LeaseSaveGroupResponse:
        """The next group of the save for this worker to write (its earlier leases of the save go back: it
        writes one group of a save at a time), or end, or wait while every group left is leased."""
        with self._cond:
            save = self._save(req.save_id, "LeaseSaveGroup")
            if save.finished or len(save.committed) >= save.num_groups:
                return dispatcher_pb2.LeaseSaveGroupResponse(end=True)
            taken = {g for g, (address, _) in save.leases.items() if address != req.worker_address}
            for group in range(save.num_groups):
                if group not in save.committed and group not in taken:
                    attempt = self.state.next_id()
                    self._commit(state_pb2.Update(lease_save_group=state_pb2.LeaseSaveGroupUpdate(
                        save_id=req.save_id, group=group, worker_address=req.worker_address, attempt=attempt)))
                    self._event("lease_save_group", save_id=req.save_id, group=group, worker=req.worker_address,
                                attempt=attempt)
                    return dispatcher_pb2.LeaseSaveGroupResponse(group=group, attempt=attempt)
            return dispatcher_pb2.LeaseSaveGroupResponse(wait=True)

    def report_save_chunk(self, req: dispatcher_pb2.ReportSaveChunkRequest
                          ) -> dispatcher_pb2.ReportSaveChunkResponse:
        """A worker wrote a group's chunk (or its pipeline failed). The FIRST complete chunk of a group is
        committed: renamed into chunks/, then journaled; any later one is deleted. So every group is in the
        save exactly once, even when a group was redone after its worker looked lost, or the pipeline is not
        deterministic. The last commit writes metadata.json and DONE; a failure writes ERROR."""
        with self._cond:
            save = self._save(req.save_id, "ReportSaveChunk")
            if not 0 <= req.group < save.num_groups:
                raise errors.InvalidRequestError(f"ReportSaveChunk: save {req.save_id} has groups 0 to "
                                                 f"{save.num_groups - 1}, not {req.group}")
            if save.finished or req.group in save.committed:
                if not req.error:
                    saves.discard_chunk(save.path, req.group, req.attempt)
                    self._event("discard_save_chunk", save_id=req.save_id, group=req.group, attempt=req.attempt)
                return dispatcher_pb2.ReportSaveChunkResponse(committed=False)
            if req.error:
                self._fail_save(save, f"group {req.group} on worker {req.worker_address}: {req.error}")
                return dispatcher_pb2.ReportSaveChunkResponse(committed=False)
            if not saves.commit_chunk(save.path, req.group, req.attempt):
                raise errors.NotFoundError(
                    f"ReportSaveChunk: {saves.uncommitted_path(save.path, req.group, req.attempt)} does not exist: "
                    f"the dispatcher must see the workers' files (a shared file system)")
            self._commit(state_pb2.Update(commit_save_chunk=state_pb2.CommitSaveChunkUpdate(
                save_id=req.save_id, group=req.group, attempt=req.attempt, num_elements=req.num_elements,
                bytes=req.bytes, element_spec=req.element_spec)))
            self._event("commit_save_chunk", save_id=req.save_id, group=req.group, attempt=req.attempt,
                        worker=req.worker_address)
            self._maybe_finish_save(save)
            return dispatcher_pb2.ReportSaveChunkResponse(committed=True)

    def _fail_save(self, save, reason: str) -> None:
        try:
            saves.write_error(save.path, reason)
        except OSError as exc:
            log.error("save %d: cannot write %s/ERROR: %s", save.save_id, save.path, exc)
        self._commit(state_pb2.Update(finish_save=state_pb2.FinishSaveUpdate(save_id=save.save_id, error=reason)))
        self._event("fail_save", save_id=save.save_id, error=reason)
        log.warning("save %d into %s failed: %s", save.save_id, save.path, reason)

    def _maybe_finish_save(self, save) -> None:
        """Once every group is committed: metadata.json, DONE, then the journal record (idempotent: a
        dispatcher restarted in between writes them again)."""
        if save.finished or len(save.committed) < save.num_groups:
            return
        from dataservice.data import specs
        from dataservice.proto import pipeline_pb2

        chunks = [{"file": saves.chunk_name(g), "shard": 0, "num_elements": save.committed[g][1],
                   "bytes": save.committed[g][2]} for g in range(save.num_groups)]
        total = sum(c["num_elements"] for c in chunks)
        spec = specs.decode(pipeline_pb2.ElementSpecDef.FromString(save.element_spec)) if save.element_spec else None
        try:
            saves.write_done(save.path, {
                "element_spec": spec, "compression": save.compression or None, "cardinality": total,
                "num_elements": total, "num_shards": 1, "shards": [0], "sharding": "distributed_save",
                "save_id": save.save_id, "chunks": chunks})
        except OSError as exc:
            self._fail_save(save, f"cannot write the save's metadata: {exc}")
            return
        self._commit(state_pb2.Update(finish_save=state_pb2.FinishSaveUpdate(save_id=save.save_id)))
        self._event("finish_save", save_id=save.save_id, num_elements=total)
        log.info("save %d into %s is done: %d chunks, %d elements", save.save_id, save.path, len(chunks), total)

    def get_save_status(self, req: dispatcher_pb2.GetSaveStatusRequest) -> dispatcher_pb2.GetSaveStatusResponse:
        """The progress of the latest save into ``path``; NotFoundError if there is none."""
        with self._cond:
            found = [s for s in self.state.saves.values() if s.path == req.path]
            if not found:
                raise errors.NotFoundError(f"no distributed_save into {req.path} on this dispatcher")
            save = max(found, key=lambda s: s.save_id)
            return dispatcher_pb2.GetSaveStatusResponse(
                save_id=save.save_id, path=save.path, num_groups=save.num_groups,
                groups_committed=len(save.committed), groups_leased=len(save.leases),
                num_elements=sum(c[1] for c in save.committed.values()),
                bytes=sum(c[2] for c in save.committed.values()),
                done=save.finished and not save.error, error=save.error)

    def _save_defs(self) -> list:
        return [dispatcher_pb2.SaveDef(save_id=s.save_id, dataset_id=s.dataset_id, path=s.path,
                                       num_groups=s.num_groups, compression=s.compression)
                for s in self.state.saves.values() if not s.finished]

    def _check_saves(self) -> None:
        """A lost worker's leases go back to the pool; a save whose every group was committed before a
        restart (but not finished) is finished now."""
        for save in list(self.state.saves.values()):
            if save.finished:
                continue
            for address in sorted({a for a, _ in save.leases.values()}):
                if self._worker_lost(address):
                    self._commit(state_pb2.Update(release_save_leases=state_pb2.ReleaseSaveLeasesUpdate(
                        save_id=save.save_id, worker_address=address)))
                    self._event("release_save_leases", save_id=save.save_id, worker=address)
                    log.warning("save %d: worker %s is lost; its groups go to other workers", save.save_id, address)
            self._maybe_finish_save(save)

    # --- housekeeping ---------------------------------------------------------------
    def liveness_interval_s(self) -> float:
        """How often ``check_liveness`` runs: a silent worker or client is noticed at most a second
        (or a quarter of its timeout, when that is shorter) after its timeout, on the dispatcher's
        own clock and not the garbage collector's. A check is a pass over workers and clients."""
        return max(0.01, min(LIVENESS_TICK_S, self.config.worker_timeout_ms / 4000,
                             self.config.client_timeout_ms / 4000))

    def check_liveness(self) -> None:
        """Revokes the tasks of workers silent past ``worker_timeout_ms`` (their splits are redone
        elsewhere), releases clients silent past ``client_timeout_ms``, and stops the tasks of named
        iterations nobody has read for ``client_timeout_ms / 2`` (their workers free what they buffered;
        what clients hold stays theirs, and a reader joining later gets the rest produced again)."""
        with self._cond:
            now = self._clock()
            self._check_saves()
            for address, worker in list(self.state.workers.items()):
                if not self._worker_lost(address):
                    continue
                for task_id in sorted(worker.tasks):
                    task = self.state.tasks[task_id]
                    if not task.revoked and not task.finished and not self.state.iterations[task.iteration_id].finished:
                        self._revoke_task(task_id, f"no heartbeat for {self.config.worker_timeout_ms} ms")
            for client_id in list(self.state.clients):
                # A client replayed from the journal has until client_timeout_ms after the start.
                seen = self._client_seen.setdefault(client_id, now)
                if now - seen > self.config.client_timeout_ms / 1000 and client_id in self.state.clients:
                    log.warning("client %d silent for %d ms: releasing it", client_id, self.config.client_timeout_ms)
                    self._event("client_timeout", client_id=client_id)
                    self._release_client(client_id)
            unread_s = self.config.client_timeout_ms / 2000
            for iteration_id, since in list(self._iteration_idle_since.items()):
                iteration = self.state.iterations.get(iteration_id)
                if iteration is None or iteration.finished or iteration.clients or now - since <= unread_s:
                    continue
                for task_id in list(iteration.tasks):
                    task = self.state.tasks[task_id]
                    if not task.revoked and not task.finished:
                        self._revoke_task(task_id, f"nobody has read its iteration for {int(unread_s * 1000)} ms")

    def collect_garbage(self) -> list[int]:
        """``check_liveness``, then collects iterations idle past ``job_gc_timeout_ms`` and prunes
        the jobs nobody can read any more."""
        self.check_liveness()
        collected = []
        with self._cond:
            now = self._clock()
            for iteration in self.state.iterations.values():
                # An iteration already idle when this dispatcher replayed its journal (or idle again
                # after a rollback undid a client's join) was never released here: without this it
                # would never be collected, and a named job on it would never free its name.
                if not iteration.clients and iteration.state is not IterationState.GARBAGE_COLLECTED:
                    self._iteration_idle_since.setdefault(iteration.iteration_id, now)
            for iteration_id, since in list(self._iteration_idle_since.items()):
                iteration = self.state.iterations.get(iteration_id)  # gone if pruned, or rolled back
                if iteration is None or iteration.clients or iteration.state is IterationState.GARBAGE_COLLECTED:
                    self._iteration_idle_since.pop(iteration_id, None)
                    continue
                if now - since > self.config.job_gc_timeout_ms / 1000:
                    self._commit(state_pb2.Update(finish_iteration=state_pb2.FinishIterationUpdate(
                        iteration_id=iteration_id, garbage_collected=True)))
                    self._iteration_idle_since.pop(iteration_id, None)
                    self._event("garbage_collect", iteration_id=iteration_id)
                    log.info("garbage collected iteration %d of job %d", iteration_id, iteration.job_id)
                    collected.append(iteration_id)
            for job in list(self.state.jobs.values()):
                if self._job_collected(job):
                    # Its name (if any) is free again: a new read under it starts a new job.
                    self._prune_job(job)
            for address, worker in list(self.state.workers.items()):
                seen = self._worker_seen.setdefault(address, now)
                if not worker.tasks and now - seen > self.config.job_gc_timeout_ms / 1000:
                    self._commit(state_pb2.Update(prune_worker=state_pb2.PruneWorkerUpdate(worker_address=address)))
                    self._worker_seen.pop(address, None)
                    self._worker_seen_unix.pop(address, None)
                    self.load_reports.forget_worker(address)
                    self._event("prune_worker", worker=address)
                    log.info("worker %s, silent for %d ms and without tasks, left the state", address,
                             self.config.job_gc_timeout_ms)
        return collected

    # --- load: client stats and the scaling signal ------------------------------------
    def client_stats(self) -> list[ClientStats]:
        """Each current client's latest stats report (elements, bytes, stall), by client id. Soft state:
        not journaled, so empty after a restart until the clients' next heartbeats (within a second).

        Example::

            >>> [(c.client_id, round(c.stall_fraction, 2)) for c in core.client_stats()]
            [(1733400000000005, 0.31)]
        """
        with self._cond:
            reports = self._client_reports()
        return sorted(reports, key=lambda c: c.client_id)

    def _client_reports(self, recent_at: Optional[float] = None) -> list[ClientStats]:
        """Under the lock, in no particular order: callers sort after letting it go (sorting 10,000 readers'
        reports there would hold every other call). ``recent_at``: only those reported within the signal's
        window before that time (``LoadReports.recent_clients``)."""
        reports = self.load_reports.client_stats() if recent_at is None else \
            self.load_reports.recent_clients(recent_at)
        # Only clients the state still holds (a journal rollback may undo a join the report outlived).
        clients = self.state.clients
        return [c for c in reports if c.client_id in clients]

    def recommended_workers(self) -> WorkerRecommendation:
        """How many workers the cluster should have, from the clients' recent stall and the live workers'
        busy fraction (``scaling.recommend`` with ``self.scaling_policy``; README: The scaling signal).

        Example::

            >>> core.recommended_workers()
            WorkerRecommendation(count=3, current=2, reason='clients stall 40% of the time and the workers ...')
        """
        with self._cond:
            now = self._clock()
            live = [a for a in self.state.workers if not self._worker_lost(a)]
            loads = [self.load_reports.worker_load(a).busy_fraction for a in live]
            reported = [f for f in loads if f >= 0]
            busy = sum(reported) / len(reported) if reported else None
            stall = max((c.recent_stall_fraction for c in self._client_reports(recent_at=now)), default=None)
            before = self._scaling_state.changed_to
            recommendation, self._scaling_state = scaling.recommend(len(live), stall, busy, now, self._scaling_state,
                                                                    self.scaling_policy)
            if self._scaling_state.changed_to != before and recommendation.count != recommendation.current:
                self._event("recommend_workers", count=recommendation.count, current=recommendation.current,
                            reason=recommendation.reason)
                log.info("recommended workers: %d (now %d): %s", recommendation.count, recommendation.current,
                         recommendation.reason)
            return recommendation

    # --- status -------------------------------------------------------------------
    def get_status(self, req: dispatcher_pb2.GetStatusRequest) -> dispatcher_pb2.GetStatusResponse:
        """What the dispatcher holds: counts of everything, and at most ``max_items`` (default
        STATUS_ITEMS) workers, datasets and jobs (running jobs first, then the most recently
        finished), so the reply stays small however large the cluster or its history."""
        limit = max(0, req.max_items) or STATUS_ITEMS
        with self._cond:
            s = self.state
            workers = []
            for w in itertools.islice(s.workers.values(), limit):
                unfinished = sorted(t for t in w.tasks if not s.tasks[t].finished)
                workers.append(dispatcher_pb2.WorkerStatus(
                    address=w.address, last_heartbeat_unix=self._worker_seen_unix.get(w.address, 0.0),
                    tasks=unfinished[:limit], num_tasks=len(unfinished), tags=w.tags, host_id=w.host_id))
                busy = self.load_reports.worker_load(w.address).busy_fraction
                if busy >= 0:
                    workers[-1].busy_fraction = busy
            datasets = [dispatcher_pb2.DatasetStatus(dataset_id=d.dataset_id, fingerprint=d.fingerprint,
                                                     num_splits=d.num_splits, size_bytes=len(d.dataset_def),
                                                     dataset_names=d.names[:limit])
                        for d in itertools.islice(reversed(s.datasets.values()), limit)]
            running, finished = [], []
            for job in s.jobs.values():
                iterations = [s.iterations[i] for i in job.iterations.values()]
                done = bool(iterations) and all(i.finished for i in iterations)
                (finished if done else running).append((job, iterations, done))
            jobs = []
            for job, iterations, done in running[:limit] + finished[::-1][:max(0, limit - len(running))]:
                jobs.append(dispatcher_pb2.JobStatus(
                    job_id=job.job_id, job_name=job.name, dataset_id=job.dataset_id,
                    processing_mode=job.processing_mode, finished=done,
                    num_clients=sum(len(i.clients) for i in iterations),
                    iterations=[i.iteration_id for i in iterations][-limit:],
                    garbage_collected=any(i.state is IterationState.GARBAGE_COLLECTED for i in iterations),
                    num_consumers=job.num_consumers, cross_trainer_cache=job.cross_trainer_cache,
                    target_workers=job.target_workers, dataset_name=job.dataset_name))
            counts = dispatcher_pb2.StatusCounts(
                workers=len(s.workers), datasets=len(s.datasets), jobs=len(s.jobs), iterations=len(s.iterations),
                tasks=len(s.tasks), clients=len(s.clients), jobs_finished=len(finished) + s.jobs_pruned,
                jobs_pruned=s.jobs_pruned)
            reports = self._client_reports()
        # The most stalled clients first: they are the ones to look at. Ranked after the lock is let go.
        clients = [dispatcher_pb2.ClientStatus(
            client_id=c.client_id, job_id=c.job_id, iteration_id=c.iteration_id, elements=c.elements,
            bytes=c.bytes, stall_s=c.stall_s, elapsed_s=c.elapsed_s, stall_fraction=c.stall_fraction,
            last_report_unix=c.last_report_unix, job_name=c.job_name)
            for c in heapq.nsmallest(limit, reports, key=lambda c: (-c.stall_fraction, c.client_id))]
        recommendation = self.recommended_workers()
        latency = [dispatcher_pb2.RpcLatency(method=m.method, calls=m.calls, p50_ms=m.p50_ms, p99_ms=m.p99_ms,
                                             max_ms=m.max_ms) for m in self.rpc_stats.summary()]
        return dispatcher_pb2.GetStatusResponse(workers=workers, datasets=datasets, jobs=jobs,
                                                dispatcher_incarnation=self.incarnation, counts=counts,
                                                rpc_latency=latency, clients=clients,
                                                scaling=dispatcher_pb2.ScalingStatus(
                                                    count=recommendation.count, current=recommendation.current,
                                                    reason=recommendation.reason))


#: The longest worker address accepted: a host name is at most 253 characters, plus ":port".
MAX_WORKER_ADDRESS_CHARS = 260


def _check_worker_address(address: str, field: str) -> None:
    """A worker's addresses reach every client and the journal: each must be a plausible host:port."""
    if not address:
        raise errors.InvalidRequestError(f"WorkerHeartbeat: {field} is empty")
    if len(address) > MAX_WORKER_ADDRESS_CHARS:
        raise errors.InvalidRequestError(f"WorkerHeartbeat: {field} has {len(address)} characters, more than "
                                         f"{MAX_WORKER_ADDRESS_CHARS}")
    try:
        parse_address(address, "worker")
    except ValueError as exc:
        raise errors.InvalidRequestError(f"WorkerHeartbeat: {field}: {exc}") from None


def _check_worker_labels(req: dispatcher_pb2.WorkerHeartbeatRequest) -> None:
    """The worker's tags and host id, by the checks WorkerConfig makes on the worker's side: this bounds what a
    heartbeat puts in the journal and in every task definition."""
    problem = worker_tags_problem(req.worker_tags)
    if problem is not None:
        raise errors.InvalidRequestError(f"WorkerHeartbeat: worker_tags: {problem}: a worker has {WORKER_TAG_RULE}")
    if req.host_id:  # "": a worker that does not say
        try:
            check_host_id(req.host_id, "host_id")
        except ValueError as exc:
            raise errors.InvalidRequestError(f"WorkerHeartbeat: {exc}") from None


def _worker_fields(worker) -> dict:
    """What a reader needs to know of a task's worker to choose whether to read it (target_workers)."""
    return {"worker_tags": worker.tags, "worker_host_id": worker.host_id, "worker_uid": worker.uid}


#: A heartbeat's new ranges are recorded this many at a time (each slice holds the lock for milliseconds).
PROGRESS_PIECE_RANGES = 32_768
#: A heartbeat of at most this many ranges is recorded as it is, in one pass under the lock: working out what
#: is new outside it would cost a second pass under the lock, to copy what is held, for nothing.
SMALL_PROGRESS_RANGES = 1_024


def _progress_pieces(progress: list) -> list[list]:
    """``progress`` (SplitProgress) cut into slices of at most PROGRESS_PIECE_RANGES ranges, in order; a split's
    total goes with its last slice. One slice (or none) for the usual small heartbeat."""
    if sum(len(p.ranges) for p in progress) <= 2 * PROGRESS_PIECE_RANGES:
        return [progress] if progress else []
    pieces: list[list] = [[]]
    room = PROGRESS_PIECE_RANGES
    for p in progress:
        flat = list(p.ranges)
        at = 0
        while True:
            take = min(len(flat) - at, 2 * room)
            last = at + take == len(flat)
            pieces[-1].append(state_pb2.SplitProgress(stream_id=p.stream_id, split_index=p.split_index,
                                                      ranges=flat[at:at + take], total=p.total if last else -1))
            at += take
            room -= take // 2
            if room == 0:
                pieces.append([])
                room = PROGRESS_PIECE_RANGES
            if last:
                break
    return [piece for piece in pieces if piece]


def _next_new_split(iteration, split: int) -> int:
    """The first split from ``split`` on that is not done: a restored read's groups taken before its state
    was saved are done from the start."""
    while (0, split) in iteration.done:
        split += 1
    return split


def _held_ranges(iteration, key: tuple) -> list[int]:
    """What clients hold of split ``key`` (stream, split) of ``iteration``, as flat offset ranges."""
    held = iteration.progress.get(key)
    return held.flat() if held else []
