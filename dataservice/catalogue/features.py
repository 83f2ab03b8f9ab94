"""TFDS's feature connectors without TensorFlow: what a dataset's examples hold and how they are stored.

A :class:`FeaturesDict` describes one example (a nested dict), each leaf a connector:
:class:`Tensor` (any shape and dtype), :class:`Scalar`, :class:`ClassLabel` (an ``int64`` label
with optional names), :class:`Text` (a UTF-8 string) and :class:`Image` (PNG/JPEG, through
Pillow: ``pip install 'dataservice[images]'``). It turns an example into the bytes of a
``tf.train.Example`` exactly as TensorFlow Datasets does (:meth:`FeaturesDict.serialize_example`)
and back into numpy values as ``tfds.as_numpy(tfds.load(...))`` gives them
(:meth:`FeaturesDict.deserialize_example`): scalars as numpy scalars of the feature's dtype,
strings as ``bytes``, tensors reshaped, images as ``uint8`` arrays ``(height, width, channels)``,
dict keys sorted. ``features.json`` (and the ``<name>.labels.txt`` files of class names) are
TFDS's own, so a dataset directory prepared by either side describes itself to the other
(:func:`save_features`, :func:`load_features`).

Dtypes are numpy dtypes; strings are ``object`` (TFDS's ``np_dtype``, written ``"string"`` in
``features.json``). A dtype may be given as a numpy dtype or type, a name (``"int64"``,
``"string"``), a Python type (``int``, ``float``, ``bool``, ``str``, ``bytes``) or a ``tf.DType``.

Example::

    >>> features = FeaturesDict({
    ...     "image": Image(shape=(28, 28, 1)),
    ...     "label": ClassLabel(names=["cat", "dog"]),
    ...     "meta": {"id": np.int64, "caption": Text()},
    ... })
    >>> data = features.serialize_example(
    ...     {"image": np.zeros((28, 28, 1), np.uint8), "label": "dog", "meta": {"id": 7, "caption": "a dog"}})
    >>> example = features.deserialize_example(data)
    >>> example["label"], example["meta"], example["image"].shape
    (np.int64(1), {'caption': b'a dog', 'id': np.int64(7)}, (28, 28, 1))
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import io
import json
import os
import sys
import zlib
from typing import Any, Callable, ClassVar, Iterable, Iterator, Mapping, Optional, Union

import numpy as np

from dataservice.catalogue import example_codec
from dataservice.catalogue.example_codec import WireSpec

__all__ = [
    "FeatureConnector", "Tensor", "Scalar", "ClassLabel", "Text", "Image", "FeaturesDict", "Documentation",
    "Encoding", "to_feature", "features_from_json", "save_features", "load_features", "FEATURES_FILENAME",
]

#: The file, in a dataset's version directory, that describes its features (TFDS's name).
FEATURES_FILENAME = "features.json"

_OBJECT = np.dtype(object)
_TFDS = "tensorflow_datasets.core.features."
_PILLOW_HINT = ("the Image feature needs Pillow to encode and decode PNG/JPEG images: "
                "pip install 'dataservice[images]' (or pip install pillow)")

Shape = tuple
Json = dict


# --- dtypes and shapes ---------------------------------------------------------------------------

def _as_dtype(value: Any, what: str = "dtype") -> np.dtype:
    """A numpy dtype for a feature: ``object`` for strings, else bool, an integer or a float."""
    specs = sys.modules.get("dataservice.data.specs")
    if specs is not None and value is specs.string:
        return _OBJECT
    if isinstance(value, str) and value in ("string", "str", "bytes"):
        return _OBJECT
    if any(value is t for t in (str, bytes, np.str_, np.bytes_, object, np.object_)):
        return _OBJECT
    if hasattr(value, "as_numpy_dtype") and isinstance(getattr(value, "name", None), str):
        # A tf.DType, taken by duck typing: TensorFlow is never imported here.
        if value.name == "string":
            return _OBJECT
        value = value.as_numpy_dtype
    if value is None:
        raise TypeError(f"{what} must be a numpy dtype, a dtype name, a Python type or a tf.DType, got None")
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be a numpy dtype, a dtype name (e.g. 'int64', 'string'), a Python type "
                        f"or a tf.DType, got {value!r}") from exc
    if dtype.kind in "SUO":
        return _OBJECT
    if dtype.kind not in "biuf":
        raise TypeError(f"{what} {dtype} cannot be stored in a tf.train.Example: use bool, an integer, "
                        f"a float or a string dtype")
    return dtype


def _dtype_to_str(dtype: np.dtype) -> str:
    return "string" if dtype == _OBJECT else dtype.name


def _dtype_from_str(name: str) -> np.dtype:
    if not isinstance(name, str):
        raise ValueError(f"features.json: a dtype must be a string, got {name!r}")
    try:
        return _as_dtype(name)
    except TypeError as exc:
        raise ValueError(f"features.json: unknown dtype {name!r}") from exc


def _as_shape(shape: Any, what: str = "shape") -> Shape:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"{what} must be a tuple of ints and Nones, got {shape!r}")
    dims = []
    for d in shape:
        if d is None or (isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d == -1):
            dims.append(None)
        elif isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0:
            dims.append(int(d))
        else:
            raise TypeError(f"{what} must be a tuple of ints >= 0 and Nones, got {shape!r}")
    return tuple(dims)


def _shape_text(shape: Shape) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + (",)" if len(shape) == 1 else ")")


def _shape_matches(actual: tuple, expected: Shape) -> bool:
    return len(actual) == len(expected) and all(e is None or a == e for a, e in zip(actual, expected))


def _where(path: str) -> str:
    return f"feature {path!r}" if path else "the feature"


def _shape_to_json(shape: Shape) -> Json:
    # Proto-JSON of TFDS's Shape message: int64 as strings, -1 for an unknown dimension, {} for ().
    return {"dimensions": [str(-1 if d is None else d) for d in shape]} if shape else {}


def _shape_from_json(value: Any) -> Shape:
    if isinstance(value, (list, tuple)):  # the legacy form: a plain list
        return _as_shape(tuple(value), "features.json shape")
    if not isinstance(value, dict):
        raise ValueError(f"features.json: a shape must be an object with 'dimensions', got {value!r}")
    try:
        dims = [int(d) for d in value.get("dimensions", [])]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"features.json: bad shape {value!r}") from exc
    if any(d < -1 for d in dims):
        raise ValueError(f"features.json: bad shape {value!r}")
    return tuple(None if d == -1 else d for d in dims)


def _optional_int(value: Any) -> Optional[int]:
    return None if value is None else int(value)


# --- the connectors ------------------------------------------------------------------------------

@dataclasses.dataclass
class Documentation:
    """A feature's description and value range: ``description`` and ``valueRange`` in features.json."""

    desc: Optional[str] = None
    value_range: Optional[str] = None


DocArg = Union[None, str, Documentation]


class FeatureConnector(abc.ABC):
    """A feature of a dataset's examples: its ``shape`` and ``dtype``, how a value is encoded for a
    ``tf.train.Example`` (:meth:`encode_example`) and decoded back (:meth:`decode_example`), and
    its ``features.json`` form (:meth:`to_json`, :func:`features_from_json`).

    Example::

        >>> feature = Tensor(shape=(2,), dtype=np.int32)
        >>> feature.encode_example([1, 2])
        array([1, 2], dtype=int32)
        >>> feature.to_json()["pythonClassName"]
        'tensorflow_datasets.core.features.tensor_feature.Tensor'
    """

    #: The ``pythonClassName`` TFDS writes for this class, so that TFDS reads our features.json.
    tfds_class_name: ClassVar[str] = ""

    def __init__(self, *, doc: DocArg = None):
        if isinstance(doc, str):
            doc = Documentation(desc=doc)
        elif doc is None:
            doc = Documentation()
        elif not isinstance(doc, Documentation):
            raise TypeError(f"doc must be a str, a Documentation or None, got {doc!r}")
        self._doc = doc

    @property
    def doc(self) -> Documentation:
        return self._doc

    @property
    @abc.abstractmethod
    def shape(self) -> Any:
        """The decoded value's shape (``None`` for a dimension that varies); a dict for a FeaturesDict."""

    @property
    @abc.abstractmethod
    def dtype(self) -> Any:
        """The decoded value's numpy dtype (``object`` for strings); a dict for a FeaturesDict."""

    @property
    def element_spec(self) -> Any:
        """The :class:`dataservice.data.specs.TensorSpec` (nested as the feature is) of decoded values.

        Example::

            >>> Tensor(shape=(None, 3), dtype=np.float32).element_spec
            TensorSpec(shape=(None, 3), dtype=float32, name=None)
        """
        from dataservice.data import specs

        return specs.TensorSpec(self.shape, specs.string if self.dtype == _OBJECT else self.dtype)

    def encode_example(self, value: Any) -> Any:
        """``value`` checked and converted to what the Example stores (e.g. a numpy array of the
        feature's dtype, an encoded image's bytes). TypeError/ValueError name what is wrong."""
        return self._encode(value, "")

    @abc.abstractmethod
    def _encode(self, value: Any, path: str) -> Any:
        """:meth:`encode_example`, with ``path`` (the feature's key) for error messages."""

    def decode_example(self, encoded: Any) -> Any:
        """What :meth:`encode_example` gave, as parsed from an Example, back to the user's value."""
        return encoded

    @abc.abstractmethod
    def serialized_info(self) -> Any:
        """How the feature is stored: a :class:`~dataservice.catalogue.example_codec.WireSpec`, or a
        dict of them (keys joined to the feature's with ``/`` in the Example)."""

    def _decoder(self, key: str) -> Callable[[dict], Any]:
        """A function from a parsed flat dict to this feature's decoded value (built once, run per record)."""
        decode = self.decode_example
        if type(self).decode_example is FeatureConnector.decode_example:
            return lambda flat: flat[key]
        return lambda flat: decode(flat[key])

    # features.json ------------------------------------------------------------------------------

    @abc.abstractmethod
    def _json_content(self) -> tuple:
        """``(field, content)``: the Feature proto's oneof field (camelCase) and its proto-JSON."""

    @classmethod
    @abc.abstractmethod
    def _from_json_content(cls, content: Json) -> "FeatureConnector":
        """The inverse of :meth:`_json_content`'s content."""

    @classmethod
    def _from_legacy_content(cls, content: Json) -> "FeatureConnector":
        """From the content of TFDS's older ``{"type": ..., "content": ...}`` form."""
        raise ValueError(f"features.json: {cls.__name__} has no legacy form")

    def to_json(self) -> Json:
        """This feature as TFDS writes it in features.json (the proto-JSON of TFDS's Feature message).

        Example::

            >>> ClassLabel(num_classes=3).to_json()["classLabel"]
            {'numClasses': '3'}
        """
        field, content = self._json_content()
        out = {"pythonClassName": self.tfds_class_name, field: content}
        if self._doc.desc:
            out["description"] = self._doc.desc
        if self._doc.value_range:
            out["valueRange"] = self._doc.value_range
        return out

    def _save_metadata(self, data_dir: str, feature_name: Optional[str]) -> None:
        """Writes what features.json does not hold (class names) beside it."""

    def _load_metadata(self, data_dir: str, feature_name: Optional[str]) -> None:
        """Reads what :meth:`_save_metadata` wrote, if it is there."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={_shape_text(self.shape)}, dtype={_dtype_to_str(self.dtype)})"


class Encoding(enum.Enum):
    """How a :class:`Tensor` is stored: ``NONE`` as a list of values (the default), ``BYTES`` as its
    raw bytes, ``ZLIB`` as its raw bytes compressed with zlib (TFDS's ``tfds.features.Encoding``)."""

    NONE = "none"
    BYTES = "bytes"
    ZLIB = "zlib"


def _default_value(dtype: np.dtype) -> Any:
    # TFDS fills an absent optional value with the dtype's minimum ('' for strings, False for bool).
    if dtype == _OBJECT:
        return b""
    if dtype.kind == "b":
        return False
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return np.finfo(dtype).min


class Tensor(FeatureConnector):
    """A tensor of a fixed ``dtype`` and a ``shape`` whose dimensions may be ``None`` (they vary).

    ``encoding`` is TFDS's: ``"none"`` stores the values as a list (at most one ``None``
    dimension), ``"bytes"``/``"zlib"`` store the raw bytes (any number of ``None`` dimensions; the
    shape is then stored beside them). ``optional=True`` accepts ``None`` for a value, which is
    left out of the Example and reads back as TFDS's default (the dtype's minimum, ``b""``,
    ``False``). ``minimum``/``maximum`` are descriptive only, kept in features.json.

    Example::

        >>> points = Tensor(shape=(None, 2), dtype=np.float32)
        >>> points.encode_example([[0, 1], [2, 3], [4, 5]]).shape
        (3, 2)
    """

    tfds_class_name = _TFDS + "tensor_feature.Tensor"

    def __init__(self, *, shape: Any, dtype: Any, encoding: Union[str, Encoding] = Encoding.NONE,
                 optional: bool = False, minimum: Optional[int] = None, maximum: Optional[int] = None,
                 doc: DocArg = None):
        super().__init__(doc=doc)
        self._shape = _as_shape(shape)
        self._dtype = _as_dtype(dtype)
        try:
            self._encoding = Encoding(encoding.lower() if isinstance(encoding, str) else encoding)
        except ValueError:
            raise ValueError(f"encoding must be one of 'none', 'bytes', 'zlib', got {encoding!r}") from None
        self._optional = bool(optional)
        self._minimum = _optional_int(minimum)
        self._maximum = _optional_int(maximum)
        if self._dtype == _OBJECT and self._encoding is not Encoding.NONE:
            raise ValueError("a string Tensor cannot have encoding='bytes' or 'zlib' (TFDS does not support it)")
        if self._optional and self._encoding is not Encoding.NONE:
            raise ValueError("optional=True needs encoding='none'")
        self._dynamic = self._shape.count(None) > 1

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def encoding(self) -> Encoding:
        return self._encoding

    @property
    def optional(self) -> bool:
        return self._optional

    def serialized_info(self) -> Any:
        if self._encoding is Encoding.NONE:
            default = _default_value(self._dtype) if self._optional else None
            return WireSpec(self._shape, self._dtype, self._optional, default)
        value = WireSpec((), _OBJECT)
        if self._dynamic:
            return {"shape": WireSpec((len(self._shape),), np.dtype(np.int32)), "value": value}
        return value

    def _to_array(self, value: Any, path: str) -> np.ndarray:
        dtype = self._dtype
        if dtype == _OBJECT:
            array = np.asarray(value, dtype=_OBJECT)
            for item in array.flat:
                if not isinstance(item, (bytes, str)):
                    raise TypeError(f"{_where(path)} holds strings (bytes or str), got {item!r} "
                                    f"({type(item).__name__})")
            return array
        if isinstance(value, np.ndarray):
            if value.dtype != dtype:
                raise TypeError(f"{_where(path)} has dtype {dtype}, got an array of {value.dtype}: "
                                f"convert it with .astype(np.{dtype})")
            return value
        if isinstance(value, (str, bytes)):
            raise TypeError(f"{_where(path)} has dtype {dtype}, got a string {value!r}")
        raw = np.asarray(value)
        if raw.dtype.kind in "SUOV":
            raise TypeError(f"{_where(path)} has dtype {dtype}, got {value!r}")
        if dtype.kind in "biu" and raw.dtype.kind in "fc":
            raise TypeError(f"{_where(path)} has dtype {dtype}, got floating-point values {value!r}")
        try:
            return np.asarray(value, dtype=dtype)
        except (OverflowError, ValueError, TypeError) as exc:
            raise ValueError(f"{_where(path)} has dtype {dtype}: cannot hold {value!r} ({exc})") from None

    def _encode(self, value: Any, path: str) -> Any:
        if value is None:
            if self._optional:
                return None
            raise TypeError(f"{_where(path)} got None, but it is not optional")
        array = self._to_array(value, path)
        if not _shape_matches(array.shape, self._shape):
            raise ValueError(f"{_where(path)} has shape {_shape_text(self._shape)}, got a value of shape "
                             f"{_shape_text(array.shape)}")
        if self._encoding is Encoding.NONE:
            if self._dynamic:
                raise ValueError(f"{_where(path)}: a shape with more than one None dimension "
                                 f"({_shape_text(self._shape)}) needs Tensor(..., encoding='zlib') or 'bytes'")
            return array
        data = np.ascontiguousarray(array).tobytes()
        if self._encoding is Encoding.ZLIB:
            data = zlib.compress(data)
        if self._dynamic:
            return {"shape": np.asarray(array.shape, dtype=np.int32), "value": data}
        return data

    def _from_bytes(self, data: bytes, shape: tuple) -> Any:
        if self._encoding is Encoding.ZLIB:
            data = zlib.decompress(data)
        array = np.frombuffer(data, dtype=self._dtype).reshape(shape)
        return array[()] if array.ndim == 0 else array

    def decode_example(self, encoded: Any) -> Any:
        if self._encoding is Encoding.NONE:
            return encoded
        if self._dynamic:
            return self._from_bytes(encoded["value"], tuple(int(d) for d in encoded["shape"]))
        return self._from_bytes(encoded, self._shape)

    def _decoder(self, key: str) -> Callable[[dict], Any]:
        if self._encoding is not Encoding.NONE and self._dynamic:
            shape_key, value_key, decode = f"{key}/shape", f"{key}/value", self.decode_example
            return lambda flat: decode({"shape": flat[shape_key], "value": flat[value_key]})
        if self._encoding is Encoding.NONE:
            return lambda flat: flat[key]
        return super()._decoder(key)

    def _json_content(self) -> tuple:
        content = {"shape": _shape_to_json(self._shape), "dtype": _dtype_to_str(self._dtype),
                   "encoding": self._encoding.value}
        if self._minimum is not None:
            content["minimum"] = str(self._minimum)
        if self._maximum is not None:
            content["maximum"] = str(self._maximum)
        if self._optional:
            content["optional"] = True
        return "tensor", content

    @classmethod
    def _from_json_content(cls, content: Json) -> "Tensor":
        return cls(shape=_shape_from_json(content.get("shape", {})), dtype=_dtype_from_str(content["dtype"]),
                   encoding=content.get("encoding") or Encoding.NONE, optional=bool(content.get("optional", False)),
                   minimum=_optional_int(content.get("minimum")), maximum=_optional_int(content.get("maximum")))

    @classmethod
    def _from_legacy_content(cls, content: Json) -> "Tensor":
        return cls(shape=_shape_from_json(content["shape"]), dtype=_dtype_from_str(content["dtype"]),
                   encoding=content.get("encoding") or Encoding.NONE, optional=bool(content.get("optional", False)),
                   minimum=_optional_int(content.get("minimum")), maximum=_optional_int(content.get("maximum")))

    def __repr__(self) -> str:
        extra = "" if self._encoding is Encoding.NONE else f", encoding={self._encoding.value}"
        extra += ", optional=True" if self._optional else ""
        return f"{type(self).__name__}(shape={_shape_text(self._shape)}, dtype={_dtype_to_str(self._dtype)}{extra})"


class Scalar(Tensor):
    """A scalar of ``dtype``: ``Tensor(shape=(), dtype=dtype)``.

    Example::

        >>> Scalar(np.float32).encode_example(0.5)
        array(0.5, dtype=float32)
    """

    tfds_class_name = _TFDS + "scalar.Scalar"

    def __init__(self, dtype: Any, *, optional: bool = False, doc: DocArg = None):
        super().__init__(shape=(), dtype=dtype, optional=optional, doc=doc)

    @classmethod
    def _from_json_content(cls, content: Json) -> "Scalar":
        return cls(_dtype_from_str(content["dtype"]), optional=bool(content.get("optional", False)))

    @classmethod
    def _from_legacy_content(cls, content: Json) -> "Scalar":
        return cls._from_json_content(content)


class ClassLabel(Tensor):
    """An integer class label (``int64``, shape ``()``), from ``num_classes``, ``names`` or a
    ``names_file`` (one name per line). An example may give the label as an int in
    ``[-1, num_classes)`` (-1: no label, as TFDS) or as its name.

    Example::

        >>> label = ClassLabel(names=["cat", "dog"])
        >>> label.str2int("dog"), label.int2str(0), label.num_classes, label.encode_example("dog")
        (1, 'cat', 2, np.int64(1))
    """

    tfds_class_name = _TFDS + "class_label_feature.ClassLabel"

    def __init__(self, *, num_classes: Optional[int] = None, names: Optional[Iterable[str]] = None,
                 names_file: Union[None, str, os.PathLike] = None, doc: DocArg = None):
        super().__init__(shape=(), dtype=np.int64, doc=doc)
        self._num_classes: Optional[int] = None
        self._int2str: Optional[list] = None
        self._str2int: Optional[dict] = None
        given = [a is not None for a in (num_classes, names, names_file)]
        if sum(given) > 1:
            raise ValueError("ClassLabel takes one of num_classes, names and names_file, not several")
        if num_classes is not None:
            if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 0:
                raise TypeError(f"num_classes must be an int >= 0, got {num_classes!r}")
            self._num_classes = int(num_classes)
        elif names is not None:
            self.names = names
        elif names_file is not None:
            self.names = _read_names(os.fspath(names_file))

    @property
    def num_classes(self) -> Optional[int]:
        return self._num_classes

    @property
    def names(self) -> list:
        """The class names; ``["0", "1", ...]`` when only ``num_classes`` was given."""
        if self._int2str is None:
            return [str(i) for i in range(self._num_classes or 0)]
        return list(self._int2str)

    @names.setter
    def names(self, new_names: Iterable[str]) -> None:
        if isinstance(new_names, (str, bytes)):
            raise TypeError(f"names must be a list of strings, got the string {new_names!r}")
        names = list(new_names)
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"class names must be strings, got {name!r}")
        if self._int2str is not None and self._int2str != names:
            raise ValueError(f"the class names are already {self._int2str}; cannot change them to {names}")
        table = {name: i for i, name in enumerate(names)}
        if len(table) != len(names):
            duplicated = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"class names must be unique; duplicated: {duplicated}")
        if self._num_classes is not None and self._num_classes != len(names):
            raise ValueError(f"{len(names)} class names for num_classes={self._num_classes}")
        self._int2str, self._str2int, self._num_classes = names, table, len(names)

    def str2int(self, name: str) -> int:
        """The label of class ``name``; with no names, ``"3"`` is label 3."""
        if self._str2int is not None:
            try:
                return self._str2int[name]
            except KeyError:
                raise ValueError(f"unknown class name {name!r}; the names are {self._int2str}") from None
        try:
            value = int(name)
        except ValueError:
            value = -2
        if self._num_classes is None or not 0 <= value < self._num_classes:
            raise ValueError(f"unknown class name {name!r}: this ClassLabel has no names and "
                             f"num_classes={self._num_classes}")
        return value

    def int2str(self, value: int) -> str:
        """The name of label ``value``."""
        if self._num_classes is None or not 0 <= value < self._num_classes:
            raise ValueError(f"label {value} is not in [0, {self._num_classes})")
        return self._int2str[value] if self._int2str is not None else str(value)

    def _encode(self, value: Any, path: str) -> Any:
        if self._num_classes is None:
            raise ValueError(f"{_where(path)}: the ClassLabel has neither num_classes nor names; set one")
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        if isinstance(value, str):
            try:
                return np.int64(self.str2int(value))
            except ValueError as exc:
                raise ValueError(f"{_where(path)}: {exc}") from None
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{_where(path)} is a class label: give an int or a class name, got {value!r}")
        if not -1 <= value < self._num_classes:
            raise ValueError(f"{_where(path)}: label {value} is not in [-1, {self._num_classes}) "
                             f"(num_classes={self._num_classes})")
        return np.int64(value)

    def _json_content(self) -> tuple:
        return "classLabel", ({} if self._num_classes is None else {"numClasses": str(self._num_classes)})

    @classmethod
    def _from_json_content(cls, content: Json) -> "ClassLabel":
        # TFDS reads an absent numClasses as 0; None lets the labels file set it.
        return cls(num_classes=_optional_int(content.get("numClasses")))

    @classmethod
    def _from_legacy_content(cls, content: Json) -> "ClassLabel":
        if "names" in content:
            return cls(names=content["names"])
        return cls(num_classes=_optional_int(content.get("num_classes")))

    def _save_metadata(self, data_dir: str, feature_name: Optional[str]) -> None:
        if self._int2str is not None:
            with open(_labels_path(data_dir, feature_name), "w", encoding="utf-8") as f:
                f.write("\n".join(self._int2str) + "\n")

    def _load_metadata(self, data_dir: str, feature_name: Optional[str]) -> None:
        path = _labels_path(data_dir, feature_name)
        if os.path.exists(path):
            try:
                self.names = _read_names(path)
            except ValueError as exc:
                raise ValueError(f"{path}: {exc}") from None

    def __repr__(self) -> str:
        return f"ClassLabel(shape=(), dtype=int64, num_classes={self._num_classes})"


def _labels_path(data_dir: str, feature_name: Optional[str]) -> str:
    # TFDS names the file after the feature's key: "label.labels.txt", "nested-key.labels.txt";
    # a ClassLabel at the root (no key) gets "None.labels.txt", as in TFDS.
    return os.path.join(os.fspath(data_dir), f"{feature_name}.labels.txt")


def _read_names(path: str) -> list:
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f.read().split("\n") if line.strip()]


class Text(Tensor):
    """A text string: ``str`` is stored as UTF-8, ``bytes`` as they are; it decodes to ``bytes``
    (as TFDS's Text without an encoder).

    Example::

        >>> Text().encode_example("héllo")
        b'h\\xc3\\xa9llo'
    """

    tfds_class_name = _TFDS + "text_feature.Text"

    def __init__(self, *, optional: bool = False, doc: DocArg = None):
        super().__init__(shape=(), dtype=_OBJECT, optional=optional, doc=doc)

    def _encode(self, value: Any, path: str) -> Any:
        if value is None and self._optional:
            return None
        if isinstance(value, str):
            return value.encode("utf-8")
        if isinstance(value, bytes):
            return bytes(value)
        raise TypeError(f"{_where(path)} is text: give a str or bytes, got {value!r} ({type(value).__name__})")

    def _json_content(self) -> tuple:
        return "text", {}

    @classmethod
    def _from_json_content(cls, content: Json) -> "Text":
        if content.get("use_encoder"):
            raise ValueError("features.json: a Text feature with a (deprecated) TFDS text encoder is not supported")
        return cls()

    @classmethod
    def _from_legacy_content(cls, content: Json) -> "Text":
        return cls._from_json_content(content)

    def __repr__(self) -> str:
        return "Text(shape=(), dtype=string)"


_IMAGE_CHANNELS = {"png": (0, 1, 2, 3, 4), "jpeg": (0, 1, 3)}
_IMAGE_DTYPES = {"png": ("uint8", "uint16", "float32"), "jpeg": ("uint8",), None: ("uint8", "uint16", "float32")}
# Pillow's mode for an image of each channel count (uint8 samples).
_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}


def _pillow():
    """Pillow's ``PIL.Image``, or an ImportError that says how to install it."""
    try:
        from PIL import Image as PIL_Image
    except ImportError as exc:
        raise ImportError(_PILLOW_HINT) from exc
    return PIL_Image


class Image(FeatureConnector):
    """An image, ``shape=(height, width, channels)`` (``None`` for what varies), ``dtype`` uint8
    (or uint16 / float32 with one channel, PNG only), stored PNG- or JPEG-encoded (PNG when
    ``encoding_format`` is None). It encodes a numpy array, a path to an image file, the bytes of
    an encoded image, a file object or a ``PIL.Image``; it decodes to a numpy array.

    Encoding and decoding use Pillow, an optional dependency (``pip install 'dataservice[images]'``);
    describing an Image (features.json, element specs) does not need it.

    Example::

        >>> image = Image(shape=(2, 3, 3))
        >>> data = image.encode_example(np.zeros((2, 3, 3), np.uint8))
        >>> data[:4], image.decode_example(data).shape
        (b'\\x89PNG', (2, 3, 3))
    """

    tfds_class_name = _TFDS + "image_feature.Image"

    def __init__(self, *, shape: Any = None, dtype: Any = None, encoding_format: Optional[str] = None,
                 use_colormap: bool = False, doc: DocArg = None):
        super().__init__(doc=doc)
        if encoding_format is not None and encoding_format not in _IMAGE_CHANNELS:
            raise ValueError(f"encoding_format must be 'png', 'jpeg' or None, got {encoding_format!r}")
        self._encoding_format = encoding_format
        shape = _as_shape(shape or (None, None, 3))
        if len(shape) != 3:
            raise ValueError(f"an Image's shape is (height, width, channels), got {_shape_text(shape)}")
        channels = _IMAGE_CHANNELS.get(encoding_format)
        if channels is not None and shape[-1] not in channels:
            raise ValueError(f"{encoding_format} images have {channels} channels, got shape {_shape_text(shape)}")
        self._shape = shape
        self._dtype = _as_dtype(np.uint8 if dtype is None else dtype)
        if self._dtype.name not in _IMAGE_DTYPES[encoding_format]:
            allowed = " or ".join(_IMAGE_DTYPES[encoding_format])
            raise ValueError(f"{encoding_format or 'png'} images have dtype {allowed}, "
                             f"got {_dtype_to_str(self._dtype)}")
        if self._dtype != np.uint8 and shape[-1] != 1:
            raise ValueError(f"{self._dtype} images must have one channel (shape (h, w, 1)), got {_shape_text(shape)}")
        if use_colormap and (shape[-1] != 1 or self._dtype.kind not in "iu" or encoding_format not in (None, "png")):
            raise ValueError("use_colormap is for single-channel integer PNG images only")
        self._use_colormap = bool(use_colormap)

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def encoding_format(self) -> Optional[str]:
        return self._encoding_format

    @property
    def use_colormap(self) -> bool:
        return self._use_colormap

    def serialized_info(self) -> WireSpec:
        return WireSpec((), _OBJECT)

    def _encode(self, value: Any, path: str) -> bytes:
        if isinstance(value, np.ndarray):
            return self._encode_array(value, path)
        if isinstance(value, (str, os.PathLike)):
            try:
                with open(value, "rb") as f:
                    return f.read()
            except OSError as exc:
                raise type(exc)(f"{_where(path)}: cannot read the image file {os.fspath(value)!r}: {exc}") from exc
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        if hasattr(value, "read"):
            return value.read()
        pil = sys.modules.get("PIL.Image")
        if pil is not None and isinstance(value, pil.Image):
            buffer = io.BytesIO()
            value.save(buffer, format=self._encoding_format or "png")
            return buffer.getvalue()
        raise TypeError(f"{_where(path)} is an image: give a numpy array, a file path, encoded bytes, a file "
                        f"object or a PIL.Image, got {type(value).__name__}")

    def _encode_array(self, array: np.ndarray, path: str) -> bytes:
        if array.dtype != self._dtype:
            raise TypeError(f"{_where(path)} is an image of {self._dtype}, got an array of {array.dtype}")
        if not _shape_matches(array.shape, self._shape):
            raise ValueError(f"{_where(path)} is an image of shape {_shape_text(self._shape)}, got an array of "
                             f"shape {_shape_text(array.shape)}")
        pil = _pillow()
        if self._dtype == np.float32:
            # As TFDS: a float32 image is stored as the 4 bytes of each pixel, an RGBA PNG.
            picture = pil.fromarray(np.ascontiguousarray(array).view(np.uint8), mode=None)
        elif self._dtype == np.uint16:
            picture = pil.fromarray(np.ascontiguousarray(array[..., 0]))
        else:
            channels = array.shape[-1]
            if channels not in _MODES:
                raise ValueError(f"{_where(path)}: cannot encode an image with {channels} channels")
            picture = pil.fromarray(np.ascontiguousarray(array[..., 0] if channels == 1 else array))
        buffer = io.BytesIO()
        if self._encoding_format == "jpeg":
            # tf.image.encode_jpeg's defaults (quality 95, 300 dpi, 4:2:0): with the same libjpeg, the same bytes.
            picture.save(buffer, format="JPEG", quality=95, dpi=(300, 300), subsampling="4:2:0")
        else:
            picture.save(buffer, format="PNG")
        return buffer.getvalue()

    def decode_example(self, encoded: bytes) -> np.ndarray:
        pil = _pillow()
        try:
            picture = pil.open(io.BytesIO(encoded))
            picture.load()
        except Exception as exc:
            raise ValueError(f"cannot decode an image ({len(encoded)} bytes): {exc}") from exc
        if self._dtype == np.float32:
            array = np.asarray(picture.convert("RGBA"), dtype=np.uint8)
            array = np.ascontiguousarray(array).view(np.float32)
        elif self._dtype == np.uint16:
            array = np.asarray(picture).astype(np.uint16, copy=False)
            if array.ndim == 3:
                raise ValueError(f"a uint16 image feature with one channel got an image of mode {picture.mode}")
            array = array[..., None]
        else:
            array = _to_uint8(picture, self._shape[-1])
        if not _shape_matches(array.shape, self._shape):
            raise ValueError(f"a decoded image has shape {array.shape}, not the feature's {_shape_text(self._shape)}")
        return array

    def _json_content(self) -> tuple:
        content = {"shape": _shape_to_json(self._shape), "dtype": _dtype_to_str(self._dtype)}
        if self._encoding_format:
            content["encodingFormat"] = self._encoding_format
        if self._use_colormap:
            content["useColormap"] = True
        return "image", content

    @classmethod
    def _from_json_content(cls, content: Json) -> "Image":
        return cls(shape=_shape_from_json(content.get("shape", {})), dtype=_dtype_from_str(content["dtype"]),
                   encoding_format=content.get("encodingFormat") or None,
                   use_colormap=bool(content.get("useColormap", False)))

    @classmethod
    def _from_legacy_content(cls, content: Json) -> "Image":
        return cls(shape=_shape_from_json(content["shape"]), dtype=_dtype_from_str(content["dtype"]),
                   encoding_format=content.get("encoding_format") or None,
                   use_colormap=bool(content.get("use_colormap") or False))

    def __repr__(self) -> str:
        return f"Image(shape={_shape_text(self._shape)}, dtype={self._dtype})"


def _to_uint8(picture: Any, channels: Optional[int]) -> np.ndarray:
    """A decoded picture as uint8 (h, w, c): ``channels`` as the feature says (converting as
    ``tf.image.decode_image(channels=...)`` does), or the file's own when it says None."""
    mode = picture.mode
    if channels is None:
        if mode == "P":
            mode = "RGBA" if "transparency" in picture.info else "RGB"
        elif mode not in ("L", "LA", "RGB", "RGBA"):
            mode = "RGB" if mode in ("CMYK", "YCbCr", "HSV", "LAB") else "L"
    else:
        mode = _MODES.get(channels)
        if mode is None:
            raise ValueError(f"cannot decode an image to {channels} channels")
    if picture.mode != mode:
        if picture.mode.startswith("I") and mode == "L":
            # 16-bit grey to 8 bits: the high byte, as TensorFlow's PNG decoder does.
            picture = picture.point(lambda v: v / 256).convert("L")
        else:
            picture = picture.convert(mode)
    array = np.asarray(picture, dtype=np.uint8)
    return array[..., None] if array.ndim == 2 else array


class FeaturesDict(FeatureConnector):
    """A dict of features: one example. Values may be connectors, nested dicts (they become
    FeaturesDicts) or dtypes (scalar Tensors). Stored flat in the Example, nested keys joined with
    ``/``; decoded with keys sorted, as TFDS gives them.

    Example::

        >>> features = FeaturesDict({"x": Tensor(shape=(2,), dtype=np.int64), "y": {"z": np.float32}})
        >>> features.deserialize_example(features.serialize_example({"x": [1, 2], "y": {"z": 0.5}}))
        {'x': array([1, 2]), 'y': {'z': np.float32(0.5)}}
        >>> features.element_spec["y"]
        {'z': TensorSpec(shape=(), dtype=float32, name=None)}
    """

    tfds_class_name = _TFDS + "features_dict.FeaturesDict"

    def __init__(self, feature_dict: Mapping[str, Any], *, doc: DocArg = None):
        super().__init__(doc=doc)
        if not isinstance(feature_dict, Mapping):
            raise TypeError(f"FeaturesDict takes a dict of features, got {type(feature_dict).__name__}")
        features = {}
        for key, value in feature_dict.items():
            if not isinstance(key, str) or not key:
                raise TypeError(f"feature names must be non-empty strings, got {key!r}")
            try:
                features[key] = to_feature(value)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"feature {key!r}: {exc}") from None
        self._features = features
        self._flat_specs_cache: Optional[dict] = None
        self._parser: Optional[example_codec.Parser] = None
        self._decode: Optional[Callable[[dict], dict]] = None

    def __getstate__(self) -> dict:
        # The parse plan is rebuilt on first use: a pickled FeaturesDict (its deserialize_example
        # shipped to workers in a pipeline) carries only the features.
        return {**self.__dict__, "_flat_specs_cache": None, "_parser": None, "_decode": None}

    # the mapping ----------------------------------------------------------------------------------

    def keys(self):
        return self._features.keys()

    def items(self):
        return self._features.items()

    def values(self):
        return self._features.values()

    def __getitem__(self, key: str) -> FeatureConnector:
        return self._features[key]

    def __contains__(self, key: object) -> bool:
        return key in self._features

    def __iter__(self) -> Iterator[str]:
        return iter(self._features)

    def __len__(self) -> int:
        return len(self._features)

    @property
    def shape(self) -> dict:
        return {k: f.shape for k, f in sorted(self._features.items())}

    @property
    def dtype(self) -> dict:
        return {k: f.dtype for k, f in sorted(self._features.items())}

    @property
    def element_spec(self) -> dict:
        return {k: f.element_spec for k, f in sorted(self._features.items())}

    # encode / decode ------------------------------------------------------------------------------

    def serialized_info(self) -> dict:
        return {k: f.serialized_info() for k, f in self._features.items()}

    def _encode(self, value: Any, path: str) -> dict:
        if not isinstance(value, Mapping):
            raise TypeError(f"{_where(path)} is a dict of features {sorted(self._features)}, "
                            f"got {type(value).__name__}")
        unknown = [k for k in value if k not in self._features]
        missing = [k for k in self._features if k not in value]
        if unknown or missing:
            where = f" in {_where(path)}" if path else ""
            parts = []
            if missing:
                parts.append(f"missing {missing}")
            if unknown:
                parts.append(f"unknown {unknown}")
            raise ValueError(f"the example's keys do not match the features{where}: {', '.join(parts)}; "
                             f"the features are {list(self._features)}")
        return {k: f._encode(value[k], f"{path}/{k}" if path else k) for k, f in self._features.items()}

    def decode_example(self, encoded: Mapping[str, Any]) -> dict:
        return {k: self._features[k].decode_example(encoded[k]) for k in sorted(self._features)}

    def _decoder(self, key: str) -> Callable[[dict], Any]:
        children = [(k, f._decoder(f"{key}/{k}" if key else k)) for k, f in sorted(self._features.items())]
        return lambda flat: {k: decode(flat) for k, decode in children}

    def _flat_specs(self) -> dict:
        if self._flat_specs_cache is None:
            flat: dict = {}
            _flatten(self.serialized_info(), "", flat, "features")
            self._flat_specs_cache = flat
        return self._flat_specs_cache

    def serialize_example(self, example: Mapping[str, Any]) -> bytes:
        """``example`` (a nested dict of values) as the bytes of a ``tf.train.Example``, the keys,
        value kinds and values TFDS writes for it; TypeError/ValueError name a bad value's feature.

        Example::

            >>> FeaturesDict({"n": np.int64}).serialize_example({"n": 5})
            b'\\n\\x0c\\n\\n\\n\\x01n\\x12\\x05\\x1a\\x03\\n\\x01\\x05'
        """
        flat: dict = {}
        _flatten(self._encode(example, ""), "", flat, "values", self._flat_specs())
        return example_codec.serialize(flat, self._flat_specs())

    def deserialize_example(self, data: bytes) -> dict:
        """One serialized ``tf.train.Example`` decoded to a nested dict of numpy values, as
        ``tfds.as_numpy`` gives it; :class:`~dataservice.errors.DataLossError` when the record does
        not match the features (a missing key, another kind of values, a wrong count)."""
        if self._parser is None:
            self._parser = example_codec.Parser(self._flat_specs())
            self._decode = self._decoder("")
        return self._decode(self._parser.parse(data))

    # features.json --------------------------------------------------------------------------------

    def _json_content(self) -> tuple:
        if not self._features:
            return "featuresDict", {}
        return "featuresDict", {"features": {k: f.to_json() for k, f in self._features.items()}}

    @classmethod
    def _from_json_content(cls, content: Json) -> "FeaturesDict":
        features = content.get("features", {})
        if not isinstance(features, dict):
            raise ValueError(f"features.json: 'features' must be an object, got {features!r}")
        return cls({k: features_from_json(v) for k, v in features.items()})

    @classmethod
    def _from_legacy_content(cls, content: Json) -> "FeaturesDict":
        return cls({k: features_from_json(v) for k, v in content.items()})

    def _save_metadata(self, data_dir: str, feature_name: Optional[str]) -> None:
        for key, feature in self._features.items():
            feature._save_metadata(data_dir, _child_file_name(key, feature_name))

    def _load_metadata(self, data_dir: str, feature_name: Optional[str]) -> None:
        for key, feature in self._features.items():
            feature._load_metadata(data_dir, _child_file_name(key, feature_name))

    def __repr__(self) -> str:
        lines = ["FeaturesDict({"]
        for key, feature in sorted(self._features.items()):
            text = f"'{key}': {feature!r},"
            lines.extend("    " + line for line in text.split("\n"))
        lines.append("})")
        return "\n".join(lines)


def _child_file_name(key: str, parent: Optional[str]) -> str:
    # TFDS's convert_feature_name_to_filename: "/" in a key becomes ".", nesting joins with "-".
    name = key.replace("/", ".")
    return name if parent is None else "-".join(parent.split("/") + [name])


def _flatten(tree: Any, prefix: str, out: dict, what: str, specs: Optional[dict] = None) -> None:
    """Flattens nested dicts into ``out`` with "/"-joined keys (TFDS's flatten_nest_dict)."""
    if isinstance(tree, dict) and not (specs is not None and prefix in specs):
        for key, value in tree.items():
            _flatten(value, f"{prefix}/{key}" if prefix else key, out, what, specs)
        return
    if prefix in out:
        raise ValueError(f"two {what} flatten to the same Example key {prefix!r}")
    out[prefix] = tree


def to_feature(value: Any) -> FeatureConnector:
    """A connector from a connector, a dict (a :class:`FeaturesDict`) or a dtype (a scalar :class:`Tensor`).

    Example::

        >>> to_feature(np.int32), to_feature("string")
        (Tensor(shape=(), dtype=int32), Tensor(shape=(), dtype=string))
    """
    if isinstance(value, FeatureConnector):
        return value
    if isinstance(value, Mapping):
        return FeaturesDict(value)
    try:
        dtype = _as_dtype(value)
    except TypeError:
        raise TypeError(f"not a feature: {value!r}; give a FeatureConnector, a dict of features or a dtype") from None
    return Tensor(shape=(), dtype=dtype)


# --- features.json -------------------------------------------------------------------------------

_CLASSES: dict = {
    FeaturesDict.tfds_class_name: FeaturesDict,
    Tensor.tfds_class_name: Tensor,
    _TFDS + "feature.Tensor": Tensor,  # TFDS's alias, from when Tensor lived in feature.py
    Scalar.tfds_class_name: Scalar,
    ClassLabel.tfds_class_name: ClassLabel,
    Text.tfds_class_name: Text,
    Image.tfds_class_name: Image,
}

# The Feature message's oneof fields whose content we read (proto-JSON names).
_CONTENT_FIELDS = ("featuresDict", "tensor", "classLabel", "image", "text", "jsonFeature", "video", "audio",
                   "boundingBox", "translation", "sequence")


def _class_for(name: Any) -> type:
    cls = _CLASSES.get(name)
    if cls is None:
        supported = sorted({c.__name__ for c in _CLASSES.values()})
        raise ValueError(f"features.json names the feature class {name!r}, which dataservice does not support "
                         f"(it reads {', '.join(supported)})")
    return cls


def features_from_json(value: Mapping[str, Any]) -> FeatureConnector:
    """The feature that :meth:`FeatureConnector.to_json` (or TFDS) wrote; also reads TFDS's older
    ``{"type": ..., "content": ...}`` form. ValueError for what it cannot read.

    Example::

        >>> features_from_json(Tensor(shape=(None,), dtype="int32").to_json())
        Tensor(shape=(None,), dtype=int32)
    """
    if not isinstance(value, Mapping):
        raise ValueError(f"features.json: a feature must be an object, got {value!r}")
    try:
        if "type" in value and "pythonClassName" not in value:
            return _from_legacy_json(value)
        cls = _class_for(value.get("pythonClassName"))
        fields = [f for f in _CONTENT_FIELDS if f in value]
        if len(fields) != 1:
            raise ValueError(f"features.json: a feature must have exactly one content field, got {value!r}")
        content = value[fields[0]]
        if not isinstance(content, dict):
            raise ValueError(f"features.json: the {fields[0]!r} of a feature must be an object, got {content!r}")
        if fields[0] == "jsonFeature":
            feature = cls._from_legacy_content(json.loads(content.get("json", "{}")))
        else:
            feature = cls._from_json_content(content)
        feature._doc = Documentation(desc=value.get("description") or None,
                                     value_range=value.get("valueRange") or None)
        return feature
    except (KeyError, TypeError) as exc:
        raise ValueError(f"features.json: cannot read the feature {dict(value)!r}: {exc!r}") from None


def _from_legacy_json(value: Mapping[str, Any]) -> FeatureConnector:
    cls = _class_for(value["type"])
    content = value.get("content", {})
    if value.get("proto_cls"):
        # The content is the proto-JSON of the Feature's content message, maybe as a string.
        if isinstance(content, str):
            content = json.loads(content)
        return cls._from_json_content(content)
    return cls._from_legacy_content(content)


def save_features(features: FeatureConnector, data_dir: Union[str, os.PathLike]) -> str:
    """Writes ``features.json`` into ``data_dir`` as TFDS does (sorted keys, 4-space indent), and
    the ``<feature key>.labels.txt`` file of each ClassLabel that has names; returns the json's path.

    Example::

        >>> save_features(FeaturesDict({"label": ClassLabel(names=["a", "b"])}), "/tmp/ds/1.0.0")
        '/tmp/ds/1.0.0/features.json'
        >>> sorted(os.listdir("/tmp/ds/1.0.0"))
        ['features.json', 'label.labels.txt']
    """
    if not isinstance(features, FeatureConnector):
        raise TypeError(f"features must be a FeatureConnector, got {type(features).__name__}")
    data_dir = os.fspath(data_dir)
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, FEATURES_FILENAME)
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(features.to_json(), indent=4, sort_keys=True))
    features._save_metadata(data_dir, None)
    return path


def load_features(data_dir: Union[str, os.PathLike]) -> FeatureConnector:
    """The features that ``data_dir/features.json`` describes, with ClassLabel names from their
    labels files. FileNotFoundError when there is no features.json, ValueError when it cannot be read.

    Example::

        >>> _ = save_features(FeaturesDict({"label": ClassLabel(names=["a", "b"])}), "/tmp/ds/1.0.0")
        >>> load_features("/tmp/ds/1.0.0")["label"].names
        ['a', 'b']
    """
    data_dir = os.fspath(data_dir)
    path = os.path.join(data_dir, FEATURES_FILENAME)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"no {FEATURES_FILENAME} in {data_dir!r}: not a prepared dataset directory") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    try:
        features = features_from_json(value)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    features._load_metadata(data_dir, None)
    return features
