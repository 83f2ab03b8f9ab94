"""The wire format of elements between workers and clients.

A frame holds a list of elements. numpy arrays travel as raw buffers (dtype,
shape, bytes); a list of numpy scalars of one dtype (a batch of small elements)
travels as a single column. Only objects with no numpy form (None, arbitrary
classes, object arrays) are pickled.

Arrays of ``OUT_OF_BAND_BYTES`` or more travel *out of band*, after the rest
of the frame (the prefix), like pickle protocol 5's buffers: a sender hands
their numpy memory straight to the socket, and a receiver reads each one into
a buffer of its own, which becomes the decoded array. So no large array is
copied in Python at either end, and each is freed as soon as its consumer
drops it (a frame's other elements do not keep it alive, nor it them). Smaller
arrays stay in the prefix, 8-byte aligned, and decode as views into it.

Frame layout (little endian)::

    prefix:  b"DSW2" | u32 count | u8 layout | u32 nbuf | pad to 16 | u64 size * nbuf | body | pad to 8
    then:    nbuf out-of-band buffers, each padded to a multiple of 8 (``size`` includes the padding)
    body, layout COLUMN:  u8 len | dtype.str | raw array of `count` scalars
    body, layout GENERAL: `count` encoded values, each a tag byte then its body:
      a ndarray  u8 len | dtype.str | u8 ndim | u64*ndim shape | pad to 8 | raw bytes
      A ndarray out of band: u8 len | dtype.str | u8 ndim | u64*ndim shape (data: the next buffer)
      s scalar   u8 len | dtype.str | raw itemsize bytes
      b bytes    u64 len | data          u str  u64 len | utf-8
      t tuple    u32 n | n values        d dict u32 n | n (key, value) pairs
      n namedtuple u32 len | pickled type | u32 n | n values
      p pickle   u64 len | pickle (protocol 5)

Example::

    >>> frame = encode_elements([np.arange(3), (b"x", {"y": np.int64(1)})])
    >>> decode_elements(bytearray(b"".join(frame.parts)))
    [array([0, 1, 2]), (b'x', {'y': np.int64(1)})]
    >>> prefix = bytearray(b"".join(frame.prefix))          # a receiver reads the prefix,
    >>> sizes = buffer_sizes(prefix)                        # learns the buffers' sizes,
    >>> decode_frame(prefix, [receive(n) for n in sizes])   # reads each into its own buffer
"""

from __future__ import annotations

import dataclasses
import pickle
import struct
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np

from dataservice.errors import ElementSerializationError

__all__ = ["encode_elements", "decode_elements", "decode_frame", "split_frame", "buffer_sizes", "iter_chunks",
           "EncodedFrame", "WireFormatError", "OUT_OF_BAND_BYTES", "FIXED_PREFIX_BYTES", "unencodable_error"]

MAGIC = b"DSW2"
_HEADER = struct.Struct("<4sIBI")
#: The prefix's fixed part: magic, count, layout, number of buffers, padding.
FIXED_PREFIX_BYTES = 16
_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_COLUMN, _GENERAL = 0, 1
_ZEROS = bytes(8)
#: Arrays this large or larger travel out of band (see the module docstring). One more
#: receive call per array costs a few microseconds: at 64 KiB that is a fraction of the copy.
OUT_OF_BAND_BYTES = 64 * 1024

Buffer = Union[bytes, bytearray, memoryview, np.ndarray]


class WireFormatError(ValueError):
    """A frame that does not decode: truncated, or not a dataservice frame."""


@dataclasses.dataclass
class EncodedFrame:
    """One frame as buffers to send: ``prefix`` (``prefix_nbytes`` bytes) then the out-of-band
    ``arrays``, each padded to its entry in ``buffer_sizes``. The encoder counts the sizes as it
    goes: nothing here walks the parts again."""

    prefix: list
    prefix_nbytes: int
    #: The out-of-band arrays' data (byte views of their numpy memory), in order.
    arrays: list
    #: Each array's size on the wire, padding included: the prefix's size table.
    buffer_sizes: list

    @property
    def buffers(self) -> list:
        """What follows the prefix: each array, then its padding."""
        out: list = []
        for data, size in zip(self.arrays, self.buffer_sizes):
            out.append(data)
            if size > data.nbytes:
                out.append(_ZEROS[:size - data.nbytes])
        return out

    @property
    def parts(self) -> list:
        return self.prefix + self.buffers

    @property
    def nbytes(self) -> int:
        return self.prefix_nbytes + sum(self.buffer_sizes)


def _nbytes(part: Buffer) -> int:
    return part.nbytes if isinstance(part, (memoryview, np.ndarray)) else len(part)


def _dtype_code(dtype: np.dtype) -> bytes:
    code = dtype.str.encode()
    return _U8.pack(len(code)) + code


class _Encoder:
    __slots__ = ("body", "size", "arrays", "sizes")

    def __init__(self) -> None:
        self.body: list = []
        self.size = 0  # bytes of body so far, for the 8-byte alignment of in-band array data
        self.arrays: list = []
        self.sizes: list = []

    def add(self, part: bytes) -> None:
        self.body.append(part)
        self.size += len(part)

    def encode(self, value: Any) -> None:
        if isinstance(value, np.ndarray) and value.dtype.kind not in "OV":
            if not value.flags.c_contiguous:
                value = np.ascontiguousarray(value)
            shape = _dtype_code(value.dtype) + _U8.pack(value.ndim) + b"".join(_U64.pack(d) for d in value.shape)
            data = memoryview(value).cast("B") if value.size else b""
            if value.nbytes >= OUT_OF_BAND_BYTES:
                self.add(b"A" + shape)
                self.arrays.append(data)
                self.sizes.append(value.nbytes + -value.nbytes % 8)
                return
            head = b"a" + shape
            self.add(head + _ZEROS[:-(self.size + len(head)) % 8])
            self.body.append(data)
            self.size += value.nbytes
        elif isinstance(value, np.generic) and value.dtype.kind not in "OV":
            self.add(b"s" + _dtype_code(value.dtype) + value.tobytes())
        elif type(value) is bytes:
            self.add(b"b" + _U64.pack(len(value)) + value)
        elif type(value) is str:
            raw = value.encode("utf-8")
            self.add(b"u" + _U64.pack(len(raw)) + raw)
        elif type(value) is tuple:
            self.add(b"t" + _U32.pack(len(value)))
            for v in value:
                self.encode(v)
        elif type(value) is dict:
            self.add(b"d" + _U32.pack(len(value)))
            for k, v in value.items():
                self.encode(k)
                self.encode(v)
        elif isinstance(value, tuple) and hasattr(value, "_fields"):
            kind = pickle.dumps(type(value), protocol=5)
            self.add(b"n" + _U32.pack(len(kind)) + kind + _U32.pack(len(value)))
            for v in value:
                self.encode(v)
        else:
            blob = pickle.dumps(value, protocol=5)
            self.add(b"p" + _U64.pack(len(blob)) + blob)


def _is_column(elements: Sequence) -> bool:
    first = elements[0]
    if not isinstance(first, np.generic) or first.dtype.kind in "OVSU":
        return False
    dtype = first.dtype
    for e in elements:
        if type(e) is not type(first) or e.dtype != dtype:
            return False
    return True


def _table(count: int, layout: int, sizes: list) -> bytes:
    """The prefix's header: fixed part and the out-of-band size table."""
    fixed = _HEADER.pack(MAGIC, count, layout, len(sizes))
    return fixed + _ZEROS[:FIXED_PREFIX_BYTES - len(fixed)] + b"".join(_U64.pack(n) for n in sizes)


def encode_elements(elements: Sequence) -> EncodedFrame:
    """Encodes elements into one frame; large arrays' memory is referenced, not copied."""
    count = len(elements)
    if count and _is_column(elements):
        column = np.array(elements)
        head = _table(count, _COLUMN, []) + _dtype_code(column.dtype)
        pad = -(len(head) + column.nbytes) % 8
        return EncodedFrame([head, memoryview(column).cast("B"), _ZEROS[:pad]], len(head) + column.nbytes + pad,
                            [], [])
    encoder = _Encoder()
    for element in elements:
        try:
            encoder.encode(element)
        except Exception as exc:
            raise _unencodable(element, exc) from exc
    if encoder.size % 8:  # so that the buffers after the prefix are 8-byte aligned in a whole frame
        encoder.add(_ZEROS[:-encoder.size % 8])
    table = _table(count, _GENERAL, encoder.sizes)
    return EncodedFrame([table] + encoder.body, len(table) + encoder.size, encoder.arrays, encoder.sizes)


def _find_unencodable(value: Any, path: str) -> Optional[tuple[str, Any, BaseException]]:
    """The first component of ``value`` that the encoder refuses, as (its path, it, the encoder's exception);
    None if each encodes. Walked only once encoding failed, so the encoder itself keeps no path."""
    kind = type(value)
    if kind is tuple or kind is list or (isinstance(value, tuple) and hasattr(value, "_fields")):
        fields = getattr(value, "_fields", None)
        for i, item in enumerate(value):
            found = _find_unencodable(item, f"{path}.{fields[i]}" if fields else f"{path}[{i}]")
            if found is not None:
                return found
        if kind is tuple:
            return None
    elif kind is dict:
        for key, item in value.items():
            found = _find_unencodable(key, f"{path}[{key!r}] (as a key)") or _find_unencodable(item, f"{path}[{key!r}]")
            if found is not None:
                return found
        return None
    try:
        _Encoder().encode(value)  # a leaf, a list (pickled whole), a namedtuple (its type is pickled)
    except Exception as exc:
        return path, value, exc
    return None


def _unencodable(element: Any, exc: Exception) -> ElementSerializationError:
    found = _find_unencodable(element, "")
    path, component, reason = found if found is not None else ("", element, exc)
    return unencodable_error(path, _type_name(type(component)), f"{type(reason).__name__}: {reason}")


def _type_name(kind: type) -> str:
    module = kind.__module__
    return kind.__qualname__ if module in ("builtins", "__main__") else f"{module}.{kind.__qualname__}"


def unencodable_error(path: str, component_type: str, reason: str, where: str = "") -> ElementSerializationError:
    """The error for an element whose component at ``path`` (``""``: the element itself) has no wire form;
    ``where``: the transformation that produced the element, when known (the worker's task runner knows it).

    Example::

        >>> str(unencodable_error("['lock']", "_thread.lock", "TypeError: cannot pickle '_thread.lock' object",
        ...                       where="Dataset.map(make_record)"))
        "Dataset.map(make_record) produced an element that cannot be serialized: its component ['lock'] is a \
_thread.lock (TypeError: cannot pickle '_thread.lock' object). Elements are serialized as ..."
    """
    made = f"{where} produced an element that cannot" if where else "an element cannot"
    part = f"its component {path}" if path else "it"
    return ElementSerializationError(
        f"{made} be serialized: {part} is a {component_type} ({reason}). Elements are serialized as numpy "
        f"arrays and scalars, str, bytes, and tuples, dicts and namedtuples of them; anything else must be "
        f"picklable", path=path, component_type=component_type, reason=reason, where=where)


def iter_chunks(parts: Sequence[Buffer], chunk_bytes: int) -> Iterator[bytes]:
    """Regroups a frame's buffers into messages of at most ``chunk_bytes`` (gRPC limits never cap an element)."""
    pending: list = []
    pending_size = 0
    for part in parts:
        view = memoryview(part).cast("B") if not isinstance(part, bytes) else part
        offset, n = 0, len(view)
        while offset < n:
            take = min(n - offset, chunk_bytes - pending_size)
            pending.append(view[offset:offset + take] if (offset or take < n) else view)
            pending_size += take
            offset += take
            if pending_size >= chunk_bytes:
                yield b"".join(pending)
                pending, pending_size = [], 0
    if pending or not parts:
        yield b"".join(pending)


# --- decoding -----------------------------------------------------------------------------------

def _fixed(prefix: Buffer) -> tuple[int, int, int]:
    if _nbytes(prefix) < FIXED_PREFIX_BYTES:
        raise WireFormatError(f"truncated frame: {_nbytes(prefix)} bytes, shorter than a frame header")
    magic, count, layout, nbuf = _HEADER.unpack_from(prefix, 0)
    if magic != MAGIC:
        raise WireFormatError(f"not a dataservice frame (magic {bytes(magic)!r})")
    return count, layout, nbuf


def buffer_sizes(prefix: Buffer) -> list[int]:
    """The sizes of the out-of-band buffers that follow a frame's prefix (which must be whole
    up to its size table)."""
    _, _, nbuf = _fixed(prefix)
    end = FIXED_PREFIX_BYTES + 8 * nbuf
    if _nbytes(prefix) < end:
        raise WireFormatError(f"truncated frame: the size table of {nbuf} buffers needs {end} bytes, "
                              f"have {_nbytes(prefix)}")
    return list(struct.unpack_from(f"<{nbuf}Q", prefix, FIXED_PREFIX_BYTES))


class _Reader:
    __slots__ = ("buf", "view", "pos", "buffers", "next_buffer")

    def __init__(self, buf: Buffer, start: int, buffers: Sequence[Buffer]):
        self.buf = buf
        self.view = memoryview(buf).cast("B")
        self.pos = start
        self.buffers = buffers
        self.next_buffer = 0

    def take(self, n: int) -> memoryview:
        start = self.pos
        end = start + n
        if end > len(self.view):
            raise WireFormatError(f"truncated frame: needed {n} bytes at offset {start}, have {len(self.view) - start}")
        self.pos = end
        return self.view[start:end]

    def u8(self) -> int:
        return self.take(1)[0]

    def u32(self) -> int:
        return _U32.unpack(self.take(4))[0]

    def u64(self) -> int:
        return _U64.unpack(self.take(8))[0]

    def dtype(self) -> np.dtype:
        return np.dtype(bytes(self.take(self.u8())).decode())

    def array_meta(self) -> tuple[np.dtype, tuple, int]:
        dtype = self.dtype()
        shape = tuple(self.u64() for _ in range(self.u8()))
        count = 1
        for d in shape:
            count *= d
        return dtype, shape, count

    def out_of_band(self) -> Buffer:
        if self.next_buffer >= len(self.buffers):
            raise WireFormatError(f"frame refers to out-of-band buffer {self.next_buffer}, "
                                  f"but has {len(self.buffers)}")
        buffer = self.buffers[self.next_buffer]
        self.next_buffer += 1
        return buffer


def _decode(r: _Reader) -> Any:
    tag = r.take(1).tobytes()
    if tag == b"a":
        dtype, shape, count = r.array_meta()
        r.take(-r.pos % 8)
        if count == 0:
            return np.zeros(shape, dtype)
        start = r.pos
        r.take(count * dtype.itemsize)
        return np.frombuffer(r.buf, dtype=dtype, count=count, offset=start).reshape(shape)
    if tag == b"A":
        dtype, shape, count = r.array_meta()
        buffer = r.out_of_band()
        if _nbytes(buffer) < count * dtype.itemsize:
            raise WireFormatError(f"out-of-band buffer {r.next_buffer - 1} holds {_nbytes(buffer)} bytes, "
                                  f"its {dtype} array of shape {shape} needs {count * dtype.itemsize}")
        return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)
    if tag == b"s":
        dtype = r.dtype()
        return np.frombuffer(r.take(dtype.itemsize), dtype=dtype)[0]
    if tag == b"b":
        return r.take(r.u64()).tobytes()
    if tag == b"u":
        return str(r.take(r.u64()), "utf-8")
    if tag == b"t":
        return tuple(_decode(r) for _ in range(r.u32()))
    if tag == b"d":
        out = {}
        for _ in range(r.u32()):
            key = _decode(r)
            out[key] = _decode(r)
        return out
    if tag == b"n":
        kind = pickle.loads(r.take(r.u32()))
        return kind(*(_decode(r) for _ in range(r.u32())))
    if tag == b"p":
        return pickle.loads(r.take(r.u64()))
    raise WireFormatError(f"unknown value tag {tag!r} at offset {r.pos - 1}")


def decode_frame(prefix: Buffer, buffers: Sequence[Buffer]) -> list:
    """Decodes a frame received in pieces: its prefix, and its out-of-band buffers (as many, and
    as large, as ``buffer_sizes(prefix)`` says). Arrays are views into these buffers, writable
    when the buffers are; an out-of-band array is the whole of its buffer."""
    count, layout, _ = _fixed(prefix)
    sizes = buffer_sizes(prefix)
    if len(buffers) != len(sizes) or any(_nbytes(b) != n for b, n in zip(buffers, sizes)):
        raise WireFormatError(f"frame announces buffers of {sizes} bytes, got {[_nbytes(b) for b in buffers]}")
    r = _Reader(prefix, FIXED_PREFIX_BYTES + 8 * len(sizes), buffers)
    if layout == _COLUMN:
        dtype = r.dtype()
        start = r.pos
        r.take(count * dtype.itemsize)
        elements = list(np.frombuffer(prefix, dtype=dtype, count=count, offset=start))
    elif layout == _GENERAL:
        elements = [_decode(r) for _ in range(count)]
    else:
        raise WireFormatError(f"unknown frame layout {layout}")
    r.take(-r.pos % 8)  # the padding that aligns the buffers after the prefix
    if r.pos != len(r.view):
        raise WireFormatError(f"{len(r.view) - r.pos} trailing bytes after {count} elements")
    if r.next_buffer != len(buffers):
        raise WireFormatError(f"{len(buffers) - r.next_buffer} out-of-band buffers left after {count} elements")
    return elements


def split_frame(frame: Buffer) -> tuple[memoryview, list]:
    """A whole frame (as gRPC delivers it) as ``decode_frame``'s arguments: its prefix and its
    out-of-band buffers, views into ``frame``."""
    view = memoryview(frame).cast("B")
    sizes = buffer_sizes(view)
    start = len(view) - sum(sizes)
    if start < FIXED_PREFIX_BYTES + 8 * len(sizes):
        raise WireFormatError(f"truncated frame: {len(view)} bytes cannot hold buffers of {sum(sizes)} bytes")
    prefix = view[:start]
    buffers = []
    for n in sizes:
        buffers.append(view[start:start + n])
        start += n
    return prefix, buffers


def decode_elements(frame: Buffer) -> list:
    """Decodes one whole frame, prefix and buffers in one piece (as gRPC delivers it)."""
    return decode_frame(*split_frame(frame))
