"""``FixedLengthRecordDataset``: files of equal-sized binary records.

Each file is ``header_bytes`` skipped, then records of ``record_bytes`` each,
then ``footer_bytes`` skipped. A body that is not a whole number of records
raises an error naming the file, of TensorFlow's kind: InvalidArgumentError
before any record of an uncompressed file (its size is known), DataLossError
after the whole records of a compressed one.

Example::

    >>> open("/tmp/r.bin", "wb").write(b"HDR" + b"aabbcc")
    >>> list(FixedLengthRecordDataset("/tmp/r.bin", record_bytes=2, header_bytes=3))
    [b'aa', b'bb', b'cc']
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Iterator, Optional

import numpy as np

from dataservice.data.readers.compression import check_buffer_size, check_compression_type, read_chunks
from dataservice.data.readers.file_source import BlockFileSource, StrideBlock
from dataservice.errors import DataLossError, InvalidArgumentError

__all__ = ["FixedLengthRecordDataset", "split_fixed_records", "fixed_blocks"]


def _check_size(name: str, value: Any, minimum: int) -> int:
    if value is None and minimum == 0:
        return 0
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def split_fixed_records(chunks: Iterable[bytes], path: str, record_bytes: int, header_bytes: int = 0,
                        footer_bytes: int = 0) -> Iterator[list[bytes]]:
    """The records in a stream of bytes, a list per chunk that completes at least one."""
    return (block.elements for block in fixed_blocks(chunks, path, record_bytes, header_bytes, footer_bytes))


def fixed_blocks(chunks: Iterable[bytes], path: str, record_bytes: int, header_bytes: int = 0,
                 footer_bytes: int = 0, start: int = 0) -> Iterator[StrideBlock]:
    """``split_fixed_records``'s lists as blocks that know their records' offsets in the stream, which
    ``chunks`` enter at offset ``start``: 0, or where a record (or the footer) begins, past the header.

    Example::

        >>> [(b.elements, b.start, b.end) for b in fixed_blocks([b"HDRaabb"], "f", 2, header_bytes=3)]
        [([b'aa', b'bb'], 3, 7)]
    """
    to_skip = header_bytes if not start else 0
    total = start
    pieces: list[bytes] = []  # bytes not yet cut into records; the footer hides at their end
    have = 0
    want = record_bytes + footer_bytes
    offset = max(start, header_bytes)  # stream offset of the first byte in pieces
    for chunk in chunks:
        total += len(chunk)
        if to_skip:
            if len(chunk) <= to_skip:
                to_skip -= len(chunk)
                continue
            chunk = chunk[to_skip:]
            to_skip = 0
        pieces.append(chunk)
        have += len(chunk)
        if have < want:
            continue
        buf = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        # Keep footer_bytes back: the stream's last bytes are the footer, not records.
        end = (len(buf) - footer_bytes) // record_bytes * record_bytes
        records = [buf[i:i + record_bytes] for i in range(0, end, record_bytes)]
        block = StrideBlock(records, offset, offset + end, record_bytes)
        offset += end
        have = len(buf) - end
        pieces = [buf[end:]] if have else []
        yield block
    if to_skip or have < footer_bytes:
        raise DataLossError(
            f"{path} has {total} bytes, fewer than header_bytes ({header_bytes}) + footer_bytes ({footer_bytes})",
            filename=path, offset=total)
    if have > footer_bytes:
        raise DataLossError(
            f"truncated record at offset {offset} in {path}: {have - footer_bytes} bytes remain before the "
            f"footer, not a whole record of record_bytes={record_bytes}", filename=path, offset=offset)


def _invalid_size(message: str, path: str, offset: int) -> InvalidArgumentError:
    error = InvalidArgumentError(message)
    error.filename, error.offset = path, offset  # as a DataLossError's
    return error


class FixedLengthRecordDataset(BlockFileSource):
    """The fixed-size records (``bytes``) of one or more files; one file is one split.

    ``record_bytes`` >= 1; ``header_bytes`` and ``footer_bytes`` (>= 0) are
    skipped at the start and end of every file. ``compression_type``: None or
    "" (plain), "GZIP" or "ZLIB"; the sizes count uncompressed bytes.

    Its iterator's state is the file and the byte offset of the next record,
    as TFRecordDataset's (a compressed file is decompressed again up to it).

    Example::

        >>> it = iter(FixedLengthRecordDataset("/tmp/r.bin", 2, header_bytes=3)); next(it)
        >>> it.state_dict()["position"]
        {'file': 0, 'offset': 5}
    """

    _op_name = "FixedLengthRecordDataset"

    def __init__(self, filenames: Any, record_bytes: int, header_bytes: Optional[int] = 0,
                 footer_bytes: Optional[int] = 0, buffer_size: Optional[int] = None,
                 compression_type: Optional[str] = None, num_parallel_reads: Optional[int] = None):
        self._record_bytes = _check_size("record_bytes", record_bytes, 1)
        self._header_bytes = _check_size("header_bytes", header_bytes, 0)
        self._footer_bytes = _check_size("footer_bytes", footer_bytes, 0)
        super().__init__(filenames, num_parallel_reads)
        self._compression_type = check_compression_type(compression_type)
        self._buffer_size = check_buffer_size(buffer_size)

    def _check_body_size(self, path: str) -> None:
        # An uncompressed file's size is known up front: like TensorFlow, refuse
        # a bad one before yielding any of its records.
        try:
            size = os.path.getsize(path)
        except OSError:
            return  # opening it reports the problem, naming the file
        # InvalidArgumentError, as TensorFlow raises here (the file's size, known up front, does not fit the
        # arguments); a compressed file is only found short at its end: DataLossError, as there.
        body = size - self._header_bytes - self._footer_bytes
        if body < 0:
            raise _invalid_size(
                f"{path} has {size} bytes, fewer than header_bytes ({self._header_bytes}) + footer_bytes "
                f"({self._footer_bytes})", path, size)
        if body % self._record_bytes:
            offset = self._header_bytes + body // self._record_bytes * self._record_bytes
            raise _invalid_size(
                f"truncated record at offset {offset} in {path}: excluding the header ({self._header_bytes} "
                f"bytes) and footer ({self._footer_bytes} bytes), the file has a body of {body} bytes, not a "
                f"multiple of record_bytes ({self._record_bytes})", path, offset)

    def _blocks(self, path: str, start: int) -> Iterator[StrideBlock]:
        if not self._compression_type:
            self._check_body_size(path)
        chunks = read_chunks(path, self._compression_type, self._buffer_size, self._op_name, start)
        yield from fixed_blocks(chunks, path, self._record_bytes, self._header_bytes, self._footer_bytes, start)

    def _check_offset(self, path: str, offset: int, where: str) -> None:
        if offset < self._header_bytes or (offset - self._header_bytes) % self._record_bytes:
            raise ValueError(f"malformed iterator state for {where}: 'offset' {offset} is not where a record of "
                             f"{path} begins (header_bytes={self._header_bytes}, record_bytes={self._record_bytes})")

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        return specs.TensorSpec((), specs.string)  # a scalar string per record, as tf.data
