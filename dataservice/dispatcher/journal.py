"""The fault-tolerant dispatcher's journal: every state update, durable before the
RPC that caused it answers, replayed through ``DispatcherState.apply`` on start.

Files in ``work_dir``::

    journal.log      records appended since the last checkpoint
    checkpoint.bin   a snapshot: the updates that rebuild the state at sequence number S

A record is ``u32 length | u32 masked CRC32C | u64 sequence | Update bytes``; the
CRC covers the sequence number and the update. Appends are group-committed: a
flusher thread writes everything queued since its last write and fsyncs once,
so concurrent RPCs share one fsync. A checkpoint is written to a temporary file,
fsynced and renamed over ``checkpoint.bin``, then the journal is truncated;
records a crash leaves behind from before the checkpoint carry a sequence number
the checkpoint already covers, and replay skips them. So restart time depends on
the size of the state, not on how many splits were ever handed out.

On open, a torn last record (a crash mid-write: the file ends inside it, or its
CRC fails and no valid record follows it) is dropped with a warning and cut off;
a bad record with a valid record after it is corruption, and the start fails
naming the file and the offset.

Example::

    >>> journal = Journal("/var/lib/dataservice")
    >>> for update in journal.open():     # replay
    ...     state.apply(update)
    >>> seq = journal.append(update)      # queued
    >>> journal.wait_durable(seq)         # written and fsynced (group commit)
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from typing import Iterable, Optional

import crc32c

from dataservice import errors
from dataservice.data.readers.tfrecord import corrupted_record, mask_crc
from dataservice.proto import state_pb2

__all__ = ["Journal", "JournalError", "JournalCorruptionError", "read_records", "DEFAULT_CHECKPOINT_RECORDS"]

log = logging.getLogger("dataservice.dispatcher.journal")

_HEADER = struct.Struct("<IIQ")  # payload length, masked crc, sequence number
_SEQ = struct.Struct("<Q")
JOURNAL_FILE = "journal.log"
CHECKPOINT_FILE = "checkpoint.bin"
#: Written, fsynced and removed by ``open``: proves ``work_dir`` takes writes before anything is served.
PROBE_FILE = ".write-test"
#: Records appended between two checkpoints, by default.
DEFAULT_CHECKPOINT_RECORDS = 10_000


class JournalError(errors.ServiceUnavailableError):
    """The journal could not be written; the update it carried did not happen."""


class JournalCorruptionError(errors.DataLossError):
    """A journal or checkpoint record before the tail is corrupted; the start stops."""


def _crc(seq: int, payload) -> int:
    return mask_crc(crc32c.crc32c(payload, crc32c.crc32c(_SEQ.pack(seq))))


def _frame(seq: int, payload: bytes) -> bytes:
    return _HEADER.pack(len(payload), _crc(seq, payload), seq) + payload


def _valid_frame_at(data: memoryview, offset: int) -> bool:
    end = len(data)
    if end - offset < _HEADER.size:
        return False
    length, crc, seq = _HEADER.unpack_from(data, offset)
    body = offset + _HEADER.size
    return body + length <= end and _crc(seq, data[body:body + length]) == crc


def _valid_frame_after(data: memoryview, offset: int) -> Optional[int]:
    """The offset of the first CRC-valid record starting after ``offset``, if any.

    Tells a torn tail (nothing valid follows the bad record) from corruption
    before the tail (valid records follow it, and dropping them would lose
    acknowledged updates). A bad length field makes the bad record's own end
    meaningless, hence the byte-by-byte scan; it runs only when a bad record is
    found, and a torn tail is at most one group-commit batch long.
    """
    end = len(data) - _HEADER.size
    unpack = _HEADER.unpack_from
    for candidate in range(offset + 1, end + 1):
        length, _, seq = unpack(data, candidate)
        # Cheap filters first: a real record fits in the file and has a sequence number.
        if seq and length <= end - candidate and _valid_frame_at(data, candidate):
            return candidate
    return None


def read_records(path: str, tolerate_torn_tail: bool,
                 limit: Optional[int] = None) -> tuple[list[tuple[int, bytes]], int]:
    """The ``(seq, payload)`` records of a file and the offset where the valid ones end.

    ``limit`` reads only the first ``limit`` bytes (the part known to be durable).
    """
    with open(path, "rb") as f:
        data = memoryview(f.read() if limit is None else f.read(limit))
    records = []
    offset = 0
    end = len(data)
    while offset < end:
        if end - offset < _HEADER.size:
            problem = "a truncated record header"
        else:
            length, crc, seq = _HEADER.unpack_from(data, offset)
            body_end = offset + _HEADER.size + length
            if body_end > end:
                problem = f"a record of {length} bytes running past the end of the file"
            elif _crc(seq, data[offset + _HEADER.size:body_end]) != crc:
                problem = "a record whose CRC does not match"
            else:
                records.append((seq, bytes(data[offset + _HEADER.size:body_end])))
                offset = body_end
                continue
        following = _valid_frame_after(data, offset)
        if following is not None:
            raise corrupted_record(path, offset, f"{problem}, with a valid record at offset {following} after it",
                                   cls=JournalCorruptionError)
        if not tolerate_torn_tail:
            raise corrupted_record(path, offset, problem, cls=JournalCorruptionError)
        log.warning("dropping a torn tail at offset %d in %s (%s, %d bytes): the last write did not complete",
                    offset, path, problem, end - offset)
        break
    return records, offset


class Journal:
    """See the module docstring."""

    def __init__(self, work_dir: str, checkpoint_records: int = DEFAULT_CHECKPOINT_RECORDS):
        if checkpoint_records < 1:
            raise ValueError(f"checkpoint_records must be positive, got {checkpoint_records!r}")
        self.work_dir = work_dir
        self.checkpoint_records = checkpoint_records
        self.journal_path = os.path.join(work_dir, JOURNAL_FILE)
        self.checkpoint_path = os.path.join(work_dir, CHECKPOINT_FILE)
        self._fd: Optional[int] = None
        self._cond = threading.Condition()
        self._queue: list[tuple[int, bytes]] = []
        self._next_seq = 1
        self._durable_seq = 0
        # Where the fsynced records end: a failed write may leave bytes after it,
        # which a rollback cuts off (see ``open(durable_end=...)``).
        self._durable_offset = 0
        self._failed: Optional[BaseException] = None
        # needs_checkpoint() once this sequence number is appended.
        self._checkpoint_due_seq = checkpoint_records
        self._closed = False
        self._flusher: Optional[threading.Thread] = None
        #: fsyncs done, and records they made durable: tests and the status page read these.
        self.fsyncs = 0
        self.records_written = 0

    # --- start ------------------------------------------------------------------------
    def replay(self, durable_end: Optional[int] = None) -> list[state_pb2.Update]:
        """The updates of checkpoint + journal, without writing anything.

        ``durable_end``: read only that many bytes of the journal (after a failed
        write, the bytes past it were never acknowledged).
        """
        updates: list[state_pb2.Update] = []
        checkpoint_seq = 0
        if os.path.exists(self.checkpoint_path):
            records, _ = read_records(self.checkpoint_path, tolerate_torn_tail=False)
            for seq, payload in records:
                checkpoint_seq = seq
                if payload:  # the empty marker record that carries the sequence number
                    updates.append(state_pb2.Update.FromString(payload))
        last_seq = checkpoint_seq
        valid_end = 0
        if os.path.exists(self.journal_path):
            records, valid_end = read_records(self.journal_path, tolerate_torn_tail=True, limit=durable_end)
            for seq, payload in records:
                if seq <= checkpoint_seq:
                    continue  # already in the checkpoint (a crash before the journal was truncated)
                updates.append(state_pb2.Update.FromString(payload))
                last_seq = seq
        self._next_seq = last_seq + 1
        self._durable_seq = last_seq
        self._durable_offset = valid_end
        self._checkpoint_due_seq = checkpoint_seq + self.checkpoint_records
        log.info("journal in %s: replayed %d updates (checkpoint at %d, journal to %d)", self.work_dir,
                 len(updates), checkpoint_seq, last_seq)
        return updates

    def open(self, durable_end: Optional[int] = None) -> list[state_pb2.Update]:
        """Checks ``work_dir`` is writable, replays checkpoint + journal, and starts the flusher.

        JournalError naming ``work_dir`` if it cannot be written; JournalCorruptionError
        naming the file and offset if a record before the tail is corrupted.
        """
        try:
            os.makedirs(self.work_dir, exist_ok=True)
            probe = os.path.join(self.work_dir, PROBE_FILE)
            with open(probe, "wb") as f:
                f.write(b"ok")
                os.fsync(f.fileno())
            os.unlink(probe)
        except OSError as exc:
            raise JournalError(f"work_dir {self.work_dir!r} is not writable: {exc.strerror or exc}") from exc
        try:
            updates = self.replay(durable_end)
        except OSError as exc:
            raise JournalError(f"cannot read the journal in {self.work_dir!r}: {exc}") from exc
        fd = None
        try:
            fd = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT, 0o644)
            os.ftruncate(fd, self._durable_offset)  # cut a torn tail (or a failed write) off before appending
            os.lseek(fd, self._durable_offset, os.SEEK_SET)
            os.fsync(fd)
        except OSError as exc:
            if fd is not None:
                os.close(fd)
            raise JournalError(f"cannot open the journal {self.journal_path!r} for writing: {exc}") from exc
        self._fd = fd
        self._flusher = threading.Thread(target=self._flush_loop, name="dataservice-journal", daemon=True)
        self._flusher.start()
        return updates

    # --- appending ----------------------------------------------------------------------
    def append(self, update: state_pb2.Update) -> int:
        """Queues ``update``; returns its sequence number (see ``wait_durable``)."""
        payload = update.SerializeToString()
        with self._cond:
            if self._failed is not None:
                raise JournalError(f"the journal in {self.work_dir!r} failed earlier: {self._failed}")
            if self._closed or self._fd is None:
                raise JournalError(f"the journal in {self.work_dir!r} is not open")
            seq = self._next_seq
            self._next_seq += 1
            self._queue.append((seq, payload))
            self._cond.notify_all()
            return seq

    @property
    def last_seq(self) -> int:
        with self._cond:
            return self._next_seq - 1

    @property
    def durable_offset(self) -> int:
        """Where the fsynced records end in ``journal.log``."""
        with self._cond:
            return self._durable_offset

    def wait_durable(self, seq: int, timeout_s: float = 30.0) -> None:
        """Blocks until every record up to ``seq`` is fsynced; JournalError if writing failed."""
        with self._cond:
            ok = self._cond.wait_for(lambda: self._durable_seq >= seq or self._failed is not None, timeout_s)
            if self._durable_seq >= seq:
                return
            if self._failed is not None:
                raise JournalError(f"writing the journal {self.journal_path!r} failed: {self._failed}")
            if not ok:
                raise JournalError(f"the journal in {self.work_dir!r} did not become durable within {timeout_s} s")

    def _flush_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if not self._queue and self._closed:
                    return
                batch, self._queue = self._queue, []
            data = b"".join(_frame(seq, payload) for seq, payload in batch)
            try:
                view = memoryview(data)
                written = 0
                while written < len(data):
                    written += os.write(self._fd, view[written:])
                os.fsync(self._fd)
            except OSError as exc:
                # Part of the batch may be on disk (or in the page cache, after a failed
                # fsync): durable_offset still says where the acknowledged records end.
                log.error("journal write to %s failed: %s", self.journal_path, exc)
                with self._cond:
                    self._failed = exc
                    self._cond.notify_all()
                return
            with self._cond:
                self._durable_seq = batch[-1][0]
                self._durable_offset += len(data)
                self.fsyncs += 1
                self.records_written += len(batch)
                self._cond.notify_all()

    @property
    def failed(self) -> bool:
        with self._cond:
            return self._failed is not None

    def needs_checkpoint(self) -> bool:
        with self._cond:
            return self._next_seq - 1 >= self._checkpoint_due_seq

    # --- checkpoints --------------------------------------------------------------------
    def checkpoint(self, updates: Iterable[state_pb2.Update], seq: int) -> None:
        """Replaces the journal up to ``seq`` by ``updates`` (which rebuild the state at ``seq``).

        The caller holds the dispatcher's lock, so nothing is appended meanwhile.
        JournalError if the checkpoint could not be written (``failed`` tells whether
        the journal itself failed; if not, the journal is intact and the next
        attempt comes after another ``checkpoint_records`` records).
        """
        self.wait_durable(seq)
        tmp = self.checkpoint_path + ".tmp"
        try:
            with open(tmp, "wb") as f:
                # A marker first: it carries ``seq`` even when the state is empty.
                f.write(_frame(seq, b""))
                for update in updates:
                    f.write(_frame(seq, update.SerializeToString()))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.checkpoint_path)
            dir_fd = os.open(self.work_dir, os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # make the rename itself durable before the journal loses those records
            finally:
                os.close(dir_fd)
        except OSError as exc:
            with self._cond:
                # Retry after another interval, not on every commit.
                self._checkpoint_due_seq = self._next_seq - 1 + self.checkpoint_records
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise JournalError(f"writing the checkpoint {self.checkpoint_path!r} failed: {exc}") from exc
        with self._cond:
            # Nothing is queued (the caller holds the dispatcher's lock and seq was durable),
            # so truncating cannot cut a write in half.
            self._checkpoint_due_seq = seq + self.checkpoint_records
            if self._failed is None and self._durable_seq == self._next_seq - 1:
                try:
                    os.ftruncate(self._fd, 0)
                    self._durable_offset = 0
                    os.lseek(self._fd, 0, os.SEEK_SET)
                    os.fsync(self._fd)
                except OSError as exc:
                    # Harmless: replay skips records the checkpoint covers.
                    log.warning("truncating %s after a checkpoint failed: %s", self.journal_path, exc)
        log.info("checkpoint at sequence %d written to %s", seq, self.checkpoint_path)

    def close(self) -> None:
        """Writes what is queued, stops the flusher and closes the file; idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._flusher is not None:
            self._flusher.join(timeout=10)
            self._flusher = None
        with self._cond:
            if self._failed is None and self._durable_seq < self._next_seq - 1:
                self._failed = JournalError("the journal was closed before these records were written")
            self._cond.notify_all()
            fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError as exc:
                log.warning("closing %s failed: %s", self.journal_path, exc)
