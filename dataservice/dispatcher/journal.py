"""The fault-tolerant dispatcher's journal: every state update, durable before the
RPC that caused it answers, replayed through ``DispatcherState.apply`` on start.

The guarantee: an update whose RPC was answered is, on every later start, either
replayed or the start is refused (JournalCorruptionError, naming the file, the
offset and what is missing) - it is never silently dropped. The limits: the
MANIFEST below is not fsynced per batch, so after a power loss (not a process
crash) the check may compare against an older figure, and a journal tail lost
*together with* that power loss may go unnoticed; and a damage that also deletes
or rewinds the MANIFEST (a restore of the whole work_dir from an old backup)
cannot be told from an older, intact work_dir.

Files in ``work_dir``::

    journal.log      a header, then the records appended since the last checkpoint
    checkpoint.bin   a marker, then updates that rebuild the state at sequence number S
    MANIFEST         how far journal.log is known durable, and which checkpoint it continues from
    damaged-<UTC time>/   what a recovery set aside (only after ``--recover-journal``)

Every record, in both files, is ``u32 length | u32 masked CRC32C | u64 sequence |
payload``; the CRC covers the sequence number and the payload. The payload is a
serialized ``state_pb2.Update``, except for two markers, each a 60-byte body
wrapped as field 100000 of an Update (a number no update uses, so a reader that
parses every record as an Update sees an empty one)::

    journal.log's first record     seq C | "\\0DSJOURN" | u32 version | id of the checkpoint it continues from
    checkpoint.bin's first record  seq S | "\\0DSCHKPT" | u32 version | its own id | id the old journal continued from

A checkpoint id is its sequence number and 16 random bytes. The null id names the
empty state at sequence 0, which needs no file: a journal continuing from it holds
every update since the work_dir was created, so a missing checkpoint.bin is normal
only then. After the header, sequence numbers run from C + 1 without a gap; every
record of a checkpoint carries its S. ``manifest.py`` describes the MANIFEST (two
CRC'd slots). Format version 2; version 1 (dataservice before it) had no MANIFEST
and no markers (its checkpoint began with an empty record carrying S).

Writing. Appends are group-committed: a flusher thread writes everything queued
since its last write and fsyncs once, so concurrent RPCs share one fsync (under a
steady load it first lingers ``GROUP_COMMIT_LINGER_S`` for more to join the batch); then it
rewrites the MANIFEST with a ``pwrite`` (no fsync: the page cache holds it, and it
reaches the disk after the journal, never ahead of it), and only then acknowledges
the batch. A checkpoint is written to a temporary file, fsynced and renamed over
``checkpoint.bin``; then a new journal (a header naming the new checkpoint, then the
records appended since its sequence number) replaces ``journal.log`` the same way,
and the MANIFEST is rewritten and fsynced. A crash between two of these steps leaves
a consistent work_dir (the old journal continues from the checkpoint the new one
names as replaced; its records the checkpoint covers are skipped; a MANIFEST still
naming the old journal is read as naming the new one, which continues it), and the
next start rewrites it into the usual form. So restart time depends on the size of
the state, not on how many splits were ever handed out.

A running dispatcher's checkpoints are written by a forked child
(``checkpoint_in_background``, ``forked_writes``): the lock is held for the fork,
and the records committed while the child writes are the ones the new journal
carries over. Where the process may not fork, ``checkpoint`` writes it under the lock.

Opening. The start is refused, and nothing on disk is changed, when:

- a record fails its CRC and a valid record follows it (corruption, not a torn write);
- the valid records end before the MANIFEST's durable sequence number (the journal
  was truncated, emptied, deleted, or its end overwritten, e.g. zero-filled);
- sequence numbers have a gap;
- checkpoint.bin is missing, damaged, or another checkpoint than the one the
  journal (or the MANIFEST) continues from;
- the MANIFEST is missing or unreadable while a version-2 journal or checkpoint exists;
- an update does not fit the state replayed before it (``StateUpdateError``: it
  names something that does not exist): records it depends on were lost.

A torn tail - bytes after the last valid record with nothing valid after them, all
past the MANIFEST's durable sequence number: a write the crash interrupted, never
acknowledged - is dropped with a warning and cut off. A version-1 work_dir starts
(its torn tails judged as before, without a MANIFEST) and is upgraded: a
checkpoint, a journal header and a MANIFEST are written, and logged.

Recovery (``recover=True``, ``dataservice dispatcher --recover-journal``): the start
keeps the longest valid prefix - the checkpoint if it is intact and consistent
with the journal (else none), then the journal's records up to the first damage or
the first update that does not fit - logs at CRITICAL each damage and exactly what
it drops (file, offset, records, bytes), links the damaged files into
``work_dir/damaged-<UTC time>/``, and writes a fresh checkpoint, journal and
MANIFEST, so the next start needs no flag. A crash during a recovery leaves a
work_dir that is refused again; recovering again gives the same state.

Example::

    >>> journal = Journal("/var/lib/dataservice")
    >>> for update in journal.open():     # replay (JournalCorruptionError if damaged)
    ...     state.apply(update)
    >>> seq = journal.append(update)      # queued
    >>> journal.wait_durable(seq)         # written and fsynced (group commit)
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
import os
import shutil
import struct
import threading
import time
from typing import Callable, Iterable, Optional

import crc32c
from google.protobuf.message import DecodeError

from dataservice import errors
from dataservice.data.readers.tfrecord import corrupted_record, mask_crc
from dataservice.dispatcher.forked_writes import ForkedWrite, fork_available
from dataservice.dispatcher.manifest import (MANIFEST_FILE, CheckpointId, ManifestError, ManifestRecord,
                                             ManifestWriter, fsync_dir, read_manifest, write_manifest)
from dataservice.proto import state_pb2
from dataservice.service.config import DEFAULT_JOURNAL_CHECKPOINT_RECORDS
from dataservice.service.latency_histogram import LatencyHistogram

__all__ = ["DurableWait", "Journal", "JournalError", "JournalCorruptionError", "Replay", "ReplayedRecord",
           "read_records", "DEFAULT_CHECKPOINT_RECORDS", "GROUP_COMMIT_LINGER_S", "GROUP_COMMIT_BUSY_S",
           "JOURNAL_FILE", "CHECKPOINT_FILE", "MANIFEST_FILE", "FORMAT_VERSION"]

log = logging.getLogger("dataservice.dispatcher.journal")

_HEADER = struct.Struct("<IIQ")  # payload length, masked crc, sequence number
_SEQ = struct.Struct("<Q")
JOURNAL_FILE = "journal.log"
CHECKPOINT_FILE = "checkpoint.bin"
#: Written, fsynced and removed by ``open``: proves ``work_dir`` takes writes before anything is served.
PROBE_FILE = ".write-test"
#: Records appended between two checkpoints, by default (``DispatcherConfig.journal_checkpoint_records``).
DEFAULT_CHECKPOINT_RECORDS = DEFAULT_JOURNAL_CHECKPOINT_RECORDS

#: How long the flusher waits for more records to join a batch, when the last fsync ended less than
#: GROUP_COMMIT_BUSY_S ago (a steady load; an idle dispatcher's call is written at once). Like
#: PostgreSQL's commit_delay: fewer fsyncs, each call a little later.
GROUP_COMMIT_LINGER_S = 0.0005
GROUP_COMMIT_BUSY_S = 0.005
#: 2: journal header, checkpoint ids, MANIFEST. 1: what dataservice wrote before (read, and upgraded).
FORMAT_VERSION = 2
# A marker's body: magic, format version, an id (seq, nonce), a second id (seq, nonce). The
# payload wraps it as field 100000 of an Update, a number no update uses: a reader that parses
# every record as an Update sees an empty one (as format 1's empty marker record parsed).
_MARKER = struct.Struct("<8sIQ16sQ16s")
_MARKER_FIELD = 100_000


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


_MARKER_PREFIX = _varint(_MARKER_FIELD << 3 | 2) + _varint(_MARKER.size)  # tag (length-delimited), length
#: The size of a marker record's payload.
MARKER_SIZE = len(_MARKER_PREFIX) + _MARKER.size
_JOURNAL_MAGIC = b"\x00DSJOURN"
_CHECKPOINT_MAGIC = b"\x00DSCHKPT"
DAMAGED_DIR_PREFIX = "damaged-"
_RECOVER_HINT = ("Nothing was changed on disk. To start from the valid data before the damage, restart with "
                 "--recover-journal (DispatcherConfig(recover_journal=True)): what follows the damage is dropped "
                 "and logged, and the damaged files are kept in {work_dir}/damaged-<UTC time>/. Or restore the "
                 "work_dir from a backup.")

# Ranks of the files, for reporting the first damage in the order replay meets it.
_CHECKPOINT_RANK, _JOURNAL_RANK, _MANIFEST_RANK = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class DurableWait:
    """What one call must see fsynced before it answers: ``journal``'s records up to ``seq``.

    Calling it blocks until they are, on any thread; if the write failed, it raises JournalError
    (after the store rolled its state back). An event loop can instead wait for ``journal``'s
    listener (``add_durable_listener``) and call it only when that did not settle it
    (``dispatcher/durable_waits.py``).

    Example::

        >>> wait = store.durability()      # None: durable already
        >>> if wait is not None:
        ...     wait()                     # blocks until journal.is_durable(wait.seq)
    """

    journal: "Journal"
    seq: int
    block: Callable[[], None]

    def __call__(self) -> None:
        self.block()


class JournalError(errors.ServiceUnavailableError):
    """The journal could not be written (or read); the update it carried did not happen."""


class JournalCorruptionError(errors.DataLossError):
    """The journal, checkpoint or MANIFEST shows that acknowledged state is damaged or missing;
    the start stops (see the module docstring, and ``--recover-journal``)."""


def _crc(seq: int, payload) -> int:
    return mask_crc(crc32c.crc32c(payload, crc32c.crc32c(_SEQ.pack(seq))))


def _frame(seq: int, payload: bytes) -> bytes:
    return _HEADER.pack(len(payload), _crc(seq, payload), seq) + payload


def _marker(magic: bytes, first: CheckpointId, second: CheckpointId = CheckpointId.NULL) -> bytes:
    return _MARKER_PREFIX + _MARKER.pack(magic, FORMAT_VERSION, first.seq, first.nonce, second.seq, second.nonce)


def _parse_marker(payload: bytes, magic: bytes, path: str) -> Optional[tuple[CheckpointId, CheckpointId]]:
    """The two ids of a marker with ``magic``; None if ``payload`` is not one."""
    if len(payload) != MARKER_SIZE or not payload.startswith(_MARKER_PREFIX + magic):
        return None
    _, version, seq, nonce, second_seq, second_nonce = _MARKER.unpack_from(payload, len(_MARKER_PREFIX))
    if version > FORMAT_VERSION:
        raise JournalError(f"{path} was written by a newer dataservice (journal format {version}; this one reads "
                           f"up to {FORMAT_VERSION}): upgrade dataservice to start on this work_dir")
    return CheckpointId(seq, nonce), CheckpointId(second_seq, second_nonce)


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


@dataclasses.dataclass
class _Scan:
    """The CRC-valid records of a file: ``frames`` up to the first bad spot (``end``, and
    ``problem`` says what is there), and ``later`` the valid records found after it."""

    size: int
    frames: list  # (offset, seq, payload)
    end: int
    problem: Optional[str]
    following: Optional[int]
    later: list


def _parse_from(data: memoryview, offset: int, out: list) -> tuple[int, Optional[str]]:
    end = len(data)
    while offset < end:
        if end - offset < _HEADER.size:
            return offset, "a truncated record header"
        length, crc, seq = _HEADER.unpack_from(data, offset)
        body_end = offset + _HEADER.size + length
        if body_end > end:
            return offset, f"a record of {length} bytes running past the end of the file"
        if _crc(seq, data[offset + _HEADER.size:body_end]) != crc:
            return offset, "a record whose CRC does not match"
        out.append((offset, seq, bytes(data[offset + _HEADER.size:body_end])))
        offset = body_end
    return offset, None


def _scan(data: memoryview) -> _Scan:
    frames: list = []
    end, problem = _parse_from(data, 0, frames)
    following, later = None, []
    if problem is not None:
        following = position = _valid_frame_after(data, end)
        while position is not None:
            stop, more = _parse_from(data, position, later)
            position = _valid_frame_after(data, stop) if more else None
    return _Scan(len(data), frames, end, problem, following, later)


def _read(path: str, limit: Optional[int] = None) -> memoryview:
    with open(path, "rb") as f:
        return memoryview(f.read() if limit is None else f.read(limit))


def read_records(path: str, tolerate_torn_tail: bool,
                 limit: Optional[int] = None) -> tuple[list[tuple[int, bytes]], int]:
    """The ``(seq, payload)`` records of a file (markers included) and the offset where the
    valid ones end; a low-level reader that knows nothing of MANIFEST or markers.

    ``limit`` reads only the first ``limit`` bytes.
    """
    scan = _scan(_read(path, limit))
    if scan.problem is not None:
        if scan.following is not None:
            raise corrupted_record(path, scan.end, f"{scan.problem}, with a valid record at offset "
                                                   f"{scan.following} after it", cls=JournalCorruptionError)
        if not tolerate_torn_tail:
            raise corrupted_record(path, scan.end, scan.problem, cls=JournalCorruptionError)
        log.warning("dropping a torn tail at offset %d in %s (%s, %d bytes): the last write did not complete",
                    scan.end, path, scan.problem, scan.size - scan.end)
    return [(seq, payload) for _, seq, payload in scan.frames], scan.end


def _seqs(first: int, last: int) -> str:
    return f"seq {first}" if first == last else f"seq {first}..{last}"


def _records_text(n: int, first: int = 0, last: int = 0) -> str:
    return f"{n} record{'s' if n != 1 else ''} ({_seqs(first, last)})" if n else "no record"


@dataclasses.dataclass(frozen=True)
class ReplayedRecord:
    """An update read back, and where it was: errors about it name the file, offset and seq."""

    path: str
    offset: int
    end: int
    seq: int
    update: state_pb2.Update


@dataclasses.dataclass
class Damage:
    """Why a start is refused: ``what`` at ``offset`` in ``path``, because ``detail``."""

    what: str
    path: str
    offset: int
    detail: str
    rank: int

    @property
    def message(self) -> str:
        return f"{self.what} at offset {self.offset} in {self.path}: {self.detail}"


class Replay:
    """What ``Journal.read`` found in a work_dir: the valid prefix of updates, with where each
    came from, and every damage that makes the start unsafe. Read-only."""

    def __init__(self, work_dir: str):
        self.work_dir = work_dir
        self.journal_path = os.path.join(work_dir, JOURNAL_FILE)
        self.checkpoint_path = os.path.join(work_dir, CHECKPOINT_FILE)
        self.manifest_path = os.path.join(work_dir, MANIFEST_FILE)
        self.manifest: Optional[ManifestRecord] = None
        self.manifest_exists = False
        self.checkpoint_exists = False
        self.checkpoint_size = 0
        self.checkpoint_legacy = False  # written by format 1: a marker without an id
        self.checkpoint_marker = False  # its marker was read: id, base and seq are known
        self.checkpoint_id = CheckpointId.NULL
        self.checkpoint_base = CheckpointId.NULL
        self.checkpoint_seq = 0
        self.checkpoint_records: list[ReplayedRecord] = []
        self.checkpoint_usable = True
        self.checkpoint_seq_lost = 0  # the seq of the state a missing checkpoint.bin held
        self.journal_exists = False
        self.journal_size = 0
        self.journal_header: Optional[CheckpointId] = None
        self.journal_header_end = 0
        self.journal_header_unknown = False  # its first record is damaged
        # The journal's valid, contiguous records up to its first damage, and where a record
        # that does not fit the state cut them (see ``reject``).
        self.journal_records_all: list[ReplayedRecord] = []
        self.journal_cut: Optional[int] = None
        # Every CRC-valid record in journal.log, past any damage too: what a recovery drops.
        self.journal_frames: list[tuple[int, int]] = []  # (offset, seq)
        # The journal continues from the checkpoint (else, when the checkpoint is used, it is dropped).
        self.journal_consistent = True
        self.valid_end = 0
        self.torn: Optional[tuple[int, str, int]] = None  # offset, problem, bytes
        self.damages: list[Damage] = []

    # --- what replay applies ----------------------------------------------------------------
    @property
    def journal_empty(self) -> bool:
        """No journal.log, or one without a byte: it continues from whatever the checkpoint is."""
        return not self.journal_exists or self.journal_size == 0

    @property
    def journal_id(self) -> CheckpointId:
        """The checkpoint journal.log continues from (its header's; null for format 1)."""
        if self.journal_header is not None:
            return self.journal_header
        return self.checkpoint_id if self.journal_empty else CheckpointId.NULL

    @property
    def journal_records(self) -> list[ReplayedRecord]:
        """The journal's part of the prefix: what follows the checkpoint, or everything valid
        when there is no usable checkpoint."""
        records = self.journal_records_all[:self.journal_cut]
        if not self.checkpoint_usable:
            return records
        if not self.journal_consistent:
            return []
        return [r for r in records if r.seq > self.checkpoint_seq]

    @property
    def records(self) -> list[ReplayedRecord]:
        """The valid prefix, in replay order."""
        return (self.checkpoint_records if self.checkpoint_usable else []) + self.journal_records

    @property
    def updates(self) -> list[state_pb2.Update]:
        return [r.update for r in self.records]

    @property
    def last_seq(self) -> int:
        """The sequence number of the state the prefix rebuilds."""
        journal = self.journal_records
        if journal:
            return journal[-1].seq
        return self.checkpoint_seq if self.checkpoint_usable and self.checkpoint_exists else 0

    @property
    def canonical(self) -> bool:
        """The work_dir is as an undamaged version-2 dispatcher leaves it: nothing to rewrite."""
        return (not self.damages and self.manifest is not None and self.journal_header is not None
                and self.journal_header == self.checkpoint_id and self.manifest.journal_id == self.journal_header
                and not self.checkpoint_legacy)

    @property
    def legacy(self) -> bool:
        """Written by dataservice before format 2 (no MANIFEST, no markers), with state in it."""
        return (not self.manifest_exists and self.journal_header is None
                and (self.checkpoint_legacy or not self.checkpoint_exists)
                and (self.checkpoint_exists or bool(self.journal_records_all)))

    # --- damage ------------------------------------------------------------------------------
    def damage(self, what: str, path: str, offset: int, detail: str, rank: int) -> None:
        self.damages.append(Damage(what, path, offset, detail, rank))

    def reject(self, index: int, exc: BaseException) -> None:
        """``records[index]`` does not fit the state replayed before it: refuse it and cut the
        prefix before it (a checkpoint that does not replay is unusable as a whole)."""
        record = self.records[index]
        kind = record.update.WhichOneof("kind")
        rank = _CHECKPOINT_RANK if record.path == self.checkpoint_path else _JOURNAL_RANK
        self.damage("update that does not fit the state", record.path, record.offset,
                    f"record seq {record.seq} ({kind}) cannot be replayed ({type(exc).__name__}: {exc}): updates "
                    f"it depends on are missing", rank)
        if rank == _CHECKPOINT_RANK:
            self.checkpoint_usable = False
        else:
            self.journal_cut = next(i for i, r in enumerate(self.journal_records_all) if r is record)

    def first_damage(self) -> Damage:
        return min(self.damages, key=lambda d: (d.rank, d.offset))

    def error(self) -> JournalCorruptionError:
        """The refusal, naming the first damage (in replay order)."""
        first = self.first_damage()
        more = len(self.damages) - 1
        also = "; ".join(d.message for d in sorted(self.damages, key=lambda d: (d.rank, d.offset)) if d is not first)
        message = (f"the dispatcher's work_dir {self.work_dir} is damaged, refusing to start: {first.message}. "
                   + (f"Also ({more} more): {also}. " if more else "")
                   + _RECOVER_HINT.format(work_dir=self.work_dir))
        return JournalCorruptionError(message, filename=first.path, offset=first.offset)

    def dropped(self) -> list[str]:
        """What starting from the prefix drops, per file, for the CRITICAL log of a recovery."""
        lines = []
        if self.checkpoint_exists and not self.checkpoint_usable:
            lines.append(f"all of {self.checkpoint_path} ({self.checkpoint_size} bytes: "
                         f"{len(self.checkpoint_records)} updates readable, the state at seq {self.checkpoint_seq})")
        elif not self.checkpoint_usable:
            lines.append(f"the state at seq {self.checkpoint_seq_lost} that {self.checkpoint_path} held (the file "
                         f"is missing)")
        if self.journal_exists:
            if self.checkpoint_usable and not self.journal_consistent:
                kept_end = 0
            else:
                kept = self.journal_records_all[:self.journal_cut]
                kept_end = kept[-1].end if kept else self.journal_header_end
            seqs = [seq for offset, seq in self.journal_frames if offset >= kept_end]
            if self.journal_size > kept_end:
                lines.append(f"{self.journal_size - kept_end} bytes of {self.journal_path} from offset {kept_end}, "
                             f"holding {_records_text(len(seqs), min(seqs, default=0), max(seqs, default=0))} "
                             f"with a valid CRC")
        in_files = max([self.checkpoint_seq] + [seq for _, seq in self.journal_frames])
        if self.manifest is not None and self.manifest.durable_seq > in_files:
            lines.append(f"updates {_seqs(in_files + 1, self.manifest.durable_seq)}, durable according to "
                         f"{self.manifest_path} but in no file any more")
        return lines


@dataclasses.dataclass
class _BackgroundCheckpoint:
    """A checkpoint a forked child is writing (``Journal.checkpoint_in_background``)."""
    checkpoint: CheckpointId
    child: ForkedWrite
    started: float
    #: Where its last record (seq ``checkpoint.seq``) ends in journal.log, once that is written.
    cut_offset: Optional[int] = None
    thread: Optional[threading.Thread] = None
    #: Renamed over checkpoint.bin: the flusher starts the next journal.
    installed: bool = False


class Journal:
    """See the module docstring."""

    def __init__(self, work_dir: str, checkpoint_records: int = DEFAULT_CHECKPOINT_RECORDS):
        if checkpoint_records < 1:
            raise ValueError(f"checkpoint_records must be positive, got {checkpoint_records!r}")
        self.work_dir = work_dir
        self.checkpoint_records = checkpoint_records
        self.journal_path = os.path.join(work_dir, JOURNAL_FILE)
        self.checkpoint_path = os.path.join(work_dir, CHECKPOINT_FILE)
        self.manifest_path = os.path.join(work_dir, MANIFEST_FILE)
        self._fd: Optional[int] = None
        self._manifest: Optional[ManifestWriter] = None
        self._manifest_failed = False
        # The checkpoint the open journal.log continues from (its header's id).
        self._journal_id = CheckpointId.NULL
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
        # Called (on the flusher's thread, without the lock) after each batch is durable, after a
        # failed write and at close: how an event loop's waiters learn it without a thread each.
        self._durable_listeners: list[Callable[[], None]] = []
        #: fsyncs done, and records they made durable: tests and the status page read these.
        self.fsyncs = 0
        #: How long each batch's write + fsync took (``/metrics``: dataservice_journal_fsync_seconds).
        self.fsync_latency = LatencyHistogram()
        #: How long the lock was held to fork each background checkpoint's child, and how many of
        #: those checkpoints were put in place (``/metrics``).
        self.checkpoint_fork_latency = LatencyHistogram()
        self.background_checkpoints = 0
        # The checkpoint a forked child is writing; one at a time.
        self._background: Optional[_BackgroundCheckpoint] = None
        self.records_written = 0
        self._work_dir_checked = False
        #: Where ``open`` set damaged files aside (``recover=True``), if it did.
        self.damaged_dir: Optional[str] = None

    # --- reading --------------------------------------------------------------------------
    def read(self, durable_end: Optional[int] = None) -> Replay:
        """What checkpoint + journal + MANIFEST hold, and what is wrong with them; writes nothing.

        ``durable_end``: read only that many bytes of the journal (after a failed write,
        the bytes past it were never acknowledged). JournalError if a file cannot be read.
        """
        replay = Replay(self.work_dir)
        try:
            self._read_manifest(replay)
            self._read_checkpoint(replay)
            self._read_journal(replay, durable_end)
        except OSError as exc:
            raise JournalError(f"cannot read the journal in {self.work_dir!r}: {exc}") from exc
        self._check(replay)
        if replay.torn is not None and not replay.damages:
            offset, problem, size = replay.torn
            log.warning("dropping a torn tail at offset %d in %s (%s, %d bytes): the last write did not complete",
                        offset, self.journal_path, problem, size)
        return replay

    def replay(self, durable_end: Optional[int] = None) -> list[state_pb2.Update]:
        """The updates of checkpoint + journal, without writing anything; JournalCorruptionError
        if they are damaged (see ``read``)."""
        replay = self.read(durable_end)
        if replay.damages:
            raise replay.error()
        return replay.updates

    def _read_manifest(self, replay: Replay) -> None:
        replay.manifest_exists = os.path.exists(self.manifest_path)
        try:
            replay.manifest = read_manifest(self.manifest_path)
        except ManifestError as exc:
            replay.damage("unreadable manifest", self.manifest_path, exc.offset,
                          f"{exc}, so how far journal.log was durable is unknown", _MANIFEST_RANK)
        replay.manifest_exists = replay.manifest_exists or replay.manifest is not None

    def _read_checkpoint(self, replay: Replay) -> None:
        path = self.checkpoint_path
        try:
            data = _read(path)
        except FileNotFoundError:
            return
        replay.checkpoint_exists, replay.checkpoint_size = True, len(data)
        scan = _scan(data)
        damaged = False
        if scan.frames and scan.frames[0][0] == 0:
            _, seq, payload = scan.frames[0]
            ids = _parse_marker(payload, _CHECKPOINT_MAGIC, path)
            if ids is not None:
                replay.checkpoint_id, replay.checkpoint_base = ids
                replay.checkpoint_marker = True
            elif not payload:  # format 1: an empty marker record, carrying the sequence number only
                replay.checkpoint_legacy = replay.checkpoint_marker = True
            if replay.checkpoint_marker:
                replay.checkpoint_seq = seq
        if not replay.checkpoint_marker and scan.frames:
            damaged = True
            replay.damage("corrupted checkpoint", path, 0, "its first record is not a checkpoint marker",
                          _CHECKPOINT_RANK)
        for offset, seq, payload in scan.frames[1:] if replay.checkpoint_marker else []:
            if seq != replay.checkpoint_seq:
                damaged = True
                replay.damage("corrupted checkpoint", path, offset, f"a record with seq {seq} in the checkpoint "
                              f"at seq {replay.checkpoint_seq}", _CHECKPOINT_RANK)
                break
            try:
                update = state_pb2.Update.FromString(payload)
            except DecodeError as exc:
                damaged = True
                replay.damage("corrupted record", path, offset, f"its CRC matches but it is not a state update "
                              f"({exc})", _CHECKPOINT_RANK)
                break
            replay.checkpoint_records.append(ReplayedRecord(path, offset, offset + _HEADER.size + len(payload),
                                                            seq, update))
        if scan.problem is not None:
            # No torn tail here: a checkpoint is renamed into place only once complete and fsynced.
            damaged = True
            after = f", with a valid record at offset {scan.following} after it" if scan.following is not None else ""
            replay.damage("corrupted record", path, scan.end, f"{scan.problem}{after}", _CHECKPOINT_RANK)
        elif not scan.frames:
            damaged = True
            replay.damage("corrupted checkpoint", path, 0, "the file is empty", _CHECKPOINT_RANK)
        if damaged:
            replay.checkpoint_usable = False

    def _read_journal(self, replay: Replay, durable_end: Optional[int]) -> None:
        path = self.journal_path
        try:
            data = _read(path, durable_end)
        except FileNotFoundError:
            return
        replay.journal_exists, replay.journal_size = True, len(data)
        scan = _scan(data)
        frames = scan.frames
        replay.journal_frames = [(offset, seq) for offset, seq, _ in frames + scan.later]
        replay.journal_header_unknown = scan.problem is not None and scan.end == 0
        if frames and frames[0][0] == 0:
            ids = _parse_marker(frames[0][2], _JOURNAL_MAGIC, path)
            if ids is not None:
                replay.journal_header = ids[0]
                replay.journal_header_end = _HEADER.size + MARKER_SIZE
                frames = frames[1:]
                replay.journal_frames = replay.journal_frames[1:]
        expected = None if replay.journal_header is None else replay.journal_header.seq + 1
        end = replay.journal_header_end
        for offset, seq, payload in frames:
            if expected is not None and seq != expected:
                replay.damage("sequence gap", path, offset,
                              f"record seq {seq} follows seq {expected - 1}: "
                              f"{'records' if seq - expected > 1 else 'record'} {_seqs(expected, seq - 1)} "
                              f"{'are' if seq - expected > 1 else 'is'} missing" if seq > expected else
                              f"record seq {seq} follows seq {expected - 1}: sequence numbers must grow by one",
                              _JOURNAL_RANK)
                break
            try:
                update = state_pb2.Update.FromString(payload)
            except DecodeError as exc:
                replay.damage("corrupted record", path, offset, f"its CRC matches but it is not a state update "
                              f"({exc})", _JOURNAL_RANK)
                break
            end = offset + _HEADER.size + len(payload)
            replay.journal_records_all.append(ReplayedRecord(path, offset, end, seq, update))
            expected = seq + 1
        else:
            end = scan.end
            if scan.problem is not None:
                if scan.following is not None:
                    replay.damage("corrupted record", path, scan.end, f"{scan.problem}, with a valid record at "
                                  f"offset {scan.following} after it", _JOURNAL_RANK)
                else:
                    replay.torn = (scan.end, scan.problem, scan.size - scan.end)
        replay.valid_end = end

    def _check(self, replay: Replay) -> None:
        """The checks across files: ids, sequence numbers, and how far the MANIFEST says it was durable."""
        manifest = replay.manifest
        journal, checkpoint = self.journal_path, self.checkpoint_path
        new_format = replay.journal_header is not None or (replay.checkpoint_marker and not replay.checkpoint_legacy)
        if not replay.manifest_exists and new_format:
            where = (f"its valid records end at offset {replay.valid_end} of {journal}" if replay.journal_exists
                     else f"{journal} is missing too")
            replay.damage("missing manifest", self.manifest_path, 0,
                          f"the file does not exist, but this work_dir was written by a dispatcher that keeps one: "
                          f"whether acknowledged records were lost at the end of the journal cannot be checked "
                          f"({where})", _MANIFEST_RANK)

        # Does the journal continue from this checkpoint? (An empty or missing journal continues
        # from any; one whose first bytes are damaged has no header to tell.)
        first = replay.journal_records_all[0] if replay.journal_records_all else None
        if not replay.journal_empty and not replay.journal_header_unknown:
            continues_from = replay.journal_id
            if replay.checkpoint_marker:
                replay.journal_consistent = continues_from in (replay.checkpoint_id, replay.checkpoint_base) and not (
                    replay.journal_header is None and first is not None and first.seq > replay.checkpoint_seq + 1)
            elif not replay.checkpoint_exists:
                replay.journal_consistent = continues_from.is_null and (first is None or first.seq == 1)
        if not replay.journal_consistent:
            continues = (f"continues from checkpoint {replay.journal_header} (header at offset 0)"
                         if replay.journal_header is not None else
                         f"starts at seq {first.seq} (offset {first.offset})")
            if not replay.checkpoint_exists:
                replay.checkpoint_usable = False
                lost = replay.journal_header.seq if replay.journal_header is not None else first.seq - 1
                replay.checkpoint_seq_lost = lost
                replay.damage("missing checkpoint", checkpoint, 0,
                              f"the file does not exist, but {journal} {continues}: the state up to seq {lost} "
                              f"is gone", _CHECKPOINT_RANK)
            else:
                replay.damage("checkpoint mismatch", checkpoint, 0,
                              f"it is checkpoint {replay.checkpoint_id} (seq {replay.checkpoint_seq}), but {journal} "
                              f"{continues}: one of the two files was replaced, e.g. restored from another time",
                              _CHECKPOINT_RANK)
        elif manifest is not None and (replay.checkpoint_marker or not replay.checkpoint_exists) and \
                manifest.journal_id not in (replay.checkpoint_id, replay.checkpoint_base):
            if replay.checkpoint_exists:
                replay.damage("checkpoint mismatch", checkpoint, 0,
                              f"it is checkpoint {replay.checkpoint_id} (seq {replay.checkpoint_seq}), but "
                              f"{self.manifest_path} says the journal continues from checkpoint {manifest.journal_id}: "
                              f"one of the files was replaced, e.g. restored from another time", _CHECKPOINT_RANK)
            else:
                replay.checkpoint_usable = False
                replay.checkpoint_seq_lost = manifest.journal_id.seq
                replay.damage("missing checkpoint", checkpoint, 0,
                              f"the file does not exist, but {self.manifest_path} says the journal continues from "
                              f"checkpoint {manifest.journal_id}: the state up to seq {manifest.journal_id.seq} is "
                              f"gone", _CHECKPOINT_RANK)
        if not replay.journal_exists and replay.checkpoint_exists and manifest is None and not new_format:
            # Format 1 created journal.log on every start and emptied it after a checkpoint, never removed it.
            replay.damage("missing journal", journal, 0,
                          f"the file does not exist, but {checkpoint} (seq {replay.checkpoint_seq}) does: updates "
                          f"acknowledged after the checkpoint would be lost", _JOURNAL_RANK)

        # Did the journal keep everything the MANIFEST says was durable? (After another damage,
        # that one explains; a recovery's log counts what is lost.)
        if manifest is None or replay.damages:
            return
        durable = manifest.durable_seq
        journal_last = (replay.journal_records_all[-1].seq if replay.journal_records_all else
                        replay.journal_header.seq if replay.journal_header is not None else 0)
        # A checkpoint written in the background carries the records appended meanwhile over into
        # the new journal, whose MANIFEST may still name the journal the checkpoint replaced.
        carried_over = replay.checkpoint_marker and manifest.journal_id == replay.checkpoint_base and \
            replay.journal_id == replay.checkpoint_id
        same_journal = manifest.journal_id == replay.journal_id or replay.journal_header_unknown or carried_over
        available = max(replay.checkpoint_seq if replay.checkpoint_marker else 0,
                        journal_last if same_journal and replay.journal_consistent else 0)
        if durable <= available:
            return
        missing = f"{durable - available} acknowledged update{'s' if durable - available != 1 else ''} " \
                  f"({_seqs(available + 1, durable)})"
        says = f"{self.manifest_path} says records up to seq {durable} were durable"
        if not replay.journal_exists:
            replay.damage("missing journal", journal, 0, f"the file does not exist, but {says}: {missing} are lost",
                          _JOURNAL_RANK)
        elif replay.journal_size == 0:
            replay.damage("empty journal", journal, 0, f"the file is empty, but {says}: {missing} are lost",
                          _JOURNAL_RANK)
        elif not same_journal:
            replay.damage("journal mismatch", journal, 0,
                          f"it continues from checkpoint {replay.journal_id}, but {says} in the journal continuing "
                          f"from checkpoint {manifest.journal_id}: {missing} are lost", _JOURNAL_RANK)
        else:
            after = ""
            if replay.torn is not None:
                offset, problem, size = replay.torn
                tail = bytes(_read(journal, replay.journal_size)[offset:])
                zeros = len(tail) - len(tail.rstrip(b"\0"))
                after = (f"; the {size} bytes after it are all zero" if zeros == size else
                         f"; the {size} bytes after it are not valid records ({problem})"
                         + (f", the last {zeros} of them zero" if zeros >= 512 else ""))
                replay.torn = None
            last = (f"its last valid record is seq {journal_last}" if replay.journal_records_all else
                    "it holds no record after its header" if replay.journal_header is not None else
                    "not even its header is valid")
            replay.damage("journal ends early", journal, replay.valid_end,
                          f"{last}, but {says}: {missing} are missing (the file was truncated or its end "
                          f"overwritten){after}", _JOURNAL_RANK)

    # --- start ------------------------------------------------------------------------
    def open(self, durable_end: Optional[int] = None, recover: bool = False, replay: Optional[Replay] = None,
             snapshot: Optional[Callable[[], Iterable[state_pb2.Update]]] = None) -> list[state_pb2.Update]:
        """Checks ``work_dir`` is writable, replays checkpoint + journal, and starts the flusher.

        JournalError naming ``work_dir`` if it cannot be written; JournalCorruptionError
        naming the file and offset if the files are damaged (see the module docstring),
        unless ``recover``: then it starts from the valid prefix, loudly. ``replay`` is a
        ``read()`` result to use (the store adds the updates that do not fit the state);
        ``snapshot`` returns updates that rebuild the prefix's state compactly, for the
        checkpoint a recovery or an upgrade writes (by default the prefix itself).
        """
        self.check_work_dir()
        if replay is None:
            replay = self.read(durable_end)
        if replay.damages and not recover:
            raise replay.error()
        updates = replay.updates
        snapshot = snapshot or (lambda: updates)
        try:
            if replay.damages:
                self._recover(replay, snapshot)
            elif durable_end is None and not replay.canonical:
                self._rewrite(replay, snapshot)
            else:
                self._continue(replay)
        except OSError as exc:
            self._close_files()
            raise JournalError(f"cannot open the journal in {self.work_dir!r} for writing: {exc}") from exc
        last_seq = replay.last_seq
        self._next_seq = last_seq + 1
        self._durable_seq = last_seq
        self._checkpoint_due_seq = (last_seq if not replay.canonical else replay.checkpoint_seq) + \
            self.checkpoint_records
        log.info("journal in %s: replayed %d updates (checkpoint at %d, journal to %d)", self.work_dir,
                 len(updates), replay.checkpoint_seq if replay.checkpoint_usable else 0, last_seq)
        self._flusher = threading.Thread(target=self._flush_loop, name="dataservice-journal", daemon=True)
        self._flusher.start()
        return updates

    def check_work_dir(self) -> None:
        """Creates ``work_dir`` if needed and proves it takes writes (a file written, fsynced and
        removed: nothing else changes); JournalError naming it if not. ``open`` calls it first."""
        if self._work_dir_checked:
            return
        try:
            os.makedirs(self.work_dir, exist_ok=True)
            probe = os.path.join(self.work_dir, PROBE_FILE)
            with open(probe, "wb") as f:
                f.write(b"ok")
                os.fsync(f.fileno())
            os.unlink(probe)
        except OSError as exc:
            raise JournalError(f"work_dir {self.work_dir!r} is not writable: {exc.strerror or exc}") from exc
        self._work_dir_checked = True

    def _continue(self, replay: Replay) -> None:
        """Appends to journal.log as it is, after cutting off a torn tail (or a failed write)."""
        fd = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT, 0o644)
        self._fd = fd
        os.ftruncate(fd, replay.valid_end)
        os.lseek(fd, replay.valid_end, os.SEEK_SET)
        os.fsync(fd)
        self._durable_offset = replay.valid_end
        self._journal_id = replay.journal_id
        manifest = replay.manifest
        if manifest is None:  # only after a failed write cut the journal of a start that wrote none
            manifest = ManifestRecord(0, replay.last_seq, self._journal_id)
            write_manifest(self.manifest_path, manifest)
            fsync_dir(self.work_dir)
        self._manifest = ManifestWriter(self.manifest_path, manifest)

    def _rewrite(self, replay: Replay, snapshot: Callable[[], Iterable[state_pb2.Update]]) -> None:
        """Brings an undamaged work_dir to the canonical form (a new work_dir, one written by an
        earlier dataservice, or a crash between the steps of a checkpoint).

        Each step leaves a work_dir that opens to the same state: the MANIFEST first names the
        journal as it is; the checkpoint names that journal as the one it replaces; then the
        new journal and the MANIFEST follow.
        """
        seq = replay.last_seq
        counter = replay.manifest.counter if replay.manifest is not None else 0
        if replay.legacy:
            log.warning("the journal in %s was written by an earlier dataservice (no %s): upgrading it to format %d "
                        "with a checkpoint at seq %d (earlier versions cannot read it back)", self.work_dir,
                        MANIFEST_FILE, FORMAT_VERSION, seq)
        write_manifest(self.manifest_path, ManifestRecord(counter + 1, seq, replay.journal_id))
        fsync_dir(self.work_dir)
        if not replay.records and not replay.checkpoint_exists:
            checkpoint = CheckpointId.NULL  # a new work_dir: the empty state needs no checkpoint file
        else:
            checkpoint = CheckpointId.new(seq)
            self._write_checkpoint_file(checkpoint, replay.journal_id, snapshot())
        self._start_journal_file(checkpoint)
        record = ManifestRecord(counter + 2, seq, checkpoint)
        write_manifest(self.manifest_path, record)
        fsync_dir(self.work_dir)
        self._manifest = ManifestWriter(self.manifest_path, record)

    def _recover(self, replay: Replay, snapshot: Callable[[], Iterable[state_pb2.Update]]) -> None:
        """Starts from the valid prefix: logs what is dropped, sets the damaged files aside and
        writes a fresh checkpoint, journal and MANIFEST."""
        for damage in sorted(replay.damages, key=lambda d: (d.rank, d.offset)):
            log.critical("--recover-journal: %s", damage.message)
        for line in replay.dropped():
            log.critical("--recover-journal: dropping %s", line)
        seq = replay.last_seq
        self.damaged_dir = self._set_aside()
        # The new checkpoint names a journal that does not exist, so that a crash before the
        # new journal is in place is refused again, never replayed half-recovered.
        checkpoint = CheckpointId.new(seq)
        self._write_checkpoint_file(checkpoint, CheckpointId.new(0), snapshot())
        self._start_journal_file(checkpoint)
        counter = replay.manifest.counter if replay.manifest is not None else 0
        record = ManifestRecord(counter + 1, seq, checkpoint)
        write_manifest(self.manifest_path, record)
        fsync_dir(self.work_dir)
        self._manifest = ManifestWriter(self.manifest_path, record)
        log.critical("--recover-journal: started %s from %d valid updates (the state at seq %d: %s); the damaged "
                     "files are kept in %s", self.work_dir, len(replay.records), seq,
                     "checkpoint and journal" if replay.checkpoint_usable and replay.checkpoint_exists and
                     replay.journal_records else "checkpoint only" if replay.checkpoint_usable and
                     replay.checkpoint_exists else "journal only" if replay.journal_records else "nothing",
                     self.damaged_dir)

    def _set_aside(self) -> str:
        """Links (or copies) journal, checkpoint and MANIFEST into a new damaged-<UTC time>/."""
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        base = os.path.join(self.work_dir, DAMAGED_DIR_PREFIX + stamp)
        target, n = base, 1
        while True:
            try:
                os.mkdir(target)
                break
            except FileExistsError:
                n += 1
                target = f"{base}-{n}"
        for path in (self.journal_path, self.checkpoint_path, self.manifest_path):
            if not os.path.exists(path):
                continue
            kept = os.path.join(target, os.path.basename(path))
            try:
                os.link(path, kept)  # the new files replace these by rename: the link keeps the old ones
            except OSError:
                shutil.copy2(path, kept)
        fsync_dir(target)
        fsync_dir(self.work_dir)
        return target

    def _write_checkpoint_file(self, checkpoint: CheckpointId, replaces: CheckpointId,
                               updates: Iterable[state_pb2.Update]) -> None:
        self._write_checkpoint_tmp(checkpoint, replaces, updates)
        self._install_checkpoint()

    @property
    def _checkpoint_tmp(self) -> str:
        return self.checkpoint_path + ".tmp"

    def _write_checkpoint_tmp(self, checkpoint: CheckpointId, replaces: CheckpointId,
                              updates: Iterable[state_pb2.Update]) -> None:
        """Writes and fsyncs checkpoint.bin.tmp (a forked child calls it too: it takes no lock)."""
        tmp = self._checkpoint_tmp
        try:
            with open(tmp, "wb") as f:
                # The marker first: it carries the sequence number even when the state is empty.
                f.write(_frame(checkpoint.seq, _marker(_CHECKPOINT_MAGIC, checkpoint, replaces)))
                for update in updates:
                    f.write(_frame(checkpoint.seq, update.SerializeToString()))
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            self._remove_checkpoint_tmp()
            raise

    def _install_checkpoint(self) -> None:
        """Renames checkpoint.bin.tmp over checkpoint.bin, durably."""
        try:
            os.replace(self._checkpoint_tmp, self.checkpoint_path)
            fsync_dir(self.work_dir)  # the rename itself is durable before the journal loses those records
        except OSError:
            self._remove_checkpoint_tmp()
            raise

    def _remove_checkpoint_tmp(self) -> None:
        try:
            os.unlink(self._checkpoint_tmp)
        except OSError:
            pass

    def _new_journal_file(self, checkpoint: CheckpointId, records: bytes = b"") -> tuple[int, int]:
        """A journal holding a header naming ``checkpoint`` and then ``records`` (framed records
        from seq ``checkpoint.seq + 1`` on), renamed over journal.log: its file descriptor
        (positioned to append) and its size."""
        tmp = self.journal_path + ".tmp"
        header = _frame(checkpoint.seq, _marker(_JOURNAL_MAGIC, checkpoint)) + records
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view, written = memoryview(header), 0
            while written < len(header):
                written += os.write(fd, view[written:])
            os.fsync(fd)
            os.replace(tmp, self.journal_path)
        except OSError:
            os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        try:
            fsync_dir(self.work_dir)
        except OSError as exc:
            # The new file is journal.log now: appends must go to it, not to the old one, which is no
            # longer reachable by its name. The rename reaches the disk with the directory's next sync.
            log.warning("fsyncing %s after starting a new journal failed: %s", self.work_dir, exc)
        return fd, len(header)

    def _start_journal_file(self, checkpoint: CheckpointId) -> None:
        self._fd, self._durable_offset = self._new_journal_file(checkpoint)
        self._journal_id = checkpoint

    def _close_files(self) -> None:
        fd, self._fd = self._fd, None
        manifest, self._manifest = self._manifest, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError as exc:
                log.warning("closing %s failed: %s", self.journal_path, exc)
        if manifest is not None:
            try:
                manifest.close()
            except OSError as exc:
                log.warning("writing %s failed: %s", self.manifest_path, exc)

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

    def is_durable(self, seq: int) -> bool:
        """Whether every record up to ``seq`` is fsynced already (no wait)."""
        with self._cond:
            return self._durable_seq >= seq and self._failed is None

    def add_durable_listener(self, listener: Callable[[], None]) -> None:
        """Calls ``listener()`` after each batch becomes durable, after a failed write and when the journal
        closes, on the journal's own thread: it must be quick (``loop.call_soon_threadsafe`` is).
        It then asks ``is_durable``/``failed`` itself. One wake-up per fsync, however many calls wait."""
        with self._cond:
            self._durable_listeners.append(listener)

    def _tell_listeners(self) -> None:
        with self._cond:
            listeners = list(self._durable_listeners)
        for listener in listeners:
            try:
                listener()
            except Exception:  # a closed event loop: its waiters are gone with it
                log.debug("a journal durability listener failed", exc_info=True)

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
        last_fsync_end = -math.inf
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed or self._rotation_due())
                rotation = self._background if self._rotation_due() and not self._closed else None
                if rotation is None and not self._queue and self._closed:
                    return
            if rotation is not None:
                self._rotate(rotation)
                continue
            if time.monotonic() - last_fsync_end < GROUP_COMMIT_BUSY_S and not self._closed:
                # Under a steady load the next batch is worth waiting a moment for: calls arrive a few
                # hundred microseconds apart, and each fsync costs this thread and the event loop a wake-up.
                time.sleep(GROUP_COMMIT_LINGER_S)
            with self._cond:
                batch, self._queue = self._queue, []
                fd, journal_id = self._fd, self._journal_id
            frames = [_frame(seq, payload) for seq, payload in batch]
            data = b"".join(frames)
            started = time.perf_counter()
            try:
                view = memoryview(data)
                written = 0
                while written < len(data):
                    written += os.write(fd, view[written:])
                os.fsync(fd)
            except OSError as exc:
                # Part of the batch may be on disk (or in the page cache, after a failed
                # fsync): durable_offset still says where the acknowledged records end.
                log.error("journal write to %s failed: %s", self.journal_path, exc)
                with self._cond:
                    self._failed = exc
                    self._cond.notify_all()
                self._tell_listeners()
                return
            self.fsync_latency.observe(time.perf_counter() - started)
            # Before the batch is acknowledged: the MANIFEST in the page cache then covers every
            # acknowledged update, and it reaches the disk after the journal (never ahead of it).
            self._note_durable(batch[-1][0], journal_id)
            with self._cond:
                background = self._background
                if background is not None and background.cut_offset is None and \
                        batch[0][0] <= background.checkpoint.seq <= batch[-1][0]:
                    # Where the checkpoint's last record ends: the next journal starts after it.
                    covered = frames[:background.checkpoint.seq - batch[0][0] + 1]
                    background.cut_offset = self._durable_offset + sum(len(f) for f in covered)
                self._durable_seq = batch[-1][0]
                self._durable_offset += len(data)
                self.fsyncs += 1
                self.records_written += len(batch)
                self._cond.notify_all()
            self._tell_listeners()
            last_fsync_end = time.monotonic()

    def _note_durable(self, seq: int, journal_id: CheckpointId, sync: bool = False) -> None:
        manifest = self._manifest
        if manifest is None:
            return
        try:
            manifest.write(seq, journal_id, sync=sync)
            self._manifest_failed = False
        except OSError as exc:
            # The journal itself is durable: a stale MANIFEST only weakens the check at the next start.
            if not self._manifest_failed:
                log.warning("writing %s failed (%s): the next start checks the journal against an older figure",
                            self.manifest_path, exc)
            self._manifest_failed = True

    @property
    def failed(self) -> bool:
        with self._cond:
            return self._failed is not None

    def needs_checkpoint(self) -> bool:
        with self._cond:
            return self._next_seq - 1 >= self._checkpoint_due_seq and self._background is None

    # --- checkpoints --------------------------------------------------------------------
    def checkpoint(self, updates: Iterable[state_pb2.Update], seq: int) -> None:
        """Replaces the journal up to ``seq`` by ``updates`` (which rebuild the state at ``seq``).

        The caller holds the dispatcher's lock, so nothing is appended meanwhile.
        JournalError if the checkpoint could not be written (``failed`` tells whether
        the journal itself failed; if not, the journal is intact and the next
        attempt comes after another ``checkpoint_records`` records).
        """
        self.wait_checkpoint()  # one checkpoint at a time: both write checkpoint.bin.tmp
        self.wait_durable(seq)
        checkpoint = CheckpointId.new(seq)
        try:
            self._write_checkpoint_file(checkpoint, self._journal_id, updates)
        except OSError as exc:
            with self._cond:
                # Retry after another interval, not on every commit.
                self._checkpoint_due_seq = self._next_seq - 1 + self.checkpoint_records
            raise JournalError(f"writing the checkpoint {self.checkpoint_path!r} failed: {exc}") from exc
        with self._cond:
            self._checkpoint_due_seq = seq + self.checkpoint_records
            # Nothing is queued (the caller holds the dispatcher's lock and seq was durable),
            # so the flusher is idle and the journal file can be swapped under it.
            start_new = self._failed is None and self._durable_seq == self._next_seq - 1
        if start_new:
            try:
                fd, size = self._new_journal_file(checkpoint)
            except OSError as exc:
                # Harmless: the old journal goes on, and the checkpoint names it as the one it replaced.
                log.warning("starting a new journal after the checkpoint at seq %d failed, appending to the old one: "
                            "%s", seq, exc)
            else:
                with self._cond:
                    old, self._fd = self._fd, fd
                    self._durable_offset, self._journal_id = size, checkpoint
                try:
                    os.close(old)
                except OSError:
                    pass
        with self._cond:
            durable_seq, journal_id = self._durable_seq, self._journal_id
        self._note_durable(durable_seq, journal_id, sync=True)
        log.info("checkpoint at sequence %d written to %s", seq, self.checkpoint_path)

    def checkpoint_in_background(self, snapshot: Callable[[], Iterable[state_pb2.Update]]) -> bool:
        """Starts a checkpoint of the state at ``last_seq``, written by a forked child (``forked_writes``).

        The caller holds the dispatcher's lock, so the child's copy of the state is the state at
        ``last_seq``; ``snapshot`` is called only in the child. The lock is held for the fork alone.
        A thread then waits for the child, for ``last_seq`` to be durable in the journal, renames the
        checkpoint into place; the flusher then starts a new journal.log from it, carrying over the
        records appended meanwhile (a crash between the steps leaves a work_dir that opens to the
        same state, as for ``checkpoint``). A failure is logged, and retried after another
        ``checkpoint_records`` records: the journal itself stays intact.

        False if it cannot fork (no ``os.fork``, or the fork failed): the caller calls
        ``checkpoint`` instead. True if a checkpoint is under way (this one or an earlier one).
        """
        if not fork_available():
            return False
        with self._cond:
            if self._background is not None:
                return True
            if self._failed is not None or self._closed or self._fd is None:
                return False  # ``checkpoint`` says why
            seq = self._next_seq - 1
            checkpoint, replaces = CheckpointId.new(seq), self._journal_id
        started = time.perf_counter()
        try:
            child = ForkedWrite.start(lambda: self._write_checkpoint_tmp(checkpoint, replaces, snapshot()))
        except OSError as exc:
            log.warning("cannot fork to write the checkpoint at sequence %d (%s): writing it under the lock", seq, exc)
            return False
        self.checkpoint_fork_latency.observe(time.perf_counter() - started)
        background = _BackgroundCheckpoint(checkpoint, child, time.monotonic())
        with self._cond:
            self._checkpoint_due_seq = seq + self.checkpoint_records
            if self._durable_seq >= seq:
                # Nothing is appended while the caller holds the lock: the durable records end at seq.
                background.cut_offset = self._durable_offset
            self._background = background
        background.thread = threading.Thread(target=self._finish_background, args=(background,),
                                             name="dataservice-checkpoint", daemon=True)
        background.thread.start()
        return True

    def wait_checkpoint(self, timeout_s: float = 30.0) -> bool:
        """Blocks until no background checkpoint is under way (done, or given up); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._background is None, timeout_s)

    def _rotation_due(self) -> bool:
        background = self._background
        return background is not None and background.installed and self._failed is None

    def _finish_background(self, background: "_BackgroundCheckpoint") -> None:
        """The background checkpoint's thread: reaps the child, then installs what it wrote."""
        seq = background.checkpoint.seq
        error = background.child.wait()
        if error is None:
            try:
                # A checkpoint must not hold a record the journal could still lose (a failed write rolls back).
                self.wait_durable(seq)
            except JournalError as exc:
                error = str(exc)
        if error is None:
            with self._cond:
                if self._failed is not None or self._closed:
                    error = "the journal " + ("failed" if self._failed is not None else "closed") + " meanwhile"
        if error is None:
            try:
                self._install_checkpoint()
            except OSError as exc:
                error = f"renaming it into place failed: {exc}"
        if error is not None:
            self._remove_checkpoint_tmp()
            with self._cond:
                closed = self._closed
            # Logged before wait_checkpoint() returns: whoever waited sees why.
            (log.info if closed else log.warning)(
                "the checkpoint at sequence %d was not written (%s): the journal goes on from the previous one",
                seq, error)
            with self._cond:
                self._checkpoint_due_seq = self._next_seq - 1 + self.checkpoint_records  # retry later
                self._background = None
                self._cond.notify_all()
            return
        with self._cond:
            background.installed = True
            self.background_checkpoints += 1
            self._cond.notify_all()  # the flusher starts the new journal

    def _rotate(self, background: "_BackgroundCheckpoint") -> None:
        """On the flusher's thread (no write in flight), after a background checkpoint is in place:
        a new journal.log whose header names it, holding the records appended since its seq."""
        with self._cond:
            end, durable_seq = self._durable_offset, self._durable_seq
        start = background.cut_offset
        try:
            with open(self.journal_path, "rb") as f:
                f.seek(start)
                tail = f.read(end - start)
            if len(tail) != end - start:
                raise OSError(f"{self.journal_path} ends at offset {start + len(tail)}, before its durable end {end}")
            fd, size = self._new_journal_file(background.checkpoint, tail)
        except OSError as exc:
            # Harmless: the old journal goes on, and the checkpoint names it as the one it replaced.
            log.warning("starting a new journal after the checkpoint at seq %d failed, appending to the old one: %s",
                        background.checkpoint.seq, exc)
        else:
            with self._cond:
                old, self._fd = self._fd, fd
                self._durable_offset, self._journal_id = size, background.checkpoint
            try:
                os.close(old)
            except OSError:
                pass
            self._note_durable(durable_seq, background.checkpoint, sync=True)
            log.info("checkpoint at sequence %d written to %s in %.0f ms (in a child process; %d records carried "
                     "over)", background.checkpoint.seq, self.checkpoint_path,
                     (time.monotonic() - background.started) * 1e3, durable_seq - background.checkpoint.seq)
        with self._cond:
            self._background = None
            self._cond.notify_all()

    def close(self) -> None:
        """Writes what is queued, stops the flusher, fsyncs the MANIFEST and closes the files; idempotent.
        A background checkpoint under way is finished first (within 10 s: then given up, as after a
        failed write; the journal still holds its records)."""
        with self._cond:
            finish = self._background is not None and self._failed is None and not self._closed
        if finish:
            self.wait_checkpoint(timeout_s=10.0)
        with self._cond:
            self._closed = True
            background = self._background
            self._cond.notify_all()
        if background is not None:
            background.child.kill()
            if background.thread is not None:
                background.thread.join(timeout=10)
        if self._flusher is not None:
            self._flusher.join(timeout=10)
            self._flusher = None
        with self._cond:
            self._background = None
            if self._failed is None and self._durable_seq < self._next_seq - 1:
                self._failed = JournalError("the journal was closed before these records were written")
            self._cond.notify_all()
        self._tell_listeners()
        self._close_files()
