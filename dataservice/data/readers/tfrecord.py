"""TFRecord files: ``TFRecordDataset`` reads them, ``TFRecordWriter`` writes them.

The format, byte for byte as TensorFlow writes it; each record is::

    uint64 length          little-endian
    uint32 masked_crc32c(length bytes)
    byte   data[length]
    uint32 masked_crc32c(data)

with ``masked(crc) = ((crc >> 15 | crc << 17) + 0xa282ead8) mod 2**32``. The
file may be a ZLIB or GZIP stream of those bytes. A record whose CRCs do not
match, or that the file cuts short, raises DataLossError naming the file and
the record's offset in the (uncompressed) stream.

Example::

    >>> with TFRecordWriter("/tmp/a.tfrecord") as w:
    ...     w.write(b"first")
    ...     w.write(b"second")
    >>> list(TFRecordDataset("/tmp/a.tfrecord"))
    [b'first', b'second']
"""

from __future__ import annotations

import os
import struct
from typing import Any, Iterable, Iterator, Optional

from crc32c import crc32c

from dataservice.data.readers.compression import (check_buffer_size, check_compression_type, open_output,
                                                  read_chunks)
from dataservice.data.readers.file_source import BlockFileSource, SizedBlock
from dataservice.errors import DataLossError

__all__ = ["TFRecordDataset", "TFRecordWriter", "corrupted_record", "mask_crc", "masked_crc32c", "parse_records",
           "record_blocks"]

_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_HEADER = 12  # length + its CRC
_FOOTER = 4   # data CRC
# Most files repeat a few record lengths; remembering headers whose length CRC
# checked out saves a CRC per record. Bounded, since lengths may all differ.
_MAX_VERIFIED_HEADERS = 4096

_pack_u64 = struct.Struct("<Q").pack
_pack_u32 = struct.Struct("<I").pack
_unpack_u32_from = struct.Struct("<I").unpack_from
_unpack_header_from = struct.Struct("<QI").unpack_from


def mask_crc(crc: int) -> int:
    """A CRC32C masked as TFRecord stores it (the dispatcher's journal masks its CRCs so too).

    The per-record loops below (``parse_records``, ``TFRecordWriter.write``) inline this
    expression to save a call per record.
    """
    return ((crc >> 15 | crc << 17) + _MASK_DELTA) & _U32


def masked_crc32c(data: bytes) -> int:
    """The CRC32C of ``data``, masked as TFRecord stores it."""
    return mask_crc(crc32c(data))


def corrupted_record(path: str, offset: int, why: str, cls: type[DataLossError] = DataLossError) -> DataLossError:
    """``cls`` (a DataLossError) saying the record at ``offset`` in ``path`` is corrupted, and why."""
    return cls(f"corrupted record at offset {offset} in {path}: {why}", filename=path, offset=offset)


def _verify_header(buf: bytes, pos: int, offset: int, path: str, verified: dict) -> int:
    length, stored = _unpack_header_from(buf, pos)
    if masked_crc32c(buf[pos:pos + 8]) != stored:
        raise corrupted_record(path, offset, "length CRC mismatch")
    if len(verified) >= _MAX_VERIFIED_HEADERS:
        verified.clear()
    verified[buf[pos:pos + _HEADER]] = length
    return length


def parse_records(chunks: Iterable[bytes], path: str) -> Iterator[list[bytes]]:
    """The records in a stream of TFRecord bytes, a list per chunk parsed.

    Parses whole buffers in one loop: no read call per record. A record larger
    than a chunk gathers chunks until complete, joined once.
    """
    return (block.elements for block in record_blocks(chunks, path))


def record_blocks(chunks: Iterable[bytes], path: str, start: int = 0) -> Iterator[SizedBlock]:
    """``parse_records``'s lists as ``SizedBlock``s that know their records' offsets in the stream, which
    ``chunks`` enter at offset ``start`` (where a record begins).

    Example::

        >>> [(b.elements, b.start, b.end) for b in record_blocks([open(p, "rb").read()], p)]
        [([b'first', b'second'], 0, 43)]
    """
    verified: dict = {}
    get_verified = verified.get
    pieces: list[bytes] = []  # unparsed bytes, joined only once there is a record to parse
    have = 0                  # their total length
    want = _HEADER            # bytes needed to parse the next record
    offset = start            # stream offset of the first unparsed byte
    for chunk in chunks:
        pieces.append(chunk)
        have += len(chunk)
        if have < want:
            continue
        buf = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        n = len(buf)
        pos = 0
        records = []
        append = records.append
        try:
            while True:
                data_start = pos + _HEADER
                if data_start > n:
                    want = _HEADER
                    break
                length = get_verified(buf[pos:data_start])
                if length is None:
                    length = _verify_header(buf, pos, offset + pos, path, verified)
                data_end = data_start + length
                if data_end + _FOOTER > n:
                    want = data_end + _FOOTER - pos
                    break
                data = buf[data_start:data_end]
                crc = crc32c(data)
                if ((crc >> 15 | crc << 17) + _MASK_DELTA) & _U32 != _unpack_u32_from(buf, data_end)[0]:
                    raise corrupted_record(path, offset + pos, "data CRC mismatch")
                append(data)
                pos = data_end + _FOOTER
        except DataLossError:
            # Records before the bad one still come out, as from TensorFlow.
            if records:
                yield SizedBlock(records, offset, offset + pos, _HEADER + _FOOTER)
            raise
        if records:
            block = SizedBlock(records, offset, offset + pos, _HEADER + _FOOTER)
        offset += pos
        have = n - pos
        pieces = [buf[pos:]] if have else []
        if records:
            yield block
    if have:
        what = "header" if want == _HEADER else f"record of {want} bytes"
        raise corrupted_record(path, offset, f"truncated record: the file ends {have} bytes into a {what}")


class TFRecordDataset(BlockFileSource):
    """The records (``bytes``) of one or more TFRecord files; one file is one split.

    ``compression_type``: None or "" (uncompressed), "GZIP" or "ZLIB".
    ``buffer_size``: bytes read at a time (None: 1 MiB).
    ``num_parallel_reads``: None reads the files in order; n (or AUTOTUNE)
    reads n files at once and interleaves their records one by one, in a
    deterministic order, as ``tf.data`` does.

    Its iterator's state is each open file's index and the byte offset of its
    next record; restoring seeks there (see ``file_source``). In a compressed
    file the offset counts uncompressed bytes: the file is decompressed again
    up to it on restore (not parsed), since deflate cannot be entered mid-stream.

    Example::

        >>> it = iter(TFRecordDataset(["/tmp/a.tfrecord"])); next(it)
        >>> it.state_dict()["position"]
        {'file': 0, 'offset': 21}
    """

    _op_name = "TFRecordDataset"

    def __init__(self, filenames: Any, compression_type: Optional[str] = None, buffer_size: Optional[int] = None,
                 num_parallel_reads: Optional[int] = None):
        super().__init__(filenames, num_parallel_reads)
        self._compression_type = check_compression_type(compression_type)
        self._buffer_size = check_buffer_size(buffer_size)

    def _blocks(self, path: str, start: int) -> Iterator[SizedBlock]:
        chunks = read_chunks(path, self._compression_type, self._buffer_size, self._op_name, start)
        return record_blocks(chunks, path, start)

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        return specs.TensorSpec((), specs.string)  # a scalar string per record, as tf.data


class TFRecordWriter:
    """Writes a TFRecord file, byte-compatible with TensorFlow's writers.

    Two ways, both TensorFlow's: ``write(dataset)`` (``tf.data.experimental.TFRecordWriter``) writes
    the whole file from a dataset of scalar strings — (re)writing it, so the file holds exactly that
    dataset's records when the call returns; ``write(record)`` (``tf.io.TFRecordWriter``) appends one
    record, and ``close()`` (or the ``with`` block's end) finishes the file.

    ``compression_type``: None or "" (uncompressed), "GZIP" or "ZLIB" (anything else: ValueError, where
    TensorFlow's dataset writer silently writes uncompressed); an object with a ``compression_type``
    attribute (``tf.io.TFRecordOptions``) works too. The file is created (or truncated) at once.

    Example::

        >>> TFRecordWriter("/tmp/a.tfrecord").write(Dataset.from_tensor_slices([b"x", b"y"]))
        >>> list(TFRecordDataset("/tmp/a.tfrecord"))
        [b'x', b'y']
    """

    def __init__(self, path: Any, compression_type: Any = None):
        compression_type = getattr(compression_type, "compression_type", compression_type)
        self._path = os.fsdecode(path)
        self._compression_type = check_compression_type(compression_type)
        self._out = open_output(self._path, self._compression_type)
        self._header_cache: dict[int, bytes] = {}

    @property
    def path(self) -> str:
        return self._path

    def _header(self, length: int) -> bytes:
        header = self._header_cache.get(length)
        if header is None:
            length_bytes = _pack_u64(length)
            header = length_bytes + _pack_u32(masked_crc32c(length_bytes))
            if len(self._header_cache) < _MAX_VERIFIED_HEADERS:
                self._header_cache[length] = header
        return header

    def write(self, record: Any) -> None:
        """Writes ``record`` — bytes-like, or ``str`` (written as UTF-8, as TensorFlow does) — after the
        records before it; or, given a Dataset, writes the file anew with its elements and finishes it.

        A dataset's elements must be scalar strings (``element_spec`` a ``TensorSpec`` of dtype string,
        shape ``()`` or unknown); TypeError otherwise, before anything is written, as TensorFlow.

        Example::

            >>> TFRecordWriter("/tmp/n.tfrecord").write(Dataset.range(3).map(lambda x: str(x)))
        """
        from dataservice.data.dataset import Dataset

        if isinstance(record, Dataset):
            self._write_dataset(record)
            return
        if self._out.closed:
            raise ValueError(f"TFRecordWriter for {self._path} is closed")
        if isinstance(record, str):
            record = record.encode("utf-8")
        elif not isinstance(record, bytes):
            try:
                record = bytes(memoryview(record))
            except TypeError:
                raise TypeError(f"TFRecordWriter.write expects bytes, got {type(record).__name__}") from None
        self._write_record(record)

    def _write_dataset(self, dataset: Any) -> None:
        from dataservice.data import specs
        from dataservice.errors import InvalidArgumentError

        spec = dataset.element_spec
        if not (isinstance(spec, specs.TensorSpec) and spec.dtype is specs.string and spec.shape in (None, ())):
            raise TypeError(f"TFRecordWriter.write expects a dataset of scalar strings (bytes or str), got one "
                            f"whose element_spec is {spec}")
        # As TensorFlow's: the file is written anew, holding exactly this dataset's records.
        self._out.close()
        self._out = open_output(self._path, self._compression_type)
        try:
            for element in dataset:
                if not isinstance(element, (bytes, str)):
                    raise InvalidArgumentError(
                        f"TFRecordWriter.write: {dataset._describe()} produced a {type(element).__name__} "
                        f"({element!r:.80}) where a scalar string was expected")
                self._write_record(element.encode("utf-8") if isinstance(element, str) else element)
        finally:
            self._out.close()

    def _write_record(self, record: bytes) -> None:
        crc = crc32c(record)
        write = self._out.write
        write(self._header(len(record)))
        write(record)
        write(_pack_u32(((crc >> 15 | crc << 17) + _MASK_DELTA) & _U32))

    def flush(self) -> None:
        """Pushes buffered records to the file (for compressed files, a decodable point)."""
        if not self._out.closed:
            self._out.flush()

    def close(self) -> None:
        """Finishes the file; further writes raise ValueError. Closing twice is fine."""
        self._out.close()

    def __enter__(self) -> "TFRecordWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        # TensorFlow's writer finishes the file when it is garbage collected; so does this one.
        out = getattr(self, "_out", None)
        if out is not None:
            try:
                out.close()
            except Exception:  # pragma: no cover - interpreter shutdown
                pass
