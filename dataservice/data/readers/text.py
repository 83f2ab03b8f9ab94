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
from dataservice.data.readers.file_source import BlockFileSource

__all__ = ["TextLineDataset", "split_lines"]


def split_lines(chunks: Iterable[bytes]) -> Iterator[list[bytes]]:
    """The lines in a stream of bytes, a list per chunk that ends at least one line."""
    carry: list[bytes] = []  # pieces of a line that has not ended yet
    for chunk in chunks:
        if b"\r" in chunk:
            # Dropping "\r" bytes never moves a line break, so it can happen chunk by chunk.
            chunk = chunk.replace(b"\r", b"")
        if b"\n" not in chunk:
            # Gathered, not concatenated: a very long line costs one join, not one per chunk.
            carry.append(chunk)
            continue
        if carry:
            carry.append(chunk)
            chunk = b"".join(carry)
            carry = []
        lines = chunk.split(b"\n")
        last = lines.pop()
        if last:
            carry.append(last)
        yield lines
    last = b"".join(carry)
    if last:
        yield [last]


class TextLineDataset(BlockFileSource):
    """The lines (``bytes``, without "\\n" and "\\r") of one or more files; one file is one split.

    ``compression_type``: None or "" (plain), "GZIP" or "ZLIB".
    ``buffer_size``: bytes read at a time (None: 1 MiB).
    ``num_parallel_reads``: as for TFRecordDataset.
    """

    _op_name = "TextLineDataset"

    def __init__(self, filenames: Any, compression_type: Optional[str] = None, buffer_size: Optional[int] = None,
                 num_parallel_reads: Optional[int] = None):
        super().__init__(filenames, num_parallel_reads)
        self._compression_type = check_compression_type(compression_type)
        self._buffer_size = check_buffer_size(buffer_size)

    def _read_blocks(self, path: str) -> Iterator[list[bytes]]:
        return split_lines(read_chunks(path, self._compression_type, self._buffer_size, self._op_name))

    def _element_spec(self) -> Any:
        from dataservice.data import specs

        return specs.TensorSpec((), specs.string)  # a scalar string per line, as tf.data
