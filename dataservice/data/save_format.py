"""The on-disk format of saved datasets (``Dataset.save`` / ``load``) and snapshots.

A saved dataset is a directory holding a metadata file and chunk files.

``metadata.json`` (written last, atomically: a directory without it is not a complete save) is a
JSON object::

    {"format": "dataservice.saved_dataset", "format_version": 1,
     "element_spec": <ElementSpecDef as protobuf JSON>, "element_spec_repr": "TensorSpec(...)",
     "compression": "LZ4" | "GZIP" | "ZLIB" | "ZSTD" | null,
     "cardinality": 1000, "num_elements": 1000, "num_shards": 2,
     "chunks": [{"file": "chunk-...", "shard": 0, "num_elements": 500, "bytes": 4196}, ...], ...}

``chunks`` lists the chunk files in order; a writer may add keys of its own.

A chunk file is a TFRecord file (``dataservice.data.readers.tfrecord``'s framing, uncompressed)::

    uint64 length | uint32 masked_crc32c(length) | byte payload[length] | uint32 masked_crc32c(payload)

Each record's payload is compressed on its own with the save's codec (none, LZ4 frame, zstd frame,
zlib or gzip stream); once decompressed it is a sequence of wire frames
(``dataservice.service.wire``), each preceded by its length::

    uint64 frame_length | frame[frame_length] | uint64 frame_length | frame[...] | ...

A record gathers elements up to about ``RECORD_BYTES``: a run of small elements is one frame
(numpy scalars of one dtype a single column), a large array one frame of its own. So the CRCs cover
exactly the bytes on disk, a corrupted byte is reported with the file and the record's byte offset,
and compressing records of about 1 MiB compresses as well as a stream while keeping every record
readable alone.

Example::

    >>> with ChunkWriter("/tmp/d/chunk-0", resolve_compression("AUTO")) as w:
    ...     w.write((np.arange(3), b"x"))
    >>> list(read_chunk("/tmp/d/chunk-0", "LZ4"))
    [(array([0, 1, 2]), b'x')]
"""

from __future__ import annotations

import json
import operator
import os
import struct
import uuid
import zlib
from typing import Any, Callable, Iterator, Optional

import numpy as np

from dataservice.data.readers.tfrecord import TFRecordWriter, corrupted_record, masked_crc32c
from dataservice.service import wire

__all__ = ["FORMAT_VERSION", "COMPRESSIONS", "METADATA_FILE", "RECORD_BYTES", "resolve_compression",
           "ChunkWriter", "read_chunk", "record_elements", "write_metadata", "read_metadata", "fsync_directory", "temporary_name",
           "write_file_atomically", "shard_index", "codec_functions", "compression_name"]

#: The version ``write_metadata`` records; ``read_metadata`` refuses a newer one.
FORMAT_VERSION = 1
#: What ``compression`` accepts ("AUTO" resolves to LZ4; None and "" mean uncompressed).
COMPRESSIONS = ("AUTO", "GZIP", "ZLIB", "LZ4", "ZSTD", None)
#: The metadata file in a saved directory.
METADATA_FILE = "metadata.json"
#: The "format" key that marks a metadata file as ours.
FORMAT_NAME = "dataservice.saved_dataset"
#: A record is written once it holds this many bytes of elements ...
RECORD_BYTES = 1 << 20
#: ... or this many elements.
RECORD_ELEMENTS = 8192
#: What "AUTO" means: LZ4 compresses at 5 GB/s and decompresses at 15 GB/s on incompressible
#: float32 (zstd level 1: 1.0 and 1.3 GB/s, zlib 35 and 270 MB/s), so it never holds back a disk.
AUTO_CODEC = "LZ4"

_U64 = struct.Struct("<Q")
#: A record's framing, as TFRecord's: length, masked CRC of the length; after the data, masked CRC of the data.
_RECORD_HEAD = struct.Struct("<QI")
_RECORD_HEADER = _RECORD_HEAD.size
_U32_STRUCT = struct.Struct("<I")
_IMMUTABLE = (bytes, str, int, float, bool, complex, type(None))


def resolve_compression(compression: Optional[str]) -> Optional[str]:
    """The codec to write or read: "AUTO" is LZ4; None and "" are None (uncompressed).

    Example::

        >>> resolve_compression("AUTO"), resolve_compression("gzip"), resolve_compression(None)
        ('LZ4', 'GZIP', None)
    """
    name = compression_name(compression, "compression must be one of 'AUTO', 'GZIP', 'ZLIB', 'LZ4', 'ZSTD' or None")
    if name is None:
        return None
    codec = AUTO_CODEC if name == "AUTO" else name
    codec_functions(codec)  # a codec whose library is missing fails here, not at the first record
    return codec


def compression_name(compression: Optional[str], refusal: str) -> Optional[str]:
    """``compression`` as a name of COMPRESSIONS, upper case (any case accepted; None and "" are None), or
    ValueError ``refusal`` + ", got ..." for anything else. Its library is not checked. The one reading of a
    compression name, for saves (``resolve_compression``) and reads (``frame_compression.check_compression``).

    Example::

        >>> compression_name("lz4", "compression must be ..."), compression_name("", "compression must be ...")
        ('LZ4', None)
    """
    if compression is None or compression == "":
        return None
    if isinstance(compression, str) and compression.upper() in COMPRESSIONS:
        return compression.upper()
    raise ValueError(f"{refusal}, got {compression!r}")


def _zlib_codec(wbits: int) -> tuple[Callable, Callable]:
    def compress(data: bytes) -> bytes:
        c = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, wbits)
        return c.compress(data) + c.flush()

    def decompress(data: bytes) -> bytes:
        d = zlib.decompressobj(wbits)
        out = d.decompress(data) + d.flush()
        if not d.eof or d.unused_data:
            raise ValueError("incomplete stream" if not d.eof else f"{len(d.unused_data)} bytes after the stream")
        return out

    return compress, decompress


def codec_functions(codec: Optional[str]) -> Optional[tuple[Callable, Callable]]:
    """(compress, decompress) for one payload (a record's; a wire frame's segment, in
    ``dataservice.service.frame_compression``); None when uncompressed. ValueError naming the package
    (and the pip extra) when the codec's library is missing.

    Example::

        >>> compress, decompress = codec_functions("LZ4")
        >>> bytes(decompress(compress(b"abc")))
        b'abc'
    """
    if codec is None:
        return None
    if codec == "LZ4":
        import lz4.frame

        # Straight into a bytearray: the record's arrays are writable views into it, with no copy.
        return ((lambda data: lz4.frame.compress(data, store_size=True)),
                (lambda data: lz4.frame.decompress(data, return_bytearray=True)))
    if codec == "ZSTD":
        try:
            import zstandard
        except ImportError:
            raise ValueError("compression 'ZSTD' needs the zstandard package: pip install zstandard "
                             "(or dataservice[zstd])") from None
        compressor = zstandard.ZstdCompressor(level=1)
        decompressor = zstandard.ZstdDecompressor()
        # A compressor object is not safe to share between threads; one per codec use is cheap.
        return compressor.compress, decompressor.decompress
    if codec == "ZLIB":
        return _zlib_codec(zlib.MAX_WBITS)
    if codec == "GZIP":
        return _zlib_codec(zlib.MAX_WBITS | 16)
    raise ValueError(f"unknown codec {codec!r}: expected one resolved by resolve_compression")


def temporary_name(path: str) -> str:
    """A name beside ``path`` for writing it before the rename: unique per process and writer."""
    return f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def write_file_atomically(target: str, data: bytes) -> None:
    """Replaces ``target`` with ``data`` so that a reader sees the old file or the new one, whole,
    even after a crash: a temporary file, fsync, rename, fsync of the directory.

    Example::

        >>> write_file_atomically("/tmp/d/DONE", b"")
    """
    tmp = temporary_name(target)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_directory(os.path.dirname(target))


def fsync_directory(directory: str) -> None:
    """Makes renames and creations in ``directory`` durable."""
    _fsync_file(directory or ".")


def _fsync_file(path: str) -> None:
    """fsyncs a file or a directory by its path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def shard_index(value: Any, where: str) -> int:
    """What a ``shard_func`` returned, as a shard index (save and snapshot): an int >= 0 (a numpy
    integer or 0-d integer array too; not a bool), else TypeError/ValueError naming ``where``."""
    try:
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value.item()
        if isinstance(value, (bool, np.bool_)):
            raise TypeError
        index = operator.index(value)
    except TypeError:
        raise TypeError(f"{where} must return an int shard index, got {value!r}") from None
    if index < 0:
        raise ValueError(f"{where} must return a shard index >= 0, got {index}")
    return index


def _estimate(element: Any) -> int:
    """Bytes an immutable element takes on the wire, roughly: enough to size records."""
    if isinstance(element, np.generic):
        return element.nbytes
    if type(element) is bytes or type(element) is str:
        return len(element) + 9
    if isinstance(element, tuple):
        return 5 + sum(_estimate(e) for e in element)
    return 16


def _immutable(element: Any) -> bool:
    """Whether ``element`` cannot change after ``write`` returns (so encoding it later is safe)."""
    if isinstance(element, np.generic) or type(element) in _IMMUTABLE:
        return True
    if type(element) is tuple:
        for e in element:
            if not _immutable(e):
                return False
        return True
    return False


class ChunkWriter:
    """Writes one chunk file: to a temporary name, made visible by ``commit`` with an atomic rename.

    ``compression`` is a codec already resolved by :func:`resolve_compression`. Elements are
    encoded before ``write`` returns, or are immutable, so a caller may hand an element on (and its
    consumer change an array in place) at once. Used as a context manager, the chunk is committed on
    a normal exit and aborted (the temporary file removed) on an exception.

    Example::

        >>> with ChunkWriter("/tmp/d/chunk-0", None) as w:
        ...     for x in Dataset.range(3):
        ...         w.write(x)
        >>> w.num_elements, list(read_chunk("/tmp/d/chunk-0", None))
        (3, [np.int64(0), np.int64(1), np.int64(2)])
    """

    def __init__(self, path: str, compression: Optional[str]) -> None:
        if compression not in COMPRESSIONS or compression == "AUTO":
            raise ValueError(f"ChunkWriter takes a resolved codec ('GZIP', 'ZLIB', 'LZ4', 'ZSTD' or None), "
                             f"got {compression!r}: pass it through resolve_compression first")
        self._path = os.fspath(path)
        self._compression = compression
        codec = codec_functions(compression)
        self._compress = codec[0] if codec else None
        self._tmp = temporary_name(self._path)
        self._writer: Optional[TFRecordWriter] = TFRecordWriter(self._tmp)
        self._objects: list = []   # immutable elements not yet encoded
        self._objects_bytes = 0
        self._frames: list = []    # encoded frames, each after its length; all precede _objects
        self._frames_bytes = 0
        self._record_elements = 0
        self._num_elements = 0
        self._bytes = 0
        self._done = False

    @property
    def path(self) -> str:
        return self._path

    @property
    def temporary_path(self) -> str:
        """Where the chunk is written until ``commit``."""
        return self._tmp

    @property
    def num_elements(self) -> int:
        """Elements written so far."""
        return self._num_elements

    @property
    def bytes_written(self) -> int:
        """Bytes of records handed to the file so far (the committed file's size, once committed)."""
        return self._bytes

    def write(self, element: Any) -> None:
        """Appends one element (anything the wire format carries)."""
        if self._done:
            raise ValueError(f"ChunkWriter for {self._path} is already committed or aborted")
        self._num_elements += 1
        self._record_elements += 1
        if _immutable(element):
            self._objects.append(element)
            self._objects_bytes += _estimate(element)
            if self._objects_bytes + self._frames_bytes >= RECORD_BYTES or self._record_elements >= RECORD_ELEMENTS:
                self._write_record()
            return
        frame = wire.encode_elements([element])
        self._seal_objects()
        if self._frames_bytes + frame.nbytes >= RECORD_BYTES:
            # The element's arrays are referenced, not copied, until the record is joined: now.
            self._frames.append(_U64.pack(frame.nbytes))
            self._frames.extend(frame.parts)
            self._frames_bytes += 8 + frame.nbytes
            self._write_record()
            return
        # Copied now: the caller may change the element's arrays once write returns.
        self._frames.append(b"".join([_U64.pack(frame.nbytes), *frame.parts]))
        self._frames_bytes += 8 + frame.nbytes
        if self._record_elements >= RECORD_ELEMENTS:
            self._write_record()

    def _seal_objects(self) -> None:
        """Encodes the pending immutable elements into one frame, after the frames before them."""
        if self._objects:
            frame = wire.encode_elements(self._objects)
            self._frames.append(_U64.pack(frame.nbytes))
            self._frames.extend(frame.parts)
            self._frames_bytes += 8 + frame.nbytes
            self._objects = []
            self._objects_bytes = 0

    def _write_record(self) -> None:
        self._seal_objects()
        if not self._frames:
            return
        payload = b"".join(self._frames)
        self._frames = []
        self._frames_bytes = 0
        self._record_elements = 0
        if self._compress is not None:
            payload = self._compress(payload)
        self._writer.write(payload)
        self._bytes += 16 + len(payload)

    def commit(self) -> None:
        """Writes what is pending, makes the file durable and renames it to its final name."""
        if self._done:
            raise ValueError(f"ChunkWriter for {self._path} is already committed or aborted")
        try:
            self._write_record()
            self._writer.close()
            _fsync_file(self._tmp)
            os.replace(self._tmp, self._path)
            fsync_directory(os.path.dirname(self._path))
        except BaseException:
            self.abort()
            raise
        self._done = True

    def abort(self) -> None:
        """Drops the chunk: the temporary file is removed; nothing appears under the final name."""
        self._done = True
        self._objects = []
        self._frames = []
        if self._writer is not None:
            try:
                self._writer.close()
            except OSError:
                pass
            self._writer = None
        try:
            os.unlink(self._tmp)
        except FileNotFoundError:
            pass

    def __enter__(self) -> "ChunkWriter":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def _decode_payload(payload: Any, path: str, offset: int) -> list:
    """The elements of one decompressed record. ``payload`` is writable memory of this record alone:
    its arrays are views into it (writable, no copy), and what they keep alive is this record."""
    view = memoryview(payload).cast("B")
    n = len(view)
    pos = 0
    elements: list = []
    try:
        while pos < n:
            if pos + 8 > n:
                raise wire.WireFormatError(f"{n - pos} bytes left, too few for a frame length")
            (length,) = _U64.unpack_from(view, pos)
            pos += 8
            if pos + length > n:
                raise wire.WireFormatError(f"a frame of {length} bytes, but {n - pos} left in the record")
            prefix, buffers = wire.split_frame(view[pos:pos + length])
            elements.extend(wire.decode_frame(prefix, buffers))
            pos += length
    except (wire.WireFormatError, ValueError, TypeError) as exc:
        raise corrupted_record(path, offset, f"the record's elements do not decode ({exc}); "
                                             "was it written by another version?") from None
    return elements


def _records(path: str, start: int = 0) -> Iterator[tuple[memoryview, int, int]]:
    """Each record of a chunk file from byte ``start`` (where a record begins) on, with its byte offset and
    the offset after it, CRC-checked, read straight into memory of its own (``readinto``: one copy from the
    page cache, none to assemble a record), so that a record's arrays can be views into it."""
    header = bytearray(_RECORD_HEADER)
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(start)  # a restored reader starts at its record: nothing before it is read
        offset = start
        while True:
            got = _read_into(f, header)
            if got == 0:
                return
            if got < _RECORD_HEADER:
                raise corrupted_record(path, offset, f"truncated record: the file ends {got} bytes into a header")
            length, stored = _RECORD_HEAD.unpack_from(header)
            if masked_crc32c(bytes(header[:8])) != stored:
                raise corrupted_record(path, offset, "length CRC mismatch")
            end = offset + _RECORD_HEADER + length + 4
            if end > size:
                raise corrupted_record(path, offset, f"truncated record: the file ends before the record of "
                                                     f"{length} bytes")
            data = bytearray(length + 4)
            if _read_into(f, data) != len(data):
                raise corrupted_record(path, offset, "truncated record: the file ended while it was read")
            record = memoryview(data)[:length]
            if masked_crc32c(record) != _U32_STRUCT.unpack_from(data, length)[0]:
                raise corrupted_record(path, offset, "data CRC mismatch")
            yield record, offset, end
            offset = end


def _read_into(f: Any, buffer: bytearray) -> int:
    """Fills ``buffer`` from ``f`` as far as the file goes (a raw read may return less than asked)."""
    view = memoryview(buffer)
    total = 0
    while total < len(buffer):
        got = f.readinto(view[total:])
        if not got:
            break
        total += got
    return total


def read_chunk(path: str, compression: Optional[str]) -> Iterator[Any]:
    """The elements of one chunk file, in order. Every record's CRCs are checked: corruption or
    truncation raises ``errors.DataLossError`` naming the file and the record's byte offset.

    ``compression`` is the codec the chunk was written with (resolved, as in the metadata).
    """
    for elements, _, _ in record_elements(os.fspath(path), compression):
        yield from elements


def record_elements(path: str, compression: Optional[str], start: int = 0) -> Iterator[tuple[list, int, int]]:
    """The elements of each record of a chunk file from byte ``start`` (where a record begins) on, with the
    record's offset and the offset after it: what a restored reader of a saved dataset seeks to."""
    codec = codec_functions(compression)
    decompress = codec[1] if codec else None
    for record, offset, end in _records(path, start):
        payload: Any = record
        if decompress is not None:
            try:
                payload = decompress(record)
                if not isinstance(payload, bytearray):  # the record's arrays are views into it: writable
                    payload = bytearray(payload)
            except Exception as exc:  # each codec raises its own error type
                raise corrupted_record(path, offset, f"the record does not decompress as {compression} "
                                                     f"({type(exc).__name__}: {exc})") from None
        yield _decode_payload(payload, path, offset), offset, end


# --- metadata ------------------------------------------------------------------------------------

def _encode_spec(spec: Any) -> Any:
    from google.protobuf import json_format

    from dataservice.data import specs

    return json_format.MessageToDict(specs.encode(spec))


def _decode_spec(data: Any) -> Any:
    from google.protobuf import json_format

    from dataservice.data import specs
    from dataservice.proto import pipeline_pb2

    return specs.decode(json_format.ParseDict(data, pipeline_pb2.ElementSpecDef()))


def write_metadata(directory: str, metadata: dict) -> None:
    """Writes ``directory/metadata.json`` atomically (a temporary file, fsync, rename, fsync of the
    directory). ``metadata["element_spec"]``, if present and not None, is a spec (a structure of
    ``TensorSpec``); it is stored encoded and ``read_metadata`` returns it decoded. The format name
    and ``format_version`` are added.

    Example::

        >>> write_metadata("/tmp/d", {"element_spec": TensorSpec((), np.int64), "chunks": []})
        >>> read_metadata("/tmp/d")["element_spec"]
        TensorSpec(shape=(), dtype=int64, name=None)
    """
    directory = os.fspath(directory)
    record = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION}
    record.update((k, v) for k, v in metadata.items() if k not in ("format", "format_version"))
    spec = metadata.get("element_spec")
    if spec is not None:
        record["element_spec"] = _encode_spec(spec)
        record.setdefault("element_spec_repr", repr(spec))
    text = json.dumps(record, indent=1, default=_json_default) + "\n"
    write_file_atomically(os.path.join(directory, METADATA_FILE), text.encode("utf-8"))


def _json_default(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    raise TypeError(f"metadata value {value!r} ({type(value).__name__}) is not JSON")


def read_metadata(directory: str) -> dict:
    """The metadata ``write_metadata`` wrote in ``directory``, its element_spec decoded.

    FileNotFoundError naming the file when there is none (a save that did not finish leaves none);
    ValueError naming the file when it is not ours, or from a newer format version.
    """
    directory = os.fspath(directory)
    path = os.path.join(directory, METADATA_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        if not os.path.isdir(directory):
            raise FileNotFoundError(2, "no saved dataset: no such directory", directory) from None
        raise FileNotFoundError(2, f"no complete saved dataset in {directory}: its {METADATA_FILE} is missing "
                                   "(a save writes it last, so an unfinished save has none)", path) from None
    try:
        metadata = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a dataservice saved dataset's metadata: not JSON ({exc})") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT_NAME:
        raise ValueError(f"{path} is not a dataservice saved dataset's metadata (no \"format\": "
                         f"\"{FORMAT_NAME}\")")
    version = metadata.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(f"{path} has format_version {version!r}; this dataservice reads versions up to "
                         f"{FORMAT_VERSION}: upgrade dataservice to load it")
    if metadata.get("element_spec") is not None:
        try:
            metadata["element_spec"] = _decode_spec(metadata["element_spec"])
        except Exception as exc:
            raise ValueError(f"{path}: its element_spec does not decode ({exc})") from None
    return metadata
