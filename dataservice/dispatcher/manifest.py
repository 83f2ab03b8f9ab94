"""The ``MANIFEST`` of a fault-tolerant dispatcher's ``work_dir``: how far its journal is
known to be durable, and which checkpoint the journal continues from.

The journal (``journal.py``) rewrites the manifest after every group-commit fsync,
before it acknowledges the batch, with a plain ``pwrite`` and no fsync of its own:
the write path keeps one fsync per batch. A manifest on disk is therefore never
ahead of the durable journal (a crash can only leave it stale, which weakens the
check but never refuses a good journal), and while the machine is up the page
cache holds the exact figure, so a journal truncated or overwritten behind the
dispatcher's back is caught on the next start. Checkpoints and ``close`` fsync it.

The file is 1,024 bytes: two slots, at offsets 0 and 512 (separate disk sectors),
each ``magic | u32 version | u64 counter | u64 durable seq | u64 checkpoint seq |
16-byte checkpoint nonce | u32 masked CRC32C``. Writes alternate between the slots
(``counter % 2``) and a reader takes the valid slot with the highest counter, so a
torn write of one slot leaves the previous value readable in the other.

Example::

    >>> write_manifest("/var/lib/ds/MANIFEST", ManifestRecord(1, 0, CheckpointId.NULL))
    >>> writer = ManifestWriter("/var/lib/ds/MANIFEST", read_manifest("/var/lib/ds/MANIFEST"))
    >>> writer.write(42, CheckpointId.NULL)             # after the journal's fsync: no fsync here
    >>> writer.close()                                  # fsyncs
"""

from __future__ import annotations

import dataclasses
import os
import struct
import threading
from typing import ClassVar, Optional

import crc32c

from dataservice.data.readers.tfrecord import mask_crc

__all__ = ["MANIFEST_FILE", "CheckpointId", "ManifestRecord", "ManifestError", "ManifestWriter", "read_manifest",
           "write_manifest", "fsync_dir"]

MANIFEST_FILE = "MANIFEST"
#: Where the second slot starts; the file is twice this long.
SLOT_SPACING = 512
_MAGIC = b"\x00DSMANIF"
_VERSION = 1
_SLOT = struct.Struct("<8sIQQQ16s")
_CRC = struct.Struct("<I")
_NONCE_BYTES = 16


@dataclasses.dataclass(frozen=True)
class CheckpointId:
    """Names one checkpoint: its sequence number and 16 random bytes.

    ``NULL`` is the empty state at sequence number 0, which needs no checkpoint file: a
    journal whose header names it holds every update since the work_dir was created.
    The journal of an earlier dataservice (no header) also counts as continuing from
    ``NULL``, as does its checkpoint (no id).
    """

    seq: int
    nonce: bytes

    NULL: ClassVar["CheckpointId"]

    @classmethod
    def new(cls, seq: int) -> "CheckpointId":
        return cls(seq, os.urandom(_NONCE_BYTES))

    @property
    def is_null(self) -> bool:
        return self.nonce == bytes(_NONCE_BYTES)

    def __str__(self) -> str:
        return "none (the empty initial state)" if self.is_null else f"{self.seq}/{self.nonce.hex()[:12]}"


CheckpointId.NULL = CheckpointId(0, bytes(_NONCE_BYTES))


@dataclasses.dataclass(frozen=True)
class ManifestRecord:
    """One slot: ``durable_seq`` is the last sequence number known fsynced in the journal
    that continues from checkpoint ``journal_id``."""

    counter: int
    durable_seq: int
    journal_id: CheckpointId


class ManifestError(ValueError):
    """The manifest cannot be read: neither slot is valid, or a newer dataservice wrote it."""

    def __init__(self, message: str, offset: int = 0):
        super().__init__(message)
        self.offset = offset


def _pack(record: ManifestRecord) -> bytes:
    body = _SLOT.pack(_MAGIC, _VERSION, record.counter, record.durable_seq, record.journal_id.seq,
                      record.journal_id.nonce)
    return body + _CRC.pack(mask_crc(crc32c.crc32c(body)))


def _unpack(data: bytes) -> Optional[ManifestRecord]:
    size = _SLOT.size + _CRC.size
    if len(data) < size:
        return None
    body = data[:_SLOT.size]
    (crc,) = _CRC.unpack_from(data, _SLOT.size)
    if mask_crc(crc32c.crc32c(body)) != crc:
        return None
    magic, version, counter, durable_seq, checkpoint_seq, nonce = _SLOT.unpack(body)
    if magic != _MAGIC:
        return None
    if version > _VERSION:
        raise ManifestError(f"written by a newer dataservice (manifest version {version}; this one reads "
                            f"{_VERSION}): upgrade dataservice")
    return ManifestRecord(counter, durable_seq, CheckpointId(checkpoint_seq, nonce))


def read_manifest(path: str) -> Optional[ManifestRecord]:
    """The newest valid slot of the manifest at ``path``; None if there is no such file.

    ManifestError if the file exists but neither slot is valid.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(2 * SLOT_SPACING)
    except FileNotFoundError:
        return None
    slots = [_unpack(data[i * SLOT_SPACING:(i + 1) * SLOT_SPACING]) for i in range(2)]
    valid = [s for s in slots if s is not None]
    if not valid:
        raise ManifestError(f"neither of its two slots (offsets 0 and {SLOT_SPACING}) is valid "
                            f"({len(data)} bytes, CRC or magic wrong)")
    return max(valid, key=lambda s: s.counter)


def fsync_dir(path: str) -> None:
    """Makes the renames and creations in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(path: str, record: ManifestRecord) -> None:
    """Replaces the manifest atomically (temporary file, fsync, rename), both slots holding
    ``record``; the caller fsyncs the directory."""
    tmp = path + ".tmp"
    slot = _pack(record).ljust(SLOT_SPACING, b"\x00")
    with open(tmp, "wb") as f:
        f.write(slot + slot)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ManifestWriter:
    """Rewrites the manifest in place, alternating slots; see the module docstring.

    ``write`` is called by the journal's flusher and by checkpoints: a lock keeps their
    slots and counters in order.
    """

    def __init__(self, path: str, current: ManifestRecord):
        self.path = path
        self._counter = current.counter
        self._lock = threading.Lock()
        self._fd: Optional[int] = os.open(path, os.O_WRONLY)

    def write(self, durable_seq: int, journal_id: CheckpointId, sync: bool = False) -> None:
        """Records ``durable_seq``; OSError if the write (or, with ``sync``, the fsync) fails."""
        with self._lock:
            if self._fd is None:
                raise OSError(f"the manifest {self.path} is closed")
            counter = self._counter + 1
            data = _pack(ManifestRecord(counter, durable_seq, journal_id))
            os.pwrite(self._fd, data, (counter % 2) * SLOT_SPACING)
            self._counter = counter
            if sync:
                os.fsync(self._fd)

    def close(self) -> None:
        """Fsyncs and closes; idempotent. OSError if the fsync fails (the file is closed anyway)."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
