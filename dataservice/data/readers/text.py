"""``TextLineDataset``: the lines of text files, as ``bytes``.

Lines end at "\\n", which is dropped. Every "\\r" is dropped too, not only
the one of a "\\r\\n": that is what TensorFlow's line reader does (checked
against TensorFlow 2.21 by the fixtures in tests/fixtures/tfrecord). A last
line without a terminator is kept unless it is empty; a file ending in
"\\n" has no extra empty line.

Example::

    >>> open("/tmp/a.txt", "wb").write(b"one\\r\\ntwo\\n\\nthree")
    >>> list(TextLineDataset("/tmp/a.txt"))
    [b'one', b'two', b'', b'three']
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional

from dataservice.data.readers.compression import check_buffer_size, check_compression_type, read_chunks
from dataservice.data.readers.file_source import Block, BlockFileSource, SizedBlock

__all__ = ["TextLineDataset", "split_lines", "line_blocks"]


def split_lines(chunks: Iterable[bytes]) -> Iterator[list[bytes]]:
    """The lines in a stream of bytes, a list per chunk that ends at least one line."""
    return (block.elements for block in line_blocks(chunks))


class _RawLinesBlock(Block):
    """Lines of a stretch that had "\\r" bytes: their offsets are found in the bytes as read (``raw``, from
    ``start``), since the lines' lengths no longer say them."""

    __slots__ = ("_raw", "_at", "_pos")

    def __init__(self, elements: list, start: int, end: int, raw: bytes):
        super().__init__(elements, start, end)
        self._raw = raw
        self._at = 0   # the line the offset was last asked for ...
        self._pos = 0  # ... and where it starts in raw

    def _inside(self, k: int) -> int:
        if k < self._at:
            self._at = self._pos = 0
        find, pos = self._raw.index, self._pos
        for _ in range(k - self._at):
            pos = find(b"\n", pos) + 1
        self._at, self._pos = k, pos
        return self.start + pos


def line_blocks(chunks: Iterable[bytes], start: int = 0) -> Iterator[Block]:
    """``split_lines``'s lists as blocks that know their lines' offsets in the stream, which ``chunks``
    enter at offset ``start`` (where a line begins).

    Example::

        >>> [(b.elements, b.start, b.end) for b in line_blocks([b"ab\\ncd\\ne"], 10)]
        [([b'ab', b'cd'], 10, 16), ([b'e'], 16, 17)]
    """
    offset = start  # stream offset of the first byte of the line not ended yet
    carry: list[bytes] = []  # pieces of that line, without "\r"
    raw_carry: list[bytes] = []  # the same bytes as read, once a "\r" is among them
    carry_size = 0  # bytes of that line read so far
    for raw in chunks:
        chunk = raw
        has_cr = b"\r" in raw
        if has_cr:
            # Dropping "\r" bytes never moves a line break, so it can happen chunk by chunk.
            chunk = raw.replace(b"\r", b"")
            if not raw_carry and carry:
                raw_carry = list(carry)  # no "\r" among them: they are the bytes as read
        if b"\n" not in chunk:
            # Gathered, not concatenated: a very long line costs one join, not one per chunk.
            carry.append(chunk)
            if raw_carry or has_cr:
                raw_carry.append(raw)
            carry_size += len(raw)
            continue
        newline = raw.rfind(b"\n") + 1  # the raw bytes up to here end lines
        if carry:
            carry.append(chunk)
            chunk = b"".join(carry)
            carry = []
        lines = chunk.split(b"\n")
        last = lines.pop()
        end = offset + carry_size + newline
        if has_cr or raw_carry:
            raw_carry.append(raw[:newline])
            yield _RawLinesBlock(lines, offset, end, b"".join(raw_carry))
        else:
            yield SizedBlock(lines, offset, end, 1)
        offset = end
        carry_size = len(raw) - newline
        raw_carry = []
        if last:
            carry.append(last)
        if has_cr and carry_size:
            raw_carry.append(raw[newline:])
    last = b"".join(carry)
    if last:
        yield Block([last], offset, offset + carry_size)


class TextLineDataset(BlockFileSource):
    """The lines (``bytes``, without "\\n" and "\\r") of one or more files; one file is one split.

    ``compression_type``: None or "" (plain), "GZIP" or "ZLIB".
    ``buffer_size``: bytes read at a time (None: 1 MiB).
    ``num_parallel_reads``: as for TFRecordDataset.

    Its iterator's state is the file and the byte offset of the next line, as
    TFRecordDataset's (a compressed file is decompressed again up to it).

    Example::

        >>> it = iter(TextLineDataset("/tmp/a.txt")); next(it)
        >>> it.state_dict()["position"]
        {'file': 0, 'offset': 5}
    """

    _op_name = "TextLineDataset"

    def __init__(self, filenames: Any, compression_type: Optional[str] = None, buffer_size: Optional[int] = None,
                 num_parallel_reads: Optional[int] = None):
        super().__init__(filenames, num_parallel_reads)
        self._compression_type = check_compression_type(compression_type)
        self._buffer_size = check_buffer_size(buffer_size)

    def _blocks(self, path: str, start: int) -> Iterator[Block]:
        return line_blocks(read_chunks(path, self._compression_type, self._buffer_size, self._op_name, start), start)

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        return specs.TensorSpec((), specs.string)  # a scalar string per line, as tf.data
