"""A worker's part in a ``distributed_save``: lease a split group, write its chunk, report it, repeat.

The dispatcher announces the saves being written in its heartbeat answers; a worker runs one
``SaveRunner`` thread per save. Each round the runner leases a group (``LeaseSaveGroup``), runs the
pipeline over the group's splits as a distributed_epoch task does (``Dataset.split_groups``: a
seeded shuffle keyed on the group), writes the elements to ``path/uncommitted/<group>-<attempt>``
with ``ChunkWriter`` (made visible by a rename only once complete), and reports it
(``ReportSaveChunk``). The dispatcher commits the first complete chunk of each group; a worker killed
mid-chunk leaves at most a temporary file, and its group goes to another worker.

Example::

    >>> runner = SaveRunner(save_def, load_dataset, dispatcher_client, "w1:6000")
    >>> runner.start()       # returns at once; the thread ends when the save has nothing left for it
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from dataservice import errors
from dataservice.data import save_format
from dataservice.dispatcher import saves
from dataservice.proto import dispatcher_pb2
from dataservice.service.dispatcher_client import DispatcherClient

__all__ = ["SaveRunner", "MAX_ERROR_CHARS"]

log = logging.getLogger("dataservice.worker")

#: How long to wait before asking again when every group left is leased to other workers.
LEASE_RETRY_S = 0.2
#: A failing pipeline's reason, as sent to the dispatcher (and written to ERROR), at most.
MAX_ERROR_CHARS = 16 * 1024


class _Cancelled(Exception):
    pass


class SaveRunner:
    """Writes chunks of one save until it has nothing left for this worker (see the module docstring).
    ``load_dataset(dataset_id)`` returns the save's pipeline (the worker's cache)."""

    def __init__(self, save_def: dispatcher_pb2.SaveDef, load_dataset: Callable[[int], Any],
                 dispatcher: DispatcherClient, worker_address: str):
        self.save_def = save_def
        self.save_id = save_def.save_id
        self._load_dataset = load_dataset
        self._dispatcher = dispatcher
        self._address = worker_address
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"dataservice-save-{self.save_id}", daemon=True)
        #: Chunks this runner wrote and the dispatcher committed (for tests and logs).
        self.committed = 0

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def cancel(self) -> None:
        """Stops after the current element: the save ended, or the worker stops. An unfinished chunk is dropped."""
        self._cancel.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            dataset = self._load_dataset(self.save_def.dataset_id)
            while not self._cancel.is_set():
                lease = self._dispatcher.lease_save_group(self.save_id, self._address)
                if lease.end:
                    return
                if lease.wait:
                    self._cancel.wait(LEASE_RETRY_S)
                    continue
                self._write_group(dataset, lease.group, lease.attempt)
        except _Cancelled:
            pass
        except errors.DataServiceError as exc:
            if not self._cancel.is_set():
                # The next heartbeat starts a new runner if the save still needs this worker.
                log.warning("save %d: stopped writing chunks: %s: %s", self.save_id, type(exc).__name__, exc)
        except Exception:
            log.exception("save %d: stopped writing chunks", self.save_id)

    def _write_group(self, dataset: Any, group: int, attempt: int) -> None:
        path = saves.uncommitted_path(self.save_def.path, group, attempt)
        writer = save_format.ChunkWriter(path, self.save_def.compression or None)
        first: Any = None
        try:
            for element in self._elements(dataset, group):
                if self._cancel.is_set():
                    raise _Cancelled()
                if first is None:
                    first = element
                writer.write(element)
            writer.commit()
        except _Cancelled:
            writer.abort()
            raise
        except Exception as exc:
            writer.abort()
            reason = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
            log.warning("save %d: the pipeline failed on group %d: %s", self.save_id, group, reason)
            self._dispatcher.report_save_chunk(dispatcher_pb2.ReportSaveChunkRequest(
                save_id=self.save_id, worker_address=self._address, group=group, attempt=attempt, error=reason))
            raise _Cancelled() from None
        spec = b""
        if first is not None:
            from dataservice.data import specs

            spec = specs.encode(specs.relaxed(specs.spec_from_value(first))).SerializeToString()
        try:
            response = self._dispatcher.report_save_chunk(dispatcher_pb2.ReportSaveChunkRequest(
                save_id=self.save_id, worker_address=self._address, group=group, attempt=attempt,
                num_elements=writer.num_elements, bytes=writer.bytes_written, element_spec=spec))
        except errors.NotFoundError as exc:
            # The chunk is gone (a dispatcher restarted between its rename and its journal record): the
            # group is leased again and redone.
            log.warning("save %d: group %d not committed: %s", self.save_id, group, exc)
            return
        if response.committed:
            self.committed += 1

    def _elements(self, dataset: Any, group: int):
        try:
            groups = dataset.split_groups(self.save_def.num_groups)
        except errors.NotSplittableError:
            groups = None  # one group: the whole pipeline
        provider = iter(groups.splits(group)) if groups is not None else None
        iterator = dataset._root_iterator(provider, split_hint=group if groups is not None else None)
        try:
            yield from iterator
        finally:
            iterator.close()
