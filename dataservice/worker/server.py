"""``WorkerServer``: serves elements and heartbeats the dispatcher, as in tf.data service.

The heartbeat is a long poll: the worker tells the dispatcher which tasks it
holds and which have finished, and the dispatcher answers as soon as it has a
new task for it (or after ``heartbeat_interval_ms``), so a new job starts
without waiting for a heartbeat period.

A task announced by the dispatcher runs only once a reader asks for its elements
(see ``task_runner``), and what all tasks buffer ahead of their readers stays
within ``WorkerConfig.memory_budget_bytes`` (``memory_budget``). A task the
dispatcher deletes is stopped at once and its buffer dropped.

Example::

    >>> worker = WorkerServer(WorkerConfig(dispatcher_address="localhost:5050"))
    >>> worker.join()
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
import uuid
from typing import NamedTuple, Optional

from prometheus_client import CollectorRegistry

from dataservice import errors
from dataservice.data.serialization import deserialize_dataset
from dataservice.data import static_sharding
from dataservice.proto import dispatcher_pb2
from dataservice.service.config import WorkerConfig
from dataservice.service import dispatcher_client
from dataservice.service.addresses import channel_address
from dataservice.service.dispatcher_client import DispatcherClient, status_hint
from dataservice.service.lifecycle import Stage, stop_at_exit
from dataservice.service.auth import ClusterAuth, warn_if_exposed
from dataservice.service.config import bind_address
from dataservice.service.host_identity import host_id
from dataservice.service.http_status import HttpStatusServer
from dataservice.service.listening import log_listening, note_loopback_only
from dataservice.service.rpc import create_server
from dataservice.worker.data_server import DataServer
from dataservice.worker import local_workers
from dataservice.worker.grpc_service import add_worker_service
from dataservice.worker.memory_budget import MemoryBudget
from dataservice.worker.metrics import ProductionCounters, WorkerMetrics
from dataservice.worker.save_runner import SaveRunner
from dataservice.worker.task_runner import TaskRunner
from dataservice.worker.trainer_cache import TrainerCache
from dataservice.worker import round_robin, shared_batches

__all__ = ["WorkerServer"]

log = logging.getLogger("dataservice.worker")

#: Loaded pipelines a worker keeps for tasks to come; another task of an evicted one downloads it again.
DATASETS_CACHED = 64
#: How long ``start()`` waits for the first heartbeat before carrying on in the background.
FIRST_HEARTBEAT_WAIT_S = 5.0
#: After two answers with news in a row (within this time of each other), how long the next heartbeat
#: waits: iterations created in a burst then arrive together rather than one heartbeat each (a full-list
#: heartbeat, after a resync, lists all our tasks: one per task would cost the dispatcher time quadratic
#: in the burst). A lone piece of news is followed by a poll at once: an epoch's end (its tasks deleted)
#: is followed by the next epoch's tasks, which would otherwise wait out the pause.
NEWS_COALESCE_S = 0.02


def news_pause_s(now: float, last_news_at: float) -> float:
    """How long a worker waits before its next heartbeat, after an answer with news at ``now`` (monotonic);
    the answer before with news came at ``last_news_at`` (after the pause that followed it, if any).

    A lone piece of news (an epoch's end, the next epoch's tasks) is followed by a poll at once; news again
    within ``NEWS_COALESCE_S`` is a burst, and the worker lets the rest of it gather.

    Example::

        >>> news_pause_s(100.0, 50.0), news_pause_s(100.0, 99.995)
        (0.0, 0.02)
    """
    return NEWS_COALESCE_S if now - last_news_at < NEWS_COALESCE_S else 0.0


class _UnloadablePipeline:
    """Stands in for a pipeline this worker cannot deserialize (a module it lacks, other
    versions than the client's). Its task fails with the load error as soon as it is read, so
    readers learn why, with this worker's address, and the task ends; otherwise the worker would
    retry the load on every heartbeat while readers wait for a task that never starts."""

    def __init__(self, exc: errors.WorkerEnvironmentError):
        self._exc = exc

    def _root_iterator(self, split_provider, split_hint=None):
        raise self._exc


class _Reported(NamedTuple):
    """What one heartbeat told the dispatcher of our tasks."""
    seq: int
    tasks: frozenset
    finished: frozenset


class WorkerServer:
    """An in-process worker. ``start=False`` defers binding until ``start()``."""

    def __init__(self, config: WorkerConfig, start: bool = True):
        if not isinstance(config, WorkerConfig):
            raise TypeError(f"config must be a WorkerConfig, got {type(config).__name__}")
        self._config = config
        self._server = None
        self._port: Optional[int] = None
        self.address = ""
        self._uid = ""
        self._tasks: dict[int, TaskRunner] = {}
        #: distributed_save runs this worker writes chunks for, by save id (see save_runner).
        self._saves: dict[int, SaveRunner] = {}
        # Loaded pipelines by dataset id, most recently used last: a worker that runs for months
        # sees many pipelines come and go, so only DATASETS_CACHED stay.
        self._datasets: collections.OrderedDict[int, object] = collections.OrderedDict()
        #: What all tasks buffer ahead of their readers, together (``WorkerConfig.memory_budget_bytes``).
        self.memory_budget = MemoryBudget(config.memory_budget_bytes)
        self._cond = threading.Condition()
        self._stopped = threading.Event()
        self._registered = threading.Event()
        #: Whether the dispatcher was said to be unreachable since the last heartbeat it answered.
        self._unreachable_said = False
        self._dispatcher_incarnation = ""
        #: The host readers compare theirs with (target_workers): the config's, else this process's.
        self._host_id = config.host_id or host_id()
        self._data_server: Optional[DataServer] = None
        # Large batches built in shared memory, for readers on this host (tcp data transfer only).
        self._shared_batches: Optional[shared_batches.SharedBatches] = None
        self.data_address = ""
        self._dispatcher: Optional[DispatcherClient] = None
        self._heartbeat_thread: Optional[threading.Thread] = None
        # The load report's baseline (_load_report): each task's load_counters() at the last heartbeat.
        self._load_seen: dict[int, tuple[float, float]] = {}
        self._load_reported_at = time.monotonic()
        # Task deltas (WorkerHeartbeatRequest.tasks_delta in dispatcher.proto): the seq of the last heartbeat
        # sent, and what the last answered one reported (its seq, tasks and finished tasks); None: the next
        # heartbeat sends the full list.
        self._heartbeat_seq = 0
        self._answered: Optional[_Reported] = None
        self._sent: Optional[_Reported] = None
        #: What the tasks hand to readers, per job and in all (``worker/metrics.py``; /metrics).
        self.production = ProductionCounters()
        self._http: Optional[HttpStatusServer] = None
        if start:
            self.start()

    @property
    def config(self) -> WorkerConfig:
        return self._config

    @property
    def uid(self) -> str:
        """This run's id (new at each start): how the dispatcher tells a restart, and readers in this
        process tell their tasks of it (``local_workers``)."""
        return self._uid

    @property
    def dispatcher_address(self) -> str:
        return self._config.dispatcher_address

    @property
    def dispatcher_incarnation(self) -> str:
        """The incarnation of the dispatcher this worker last heard from ("" before its first heartbeat)."""
        return self._dispatcher_incarnation

    @property
    def http_port(self) -> int:
        """The port of /metrics, /status.json and the status page (``WorkerConfig.http_port``)."""
        if self._http is None:
            raise RuntimeError("the worker serves no HTTP: set WorkerConfig.http_port (--http-port)")
        return self._http.port

    def task_runners(self) -> list[TaskRunner]:
        """The tasks this worker holds now (for the metrics and the status page)."""
        with self._cond:
            return list(self._tasks.values())

    def loaded_pipelines(self) -> dict[int, object]:
        """The pipelines loaded here, by dataset id: the cached ones and those of the current tasks."""
        with self._cond:
            pipelines = dict(self._datasets)
            runners = list(self._tasks.values())
        for runner in runners:
            pipelines.setdefault(runner.task_def.dataset_id, runner._dataset)
        return pipelines

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the worker has not been started")
        return self._port

    def start(self) -> None:
        """Binds the port, starts serving and heartbeating; idempotent."""
        if self._server is not None:
            return
        self._auth = ClusterAuth.of(self._config)
        tls = self._config.tls
        server_tls = tls if tls is not None and tls.serves else None
        server, port = create_server(bind_address(self._config.host, self._config.port),
                                     services=("dataservice.Worker",), auth=self._auth, what="the worker",
                                     tls=server_tls)
        self._port = port
        self.address = self._config.worker_address.replace("%port%", str(port))
        self._uid = uuid.uuid4().hex
        add_worker_service(server, self)
        if self._config.http_port is not None:
            registry = CollectorRegistry()
            metrics = WorkerMetrics(self)
            registry.register(metrics)
            http = HttpStatusServer(self._config.host, self._config.http_port, registry, metrics.status,
                                    what="the worker")
            try:
                http.start()
            except BaseException:
                server.stop(None)
                raise
            self._http = http
        server.start()
        self._server = server
        self.data_address = ""
        if self._config.data_transfer_protocol == "tcp":
            config = self._config
            try:
                self._shared_batches = shared_batches.process_pool(config.shared_batch_bytes)
                self._data_server = DataServer(self, host=config.host, port=config.data_transfer_port,
                                               auth=self._auth, tls=server_tls,
                                               idle_timeout_s=config.data_idle_timeout_ms / 1000,
                                               request_timeout_s=config.data_request_timeout_ms / 1000,
                                               max_connections=config.data_max_connections,
                                               shared_batches=self._shared_batches)
            except BaseException:  # its port taken, say: free the gRPC and HTTP ports bound above
                self.stop(grace_s=0)
                raise
            self._data_server.start()
            host = self.address.rsplit(":", 1)[0]
            self.data_address = f"{host}:{self._data_server.port}"
        self._stopped.clear()
        self._dispatcher = DispatcherClient(self._config.dispatcher_address, auth=self._auth,
                                            tls=None if tls is None else tls.as_client(),
                                            timeout_ms=self._config.dispatcher_timeout_ms,
                                            should_stop=self._stopped.is_set,
                                            on_unreachable=self._dispatcher_unreachable)
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="dataservice-worker-heartbeat",
                                                  daemon=True)
        self._heartbeat_thread.start()
        local_workers.register(self)  # readers in this process read it without RPC from now on
        stop_at_exit(self.stop, Stage.WORKERS)
        warn_if_exposed(self._config, "worker", port)
        log_listening(log, "worker listening on port %d as %s; dispatcher %s", port, self.address,
                      self._config.dispatcher_address)
        note_loopback_only(log, "worker", self._config.host, bind_address(self._config.host, port))
        self._registered.wait(FIRST_HEARTBEAT_WAIT_S)

    # --- tasks --------------------------------------------------------------------
    def find_task(self, task_id: int, wait_s: float) -> Optional[TaskRunner]:
        """The task, waiting up to ``wait_s`` for the dispatcher's announcement of it to arrive."""
        with self._cond:
            self._cond.wait_for(lambda: task_id in self._tasks or self._stopped.is_set(), timeout=wait_s)
            return self._tasks.get(task_id)

    @property
    def task_ids(self) -> list[int]:
        with self._cond:
            return sorted(self._tasks)

    def _start_tasks(self, task_defs) -> None:
        """Adds the tasks of one heartbeat answer (thousands, when many iterations were created at
        once): each costs an idle ``TaskRunner``, its pipeline loaded once per dataset."""
        # A pipeline that failed to load, or to download, is tried once per answer, not once per
        # task of it: the next answer tries again (the worker's environment may have been fixed,
        # the dispatcher reached). A task skipped here comes again, as we do not list it as ours.
        unloadable: dict[int, _UnloadablePipeline] = {}
        not_downloaded: set[int] = set()
        runners = []
        for task_def in task_defs:
            if task_def.dataset_id in not_downloaded:
                continue
            try:
                dataset = self._datasets.get(task_def.dataset_id)
                if dataset is not None:
                    self._datasets.move_to_end(task_def.dataset_id)
                if dataset is None:
                    dataset = unloadable.get(task_def.dataset_id)
                if dataset is None:
                    try:
                        blob = self._dispatcher.get_dataset_def(task_def.dataset_id)
                    except errors.DataServiceError as exc:
                        if self._stopped.is_set():
                            return  # stopping: the channel was closed under the call
                        not_downloaded.add(task_def.dataset_id)
                        log.warning("cannot download the pipeline of dataset %d for task %d (tried again at the "
                                    "next heartbeat): %s", task_def.dataset_id, task_def.task_id, exc)
                        continue
                    dataset = self._load_dataset(task_def, blob)
                    if isinstance(dataset, _UnloadablePipeline):
                        unloadable[task_def.dataset_id] = dataset
                if not task_def.read_key:
                    log.warning("task %d (iteration %d) has no read key: its iteration was created by a dispatcher "
                                "without read keys (replayed from an old journal), so this worker serves its "
                                "elements to any client that asks", task_def.task_id, task_def.iteration_id)
                # Static sharding: the task runs this worker's shard of the pipeline (data/static_sharding.py).
                runner = TaskRunner(task_def, static_sharding.for_task(dataset, task_def), self._dispatcher,
                                    self.address, budget=self.memory_budget, start=False, counters=self.production,
                                    shared_batches=self._shared_batches)
                if task_def.cross_trainer_cache or task_def.num_readers:
                    # Its trainers share its elements through a window of the task's own (responses.take); elastic
                    # readers through one that keeps each element until every reader has read it.
                    runner.trainer_cache = TrainerCache(runner, self.config.cross_trainer_cache_size_bytes,
                                                        self.memory_budget, readers=task_def.num_readers)
                if task_def.num_consumers > 0:
                    # Coordinated reads: its consumers read it in rounds (round_robin, responses.take).
                    runner.rounds = round_robin.Rounds(runner, task_def.num_consumers, self.memory_budget)
                runners.append(runner)
            except Exception:
                log.exception("cannot start task %d", task_def.task_id)
        if not runners:
            return
        with self._cond:
            if self._stopped.is_set():
                for runner in runners:
                    runner.stop()  # stop() ran meanwhile: these would never be stopped
                return
            for runner in runners:
                self._tasks[runner.task_id] = runner
            self._cond.notify_all()
        if len(runners) <= 8:
            for runner in runners:
                log.info("added task %d (iteration %d, dataset %d); it starts when read", runner.task_id,
                         runner.task_def.iteration_id, runner.task_def.dataset_id)
        else:
            log.info("added %d tasks (ids %d ... %d); each starts when read", len(runners), runners[0].task_id,
                     runners[-1].task_id)

    def _load_dataset(self, task_def: dispatcher_pb2.TaskDef, blob: bytes):
        """The task's pipeline from its serialized form, cached by dataset; one that cannot be
        deserialized here becomes an ``_UnloadablePipeline`` (not cached)."""
        try:
            dataset = deserialize_dataset(blob)
        except errors.WorkerEnvironmentError as exc:
            log.warning("task %d: cannot load the pipeline of dataset %d: %s", task_def.task_id,
                        task_def.dataset_id, exc)
            return _UnloadablePipeline(exc)
        self._datasets[task_def.dataset_id] = dataset
        while len(self._datasets) > DATASETS_CACHED:
            self._datasets.popitem(last=False)  # running tasks keep their own reference
        return dataset

    def _delete_task(self, task_id: int) -> None:
        with self._cond:
            runner = self._tasks.pop(task_id, None)
        if runner is not None:
            runner.stop()
            log.info("deleted task %d", task_id)

    # --- distributed_save ------------------------------------------------------------
    def _update_saves(self, save_defs) -> None:
        """Starts a runner for each save being written that has none running here; cancels those of saves
        that ended. A runner that ended (no group free then) is started again while its save goes on: a lost
        worker's groups may have come back."""
        announced = {d.save_id: d for d in save_defs}
        with self._cond:
            if self._stopped.is_set():
                return
            for save_id in [i for i in self._saves if i not in announced]:
                self._saves.pop(save_id).cancel()
            for save_id, save_def in announced.items():
                runner = self._saves.get(save_id)
                if runner is None or not runner.alive:
                    runner = self._saves[save_id] = SaveRunner(save_def, self._save_dataset, self._dispatcher,
                                                               self.address)
                    runner.start()

    def _save_dataset(self, dataset_id: int):
        """A save's pipeline, from the cache or downloaded (on the save's thread)."""
        with self._cond:
            dataset = self._datasets.get(dataset_id)
        if dataset is None:
            dataset = deserialize_dataset(self._dispatcher.get_dataset_def(dataset_id))
            with self._cond:
                self._datasets[dataset_id] = dataset
                while len(self._datasets) > DATASETS_CACHED:
                    self._datasets.popitem(last=False)
        return dataset

    # --- heartbeats -----------------------------------------------------------------
    def _heartbeat_request(self, wait_ms: int) -> dispatcher_pb2.WorkerHeartbeatRequest:
        """The next heartbeat: what changed in our tasks since the last answered one (a delta), or the full
        list when there is none to build on (the first, after a failed call, a dispatcher restart, a resync)."""
        with self._cond:
            runners = list(self._tasks.values())
            saves = sorted(self._saves)
        self._heartbeat_seq += 1
        tasks = frozenset(r.task_id for r in runners)
        finished = frozenset(r.task_id for r in runners if r.finished)
        self._sent = _Reported(self._heartbeat_seq, tasks, finished)
        base = self._answered
        if base is None:
            listed = dict(current_tasks=[r.task_id for r in runners], finished_tasks=sorted(finished))
        else:
            # The dispatcher applied the base heartbeat's finished tasks: only those finished since are news.
            listed = dict(tasks_delta=True, base_seq=base.seq, added_tasks=sorted(tasks - base.tasks),
                          removed_tasks=sorted(base.tasks - tasks), finished_tasks=sorted(finished - base.finished))
        return dispatcher_pb2.WorkerHeartbeatRequest(
            worker_address=self.address, worker_uid=self._uid, heartbeat_seq=self._heartbeat_seq, wait_ms=wait_ms,
            data_address=self.data_address, current_saves=saves, load=self._load_report(runners),
            worker_tags=self._config.worker_tags, host_id=self._host_id, **listed)

    def _load_report(self, runners: list) -> dispatcher_pb2.WorkerLoadReport:
        """How busy the tasks' producers were since the previous heartbeat (the dispatcher's scaling
        signal): per task the growth of its ``load_counters()``, summed. A task deleted in between
        takes its last interval with it."""
        now = time.monotonic()
        seen, busy, blocked, running = {}, 0.0, 0.0, 0
        for runner in runners:
            ran, was_blocked = seen[runner.task_id] = runner.load_counters()
            ran_before, blocked_before = self._load_seen.get(runner.task_id, (0.0, 0.0))
            d_ran, d_blocked = ran - ran_before, max(0.0, was_blocked - blocked_before)
            if d_ran > 0:
                running += 1
                busy += max(0.0, d_ran - d_blocked)
                blocked += min(d_blocked, d_ran)
        self._load_seen = seen
        interval, self._load_reported_at = now - self._load_reported_at, now
        return dispatcher_pb2.WorkerLoadReport(interval_us=int(interval * 1e6), busy_us=int(busy * 1e6),
                                               blocked_us=int(blocked * 1e6), running_tasks=running)

    def _dispatcher_unreachable(self, cause: str, seconds: float) -> None:
        """Told by the DispatcherClient, at a bounded rate, while calls do not reach the dispatcher."""
        self._unreachable_said = True
        address = channel_address(self._config.dispatcher_address, "dispatcher")
        log.warning("worker %s cannot reach its dispatcher at %s for %.1f s: %s. Is the dispatcher running, and is "
                    "--dispatcher its address? Check with: %s. Still trying (said again every %.0f s until it "
                    "answers)", self.address, address, seconds, cause, status_hint(address),
                    dispatcher_client.UNREACHABLE_NOTICE_INTERVAL_S)

    def _heartbeat_loop(self) -> None:
        wait_ms = 0  # the first heartbeat registers at once
        self._answered = None  # a (re)started worker's first heartbeat lists all its tasks
        backoff = 0.1
        last_failure = ""
        registered = False
        self._unreachable_said = False
        news_at = -math.inf  # when the last answer with news came (monotonic)
        while not self._stopped.is_set():
            try:
                sent = time.monotonic()
                request = self._heartbeat_request(wait_ms)
                response = self._dispatcher.worker_heartbeat(request)
            except errors.DataServiceError as exc:
                # The dispatcher may or may not have applied it: the next heartbeat lists all our tasks.
                self._answered = None
                if self._stopped.is_set():
                    return
                # An unreachable dispatcher is said by _dispatcher_unreachable, at a bounded rate. Anything
                # else is said once while it stays the same (say, --dispatcher names a worker).
                message = f"{type(exc).__name__}: {exc}"
                if message != last_failure and not isinstance(exc, errors.ServiceUnavailableError):
                    log.warning("heartbeat to dispatcher %s failed: %s", self._config.dispatcher_address, exc)
                    last_failure = message
                self._stopped.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if not registered:
                registered = True
                log.info("worker %s registered with the dispatcher at %s", self.address,
                         self._config.dispatcher_address)
            elif last_failure or self._unreachable_said:
                log.info("dispatcher %s reached again", self._config.dispatcher_address)
            last_failure = ""
            self._unreachable_said = False
            backoff = 0.1
            self._registered.set()
            # Our tasks as the dispatcher now knows them: the base of the next delta.
            self._answered = self._sent
            if response.dispatcher_incarnation != self._dispatcher_incarnation:
                if self._dispatcher_incarnation:
                    self._answered = None  # a new dispatcher: it knows nothing of our deltas
                    # Said once per restart: a fault-tolerant dispatcher carries on with our tasks;
                    # one without fault tolerance tells us to drop them (tasks_to_delete).
                    log.info("dispatcher %s restarted (incarnation %s -> %s)", self._config.dispatcher_address,
                             self._dispatcher_incarnation[:8], response.dispatcher_incarnation[:8])
                self._dispatcher_incarnation = response.dispatcher_incarnation
            if response.resync_tasks:
                # The dispatcher could not apply our delta and did nothing else (its saves are not in the
                # answer): the full list at once.
                self._answered = None
                wait_ms = self._config.heartbeat_interval_ms
                if request.tasks_delta:
                    continue
                self._stopped.wait(max(0.0, wait_ms / 2000 - (time.monotonic() - sent)))
                continue
            self._start_tasks(response.new_tasks)
            self._update_saves(response.saves)
            for task_id in response.tasks_to_delete:
                self._delete_task(task_id)
            asked_ms = wait_ms
            wait_ms = self._config.heartbeat_interval_ms
            if response.new_tasks or response.tasks_to_delete:
                self._stopped.wait(news_pause_s(time.monotonic(), news_at))
                news_at = time.monotonic()  # after the pause: news at once after it is the burst going on
            else:
                # Answered early without news: a dispatcher of an older version, on a thread-per-call server,
                # had no long-poll slot free (ours wait on asyncio: dispatcher/long_polls.py). Pause here rather
                # than ask again at once; half the interval at most, so a dispatcher that cut a long wait short
                # never sees us silent for longer.
                self._stopped.wait(max(0.0, asked_ms / 2000 - (time.monotonic() - sent)))

    # --- lifecycle -------------------------------------------------------------------
    def join(self) -> None:
        """Blocks until the server stops."""
        if self._server is not None:
            self._server.wait_for_termination()

    def stop(self, grace_s: float = 0.5) -> None:
        """Stops serving and heartbeating; running tasks end."""
        local_workers.unregister(self)
        self._stopped.set()
        if self._http is not None:
            self._http.stop()
            self._http = None
        with self._cond:
            runners = list(self._tasks.values())
            self._tasks.clear()
            save_runners = list(self._saves.values())
            self._saves.clear()
            self._cond.notify_all()
        for runner in runners:
            runner.stop()
        for save_runner in save_runners:
            save_runner.cancel()
        if self._data_server is not None:
            self._data_server.stop()
            self._data_server = None
        if self._server is not None:
            self._server.stop(grace_s).wait()
            self._server = None
        if self._dispatcher is not None:
            self._dispatcher.close()  # cancels a heartbeat long poll in flight
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join(timeout=15)
            self._heartbeat_thread = None
        self._dispatcher = None

    def __enter__(self) -> "WorkerServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
