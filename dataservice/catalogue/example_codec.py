"""``tf.train.Example`` bytes to and from flat dicts of numpy values, as TFDS writes and parses them.

A TFDS record is a serialized ``tf.train.Example`` (our own compiled copy of TensorFlow's proto,
:mod:`dataservice.proto.example_pb2`: same field numbers, no TensorFlow): one ``Feature`` per
leaf of the features, keyed by the leaf's path with ``/`` between nested names. Each leaf has a
:class:`WireSpec` (TFDS's "serialized info"): its shape and dtype. On the wire there are three
kinds of lists, so integers and bools go to ``int64_list`` (``uint64`` bit-cast to ``int64``),
floating point to ``float_list`` (float32: ``float64`` loses precision, as in TFDS) and strings to
``bytes_list`` (``str`` as UTF-8); every tensor is flattened in C order.

Parsing does what ``tf.io.parse_single_example`` does with the specs TFDS gives it: a fully
defined shape needs exactly its number of values; a shape with one ``None`` dimension takes any
multiple of the others, and a missing key reads as empty; a missing required key, a list of
another kind or a wrong count raise :class:`~dataservice.errors.DataLossError` naming the key.
Values come back cast to the leaf's dtype and reshaped: a numpy scalar (``bytes`` for a string)
for shape ``()``, else an array (``object`` of ``bytes`` for strings).

Example::

    >>> specs = {"label": WireSpec((), np.int64), "pixels": WireSpec((None, 2), np.float32)}
    >>> data = serialize({"label": np.int64(3), "pixels": np.ones((2, 2), np.float32)}, specs)
    >>> parse(data, specs)
    {'label': np.int64(3), 'pixels': array([[1., 1.],
           [1., 1.]], dtype=float32)}
"""

from __future__ import annotations

import math
from typing import Any, Mapping, NamedTuple

import numpy as np

from dataservice.errors import DataLossError
from dataservice.proto import example_pb2

__all__ = ["WireSpec", "wire_kind", "serialize", "parse", "Parser"]

_INT64 = np.dtype(np.int64)
_UINT64 = np.dtype(np.uint64)
_FLOAT32 = np.dtype(np.float32)
_OBJECT = np.dtype(object)

INT64_LIST = "int64_list"
FLOAT_LIST = "float_list"
BYTES_LIST = "bytes_list"

# TensorFlow's names for the kinds, as its parser's errors say them.
_KIND_NAMES = {INT64_LIST: "int64", FLOAT_LIST: "float", BYTES_LIST: "string"}


class WireSpec(NamedTuple):
    """One leaf as stored in an Example: ``shape`` (``None`` for a dimension that varies), the
    numpy ``dtype`` it decodes to (``object`` for strings), and whether it may be absent
    (``optional``; then ``default`` fills it in, as TFDS's optional features)."""

    shape: tuple
    dtype: np.dtype
    optional: bool = False
    default: Any = None


def wire_kind(dtype: Any) -> str:
    """The Feature list that holds ``dtype``: ``"int64_list"``, ``"float_list"`` or ``"bytes_list"``.

    Example::

        >>> wire_kind(np.dtype("bool")), wire_kind(np.dtype("float64")), wire_kind(np.dtype(object))
        ('int64_list', 'float_list', 'bytes_list')
    """
    kind = np.dtype(dtype).kind
    if kind in "iub":
        return INT64_LIST
    if kind == "f":
        return FLOAT_LIST
    if kind in "OSU":
        return BYTES_LIST
    raise TypeError(f"a tf.train.Example holds integers, floats and strings only, not {np.dtype(dtype)}")


def _as_bytes(value: Any, key: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytearray):
        return bytes(value)
    raise TypeError(f"feature {key!r}: expected bytes or str values, got {value!r} ({type(value).__name__})")


def _to_feature(value: Any, spec: WireSpec, key: str) -> example_pb2.Feature:
    kind = wire_kind(spec.dtype)
    if kind == BYTES_LIST:
        if isinstance(value, (bytes, str)):
            values = [_as_bytes(value, key)]
        else:
            values = [_as_bytes(v, key) for v in np.asarray(value, dtype=object).ravel()]
        return example_pb2.Feature(bytes_list=example_pb2.BytesList(value=values))
    array = np.asarray(value)
    if kind == INT64_LIST:
        if array.dtype == _UINT64:
            array = array.view(_INT64)  # TFDS bit-casts: tf.train.Example has no uint64
        # tolist() makes Python ints in C, the fastest way into a repeated field.
        return example_pb2.Feature(int64_list=example_pb2.Int64List(value=array.astype(_INT64).ravel().tolist()))
    return example_pb2.Feature(float_list=example_pb2.FloatList(value=array.astype(_FLOAT32).ravel().tolist()))


def serialize(flat_values: Mapping[str, Any], specs: Mapping[str, WireSpec]) -> bytes:
    """The serialized Example of ``flat_values`` (flat key -> value already of the spec's dtype and
    shape; ``None`` for an absent optional value, which is left out, as TFDS does).

    Map entries are written sorted by key (protobuf's deterministic serialization), so the same
    values always give the same bytes; TFDS's order is the protobuf runtime's hash order, which
    changes from process to process. Parsers do not depend on the order.
    """
    example = example_pb2.Example()
    example.features.SetInParent()  # present even when empty, as in TFDS's Examples
    feature_map = example.features.feature
    for key, spec in specs.items():
        value = flat_values[key]
        if value is None and spec.optional:
            continue
        feature_map[key].CopyFrom(_to_feature(value, spec, key))
    return example.SerializeToString(deterministic=True)


def _shape_text(shape: tuple) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + (",)" if len(shape) == 1 else ")")


class _Leaf:
    """How to parse one key: precomputed once per feature, used per record."""

    __slots__ = ("key", "spec", "kind", "dtype", "shape", "scalar", "count", "inner", "known", "cast", "default")

    def __init__(self, key: str, spec: WireSpec):
        self.key = key
        self.spec = spec
        self.dtype = np.dtype(spec.dtype)
        self.kind = wire_kind(self.dtype)
        self.shape = tuple(spec.shape)
        self.scalar = self.shape == ()
        unknown = [i for i, d in enumerate(self.shape) if d is None]
        if len(unknown) > 1:
            raise ValueError(f"feature {key!r}: a tf.train.Example stores shapes with at most one unknown "
                             f"dimension, not {_shape_text(self.shape)}")
        self.known = not unknown
        self.inner = math.prod(d for d in self.shape if d is not None)
        self.count = self.inner if self.known else None
        if self.kind == BYTES_LIST:
            self.cast = None
        elif self.kind == INT64_LIST:
            self.cast = None if self.dtype == _INT64 else self.dtype
        else:
            self.cast = None if self.dtype == _FLOAT32 else self.dtype
        self.default = None
        if spec.optional:
            default = spec.default
            if self.scalar:
                self.default = default if self.kind == BYTES_LIST else self.dtype.type(default)
            else:
                self.default = np.full(tuple(0 if d is None else d for d in self.shape), default, dtype=self.dtype)

    def error(self, what: str) -> DataLossError:
        return DataLossError(f"a tf.train.Example does not match the features: key {self.key!r} "
                             f"({_KIND_NAMES[self.kind]}, shape {_shape_text(self.shape)}): {what}")

    def missing(self) -> Any:
        if self.spec.optional:
            return self.default
        if not self.known:
            # TFDS parses these with allow_missing=True: an absent key is an empty tensor.
            return self.values_to_numpy(())
        raise self.error("it is required but the Example does not have it")

    def values_to_numpy(self, values: Any) -> Any:
        n = len(values)
        if self.scalar:
            if n != 1:
                raise self.error(f"expected 1 value, got {n}")
            value = values[0]
            if self.kind == BYTES_LIST:
                return value
            if self.dtype == _UINT64:
                return np.int64(value).view(_UINT64)
            return self.dtype.type(value)
        if self.kind == BYTES_LIST:
            array = np.empty(n, dtype=_OBJECT)
            array[:] = list(values)  # element by element: np.array() would make a bytes dtype
        elif self.kind == INT64_LIST:
            array = np.array(values, dtype=_INT64)
            if self.cast is not None:
                array = array.view(_UINT64) if self.cast == _UINT64 else array.astype(self.cast)
        else:
            array = np.array(values, dtype=_FLOAT32)
            if self.cast is not None:
                array = array.astype(self.cast)
        if self.known:
            if n != self.count:
                raise self.error(f"expected {self.count} values, got {n}")
            return array.reshape(self.shape)
        if self.inner == 0:
            if n:
                raise self.error(f"expected no values, got {n}")
            return array.reshape(tuple(0 if d is None else d for d in self.shape))
        if n % self.inner:
            raise self.error(f"got {n} values, not a multiple of {self.inner}")
        return array.reshape(tuple(-1 if d is None else d for d in self.shape))


class Parser:
    """Parses serialized Examples into flat dicts of numpy values, for fixed ``specs`` (flat key ->
    :class:`WireSpec`). Keys of the Example that are not in ``specs`` are ignored, as TFDS does.

    Example::

        >>> parser = Parser({"x": WireSpec((3,), np.int32)})
        >>> parser.parse(serialize({"x": np.arange(3, dtype=np.int32)}, {"x": WireSpec((3,), np.int32)}))
        {'x': array([0, 1, 2], dtype=int32)}
    """

    def __init__(self, specs: Mapping[str, WireSpec]):
        self._leaves = [_Leaf(key, spec) for key, spec in specs.items()]

    def parse(self, data: bytes) -> dict:
        """``data`` (one serialized Example) as a flat dict, key -> numpy value."""
        try:
            example = example_pb2.Example.FromString(data)
        except Exception as exc:  # protobuf's DecodeError and friends
            raise DataLossError(f"not a serialized tf.train.Example ({len(data)} bytes): {exc}") from None
        feature_map = example.features.feature
        out = {}
        for leaf in self._leaves:
            feature = feature_map.get(leaf.key)
            kind = None if feature is None else feature.WhichOneof("kind")
            if kind is None:
                # A Feature with no list set reads as an absent one, as in TensorFlow.
                out[leaf.key] = leaf.missing()
                continue
            if kind != leaf.kind:
                raise leaf.error(f"the Example holds a {_KIND_NAMES[kind]} list")
            out[leaf.key] = leaf.values_to_numpy(getattr(feature, kind).value)
        return out


def parse(data: bytes, specs: Mapping[str, WireSpec]) -> dict:
    """One serialized Example as a flat dict (key -> numpy value), by ``specs``; for many records,
    build a :class:`Parser` once instead."""
    return Parser(specs).parse(data)

