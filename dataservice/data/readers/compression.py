"""The byte streams under the record formats: opening, decompressing, compressing.

Readers never hold a whole file: ``read_chunks`` yields the file's
(decompressed) bytes in chunks of about ``buffer_size``, and the record
parsers work chunk by chunk. ``ZLIB`` is a zlib stream and ``GZIP`` a gzip
stream, as TensorFlow writes them; concatenated streams are read one after
the other, as TensorFlow does.

Example::

    >>> check_compression_type("gzip")
    'GZIP'
    >>> with open_output("/tmp/x.gz", "GZIP") as out:
    ...     out.write(b"hello\\n")
    >>> b"".join(read_chunks("/tmp/x.gz", "GZIP"))
    b'hello\\n'
"""

from __future__ import annotations

import errno
import os
import zlib
from typing import Any, BinaryIO, Iterator, Optional

from dataservice.errors import DataLossError

__all__ = ["COMPRESSION_TYPES", "DEFAULT_BUFFER_SIZE", "check_compression_type", "check_buffer_size",
           "read_chunks", "open_output", "CompressedOutput"]

#: What ``compression_type`` accepts; None and "" both mean uncompressed.
COMPRESSION_TYPES = (None, "", "GZIP", "ZLIB")
#: Bytes read from a file at a time when ``buffer_size`` is None. Large, so that
#: reading many small records costs few system calls and few buffer joins.
DEFAULT_BUFFER_SIZE = 1 << 20

# zlib window bits: 15 is a zlib-wrapped stream, 15 + 16 a gzip-wrapped one.
_WBITS = {"ZLIB": zlib.MAX_WBITS, "GZIP": zlib.MAX_WBITS | 16}


def check_compression_type(compression_type: Any) -> str:
    """The canonical name: "" (none), "GZIP" or "ZLIB"; ValueError for anything else."""
    if compression_type is None:
        return ""
    if isinstance(compression_type, bytes):
        compression_type = compression_type.decode()
    if isinstance(compression_type, str) and compression_type.upper() in ("", "GZIP", "ZLIB"):
        return compression_type.upper()
    raise ValueError(f"compression_type must be one of None, '', 'GZIP' or 'ZLIB', got {compression_type!r}")


def check_buffer_size(buffer_size: Any) -> int:
    """Bytes to read at a time; None or 0 (TensorFlow's "no buffering") mean the default."""
    if buffer_size is None:
        return DEFAULT_BUFFER_SIZE
    if not isinstance(buffer_size, int) or isinstance(buffer_size, bool):
        raise TypeError(f"buffer_size must be an int or None, got {buffer_size!r}")
    if buffer_size < 0:
        raise ValueError(f"buffer_size must be >= 0, got {buffer_size}")
    return buffer_size or DEFAULT_BUFFER_SIZE


def _open_input(path: str, op_name: str) -> BinaryIO:
    try:
        return open(path, "rb", buffering=0)
    except FileNotFoundError:
        # The bare OSError names the file but not which reader wanted it.
        raise FileNotFoundError(errno.ENOENT, f"{op_name}: no such file", path) from None


def _raw_chunks(f: BinaryIO, size: int) -> Iterator[bytes]:
    read = f.read
    while True:
        chunk = read(size)
        if not chunk:
            return
        yield chunk


def _inflate(raw: Iterator[bytes], compression_type: str, out_limit: int, path: str) -> Iterator[bytes]:
    wbits = _WBITS[compression_type]
    d = zlib.decompressobj(wbits)
    consumed = 0  # compressed bytes fed so far, for error messages
    in_stream = False
    for data in raw:
        chunk_start = consumed
        consumed += len(data)
        while True:
            if data:
                in_stream = True
            try:
                # Bounded output: a small compressed chunk may inflate enormously.
                out = d.decompress(data, out_limit)
            except zlib.error as exc:
                raise DataLossError(
                    f"corrupted {compression_type} stream in {path} (compressed bytes "
                    f"{chunk_start}..{consumed}): {exc}", filename=path, offset=chunk_start) from None
            if out:
                yield out
            if d.eof:
                # Concatenated streams (e.g. appended gzip members) are read in turn.
                data = d.unused_data
                d = zlib.decompressobj(wbits)
                in_stream = False
                if not data:
                    break
                continue
            data = d.unconsumed_tail
            # With no input left, zlib may still hold output that did not fit in out_limit.
            if not data and len(out) < out_limit:
                break
    if in_stream:
        raise DataLossError(f"truncated {compression_type} stream in {path}: the file ends after "
                            f"{consumed} compressed bytes, in the middle of a stream",
                            filename=path, offset=consumed)


def read_chunks(path: str, compression_type: str = "", buffer_size: int = DEFAULT_BUFFER_SIZE,
                op_name: str = "reader", start: int = 0) -> Iterator[bytes]:
    """The bytes of ``path``, decompressed, as a sequence of non-empty chunks, from byte ``start`` of the
    (decompressed) stream on.

    The file is opened when iteration starts and closed when it ends (or when
    the iterator is closed). A missing file raises FileNotFoundError naming it
    and ``op_name``; a corrupted or truncated compressed stream DataLossError.
    An uncompressed file is opened at ``start`` (a seek: nothing before it is
    read); a compressed one is decompressed from its beginning and its first
    ``start`` bytes dropped (a deflate stream cannot be entered in the middle),
    and a stream shorter than ``start`` is a ValueError: a restored iterator's
    state that does not fit the file.

    Example::

        >>> b"".join(read_chunks("/tmp/x.gz", "GZIP", start=2))
        b'llo\\n'
    """
    with _open_input(path, op_name) as f:
        if not compression_type:
            if start:
                f.seek(start)
            yield from _raw_chunks(f, buffer_size)
        else:
            chunks = _inflate(_raw_chunks(f, buffer_size), compression_type, max(buffer_size, 1 << 16), path)
            yield from (_dropping(chunks, start, path, op_name) if start else chunks)


def _dropping(chunks: Iterator[bytes], count: int, path: str, op_name: str) -> Iterator[bytes]:
    """``chunks`` without their first ``count`` bytes."""
    left = count
    for chunk in chunks:
        if left >= len(chunk):
            left -= len(chunk)
            continue
        if left:
            chunk = chunk[left:]
            left = 0
        yield chunk
        break
    else:
        if left:
            raise ValueError(f"the iterator state does not fit {op_name}: {path} decompresses to "
                             f"{count - left} bytes, fewer than the saved 'offset' {count}")
        return
    yield from chunks


class CompressedOutput:
    """A write-only binary file that compresses into a zlib or gzip stream.

    Small writes are gathered and compressed in large pieces: one zlib call per
    record would cost more than the compression itself.
    """

    _GATHER = 1 << 18

    def __init__(self, f: BinaryIO, compression_type: str, level: int = zlib.Z_DEFAULT_COMPRESSION):
        self._f = f
        self._z = zlib.compressobj(level, zlib.DEFLATED, _WBITS[compression_type])
        self._pending: list[bytes] = []
        self._pending_size = 0

    def write(self, data: bytes) -> int:
        self._pending.append(data)
        self._pending_size += len(data)
        if self._pending_size >= self._GATHER:
            self._compress_pending()
        return len(data)

    def _compress_pending(self) -> None:
        if self._pending:
            self._f.write(self._z.compress(b"".join(self._pending)))
            self._pending.clear()
            self._pending_size = 0

    def flush(self) -> None:
        """Makes everything written so far decodable from the file (a zlib sync flush)."""
        self._compress_pending()
        self._f.write(self._z.flush(zlib.Z_SYNC_FLUSH))
        self._f.flush()

    def close(self) -> None:
        if self._f.closed:
            return
        try:
            self._compress_pending()
            self._f.write(self._z.flush(zlib.Z_FINISH))
        finally:
            self._f.close()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def __enter__(self) -> "CompressedOutput":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_output(path: Any, compression_type: Optional[str] = None) -> Any:
    """A binary file for writing ``path`` (created or truncated), compressing if asked."""
    compression_type = check_compression_type(compression_type)
    f = open(os.fspath(path), "wb", buffering=DEFAULT_BUFFER_SIZE)
    if not compression_type:
        return f
    return CompressedOutput(f, compression_type)
