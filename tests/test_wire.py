"""The element wire format: round trips, out-of-band arrays, alignment, chunking and bad frames."""

from __future__ import annotations

import collections
import threading

import numpy as np
import pytest

from dataservice.errors import ElementSerializationError
from dataservice.service.wire import (FIXED_PREFIX_BYTES, OUT_OF_BAND_BYTES, WireFormatError, buffer_sizes,
                                      decode_elements, decode_frame, encode_elements, iter_chunks, split_frame)

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc

Point = collections.namedtuple("Point", ["x", "y"])


class Opaque:
    """No numpy form: travels pickled."""

    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, Opaque) and other.v == self.v


def whole(frame) -> bytearray:
    return bytearray(b"".join(bytes(memoryview(p).cast("B")) for p in frame.parts))


def in_pieces(frame) -> tuple[bytearray, list[np.ndarray]]:
    """What a TCP reader does: the prefix, then each buffer into memory of its own."""
    prefix = bytearray(b"".join(bytes(memoryview(p).cast("B")) for p in frame.prefix))
    data = whole(frame)[len(prefix):]
    buffers, at = [], 0
    for n in buffer_sizes(prefix):
        buffer = np.empty(n, np.uint8)
        buffer[:] = np.frombuffer(data, np.uint8, n, at)
        buffers.append(buffer)
        at += n
    assert at == len(data)
    return prefix, buffers


def same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, np.generic):
        return type(a) is type(b) and a == b
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


BIG = OUT_OF_BAND_BYTES // 4  # float32 elements of an array exactly at the out-of-band threshold

ELEMENT_LISTS = {
    "scalars (one column)": [np.int64(i) for i in range(100)],
    "float column": [np.float32(i) / 3 for i in range(7)],
    "mixed scalars": [np.int64(1), np.float64(2.5), np.bool_(True), np.int8(-3)],
    "python values": [1, 2.5, "text", "ünïcode", b"bytes", None, True, Opaque(3)],
    "small arrays": [np.arange(5), np.zeros((2, 3), np.float32), np.array([True, False]), np.arange(3, dtype=">i4")],
    "empty arrays": [np.zeros((0,), np.float64), np.zeros((3, 0), np.int8)],
    "zero-d and odd sizes": [np.array(7), np.arange(3, dtype=np.uint8), np.arange(5, dtype=np.float64)],
    "structures": [(np.int64(1), {"a": np.arange(3), "b": (b"x", "y")}), Point(np.float32(1), np.arange(2))],
    "large arrays": [np.arange(BIG, dtype=np.float32), np.arange(300_001, dtype=np.uint8), np.ones((64, 64, 3), np.uint8)],
    "large and small mixed": [(np.full((BIG,), i, np.float32), np.int64(i), np.arange(i + 1)) for i in range(5)],
    "just under and at the threshold": [np.zeros(OUT_OF_BAND_BYTES - 1, np.uint8), np.zeros(OUT_OF_BAND_BYTES, np.uint8)],
    "non-contiguous": [np.arange(2 * BIG, dtype=np.float32)[::2], np.arange(12).reshape(3, 4).T],
    "strings array": [np.array(["a", "bc"]), np.array([b"x", b"yz"])],
    "no elements": [],
}


@pytest.mark.parametrize("name", ELEMENT_LISTS)
def test_round_trip_whole_and_in_pieces(name):
    elements = ELEMENT_LISTS[name]
    frame = encode_elements(elements)
    assert frame.nbytes == len(whole(frame))
    for decoded in (decode_elements(whole(frame)), decode_frame(*in_pieces(frame))):
        assert len(decoded) == len(elements)
        for original, back in zip(elements, decoded):
            expected = np.array(original, order="C") if isinstance(original, np.ndarray) else original
            assert same(expected, back), (original, back)


def test_arrays_at_the_threshold_go_out_of_band_without_a_copy():
    small = np.arange(OUT_OF_BAND_BYTES - 8, dtype=np.uint8)
    large = np.arange(BIG, dtype=np.float32)
    frame = encode_elements([small, large])
    assert len(frame.buffers) == 1
    # The sender hands the array's own memory to the socket.
    assert np.shares_memory(np.frombuffer(frame.buffers[0], np.uint8), large)
    prefix, buffers = in_pieces(frame)
    assert buffer_sizes(prefix) == [large.nbytes]
    decoded_small, decoded_large = decode_frame(prefix, buffers)
    # The receiver's buffer becomes the array, writable, and the small array stays in the prefix.
    assert np.shares_memory(decoded_large, buffers[0]) and decoded_large.nbytes == buffers[0].nbytes
    assert decoded_large.flags.writeable
    decoded_large[0] = -1.0
    assert buffers[0][:4].view(np.float32)[0] == -1.0
    assert np.shares_memory(decoded_small, np.frombuffer(prefix, np.uint8))


def test_out_of_band_buffers_are_padded_to_eight_bytes():
    odd = np.ones(OUT_OF_BAND_BYTES + 3, np.uint8)
    after = np.arange(BIG, dtype=np.float64)
    frame = encode_elements([odd, after])
    assert buffer_sizes(b"".join(frame.prefix)) == [OUT_OF_BAND_BYTES + 8, after.nbytes]
    decoded = decode_elements(whole(frame))
    assert same(decoded[0], odd) and same(decoded[1], after)
    # In one piece (gRPC), every array still starts 8-byte aligned in the frame.
    assert all(a.ctypes.data % 8 == 0 for a in decoded)


def test_in_band_arrays_are_eight_byte_aligned():
    elements = [(b"x" * k, np.arange(k + 1, dtype=np.float64)) for k in range(1, 12)]
    frame = encode_elements(elements)
    data = whole(frame)
    base = np.frombuffer(data, np.uint8).ctypes.data
    for _, array in decode_elements(data):
        assert (array.ctypes.data - base) % 8 == 0


def test_split_frame_locates_the_buffers():
    frame = encode_elements([np.zeros(BIG, np.float32), np.int64(3)])
    prefix, buffers = split_frame(whole(frame))
    assert len(prefix) == frame.prefix_nbytes and [b.nbytes for b in buffers] == frame.buffer_sizes
    assert frame.prefix_nbytes % 8 == 0 and frame.prefix_nbytes >= FIXED_PREFIX_BYTES + 8


@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 4096, 1 << 20])
def test_iter_chunks_reassembles_to_the_frame(chunk_bytes):
    frame = encode_elements(ELEMENT_LISTS["large and small mixed"][:2] + [np.arange(10)])
    chunks = list(iter_chunks(frame.parts, chunk_bytes))
    assert all(len(c) <= chunk_bytes for c in chunks)
    assert all(len(c) == chunk_bytes for c in chunks[:-1])
    assert b"".join(chunks) == bytes(whole(frame))


def test_iter_chunks_of_nothing_is_one_empty_chunk():
    assert list(iter_chunks([], 16)) == [b""]


# --- bad frames ---------------------------------------------------------------------------------

def test_not_a_frame():
    with pytest.raises(WireFormatError, match="not a dataservice frame"):
        decode_elements(bytearray(b"GET / HTTP/1.1\r\n\r\n"))


def test_shorter_than_a_header():
    with pytest.raises(WireFormatError, match="shorter than a frame header"):
        decode_elements(bytearray(b"DSW2"))


@pytest.mark.parametrize("cut", [1, 8, 100])
def test_truncated_frames_are_errors_not_garbage(cut):
    data = whole(encode_elements([np.arange(100), "text", np.arange(BIG, dtype=np.float32)]))
    with pytest.raises(WireFormatError, match="truncated|trailing|buffers"):
        decode_elements(data[:-cut])


def test_buffers_that_do_not_match_the_size_table():
    prefix, buffers = in_pieces(encode_elements([np.zeros(BIG, np.float32)]))
    with pytest.raises(WireFormatError, match="announces buffers"):
        decode_frame(prefix, [])
    with pytest.raises(WireFormatError, match="announces buffers"):
        decode_frame(prefix, [buffers[0][:-8]])


def test_unknown_tag():
    data = whole(encode_elements([b"x"]))
    data[FIXED_PREFIX_BYTES] = ord("?")
    with pytest.raises(WireFormatError, match="unknown value tag"):
        decode_elements(data)


# --- elements with no wire form -----------------------------------------------------------------

def _local_point():
    LocalPoint = collections.namedtuple("LocalPoint", ["x"])  # a type pickle cannot find by name
    return LocalPoint(1)


@pytest.mark.parametrize("element, path, component_type", [
    ({"id": 1, "lock": threading.Lock()}, "['lock']", "_thread.lock"),
    ((np.int64(1), {"meta": threading.Lock(), "ok": b"x"}), "[1]['meta']", "_thread.lock"),
    (Point(1, {"tags": ["a", threading.Lock()]}), ".y['tags'][1]", "_thread.lock"),
    ({threading.Lock(): 1}, "(as a key)", "_thread.lock"),
    ((np.arange(3), _local_point()), "[1]", "test_wire.LocalPoint"),
    ((i for i in range(3)), "", "generator"),
], ids=["dict", "nested", "namedtuple-list", "key", "namedtuple-type", "whole-element"])
def test_an_element_with_no_wire_form_names_the_component_and_its_type(element, path, component_type):
    with pytest.raises(ElementSerializationError) as info:
        encode_elements([np.arange(4), element])
    error = info.value
    assert path in error.path and error.component_type.endswith(component_type)
    assert error.where == ""  # the encoder does not know the pipeline: the worker's task runner adds it
    assert (f"its component {error.path} is a {error.component_type}" if path else
            f"it is a {component_type}") in str(error)
    assert isinstance(error.__cause__, Exception) and error.reason.endswith(str(error.__cause__))
