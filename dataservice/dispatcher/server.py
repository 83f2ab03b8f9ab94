"""``DispatchServer``: the dispatcher process's entry point, as in tf.data service.

Example::

    >>> dispatcher = DispatchServer(DispatcherConfig(port=0))
    >>> dispatcher.target
    'grpc://localhost:40123'
    >>> dispatcher.stop()

With ``fault_tolerant_mode=True`` the state is journaled to ``work_dir``
(``journaled_store.py``) and replayed before the port is bound, so a restarted
dispatcher answers with the state it had::

    >>> DispatchServer(DispatcherConfig(port=5050, work_dir="/var/lib/ds", fault_tolerant_mode=True))
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional

from dataservice.dispatcher.collector_pauses import watch_full_collections
from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.grpc_service import add_dispatcher_service
from dataservice.dispatcher.journaled_store import JournaledStore
from dataservice.dispatcher.metrics import DispatcherMetrics
from dataservice.service.config import DispatcherConfig
from dataservice.service.lifecycle import Stage, stop_at_exit
from dataservice.service.auth import ClusterAuth, warn_if_exposed
from dataservice.service.config import bind_address
from dataservice.service.http_status import HttpStatusServer
from dataservice.service.listening import log_listening, note_loopback_only, tls_note
from dataservice.service.aio_rpc import create_aio_server
from prometheus_client import CollectorRegistry

__all__ = ["DispatchServer"]

log = logging.getLogger("dataservice.dispatcher")


class DispatchServer:
    """An in-process dispatcher. ``start=False`` defers binding until ``start()``."""

    def __init__(self, config: Optional[DispatcherConfig] = None, start: bool = True):
        self._config = config or DispatcherConfig()
        if not isinstance(self._config, DispatcherConfig):
            raise TypeError(f"config must be a DispatcherConfig, got {type(self._config).__name__}")
        self._core: Optional[DispatcherCore] = None
        self._store: Optional[JournaledStore] = None
        self._server = None
        self._port: Optional[int] = None
        self._stopped = threading.Event()
        self._gc_thread: Optional[threading.Thread] = None
        self._http: Optional[HttpStatusServer] = None
        if start:
            self.start()

    @property
    def config(self) -> DispatcherConfig:
        return self._config

    @property
    def core(self) -> DispatcherCore:
        """The dispatcher's logic and state (for tests and the status page)."""
        if self._core is None:
            raise RuntimeError("the dispatcher has not been started")
        return self._core

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the dispatcher has not been started")
        return self._port

    @property
    def target(self) -> str:
        """The address clients pass as ``service``: ``grpc://localhost:PORT``."""
        return f"grpc://localhost:{self.port}"

    @property
    def http_port(self) -> int:
        """The port of /metrics, /status.json and the status page (``DispatcherConfig.http_port``)."""
        if self._http is None:
            raise RuntimeError("the dispatcher serves no HTTP: set DispatcherConfig.http_port (--http-port)")
        return self._http.port

    def start(self) -> None:
        """Binds the port and starts serving; idempotent."""
        if self._server is not None:
            return
        watch_full_collections()  # a collection's pause, named on /metrics, tells late heartbeats' cause
        store = self._open_store() if self._config.fault_tolerant_mode else None
        try:
            core = DispatcherCore(self._config, store=store)
            server, port = create_aio_server(bind_address(self._config.host, self._config.port),
                                         services=("dataservice.Dispatcher",), auth=ClusterAuth.of(self._config),
                                         what="the dispatcher", tls=self._config.tls)
        except BaseException:
            if store is not None:
                store.close()
            raise
        if self._config.http_port is not None:
            try:
                registry = CollectorRegistry()
                metrics = DispatcherMetrics(core)
                registry.register(metrics)
                http = HttpStatusServer(self._config.host, self._config.http_port, registry, metrics.status,
                                        what="the dispatcher")
                http.start()
            except BaseException:
                server.stop(None)
                if store is not None:
                    store.close()
                raise
            self._http = http
        self._core, self._store = core, store
        add_dispatcher_service(server, core)
        server.start()
        self._server, self._port = server, port
        self._stopped.clear()
        self._gc_thread = threading.Thread(target=self._gc_loop, name="dataservice-dispatcher-gc", daemon=True)
        self._gc_thread.start()
        stop_at_exit(self.stop, Stage.DISPATCHERS)
        warn_if_exposed(self._config, "dispatcher", port)
        tls = tls_note(self._config.tls)
        log_listening(log, "dispatcher listening on %s%s", bind_address(self._config.host, port),
                      f" ({tls})" if tls else "")
        note_loopback_only(log, "dispatcher", self._config.host, bind_address(self._config.host, port))

    def _open_store(self) -> JournaledStore:
        """Replays the journal before anything is served. JournalError naming ``work_dir`` if it
        cannot be written; JournalCorruptionError naming file and offset if it is corrupted."""
        store = JournaledStore(self._config.work_dir, recover=self._config.recover_journal,
                               checkpoint_records=self._config.journal_checkpoint_records)
        try:
            store.open()
        except BaseException:
            store.close()
            raise
        log.info("fault-tolerant mode: replayed %d updates from %s in %.3f s (%d datasets, %d jobs, %d workers)",
                 store.replayed_updates, self._config.work_dir, store.replay_seconds, len(store.state.datasets),
                 len(store.state.jobs), len(store.state.workers))
        return store

    def _gc_loop(self) -> None:
        # Silent workers and clients are noticed on their own clock (every second at most: see
        # DispatcherCore.liveness_interval_s), not only when the garbage collector runs.
        core = self.core
        gc_interval = self._config.job_gc_check_interval_ms / 1000
        next_gc = time.monotonic() + gc_interval
        while not self._stopped.wait(min(core.liveness_interval_s(), max(0.0, next_gc - time.monotonic()))):
            try:
                if time.monotonic() >= next_gc:
                    next_gc = time.monotonic() + gc_interval
                    core.collect_garbage()
                else:
                    core.check_liveness()
                core.wait_durable()
            except Exception:  # keep collecting; a bug here must not stop the dispatcher
                log.exception("garbage collection failed")

    def join(self) -> None:
        """Blocks until the server stops."""
        if self._server is not None:
            self._server.wait_for_termination()

    def stop(self, grace_s: float = 0.5) -> None:
        """Stops serving; in-flight RPCs get ``grace_s`` seconds to finish."""
        self._stopped.set()
        if self._http is not None:
            self._http.stop()
            self._http = None
        if self._server is not None:
            self._server.stop(grace_s).wait()
            self._server = None
        if self._gc_thread is not None:
            self._gc_thread.join(timeout=5)
            self._gc_thread = None
        if self._store is not None:
            self._store.close()  # after the last RPC: what they committed is written
            self._store = None

    def __enter__(self) -> "DispatchServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
