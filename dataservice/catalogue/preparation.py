"""Writing a split as TFDS does: records ordered by the hash of their key, cut into TFRecord shards.

A builder's generator yields ``(key, example)``. Each example is serialized (a ``tf.train.Example``),
then the split's records are ordered by ``md5(split_name + key)`` read as a 128-bit integer — TFDS's
order, so the same generator gives the same records in the same order, and hence the same slices,
whether TFDS or we prepare it, on any machine. A builder with ``disable_shuffling = True`` keeps the
keys' own order (its keys must be integers or strings that sort as intended).

The records are cut into ``num_shards`` files at boundaries ``round(n * i / num_shards)``; the number
of shards follows TFDS's rule (shards of 64 MiB to 1 GiB, a power of two, at most one per record)
unless the caller fixes it.

Memory stays bounded: past ``MAX_MEMORY_BYTES`` of records the split spills to 1,000 bucket files
by hash prefix, each sorted on its own when the shards are written.

Everything is written to ``<name>[/<config>]/incomplete.<host>-<pid>-<random>_<version>/`` (locked
while its writer lives) and renamed to the version directory at the end, so a killed preparation
leaves nothing that a reader would take for a prepared dataset (the next preparation sweeps it), and
two preparations at once never disturb each other.

Example::

    >>> order = KeyOrder("train")
    >>> writer = SplitWriter("/tmp/x/incomplete.ab12_1.0.0", "my_ds", "train", order)
    >>> for key, record in examples:
    ...     writer.add(key, record)
    >>> split_info = writer.finish(num_shards=None)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import struct
import tempfile
from typing import Any, Iterator, Optional

import numpy as np

from dataservice.catalogue.dataset_info import DEFAULT_FILEPATH_TEMPLATE, SplitInfo
from dataservice.data.attempts import Attempt, fsync_tree_dirs, sweep_stale_attempts
from dataservice.data.readers.tfrecord import TFRecordWriter

__all__ = ["KeyOrder", "SplitWriter", "number_of_shards", "shard_boundaries", "incomplete_directory",
           "MAX_MEMORY_BYTES", "DuplicateKeyError"]

MIN_SHARD_BYTES = 64 << 20
MAX_SHARD_BYTES = 1024 << 20
#: Records of one split held in memory before spilling to bucket files.
MAX_MEMORY_BYTES = 256 << 20
_BUCKETS = 1000
_RECORD_OVERHEAD = 16  # a TFRecord's length, CRCs
_INCOMPLETE_PREFIX = "incomplete."
_bucket_header = struct.Struct("<16sQ")


class DuplicateKeyError(ValueError):
    """Two examples of one split have the same key (their order, and so every slice, would be undefined)."""


def _key_bytes(key: Any) -> bytes:
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.replace("\\", "/").encode("utf-8")  # as TFDS, so Windows paths hash alike
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return str(int(key)).encode("utf-8")
    if isinstance(key, np.ndarray) and key.size == 1:
        return _key_bytes(key.item())
    raise TypeError(f"an example's key must be a str, bytes or int, got {key!r} ({type(key).__name__})")


class KeyOrder:
    """The position of a key in its split: its md5, salted with the split name, as a 128-bit integer.

    Example::

        >>> KeyOrder("train").hash_key("k0") != KeyOrder("test").hash_key("k0")
        True
    """

    def __init__(self, split_name: str, disable_shuffling: bool = False):
        self._salted = hashlib.md5(_key_bytes(split_name))
        self._disable_shuffling = disable_shuffling

    @property
    def shuffles(self) -> bool:
        return not self._disable_shuffling

    def hash_key(self, key: Any) -> int:
        md5 = self._salted.copy()
        md5.update(_key_bytes(key))
        return int.from_bytes(md5.digest(), "big")

    def sort_key(self, key: Any) -> Any:
        if not self._disable_shuffling:
            return self.hash_key(key)
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            return int(key)
        return _key_bytes(key)


def shard_boundaries(num_examples: int, num_shards: int) -> list[int]:
    """The end offset of each shard: ``round(num_examples * i / num_shards)`` for i = 1..num_shards."""
    return [round(num_examples * i / num_shards) for i in range(1, num_shards + 1)]


def number_of_shards(total_bytes: int, num_examples: int) -> int:
    """TFDS's choice: a power of two giving shards of 64 MiB–1 GiB, never more shards than records."""
    total = total_bytes + num_examples * _RECORD_OVERHEAD
    most = total // MIN_SHARD_BYTES
    least = total // MAX_SHARD_BYTES
    if least <= 1024 <= most and num_examples >= 1024:
        return 1024
    if least > 1024:
        n = 2048
        while not (n >= least and num_examples >= n):
            n += 1024
        return n
    for n in (512, 256, 128, 64, 32, 16, 8, 4, 2):
        if least <= n <= most and num_examples >= n:
            return n
    return 1


class SplitWriter:
    """Collects one split's serialized records and writes them as ordered shards; see the module docstring."""

    def __init__(self, directory: str, dataset_name: str, split_name: str, order: KeyOrder,
                 max_memory_bytes: int = MAX_MEMORY_BYTES):
        self._directory = directory
        self._dataset_name = dataset_name
        self._split = split_name
        self._order = order
        self._max_memory = max_memory_bytes
        self._memory: Optional[list] = []
        self._buckets: Optional[list] = None
        self._bucket_dir: Optional[str] = None
        self._seen: set = set()
        self._bytes = 0
        self._count = 0

    def add(self, key: Any, record: bytes) -> None:
        sort_key = self._order.sort_key(key)
        if sort_key in self._seen:
            raise DuplicateKeyError(f"split {self._split!r}: two examples have the key {key!r}; keys must be "
                                    "unique within a split")
        self._seen.add(sort_key)
        self._bytes += len(record)
        self._count += 1
        if self._memory is not None:
            self._memory.append((sort_key, record))
            if self._bytes > self._max_memory and self._order.shuffles:
                self._spill()
        else:
            self._to_bucket(sort_key, record)

    def _spill(self) -> None:
        self._bucket_dir = tempfile.mkdtemp(prefix=f"buckets-{self._split}-", dir=self._directory)
        self._buckets = [open(os.path.join(self._bucket_dir, f"{i:03d}"), "wb") for i in range(_BUCKETS)]
        for sort_key, record in self._memory:
            self._to_bucket(sort_key, record)
        self._memory = None

    def _to_bucket(self, sort_key: int, record: bytes) -> None:
        # Buckets by the top of the hash keep the global order: bucket i holds only keys below bucket i+1's.
        f = self._buckets[(sort_key * _BUCKETS) >> 128]
        f.write(_bucket_header.pack(sort_key.to_bytes(16, "big"), len(record)))
        f.write(record)

    def _ordered(self) -> Iterator[bytes]:
        if self._memory is not None:
            self._memory.sort(key=lambda item: item[0])
            for _, record in self._memory:
                yield record
            return
        for f in self._buckets:
            f.close()
        try:
            for i in range(_BUCKETS):
                path = os.path.join(self._bucket_dir, f"{i:03d}")
                with open(path, "rb") as f:
                    data = f.read()
                os.unlink(path)
                items = []
                pos = 0
                while pos < len(data):
                    key, length = _bucket_header.unpack_from(data, pos)
                    pos += _bucket_header.size
                    items.append((key, data[pos:pos + length]))
                    pos += length
                items.sort(key=lambda item: item[0])
                for _, record in items:
                    yield record
        finally:
            shutil.rmtree(self._bucket_dir, ignore_errors=True)

    def finish(self, num_shards: Optional[int] = None) -> SplitInfo:
        """Writes the shards and returns the split's info (its shard lengths and bytes)."""
        if self._count == 0:
            raise ValueError(f"split {self._split!r} has no examples: its generator yielded nothing")
        if num_shards is None:
            num_shards = number_of_shards(self._bytes, self._count)
        num_shards = min(num_shards, self._count)
        ends = shard_boundaries(self._count, num_shards)
        names = SplitInfo(self._split, shard_lengths=(0,) * num_shards).filenames(self._dataset_name)
        records = self._ordered()
        lengths = []
        start = 0
        try:
            for name, end in zip(names, ends):
                with TFRecordWriter(os.path.join(self._directory, name)) as writer:
                    for _ in range(end - start):
                        writer.write(next(records))
                lengths.append(end - start)
                start = end
        finally:
            records.close()  # removes the bucket files
        return SplitInfo(self._split, shard_lengths=tuple(lengths), num_bytes=self._bytes,
                         filepath_template=DEFAULT_FILEPATH_TEMPLATE)


@contextlib.contextmanager
def incomplete_directory(final_dir: str) -> Iterator[str]:
    """A fresh directory beside ``final_dir``, renamed to it on success and deleted on failure.

    It is an ``Attempt`` (``dataservice/data/attempts.py``, as a snapshot's writers use): locked while
    its preparation lives, so a concurrent preparation never sweeps it, and swept by the next one once
    its writer died (SIGKILL included). Should another preparation commit first, this one's directory
    is discarded: the dataset is prepared.
    """
    parent = os.path.dirname(final_dir)
    os.makedirs(parent, exist_ok=True)
    sweep_stale_attempts(parent, prefix=_INCOMPLETE_PREFIX)
    attempt = Attempt(parent, prefix=_INCOMPLETE_PREFIX, suffix="_" + os.path.basename(final_dir))
    try:
        yield attempt.directory
        fsync_tree_dirs(attempt.directory)
        attempt.commit(final_dir)
    except BaseException:
        attempt.discard()
        raise
